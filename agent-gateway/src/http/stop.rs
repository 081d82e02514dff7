//! Stop strings in OpenAI's sense: the output ends *before* the first stop string and does not
//! contain it. The worker stops after producing a stop string and keeps it in its text, so the
//! gateway cuts it off; while streaming it holds back text that may be the start of a stop
//! string until the next token decides.

/// Streaming stop-string filter over text pieces.
#[derive(Debug, Clone, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

impl StopFilter {
    /// A filter for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new(), stopped: false }
    }

    /// Adds a piece of output; returns the text that may be sent now. After a stop string has
    /// been seen, returns `""` for everything.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = (1..=self.pending.len())
            .rev()
            .filter(|&n| self.pending.is_char_boundary(self.pending.len() - n))
            .find(|&n| {
                let suffix = &self.pending[self.pending.len() - n..];
                self.stops.iter().any(|s| s.len() > n && s.starts_with(suffix))
            })
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        out
    }

    /// Whether a stop string has been seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The text still held back (at the end of generation it is output, not a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// `text` cut before the first occurrence of any of `stops` (whole-output form of
/// [`StopFilter`]).
pub fn truncate_at_stop(text: &str, stops: &[String]) -> String {
    let mut f = StopFilter::new(stops);
    let mut out = f.push(text);
    out.push_str(&f.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(pieces: &[&str], stops: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut out: Vec<String> = pieces.iter().map(|p| f.push(p)).collect();
        out.push(f.finish());
        (out, f.stopped())
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_cut_and_held_text_is_released() {
        let (out, stopped) = stream(&["Hello wo", "rld E", "N", "D tail"], &["END"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hello world ");
        assert_eq!(out[1], "rld ", "the E is held back until the next piece");

        let (out, stopped) = stream(&["a E", "x"], &["END"]);
        assert!(!stopped);
        assert_eq!(out, vec!["a ", "Ex", ""], "a false start is released");

        let (out, _) = stream(&["abc"], &["zz"]);
        assert_eq!(out.concat(), "abc");
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_text_is_not_split() {
        assert_eq!(truncate_at_stop("x}\n\ny STOP", &["STOP".into(), "\n".into()]), "x}");
        let (out, _) = stream(&["é", "éa"], &["éb"]);
        assert_eq!(out.concat(), "ééa");
        assert_eq!(out[0], "", "é may start the stop string");
        assert_eq!(truncate_at_stop("no stops", &[]), "no stops");
    }
}
