//! A slot: one sequence's cached tokens and KV cache, bound to a session (episode).
//!
//! Names follow llama.cpp's server (`server_slot`): a request is routed to the slot of its
//! session, or to the least recently used one.

use super::kv::KvCache;

pub struct Slot {
    pub id: u32,
    /// Session (episode) the slot last served; empty when never used.
    pub session_id: String,
    /// Tokens whose keys and values are in `kv` (`tokens.len() == kv.len()`).
    pub tokens: Vec<u32>,
    pub kv: KvCache,
    /// Request counter value when last used (for LRU choice).
    pub last_used: u64,
}

impl Slot {
    pub fn new(id: u32, kv: KvCache) -> Self {
        Self { id, session_id: String::new(), tokens: Vec::new(), kv, last_used: 0 }
    }

    /// Keeps the first `n` cached tokens (prefix reuse, cancellation).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.kv.truncate(n);
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Picks the slot for `session_id`: the slot already bound to it; else the slot whose cached
/// tokens share the longest prefix with `prompt` (ties: least recently used); unbound
/// requests (empty session) take the least recently used slot.
pub fn choose_slot(slots: &[Slot], session_id: &str, prompt: &[u32]) -> usize {
    if !session_id.is_empty() {
        if let Some(i) = slots.iter().position(|s| s.session_id == session_id) {
            return i;
        }
        let best = slots
            .iter()
            .enumerate()
            .max_by_key(|(_, s)| (common_prefix(&s.tokens, prompt), std::cmp::Reverse(s.last_used)))
            .map(|(i, _)| i)
            .unwrap_or(0);
        if common_prefix(&slots[best].tokens, prompt) > 0 {
            return best;
        }
    }
    slots.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: u32, session: &str, tokens: &[u32], last_used: u64) -> Slot {
        let mut s = Slot::new(id, KvCache::new(1, 1, 1, 16));
        s.session_id = session.into();
        s.tokens = tokens.to_vec();
        s.last_used = last_used;
        s
    }

    #[test]
    fn session_affinity_then_prefix_then_lru() {
        let slots = vec![slot(0, "a", &[1, 2, 3], 5), slot(1, "b", &[1, 9], 3), slot(2, "", &[], 1)];
        assert_eq!(choose_slot(&slots, "b", &[1, 2, 3]), 1);
        assert_eq!(choose_slot(&slots, "new", &[1, 2, 7]), 0);
        assert_eq!(choose_slot(&slots, "new", &[8]), 2);
        assert_eq!(choose_slot(&slots, "", &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2]), 2);
    }
}
