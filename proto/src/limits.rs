//! The value rules of the contracts, checked with these functions by both servers, so a
//! field means the same on every hop: the gateway (gRPC `AgentService`, the OpenAI HTTP
//! endpoint) and the worker (gRPC `StepService`).
//!
//! - Session and episode ids ([`check_id`]): at most [`MAX_ID_BYTES`] bytes of UTF-8 without
//!   control characters (`char::is_control`: C0, DEL, C1). Empty is allowed (no affinity /
//!   the gateway makes one). A refused id is named in errors and logs only by its first
//!   [`ID_PREFIX_CHARS`] characters ([`brief`]).
//! - Seeded sampling ([`check_seeded`]): `temperature` in (0, 2], `top_p` in [0, 1] (0 or 1:
//!   off), `top_k` any (0 or at least the vocabulary: off), `seed` any. NaN and infinities
//!   are out of every range. `max_tokens` needs no rule: 0 is the worker's default and
//!   generation also stops when the context is full.

use crate::step::v1 as pb;

/// The longest session or episode id, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// How many characters of a refused value an error or a log line shows.
pub const ID_PREFIX_CHARS: usize = 32;

/// The largest sampling temperature (OpenAI's bound).
pub const MAX_TEMPERATURE: f32 = 2.0;

/// A field whose value is outside its rule: the field, the rule, and the value as shown
/// (cut to a prefix for long ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub expected: &'static str,
    pub found: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: expected {}, found {}", self.field, self.expected, self.found)
    }
}

impl std::error::Error for FieldError {}

/// What [`check_id`] requires, as error text.
pub const ID_RULE: &str = "at most 128 bytes of UTF-8 without control characters";

/// Checks a session or episode id named `field` (see the module rules).
///
/// Errors: [`FieldError`] naming `field`, [`ID_RULE`] and the id's length and first
/// [`ID_PREFIX_CHARS`] characters (control characters escaped).
pub fn check_id(field: &'static str, id: &str) -> Result<(), FieldError> {
    if id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control) {
        return Ok(());
    }
    Err(FieldError { field, expected: ID_RULE, found: brief(id) })
}

/// `s` for an error or a log line: its first [`ID_PREFIX_CHARS`] characters, debug-quoted
/// (control characters escaped), with its length in bytes when it was cut.
pub fn brief(s: &str) -> String {
    match s.char_indices().nth(ID_PREFIX_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
        None => format!("{s:?} ({} bytes)", s.len()),
    }
}

/// Checks seeded-sampling parameters (see the module rules).
///
/// Errors: [`FieldError`] naming the first field out of range (`temperature`, `top_p`).
pub fn check_seeded(s: &pb::Seeded) -> Result<(), FieldError> {
    if !(s.temperature > 0.0 && s.temperature <= MAX_TEMPERATURE) {
        return Err(FieldError { field: "temperature", expected: "a number in (0, 2] for seeded sampling", found: s.temperature.to_string() });
    }
    if !(0.0..=1.0).contains(&s.top_p) {
        return Err(FieldError { field: "top_p", expected: "a number in [0, 1] (0 or 1: off)", found: s.top_p.to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_up_to_the_limit_pass_and_longer_or_control_ones_are_refused_by_a_prefix() {
        for ok in ["", "ep-1", &"é".repeat(MAX_ID_BYTES / 2), &"a".repeat(MAX_ID_BYTES), "任务 42"] {
            assert_eq!(check_id("session_id", ok), Ok(()), "{ok:?}");
        }
        let long = "x".repeat(1 << 20);
        let e = check_id("session_id", &long).unwrap_err();
        assert_eq!(e.field, "session_id");
        assert!(e.to_string().len() < 200, "{e}");
        assert!(e.to_string().contains("128 bytes") && e.found.contains("1048576 bytes"), "{e}");
        for bad in ["a\nb", "\u{7f}", "a\u{85}", "\0", &"a".repeat(MAX_ID_BYTES + 1)] {
            let e = check_id("episode_id", bad).unwrap_err();
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }

    #[test]
    fn seeded_sampling_outside_its_ranges_names_the_field() {
        let ok = pb::Seeded { seed: 1, temperature: 0.7, top_p: 0.0, top_k: 0 };
        assert_eq!(check_seeded(&ok), Ok(()));
        assert_eq!(check_seeded(&pb::Seeded { temperature: 2.0, top_p: 1.0, top_k: u32::MAX, ..ok }), Ok(()));
        let cases = [
            (pb::Seeded { temperature: f32::NAN, ..ok }, "temperature"),
            (pb::Seeded { temperature: 0.0, ..ok }, "temperature"),
            (pb::Seeded { temperature: -1.0, ..ok }, "temperature"),
            (pb::Seeded { temperature: f32::INFINITY, ..ok }, "temperature"),
            (pb::Seeded { temperature: 2.5, ..ok }, "temperature"),
            (pb::Seeded { top_p: f32::NAN, ..ok }, "top_p"),
            (pb::Seeded { top_p: -0.1, ..ok }, "top_p"),
            (pb::Seeded { top_p: 1.5, ..ok }, "top_p"),
            (pb::Seeded { top_p: f32::INFINITY, ..ok }, "top_p"),
        ];
        for (s, field) in cases {
            assert_eq!(check_seeded(&s).unwrap_err().field, field, "{s:?}");
        }
    }
}
