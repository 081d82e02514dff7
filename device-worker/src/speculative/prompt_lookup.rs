//! Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp `--lookup` and
//! `common/ngram-cache` read for reference only): the suffix n-gram of `prompt ++ output` is
//! looked up earlier in the same context and the tokens that followed it are the draft.
//!
//! GUI actions copy element text, resource ids and indices from the screen dump in the prompt,
//! so this drafter is the cheap one: no model, no memory, one backward scan of the context.

use super::{Draft, DraftRequest, Drafter, DrafterKind, SpecError};

/// The prompt-lookup drafter.
///
/// For `n` from `max_ngram` down to `min_ngram`, take the suffix n-gram of `prompt ++ output`
/// and search for its most recent earlier occurrence (any start before the suffix itself;
/// occurrences may overlap the suffix). The first `n` with a match wins: propose the tokens
/// that followed that occurrence, up to `max` and never past the end of the context.
///
/// Cost: `O((max_ngram − min_ngram + 1) · L · max_ngram)` token comparisons per call for a
/// context of `L` tokens, no allocation besides the draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Shortest suffix n-gram tried (tokens, ≥ 1; 0 is treated as 1).
    pub min_ngram: usize,
    /// Longest suffix n-gram tried (tokens, ≥ `min_ngram`).
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    /// `min_ngram = 1`, `max_ngram = 3`.
    fn default() -> Self {
        PromptLookup {
            min_ngram: 1,
            max_ngram: 3,
        }
    }
}

impl PromptLookup {
    /// A drafter for n-grams `min_ngram..=max_ngram`.
    ///
    /// Errors: [`SpecError::InvalidNgramRange`] unless `1 <= min_ngram <= max_ngram`.
    pub fn new(min_ngram: usize, max_ngram: usize) -> Result<Self, SpecError> {
        if min_ngram == 0 || min_ngram > max_ngram {
            return Err(SpecError::InvalidNgramRange {
                min_ngram,
                max_ngram,
            });
        }
        Ok(PromptLookup {
            min_ngram,
            max_ngram,
        })
    }

    /// The draft for the context `prompt ++ output`: up to `max` tokens, empty when no suffix
    /// n-gram recurs (or `max == 0`).
    pub fn lookup(&self, prompt: &[u32], output: &[u32], max: usize) -> Vec<u32> {
        let ctx = Joined {
            head: prompt,
            tail: output,
        };
        let len = ctx.len();
        if max == 0 || len < 2 {
            return Vec::new();
        }
        let min_n = self.min_ngram.max(1);
        // The suffix and an earlier occurrence need n + 1 tokens at least.
        let max_n = self.max_ngram.min(len - 1);
        for n in (min_n..=max_n).rev() {
            let suffix_start = len - n;
            // Most recent earlier occurrence first: starts suffix_start-1 down to 0.
            let found = (0..suffix_start)
                .rev()
                .find(|&start| (0..n).all(|k| ctx.at(start + k) == ctx.at(suffix_start + k)));
            if let Some(start) = found {
                let from = start + n;
                let to = (from + max).min(len);
                return (from..to).map(|i| ctx.at(i)).collect();
            }
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn kind(&self) -> DrafterKind {
        DrafterKind::PromptLookup
    }

    /// See [`PromptLookup::lookup`]; bucket 0.
    fn propose(&mut self, req: DraftRequest<'_, '_>) -> Option<Draft> {
        let tokens = self.lookup(req.ctx.prompt, req.ctx.output, req.max);
        (!tokens.is_empty()).then_some(Draft {
            kind: DrafterKind::PromptLookup,
            tokens,
            bucket: 0,
        })
    }
}

/// `head ++ tail` without copying.
struct Joined<'a> {
    head: &'a [u32],
    tail: &'a [u32],
}

impl Joined<'_> {
    fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Token `i < len()`.
    fn at(&self, i: usize) -> u32 {
        match self.head.get(i) {
            Some(&t) => t,
            None => self.tail[i - self.head.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::test_rng::SplitMix64;
    use crate::speculative::DraftContext;

    fn propose(pl: &PromptLookup, prompt: &[u32], output: &[u32], max: usize) -> Option<Vec<u32>> {
        let ctx = DraftContext {
            prompt,
            output,
            hidden: &[],
        };
        let mut pl = *pl;
        pl.propose(DraftRequest {
            ctx: &ctx,
            max,
            model: None,
        })
        .map(|d| {
            assert_eq!(d.kind, DrafterKind::PromptLookup);
            assert_eq!(d.bucket, 0);
            d.tokens
        })
    }

    #[test]
    fn longest_ngram_wins_over_a_more_recent_shorter_one() {
        let pl = PromptLookup::default();
        // Suffix (1, 2, 3): the trigram occurs at 0 (followed by 10, 11); the unigram 3 occurs
        // more recently at 6 (followed by 20). The trigram must win.
        let prompt = [1, 2, 3, 10, 11, 9, 3, 20, 21];
        let output = [1, 2, 3];
        assert_eq!(propose(&pl, &prompt, &output, 2), Some(vec![10, 11]));
    }

    #[test]
    fn most_recent_occurrence_wins_among_equal_lengths() {
        let pl = PromptLookup::default();
        let prompt = [7, 8, 1, 7, 8, 2, 5];
        let output = [7, 8];
        assert_eq!(propose(&pl, &prompt, &output, 1), Some(vec![2]));
        // Across the prompt/output boundary: the most recent occurrence is in the output.
        let output = [7, 8, 4, 6, 7, 8];
        assert_eq!(propose(&pl, &prompt, &output, 2), Some(vec![4, 6]));
    }

    #[test]
    fn respects_max_and_the_context_end() {
        let pl = PromptLookup::default();
        let prompt = [5, 6, 1, 2, 3, 4];
        let output = [5, 6];
        assert_eq!(propose(&pl, &prompt, &output, 3), Some(vec![1, 2, 3]));
        // More than the context holds after the match: stops at the end (which includes the
        // suffix itself).
        assert_eq!(
            propose(&pl, &prompt, &output, 100),
            Some(vec![1, 2, 3, 4, 5, 6])
        );
        assert_eq!(propose(&pl, &prompt, &output, 0), None);
    }

    #[test]
    fn overlapping_occurrence_of_a_run() {
        let pl = PromptLookup::default();
        // Suffix (4, 4, 4) recurs at 0 (overlapping the suffix), followed by the last 4.
        assert_eq!(propose(&pl, &[4, 4], &[4, 4], 5), Some(vec![4]));
    }

    #[test]
    fn no_recurring_ngram_gives_none() {
        let pl = PromptLookup::default();
        assert_eq!(propose(&pl, &[1, 2, 3], &[4], 4), None);
        assert_eq!(propose(&pl, &[], &[4], 4), None);
        assert_eq!(propose(&pl, &[], &[], 4), None);
        // min_ngram = 2 ignores a unigram match.
        let pl2 = PromptLookup::new(2, 3).expect("valid range");
        assert_eq!(propose(&pl2, &[9, 1, 2], &[9], 4), None);
        assert_eq!(
            propose(&PromptLookup::default(), &[9, 1, 2], &[9], 4),
            Some(vec![1, 2, 9])
        );
    }

    #[test]
    fn invalid_ranges_are_rejected() {
        assert!(matches!(
            PromptLookup::new(0, 3),
            Err(SpecError::InvalidNgramRange {
                min_ngram: 0,
                max_ngram: 3
            })
        ));
        assert!(matches!(
            PromptLookup::new(4, 3),
            Err(SpecError::InvalidNgramRange { .. })
        ));
    }

    /// Reference: materialise the context and test the definition directly.
    fn reference(pl: &PromptLookup, ctx: &[u32], max: usize) -> Vec<u32> {
        let len = ctx.len();
        for n in (pl.min_ngram..=pl.max_ngram).rev() {
            if n + 1 > len {
                continue;
            }
            let suffix = &ctx[len - n..];
            let best = (0..len - n).filter(|&s| &ctx[s..s + n] == suffix).max();
            if let Some(s) = best {
                return ctx[s + n..(s + n + max).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn matches_the_definition_on_random_contexts() {
        let mut rng = SplitMix64(0x5eed_1001);
        for _ in 0..2000 {
            let pl = PromptLookup::new(1 + rng.below(2) as usize, 2 + rng.below(3) as usize)
                .expect("valid range");
            let vocab = 2 + rng.below(6);
            let n_prompt = rng.below(20) as usize;
            let n_out = rng.below(8) as usize;
            let prompt: Vec<u32> = (0..n_prompt).map(|_| rng.below(vocab) as u32).collect();
            let output: Vec<u32> = (0..n_out).map(|_| rng.below(vocab) as u32).collect();
            let max = rng.below(6) as usize;
            let ctx: Vec<u32> = prompt.iter().chain(&output).copied().collect();
            assert_eq!(
                pl.lookup(&prompt, &output, max),
                reference(&pl, &ctx, max),
                "prompt {prompt:?} output {output:?} max {max} {pl:?}"
            );
        }
    }
}
