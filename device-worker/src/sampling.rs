//! Token choice from logits, in one place: greedy (argmax, ties to the lowest id as
//! llama.cpp's greedy sampler) or seeded temperature / top-k / top-p sampling, under the
//! request's grammar mask when it has one ([`choose`]).

use crate::constraint::{Constraint, ConstraintError};

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum SamplingMode {
    Greedy,
    Seeded {
        seed: u64,
        temperature: f32,
        top_k: u32,
        top_p: f32,
    },
}

/// Index of the largest finite logit; the lowest index wins ties. `None` if every logit is
/// `-inf` (nothing allowed).
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l == f32::NEG_INFINITY || l.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// The next token from `logits` (`[n_vocab]`; masked in place when the grammar must be
/// applied): greedy → [`argmax`], where the unconstrained argmax is taken as is when the
/// grammar allows it (it is then the masked argmax, so the mask is computed only when it is
/// not, [`Constraint::is_allowed`]); seeded → [`sample`] over the masked logits. `None` when
/// nothing is allowed.
///
/// Errors: the grammar's ([`ConstraintError`]).
pub fn choose(
    mode: &SamplingMode,
    constraint: Option<&mut Constraint>,
    logits: &mut [f32],
    rng: &mut Rng,
) -> Result<Option<u32>, ConstraintError> {
    Ok(match (mode, constraint) {
        (SamplingMode::Greedy, None) => argmax(logits),
        (SamplingMode::Greedy, Some(con)) => match argmax(logits) {
            Some(id) if con.is_allowed(id) => Some(id),
            _ => {
                con.allowed_tokens()?.apply(logits);
                argmax(logits)
            }
        },
        (
            &SamplingMode::Seeded {
                temperature,
                top_k,
                top_p,
                ..
            },
            con,
        ) => {
            if let Some(con) = con {
                con.allowed_tokens()?.apply(logits);
            }
            sample(logits, temperature, top_k, top_p, rng)
        }
    })
}

/// A small deterministic generator (SplitMix64) so a seed reproduces a sample.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Samples from `softmax(logits / temperature)` restricted to the `top_k` most likely tokens
/// (0: all) and the smallest set whose probability reaches `top_p` (0 or ≥ 1: all).
pub fn sample(
    logits: &[f32],
    temperature: f32,
    top_k: u32,
    top_p: f32,
    rng: &mut Rng,
) -> Option<u32> {
    if temperature <= 0.0 {
        return argmax(logits);
    }
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / temperature))
        .collect();
    if cand.is_empty() {
        return None;
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if top_k > 0 {
        cand.truncate(top_k as usize);
    }
    let max = cand[0].1;
    let mut probs: Vec<f32> = cand.iter().map(|(_, l)| (l - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    if top_p > 0.0 && top_p < 1.0 {
        let mut acc = 0.0;
        let keep = probs.iter().position(|p| {
            acc += p;
            acc >= top_p
        });
        let keep = keep.map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        let s: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= s);
    }
    let r = rng.next_f32();
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += p;
        if r < acc {
            return Some(cand[i].0);
        }
    }
    Some(cand[probs.len() - 1].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_index_on_ties_and_skips_masked() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NEG_INFINITY]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY, 0.5]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits = [0.0, 1.0, 2.0, 3.0];
        let a: Vec<_> = {
            let mut r = Rng::new(7);
            (0..20)
                .map(|_| sample(&logits, 1.0, 2, 1.0, &mut r).unwrap())
                .collect()
        };
        let b: Vec<_> = {
            let mut r = Rng::new(7);
            (0..20)
                .map(|_| sample(&logits, 1.0, 2, 1.0, &mut r).unwrap())
                .collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|&t| t == 2 || t == 3));
        assert!(a.contains(&2) && a.contains(&3));
    }
}
