//! The adaptive draft-length controller (DESIGN.md "Adaptive draft length from online
//! estimates of acceptance and pass latency"; Tandem §3.3/§4.3; PastForward §3.2
//! "Runtime-adaptive proposal-length controller").
//!
//! Each round the engine asks [`DraftLength::choose`] how many drafted tokens `n` one
//! verification pass should check. With a per-token acceptance probability `α` (acceptance
//! is a prefix: the first rejected token ends it) the pass yields on average
//! `E(n) = 1 + α + … + αⁿ = (1 − αⁿ⁺¹)/(1 − α)` tokens (the accepted prefix plus the target's
//! own next token; `E = n + 1` at `α = 1`), and takes `t(n)` ms to verify plus `n·c` ms to
//! draft (`c`, the drafter's cost per drafted token: an MTP step, 0 for prompt lookup). The
//! controller returns the `n` maximising `E(n)/(t(n) + n·c)`, tokens per ms; `n = 0` (a plain
//! decode pass) when no draft pays.
//!
//! `α` is estimated per (drafter, bucket) (the bucket is the experience memory's similarity
//! bucket, 0 otherwise) and `t(n)` per `n`, both as exponential moving averages.

use std::collections::HashMap;

use super::{DrafterKind, SpecError};

/// How the draft length is chosen each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftLengthMode {
    Adaptive,
    Fixed,
}


/// Settings of [`DraftLength`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftLengthConfig {
    /// `α` before any observation for a (drafter, bucket); optimistic so drafting gets tried.
    /// In `[0, 1]`. Default 0.6.
    pub prior_alpha: f64,
    /// EMA weight of one accept/reject observation in the `α` estimate, in `(0, 1]`.
    /// Default 0.05 (about the last 20 drafted tokens).
    pub alpha_smoothing: f64,
    /// EMA weight of one measured pass in the `t(n)` estimate, in `(0, 1]`. Default 0.2.
    pub latency_smoothing: f64,
    /// Relative cost per drafted token of the prior `t(n) = t(0)·(1 + slope·n)` used before
    /// `t(n)` is measured (Tandem §4.3: 4 columns cost ≈1.27× one). `≥ 0`. Default 0.08.
    pub prior_slope: f64,
}

impl Default for DraftLengthConfig {
    fn default() -> Self {
        DraftLengthConfig {
            prior_alpha: 0.6,
            alpha_smoothing: 0.05,
            latency_smoothing: 0.2,
            prior_slope: 0.08,
        }
    }
}

/// Online acceptance and pass-latency estimates and the draft length they imply.
#[derive(Clone, Debug)]
pub struct DraftLength {
    config: DraftLengthConfig,
    /// `α` per (drafter, bucket), only for observed keys.
    alpha: HashMap<(DrafterKind, usize), f64>,
    /// Measured pass latency (EMA, ms) per draft length `n` (index), `None` until measured.
    pass_ms: Vec<Option<f64>>,
}

impl Default for DraftLength {
    /// [`DraftLengthConfig::default`].
    fn default() -> Self {
        DraftLength {
            config: DraftLengthConfig::default(),
            alpha: HashMap::new(),
            pass_ms: Vec::new(),
        }
    }
}

/// Expected tokens one verification pass yields with `n` drafted tokens of per-token
/// acceptance `alpha` (clamped to `[0, 1]`): `Σ_{i=0..=n} αⁱ = (1 − αⁿ⁺¹)/(1 − α)`, `n + 1`
/// at `α = 1`. Prefix acceptance (Leviathan et al. 2023, eq. 1).
pub fn expected_tokens(alpha: f64, n: usize) -> f64 {
    let alpha = if alpha.is_nan() {
        0.0
    } else {
        alpha.clamp(0.0, 1.0)
    };
    let mut term = 1.0;
    let mut sum = 0.0;
    for _ in 0..=n {
        sum += term;
        term *= alpha;
    }
    sum
}

// === impl DraftLength ===

impl DraftLength {
    /// A controller with `config`.
    ///
    /// Errors: [`SpecError::InvalidConfig`] when `prior_alpha ∉ [0, 1]`, a smoothing weight
    /// `∉ (0, 1]` or `prior_slope < 0` (or any is NaN).
    pub fn new(config: DraftLengthConfig) -> Result<Self, SpecError> {
        let check = |field, value: f64, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(SpecError::InvalidConfig {
                    field,
                    value,
                    expected,
                })
            }
        };
        let c = config;
        check(
            "prior_alpha",
            c.prior_alpha,
            (0.0..=1.0).contains(&c.prior_alpha),
            "[0, 1]",
        )?;
        check(
            "alpha_smoothing",
            c.alpha_smoothing,
            c.alpha_smoothing > 0.0 && c.alpha_smoothing <= 1.0,
            "(0, 1]",
        )?;
        check(
            "latency_smoothing",
            c.latency_smoothing,
            c.latency_smoothing > 0.0 && c.latency_smoothing <= 1.0,
            "(0, 1]",
        )?;
        check(
            "prior_slope",
            c.prior_slope,
            c.prior_slope >= 0.0 && c.prior_slope.is_finite(),
            ">= 0",
        )?;
        Ok(DraftLength {
            config,
            alpha: HashMap::new(),
            pass_ms: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &DraftLengthConfig {
        &self.config
    }

    /// Current per-token acceptance estimate for drafts of `kind` in `bucket`
    /// (`prior_alpha` before any observation).
    pub fn alpha(&self, kind: DrafterKind, bucket: usize) -> f64 {
        self.alpha
            .get(&(kind, bucket))
            .copied()
            .unwrap_or(self.config.prior_alpha)
    }

    /// Estimated verification-pass latency in ms with `n` drafted tokens (`n = 0`: a plain
    /// decode pass): the measured EMA, else `t(0)·(1 + prior_slope·n)` with `t(0)` measured or
    /// derived from the shortest measured length, else (nothing measured) 1.0 ms at `n = 0`
    /// (the choice does not depend on the unit then).
    pub fn pass_ms(&self, n: usize) -> f64 {
        if let Some(Some(ms)) = self.pass_ms.get(n) {
            return *ms;
        }
        let slope = self.config.prior_slope;
        let t0 = self
            .pass_ms
            .iter()
            .enumerate()
            .find_map(|(m, ms)| ms.map(|ms| ms / (1.0 + slope * m as f64)))
            .unwrap_or(1.0);
        t0 * (1.0 + slope * n as f64)
    }

    /// The draft length in `0..=n_max` maximising expected tokens per ms,
    /// `expected_tokens(α, n) / (pass_ms(n) + n·draft_ms_per_token)` with
    /// `α = alpha(kind, bucket)` and the drafter's cost per drafted token (ms, 0 for drafters
    /// that run no model; negative or non-finite counts as 0); the shorter length on ties, so
    /// 0 when no draft pays.
    pub fn choose(&self, kind: DrafterKind, bucket: usize, n_max: usize, draft_ms_per_token: f64) -> usize {
        let alpha = self.alpha(kind, bucket);
        let c = if draft_ms_per_token.is_finite() { draft_ms_per_token.max(0.0) } else { 0.0 };
        let mut best = (0, expected_tokens(alpha, 0) / self.pass_ms(0));
        for n in 1..=n_max {
            let rate = expected_tokens(alpha, n) / (self.pass_ms(n) + n as f64 * c);
            if rate > best.1 {
                best = (n, rate);
            }
        }
        best.0
    }

    /// Update `α` for (`kind`, `bucket`) after a verification pass that checked `proposed`
    /// drafted tokens and accepted the first `accepted` of them (clamped to `proposed`). This
    /// is `accepted` successes plus one failure when `accepted < proposed`; the `m` outcomes
    /// enter the EMA together at their mean: `α ← (1−w)ᵐ·α + (1 − (1−w)ᵐ)·successes/m`,
    /// `w = alpha_smoothing` (the censored-geometric estimate successes/trials). No-op when
    /// `proposed == 0`.
    pub fn record_verify(
        &mut self,
        kind: DrafterKind,
        bucket: usize,
        proposed: usize,
        accepted: usize,
    ) {
        if proposed == 0 {
            return;
        }
        let accepted = accepted.min(proposed);
        let trials = accepted + usize::from(accepted < proposed);
        let mean = accepted as f64 / trials as f64;
        let keep = (1.0 - self.config.alpha_smoothing).powi(trials.min(i32::MAX as usize) as i32);
        let prior = self.config.prior_alpha;
        let alpha = self.alpha.entry((kind, bucket)).or_insert(prior);
        *alpha = keep * *alpha + (1.0 - keep) * mean;
    }

    /// Record a measured verification pass of `n` drafted tokens that took `ms` milliseconds.
    /// The first measurement of a length replaces the prior; later ones enter an EMA with
    /// weight `latency_smoothing`. Non-finite or negative `ms` is ignored.
    pub fn record_pass(&mut self, n: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        if self.pass_ms.len() <= n {
            self.pass_ms.resize(n + 1, None);
        }
        let w = self.config.latency_smoothing;
        let slot = &mut self.pass_ms[n];
        *slot = Some(match *slot {
            Some(old) => (1.0 - w) * old + w * ms,
            None => ms,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::test_rng::SplitMix64;

    const K: DrafterKind = DrafterKind::PromptLookup;

    /// A controller whose passes of `0..=n_max` drafts were measured at 20 ms plus 10 % per
    /// drafted token.
    fn with_passes_up_to(n_max: usize) -> DraftLength {
        let mut ctl = DraftLength::default();
        for n in 0..=n_max {
            ctl.record_pass(n, 20.0 * (1.0 + 0.1 * n as f64));
        }
        ctl
    }

    #[test]
    fn expected_tokens_matches_closed_form() {
        for &alpha in &[0.0, 0.3, 0.6, 0.9, 0.999] {
            for n in 0..8 {
                let closed = (1.0 - f64::powi(alpha, n as i32 + 1)) / (1.0 - alpha);
                assert!(
                    (expected_tokens(alpha, n) - closed).abs() < 1e-9,
                    "alpha {alpha} n {n}"
                );
            }
        }
        assert_eq!(expected_tokens(1.0, 4), 5.0);
        assert_eq!(expected_tokens(0.0, 4), 1.0);
    }

    /// Simulate prefix acceptance with per-token probability `p` and `n` tokens per draft.
    fn simulate(
        ctl: &mut DraftLength,
        rng: &mut SplitMix64,
        bucket: usize,
        p: f64,
        n: usize,
        rounds: usize,
    ) {
        for _ in 0..rounds {
            let accepted = (0..n).take_while(|_| rng.unit() < p).count();
            ctl.record_verify(K, bucket, n, accepted);
        }
    }

    #[test]
    fn alpha_converges_toward_the_observed_rate() {
        let mut rng = SplitMix64(0xa1fa);
        let mut ctl = DraftLength::default();
        for &p in &[0.9, 0.2, 0.75] {
            simulate(&mut ctl, &mut rng, 1, p, 3, 3000);
            // Tolerance: the EMA over ~20 observations has a standard deviation of ~0.06 at
            // p = 0.5; average the estimate over further rounds to take the noise out.
            let mut sum = 0.0;
            for _ in 0..400 {
                simulate(&mut ctl, &mut rng, 1, p, 3, 1);
                sum += ctl.alpha(K, 1);
            }
            let mean = sum / 400.0;
            assert!((mean - p).abs() < 0.05, "p {p}: estimate {mean}");
        }
        // Other buckets and kinds keep the prior.
        assert_eq!(ctl.alpha(K, 0), 0.6);
        assert_eq!(ctl.alpha(DrafterKind::Experience, 1), 0.6);
    }

    #[test]
    fn one_round_moves_alpha_toward_its_outcome() {
        let mut ctl = DraftLength::default();
        ctl.record_verify(K, 0, 4, 4);
        assert!(ctl.alpha(K, 0) > 0.6);
        let mut ctl = DraftLength::default();
        ctl.record_verify(K, 0, 4, 0);
        assert!(ctl.alpha(K, 0) < 0.6);
        let before = ctl.alpha(K, 0);
        ctl.record_verify(K, 0, 0, 0);
        ctl.record_verify(K, 0, 2, 9); // clamped to 2 of 2
        assert!(ctl.alpha(K, 0) > before);
    }

    #[test]
    fn high_acceptance_chooses_longer_drafts() {
        let mut ctl = with_passes_up_to(6);
        for _ in 0..500 {
            ctl.record_verify(K, 3, 6, 6);
            ctl.record_verify(K, 0, 6, 1);
        }
        let high = ctl.choose(K, 3, 6, 0.0);
        let low = ctl.choose(K, 0, 6, 0.0);
        assert!(high > low, "high {high} low {low}");
        assert_eq!(
            high, 6,
            "α ≈ 1 with a 10% cost per token: the longest draft pays"
        );
        assert!(ctl.choose(K, 3, 2, 0.0) == 2, "n_max caps the choice");
    }

    #[test]
    fn no_draft_when_alpha_is_near_zero_and_passes_are_costly() {
        let mut ctl = DraftLength::default();
        for _ in 0..500 {
            ctl.record_verify(K, 0, 3, 0);
        }
        assert!(ctl.alpha(K, 0) < 0.01);
        for n in 0..=3 {
            ctl.record_pass(n, 30.0 + 6.0 * n as f64);
        }
        assert_eq!(ctl.choose(K, 0, 3, 0.0), 0);
    }

    #[test]
    fn the_drafting_cost_shortens_or_stops_drafts() {
        // α ≈ 0.25 on passes costing 10 % more per verified token: free drafts pay (n ≥ 1);
        // drafts costing a fifth of a decode pass each (an MTP step on the 0.8B shape) do
        // not, and a cost between shortens them.
        let mut ctl = with_passes_up_to(4);
        for _ in 0..400 {
            ctl.record_verify(K, 0, 3, 0);
            ctl.record_verify(K, 0, 3, 1);
            ctl.record_verify(K, 0, 3, 0);
        }
        let alpha = ctl.alpha(K, 0);
        assert!((0.2..0.3).contains(&alpha), "α {alpha}");
        let free = ctl.choose(K, 0, 4, 0.0);
        assert!(free >= 1, "free drafts at α {alpha}: {free}");
        assert_eq!(ctl.choose(K, 0, 4, 4.0), 0, "a draft token at a fifth of a decode pass");
        assert!(ctl.choose(K, 0, 4, 1.0) <= free);
        assert_eq!(ctl.choose(K, 0, 4, f64::NAN), free, "a non-finite cost counts as none");
    }

    #[test]
    fn prior_is_used_before_measurements() {
        let ctl = DraftLength::default();
        // Nothing measured: t(n) ∝ 1 + 0.08 n and α = 0.6 → E(n)/t(n) peaks at n = 3
        // (1.755 tokens per unit, vs 1.747 at n = 4).
        assert_eq!(ctl.alpha(K, 2), 0.6);
        assert!((ctl.pass_ms(5) / ctl.pass_ms(0) - 1.4).abs() < 1e-12);
        let best = (0..=8)
            .max_by(|&a, &b| {
                let ra = expected_tokens(0.6, a) / (1.0 + 0.08 * a as f64);
                let rb = expected_tokens(0.6, b) / (1.0 + 0.08 * b as f64);
                ra.total_cmp(&rb)
            })
            .unwrap_or(0);
        assert_eq!(ctl.choose(K, 2, 8, 0.0), best);
        assert_eq!(best, 3);

        // Only t(0) measured: the others follow the prior from it.
        let mut ctl = DraftLength::default();
        ctl.record_pass(0, 50.0);
        assert!((ctl.pass_ms(3) - 50.0 * 1.24).abs() < 1e-9);
        // Only t(2) measured: t(0) is derived from it, t(2) itself is the measurement.
        let mut ctl = DraftLength::default();
        ctl.record_pass(2, 58.0);
        assert!((ctl.pass_ms(0) - 50.0).abs() < 1e-9);
        assert!((ctl.pass_ms(2) - 58.0).abs() < 1e-9);
        // A measured expensive pass overrides the prior and changes the choice.
        let mut ctl = DraftLength::default();
        ctl.record_pass(0, 10.0);
        for n in 1..=8 {
            ctl.record_pass(n, 10.0 * 2.0 * n as f64);
        }
        assert_eq!(ctl.choose(K, 0, 8, 0.0), 0);
    }

    #[test]
    fn latency_ema_moves_toward_new_measurements() {
        let mut ctl = DraftLength::default();
        ctl.record_pass(1, 10.0);
        ctl.record_pass(1, 20.0);
        assert!((ctl.pass_ms(1) - 12.0).abs() < 1e-9);
        ctl.record_pass(1, f64::NAN);
        ctl.record_pass(1, -1.0);
        assert!((ctl.pass_ms(1) - 12.0).abs() < 1e-9);
    }

    #[test]
    fn invalid_config_is_rejected() {
        let bad = DraftLengthConfig {
            alpha_smoothing: 0.0,
            ..Default::default()
        };
        assert!(matches!(
            DraftLength::new(bad),
            Err(SpecError::InvalidConfig {
                field: "alpha_smoothing",
                ..
            })
        ));
        let bad = DraftLengthConfig {
            prior_alpha: f64::NAN,
            ..Default::default()
        };
        assert!(DraftLength::new(bad).is_err());
        assert!(DraftLength::new(DraftLengthConfig::default()).is_ok());
    }
}
