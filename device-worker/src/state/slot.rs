//! A slot: one sequence's cached tokens and model state (KV cache, and the recurrent state of
//! hybrid models), bound to a session (episode).
//!
//! Names follow llama.cpp's server (`server_slot`): a request is routed to the slot of its
//! session, else to a free slot, else to the least recently used one ([`choose_slot`]).

use super::mtp::MtpCache;
use super::sequence::SequenceState;
use super::planner::SlotCache;

pub struct Slot {
    pub id: u32,
    /// Session (episode) the slot is bound to while it is live (until a new session takes the
    /// slot, [`choose_slot`]); empty: free (never used, or last used by an unbound request).
    pub session_id: String,
    /// Tokens the model state has processed (`tokens.len() == seq.len()`).
    pub tokens: Vec<u32>,
    pub seq: SequenceState,
    /// Request counter value when last used (for LRU choice).
    pub last_used: u64,
    /// Checkpoints, prompt-cache entries and the planner's view of them.
    pub cache: SlotCache,
    /// The MTP block's KV cache and pending hidden states (only with an MTP drafter on); cut
    /// back with the sequence ([`Slot::truncate`], rollbacks, resets).
    pub mtp: Option<MtpCache>,
}

impl Slot {
    pub fn new(id: u32, seq: SequenceState) -> Self {
        Self {
            id,
            session_id: String::new(),
            tokens: Vec::new(),
            seq,
            last_used: 0,
            cache: SlotCache::default(),
            mtp: None,
        }
    }

    /// Marks the slot used now (`next_use`: one more than the slots' largest `last_used`) by
    /// `session_id`, which it is bound to from now on.
    pub fn touch(&mut self, session_id: &str, next_use: u64) {
        self.last_used = next_use;
        if self.session_id != session_id {
            self.session_id = session_id.to_string();
        }
    }

    /// Empties a slot whose state can no longer be trusted (a failed batch or rollback):
    /// sequence, tokens, checkpoints and MTP entries.
    pub fn reset(&mut self) {
        self.seq.reset();
        self.tokens.clear();
        self.cache.clear();
        if let Some(m) = self.mtp.as_mut() {
            m.reset();
        }
    }

    /// Keeps the first `n` cached tokens (prefix reuse, cancellation) where the model state
    /// allows it ([`SequenceState::truncate`]: a hybrid model's recurrent state is valid only at
    /// the full cached length, so any shorter `n` empties the slot). Returns the tokens kept.
    pub fn truncate(&mut self, n: usize) -> usize {
        let kept = self.seq.truncate(n);
        self.tokens.truncate(kept);
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(kept);
        }
        kept
    }
}

impl Slot {
    /// Cached tokens a request for `prompt` could keep: the common prefix, except that a
    /// hybrid model's slot resumes only where its whole cached sequence is a prefix of
    /// `prompt` (its recurrent state cannot be rewound) or at its newest checkpoint within
    /// the common prefix, else 0.
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let n = common_prefix(&self.tokens, prompt);
        if self.seq.can_truncate_to(n) {
            n
        } else {
            self.cache
                .meta
                .slot
                .checkpoint_at_or_before(n)
                .map_or(0, |c| c.pos)
        }
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Where a request runs ([`choose_slot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotChoice {
    /// Index of the slot.
    pub slot: usize,
    /// The session whose live slot this request takes (the least recently used one, every
    /// slot being bound), if any: its slot content moves to the prompt cache.
    pub evicted: Option<String>,
}

/// Picks the slot for `session_id` (an episode keeps its slot while it is live):
/// 1. the slot already bound to the session;
/// 2. else a free slot (bound to no session), the one sharing the longest reusable prefix with
///    `prompt` ([`Slot::reusable_prefix`]), ties: least recently used;
/// 3. else the least recently used slot, whose session is then evicted
///    ([`SlotChoice::evicted`]).
///
/// Unbound requests (empty session) follow 2 and 3 as well. A shared prefix held by another
/// live slot (the rules) is not a reason to take that slot: it is found through the prompt
/// cache (`engine/step/restore.rs`).
pub fn choose_slot(slots: &[Slot], session_id: &str, prompt: &[u32]) -> SlotChoice {
    if !session_id.is_empty() {
        if let Some(i) = slots.iter().position(|s| s.session_id == session_id) {
            return SlotChoice { slot: i, evicted: None };
        }
    }
    let free = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.session_id.is_empty())
        .max_by_key(|(_, s)| (s.reusable_prefix(prompt), std::cmp::Reverse(s.last_used)))
        .map(|(i, _)| i);
    if let Some(i) = free {
        return SlotChoice { slot: i, evicted: None };
    }
    let lru = slots
        .iter()
        .enumerate()
        .min_by_key(|(_, s)| s.last_used)
        .map_or(0, |(i, _)| i);
    SlotChoice {
        slot: lru,
        evicted: slots.get(lru).map(|s| s.session_id.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::kv::KvCache;

    fn slot(id: u32, session: &str, tokens: &[u32], last_used: u64) -> Slot {
        let mut s = Slot::new(id, SequenceState::attention_only(KvCache::new(1, 1, 1, 16)));
        s.session_id = session.into();
        s.tokens = tokens.to_vec();
        s.last_used = last_used;
        s
    }

    #[test]
    fn session_affinity_then_a_free_slot_then_lru() {
        let slots = vec![
            slot(0, "a", &[1, 2, 3], 5),
            slot(1, "b", &[1, 9], 3),
            slot(2, "", &[], 1),
            slot(3, "", &[1, 2], 0),
        ];
        let pick = |s: &[Slot], session: &str, p: &[u32]| choose_slot(s, session, p);
        assert_eq!(pick(&slots, "b", &[1, 2, 3]), SlotChoice { slot: 1, evicted: None });
        // A new session never takes a live slot while one is free, however long the prefix
        // the live one shares; among free slots the longest reusable prefix wins.
        assert_eq!(pick(&slots, "new", &[1, 2, 3]).slot, 3);
        assert_eq!(pick(&slots, "new", &[8]).slot, 3, "no prefix anywhere: least recently used free slot");
        assert_eq!(pick(&slots, "", &[1, 2, 3]).slot, 3);
        // Every slot bound: the least recently used one, its session evicted.
        let bound = vec![slot(0, "a", &[1, 2, 3], 5), slot(1, "b", &[1, 9], 3)];
        assert_eq!(pick(&bound, "new", &[1, 2, 3]), SlotChoice { slot: 1, evicted: Some("b".into()) });
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2]), 2);
    }

    #[test]
    fn hybrid_slots_are_reusable_only_when_their_sequence_is_a_prefix() {
        use crate::state::recurrent::RecurrentState;
        let mut slots = Vec::new();
        for (id, tokens, last_used) in [
            (0u32, vec![1u32, 2, 3, 4], 5u64),
            (1, vec![1, 2], 3),
            (2, vec![], 1),
        ] {
            let mut seq = SequenceState {
                kv: KvCache::new(1, 1, 1, 16),
                recurrent: Some(RecurrentState::new(1, 2, 2)),
            };
            seq.kv.set_len(tokens.len());
            let mut s = Slot::new(id, seq);
            s.tokens = tokens;
            s.last_used = last_used;
            slots.push(s);
        }
        // Slot 0 shares 3 tokens but would have to rewind; slot 1 is a full prefix.
        assert_eq!(slots[0].reusable_prefix(&[1, 2, 3, 9]), 0);
        assert_eq!(slots[1].reusable_prefix(&[1, 2, 3, 9]), 2);
        assert_eq!(choose_slot(&slots, "new", &[1, 2, 3, 9]).slot, 1);
        // Nothing reusable: least recently used.
        assert_eq!(choose_slot(&slots, "new", &[7]).slot, 2);
        // Truncating a hybrid slot below its length empties it.
        assert_eq!(slots[0].truncate(3), 0);
        assert!(slots[0].tokens.is_empty());
    }
}
