//! Verification of a round (Tandem §3.3): the newest output token and the draft are fed in
//! one pass (`Model::verify`, logits of every position); greedy decoding then chooses each
//! next token from the previous position's logits, and a draft token is **accepted** while
//! it equals that choice ([`Round::accept`]). The first mismatch closes the round: the
//! engine rolls the sequence back to the last accepted position. Output = plain greedy
//! decoding, token for token.

use std::collections::BTreeMap;

use tandem_proto::step::v1 as pb;

use super::Draft;

/// Draft figures of one request, per drafter (the `drafts` of [`pb::FinalStats`]).
#[derive(Default)]
pub struct DraftTally(BTreeMap<&'static str, pb::DraftStats>);

impl DraftTally {
    /// A round of `draft` ended with `accepted` tokens accepted.
    pub fn add(&mut self, draft: &Draft, accepted: usize) {
        let name = draft.kind.name();
        let s = self.0.entry(name).or_insert_with(|| pb::DraftStats {
            drafter: name.into(),
            ..Default::default()
        });
        s.proposed += draft.tokens.len() as u32;
        s.accepted += accepted as u32;
        s.rounds += 1;
    }

    pub fn into_stats(self) -> Vec<pb::DraftStats> {
        self.0.into_values().collect()
    }
}

/// An open verification round: the draft fed after the newest output token, and how many of
/// its tokens greedy decoding has accepted so far.
pub struct Round {
    pub draft: Draft,
    pub matched: usize,
}

impl Round {
    /// Whether `id`, the token greedy decoding just chose, is the next draft token (then it
    /// was already fed by the verification pass and is counted).
    pub fn accept(&mut self, id: u32) -> bool {
        if self.draft.tokens.get(self.matched) == Some(&id) {
            self.matched += 1;
            true
        } else {
            false
        }
    }
}
