//! Speculative decoding (DESIGN.md "Within-request"; Tandem §3.3, §4.3; PastForward §3.2),
//! one request round by round, in llama.cpp's lifecycle (`common/speculative.h`):
//! **begin → draft → verify → accept → rollback**.
//!
//! - [`drafter`]: the [`Drafter`] trait every drafter implements — [`prompt_lookup`] (n-gram
//!   copy from prompt and output; actions copy element text and indices from the screen),
//!   [`experience`] (PastForward's decoding experience memory: earlier outputs indexed per
//!   position by token and final hidden state), [`mtp`] (the model's MTP block over the full
//!   vocabulary, or over a trimmed draft vocabulary), all asked the same way.
//! - [`driver`]: the [`Speculator`] — which drafters are asked, which proposal a round
//!   verifies, the experience memory's lifetime (it outlives requests and model unloads, and is
//!   saved to `--experience-file`).
//! - [`verifier`]: greedy acceptance of a round ([`Round`]: a draft is accepted while it equals
//!   the token greedy decoding chooses) and the per-request draft figures ([`DraftTally`]).
//! - [`policy`]: the adaptive draft length (online acceptance and pass-latency estimates).
//! - [`error`]: [`SpecError`].
//!
//! The verification pass itself is the model's (`Model::verify`), the rollback the state's
//! (`state::rollback`), and the engine's decode stage (`engine/step/decode.rs`) runs the
//! rounds; the output is the output of plain greedy decoding.

pub mod driver;
pub mod drafter;
pub mod error;
pub mod experience;
pub mod mtp;
pub mod policy;
pub mod prompt_lookup;
pub mod verifier;

pub use drafter::{DraftRequest, Drafter, ModelAccess};
pub use driver::{pass_tokens, SpecSettings, Speculator};
pub use error::SpecError;
pub use experience::{similarity_bucket, ExperienceMemory, N_BUCKETS};
pub use mtp::MtpDrafter;
pub use policy::{expected_tokens, DraftLength, DraftLengthConfig, DraftLengthMode};
pub use prompt_lookup::PromptLookup;
pub use verifier::{DraftTally, Round};

/// Which drafter proposed a draft (also the metric label, see [`DrafterKind::name`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum DrafterKind {
    /// [`PromptLookup`]: n-gram copy from the prompt and the output so far.
    PromptLookup,
    /// [`ExperienceMemory`]: continuation of a similar earlier output (PastForward §3.2).
    Experience,
    /// The model's multi-token-prediction block over the full vocabulary ([`MtpDrafter`]).
    Mtp,
    /// The MTP block with the trimmed draft head (N rows of the vocabulary, mapped back to
    /// original ids; [`MtpDrafter`]).
    MtpTrimmed,
}

impl DrafterKind {
    /// Every kind, in declaration order.
    pub const ALL: [DrafterKind; 4] = [
        DrafterKind::PromptLookup,
        DrafterKind::Experience,
        DrafterKind::Mtp,
        DrafterKind::MtpTrimmed,
    ];

    /// The kebab-case label used on the command line, in serde and as the metric label:
    /// `"prompt-lookup"`, `"experience"`, `"mtp"` or `"mtp-trimmed"`.
    pub fn name(self) -> &'static str {
        match self {
            DrafterKind::PromptLookup => "prompt-lookup",
            DrafterKind::Experience => "experience",
            DrafterKind::Mtp => "mtp",
            DrafterKind::MtpTrimmed => "mtp-trimmed",
        }
    }

    /// Whether this drafter runs the model's MTP block (needs an [`crate::state::mtp::MtpCache`]
    /// per slot and the hidden state of every position).
    pub fn is_mtp(self) -> bool {
        matches!(self, DrafterKind::Mtp | DrafterKind::MtpTrimmed)
    }
}

/// What a drafter sees when asked for a draft.
#[derive(Clone, Copy, Debug)]
pub struct DraftContext<'a> {
    /// Prompt tokens of the request.
    pub prompt: &'a [u32],
    /// Output tokens so far (the newest one is the token the target just chose; it has not
    /// been fed to the model yet).
    pub output: &'a [u32],
    /// Final hidden state (after the output norm) `[n_embd]` of the last token that WAS fed:
    /// `output[output.len()-2]`, or the last prompt token when `output.len() == 1`.
    pub hidden: &'a [f32],
}

/// A proposal: `tokens` to follow `ctx.output`, and the acceptance bucket it falls in
/// (experience: a cosine-similarity bucket `0..N_BUCKETS`, see [`similarity_bucket`]; other
/// drafters 0). The bucket keys the acceptance estimate in [`DraftLength`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    /// The drafter that proposed it.
    pub kind: DrafterKind,
    /// Drafted tokens, in order, to follow the newest output token; never empty.
    pub tokens: Vec<u32>,
    /// Acceptance bucket, `< N_BUCKETS`.
    pub bucket: usize,
}

/// A seeded SplitMix64 generator for randomized tests (no extra dependency).
#[cfg(test)]
pub(crate) mod test_rng {
    /// SplitMix64 (Steele, Lea, Flood 2014).
    pub(crate) struct SplitMix64(pub(crate) u64);

    impl SplitMix64 {
        pub(crate) fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in `0..n` (`n > 0`).
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }

        /// Uniform in `[0, 1)`.
        pub(crate) fn unit(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Uniform in `[-1, 1)`.
        pub(crate) fn signed(&mut self) -> f32 {
            (self.unit() * 2.0 - 1.0) as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_match_clap_and_serde_labels() {
        for kind in DrafterKind::ALL {
            let clap_name = kind.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(clap_name.as_deref(), Some(kind.name()));
            let json = serde_json::to_string(&kind).expect("serialize");
            assert_eq!(json, format!("\"{}\"", kind.name()));
            let back: DrafterKind = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, kind);
        }
    }
}
