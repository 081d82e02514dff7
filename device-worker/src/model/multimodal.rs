//! Images inside a text sequence (issue 19): which sequence indices are image tokens, their
//! embeddings (the projector's output, replacing the token embeddings there), and the
//! multimodal rotary position of every index ([`SequenceImages::position`]).
//!
//! Positions follow the references (Hugging Face `Qwen3VLModel.get_rope_index`, llama.cpp
//! `mtmd_image_tokens_get_decoder_pos` / `mtmd_image_tokens_get_n_pos`; read, not copied): a
//! text token has `(p, p, p)`; an image whose first token would be at text position `s`
//! gives its token in row `r`, column `c` of the merged grid `(s, s + r, s + c)`; the text
//! after it resumes at `s + max(rows, cols)`, not at `s + rows·cols`. So the text position of
//! index `i` is `i` less, for every image that ends at or before `i`, its token count minus
//! `max(rows, cols)`. Before the first image positions equal indices (a text checkpoint there
//! is position-exact: Tandem §4.5).

use std::sync::Arc;

use gguf::reader::{GgufFile, MetaValue};

use super::ModelError;

/// The interleaved multimodal RoPE sections at `key` (`{arch}.rope.dimension_sections`,
/// four integers, e.g. `[11, 11, 10, 0]` for Qwen3.5): rotary pairs per axis (t, h, w).
/// `None` when the key is absent.
///
/// Errors: [`ModelError::Invalid`] for a value that is not an array of integers, a fourth
/// section other than 0, or sections that do not sum to `n_rot / 2`.
pub fn rope_sections(
    file: &GgufFile,
    key: &str,
    n_rot: usize,
) -> Result<Option<[usize; 3]>, ModelError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    let bad = |why: &str| ModelError::Invalid(format!("{key}: {why}"));
    let MetaValue::Array(items) = v else {
        return Err(bad("expected an array of integers"));
    };
    let vals: Vec<usize> = items
        .iter()
        .map(|e| e.as_integer().and_then(|i| usize::try_from(i).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("expected non-negative integers"))?;
    match vals[..] {
        [t, h, w] | [t, h, w, 0] if t + h + w == n_rot / 2 => Ok(Some([t, h, w])),
        _ => Err(bad(&format!(
            "{vals:?} must be 3 sections (and a 4th of 0) summing to n_rot / 2 = {}",
            n_rot / 2
        ))),
    }
}

/// One image's tokens in a sequence.
#[derive(Clone, Debug)]
pub struct ImageSpan {
    /// Sequence index of its first token.
    pub start: usize,
    /// Rows and columns of image tokens (merged 2×2 patch blocks), row-major.
    pub grid: (usize, usize),
    /// The image embeddings `[rows·cols, n_embd]` (projector output); `None` when no pass
    /// computes these indices (the image lies in the reused prefix and only its positions
    /// matter).
    pub embd: Option<Arc<Vec<f32>>>,
}

impl ImageSpan {
    /// Image tokens: `rows · cols`.
    pub fn n_tokens(&self) -> usize {
        self.grid.0 * self.grid.1
    }

    /// One past its last token.
    pub fn end(&self) -> usize {
        self.start + self.n_tokens()
    }

    /// Rotary positions the image takes: `max(rows, cols)`.
    pub fn n_pos(&self) -> usize {
        self.grid.0.max(self.grid.1)
    }
}

/// The images of one sequence, ascending and disjoint.
#[derive(Clone, Debug, Default)]
pub struct SequenceImages {
    spans: Vec<ImageSpan>,
}

impl SequenceImages {
    /// Checks the spans: ascending, disjoint, not empty, embeddings of `n_tokens · n_embd`
    /// values where present.
    ///
    /// Errors: [`ModelError::Invalid`] naming the span.
    pub fn new(spans: Vec<ImageSpan>, n_embd: usize) -> Result<Self, ModelError> {
        let mut end = 0;
        for (i, s) in spans.iter().enumerate() {
            if s.start < end || s.n_tokens() == 0 {
                return Err(ModelError::Invalid(format!(
                    "image {i} at {} with grid {:?} overlaps the previous one or is empty",
                    s.start, s.grid
                )));
            }
            if let Some(e) = &s.embd {
                if e.len() != s.n_tokens() * n_embd {
                    return Err(ModelError::Invalid(format!(
                        "image {i}: {} embedding values for {} tokens of {n_embd}",
                        e.len(),
                        s.n_tokens()
                    )));
                }
            }
            end = s.end();
        }
        Ok(Self { spans })
    }

    pub fn spans(&self) -> &[ImageSpan] {
        &self.spans
    }

    /// The image holding sequence index `i`, and `i`'s index inside it.
    pub fn image_at(&self, i: usize) -> Option<(&ImageSpan, usize)> {
        self.spans
            .iter()
            .find(|s| (s.start..s.end()).contains(&i))
            .map(|s| (s, i - s.start))
    }

    /// The multimodal rotary position `(t, h, w)` of sequence index `i` (module docs).
    pub fn position(&self, i: usize) -> [u32; 3] {
        let mut shift = 0;
        for s in &self.spans {
            if i >= s.end() {
                shift += s.n_tokens() - s.n_pos();
            } else if i >= s.start {
                let base = (s.start - shift) as u32;
                let k = i - s.start;
                let (r, c) = ((k / s.grid.1) as u32, (k % s.grid.1) as u32);
                return [base, base + r, base + c];
            } else {
                break;
            }
        }
        let p = (i - shift) as u32;
        [p, p, p]
    }

    /// Writes the input rows of indices `pos0..pos0 + tokens.len()` into `out`
    /// `[n, n_embd]`: image embeddings inside images, `embed(id, row)` (the token embedding)
    /// elsewhere.
    ///
    /// Errors: [`ModelError::Invalid`] for an image index whose image has no embeddings;
    /// `embed`'s.
    pub fn embed(
        &self,
        pos0: usize,
        tokens: &[u32],
        n_embd: usize,
        out: &mut [f32],
        mut embed: impl FnMut(u32, &mut [f32]) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        for (t, (&id, row)) in tokens.iter().zip(out.chunks_exact_mut(n_embd)).enumerate() {
            match self.image_at(pos0 + t) {
                Some((s, k)) => {
                    let e = s.embd.as_ref().ok_or_else(|| {
                        ModelError::Invalid(format!(
                            "index {} is in the image at {} but the pass has no embeddings for it",
                            pos0 + t,
                            s.start
                        ))
                    })?;
                    row.copy_from_slice(&e[k * n_embd..(k + 1) * n_embd]);
                }
                None => embed(id, row)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: usize, grid: (usize, usize)) -> ImageSpan {
        ImageSpan {
            start,
            grid,
            embd: None,
        }
    }

    #[test]
    fn text_only_positions_are_the_indices() {
        let im = SequenceImages::default();
        for i in [0, 1, 999] {
            let p = i as u32;
            assert_eq!(im.position(i), [p, p, p]);
        }
    }

    /// Hugging Face's `get_rope_index` for one image, written out by hand: text `0..s`,
    /// the image's tokens `(s, s + r, s + c)`, then text from `s + max(rows, cols)`.
    #[test]
    fn positions_around_images_follow_get_rope_index() {
        // 5 text tokens, a 2×3 image, 2 text tokens, a 3×1 image, 1 text token.
        let im = SequenceImages::new(vec![span(5, (2, 3)), span(13, (3, 1))], 4).unwrap();
        let got: Vec<[u32; 3]> = (0..17).map(|i| im.position(i)).collect();
        let want = vec![
            [0, 0, 0],
            [1, 1, 1],
            [2, 2, 2],
            [3, 3, 3],
            [4, 4, 4],
            [5, 5, 5],
            [5, 5, 6],
            [5, 5, 7],
            [5, 6, 5],
            [5, 6, 6],
            [5, 6, 7],
            // After the first image: 5 + max(2, 3) = 8.
            [8, 8, 8],
            [9, 9, 9],
            // Second image at text position 10: rows 0..3, one column.
            [10, 10, 10],
            [10, 11, 10],
            [10, 12, 10],
            // 10 + max(3, 1) = 13.
            [13, 13, 13],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn embed_takes_image_rows_inside_images_and_token_rows_elsewhere() {
        let e = Arc::new((0..6 * 2).map(|v| 100.0 + v as f32).collect::<Vec<f32>>());
        let im = SequenceImages::new(
            vec![ImageSpan {
                start: 2,
                grid: (2, 3),
                embd: Some(e),
            }],
            2,
        )
        .unwrap();
        // A pass over indices 1..5: one text token, then the image's first three rows.
        let mut out = vec![0.0; 4 * 2];
        im.embed(1, &[7, 0, 0, 0], 2, &mut out, |id, row| {
            row.fill(id as f32);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            out,
            vec![7.0, 7.0, 100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
        );
        let bare = SequenceImages::new(vec![span(2, (2, 3))], 2).unwrap();
        assert!(bare
            .embed(1, &[7, 0], 2, &mut out[..4], |_, _| Ok(()))
            .is_err());
    }

    #[test]
    fn overlapping_or_misshapen_images_are_refused() {
        assert!(SequenceImages::new(vec![span(0, (2, 2)), span(3, (1, 1))], 2).is_err());
        assert!(SequenceImages::new(vec![span(0, (0, 2))], 2).is_err());
        let short = ImageSpan {
            start: 0,
            grid: (1, 2),
            embd: Some(Arc::new(vec![0.0; 3])),
        };
        assert!(SequenceImages::new(vec![short], 2).is_err());
    }
}
