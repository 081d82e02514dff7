//! The per-slot state of MTP drafting (Qwen3.5's multi-token-prediction block; llama.cpp
//! `graph_mtp` in `src/models/qwen35.cpp`, vLLM `qwen3_next_mtp.py`): the KV cache of the
//! MTP block's one attention layer, and the target's hidden states that still await their
//! MTP entry.
//!
//! The MTP entry of position `i` is computed from the target's output-normed hidden state
//! `h_i` and the token `t_{i+1}` that follows it, so it can only be written once `t_{i+1}`
//! is known: after a pass over positions `a..b` the entries `a−1..b−1` become computable,
//! and `h_{b−1}` waits for the next token. [`MtpCache`] keeps those waiting rows
//! ([`MtpCache::pending`]) beside the entries.
//!
//! Entries carry their sequence position: the cache index is not the position, because a
//! slot restored from a checkpoint or the prompt cache lacks the hidden states of some
//! earlier positions, and their entries are then simply missing (the MTP attention sees the
//! others, at their true RoPE positions). Drafting quality degrades a little there; the
//! output never does (drafts are verified).

use super::kv::KvCache;

/// MTP attention KV entries (one layer) with their positions, and the target hidden rows
/// `[p, n_embd]` of positions `hidden_from .. hidden_from + p` that have no entry yet.
#[derive(Clone)]
pub struct MtpCache {
    kv: KvCache,
    /// Position of each KV entry, strictly increasing.
    pos: Vec<usize>,
    n_embd: usize,
    hidden: Vec<f32>,
    hidden_from: usize,
}

impl MtpCache {
    /// An empty cache for `n_ctx` entries of `n_kv_head` heads of `head_dim` (f16, the
    /// layout of [`KvCache`] with one layer), for hidden states of `n_embd`.
    pub fn new(n_kv_head: usize, head_dim: usize, n_ctx: usize, n_embd: usize) -> Self {
        Self {
            kv: KvCache::new(1, n_kv_head, head_dim, n_ctx),
            pos: Vec::with_capacity(n_ctx),
            n_embd,
            hidden: Vec::new(),
            hidden_from: 0,
        }
    }

    /// The entries' KV cache (layer 0; index `j` holds position [`Self::positions`]`[j]`).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Mutable KV cache for the MTP pass, which writes entries at indices
    /// `n_entries()..` and then calls [`Self::commit_entries`].
    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// Positions of the entries, in cache order.
    pub fn positions(&self) -> &[usize] {
        &self.pos
    }

    /// Number of entries.
    pub fn n_entries(&self) -> usize {
        self.pos.len()
    }

    /// Capacity in entries.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Hidden size of the pending rows.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// Whether `n` entries for positions `pos0..pos0 + n` can be appended: room in the cache
    /// and `pos0` after the last entry's position.
    pub fn can_append(&self, pos0: usize, n: usize) -> bool {
        self.pos.len() + n <= self.kv.n_ctx() && self.pos.last().is_none_or(|&p| p < pos0)
    }

    /// Records `n` entries for positions `pos0..pos0 + n` that the MTP pass wrote at cache
    /// indices `n_entries()..n_entries() + n` (check [`Self::can_append`] first).
    pub fn commit_entries(&mut self, pos0: usize, n: usize) {
        debug_assert!(self.can_append(pos0, n));
        self.pos.extend(pos0..pos0 + n);
        self.kv.set_len(self.pos.len());
    }

    /// Drops the entries of positions `>= pos` (draft-step entries after a round).
    pub fn drop_entries_from(&mut self, pos: usize) {
        let keep = self.pos.partition_point(|&p| p < pos);
        self.pos.truncate(keep);
        self.kv.truncate(keep);
    }

    /// `(first position, rows [p, n_embd])` of the target hidden states without an entry.
    pub fn pending(&self) -> (usize, &[f32]) {
        (self.hidden_from, &self.hidden)
    }

    /// One past the last pending position (`hidden_from` when none is pending).
    pub fn pending_end(&self) -> usize {
        self.hidden_from + self.hidden.len() / self.n_embd.max(1)
    }

    /// The target just computed positions `pos0..` with output-normed hidden states `rows`
    /// `[n, n_embd]`: they join the pending rows. Rows and entries of positions `>= pos0`
    /// from before (a recomputation) are dropped first; a gap after the pending rows (hidden
    /// states that were never handed over) drops the pending rows, whose entries can then
    /// never be completed in order.
    pub fn push_hidden(&mut self, pos0: usize, rows: &[f32]) {
        self.drop_entries_from(pos0);
        if pos0 < self.hidden_from || pos0 > self.pending_end() {
            self.hidden.clear();
            self.hidden_from = pos0;
        } else {
            self.hidden
                .truncate((pos0 - self.hidden_from) * self.n_embd);
        }
        self.hidden.extend_from_slice(rows);
    }

    /// The first `n` pending rows got their entries.
    pub fn consume_pending(&mut self, n: usize) {
        let n = n.min(self.hidden.len() / self.n_embd.max(1));
        self.hidden.drain(..n * self.n_embd);
        self.hidden_from += n;
    }

    /// The target sequence was cut back to `len` positions: entries that used a token at
    /// position `>= len` (entry `i` uses `t_{i+1}`, so `i >= len − 1`) and pending rows of
    /// positions `>= len` are dropped.
    pub fn truncate(&mut self, len: usize) {
        self.drop_entries_from(len.saturating_sub(1));
        if len <= self.hidden_from {
            self.hidden.clear();
            self.hidden_from = len;
        } else {
            self.hidden
                .truncate(((len - self.hidden_from) * self.n_embd).min(self.hidden.len()));
        }
    }

    /// Empty: no entries, nothing pending.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Bytes allocated for the entries (the pending rows are not counted).
    pub fn bytes_allocated(&self) -> usize {
        self.kv.bytes_allocated()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(from: usize, n: usize) -> Vec<f32> {
        (from..from + n)
            .flat_map(|p| [p as f32, -(p as f32)])
            .collect()
    }

    #[test]
    fn pending_rows_follow_pushes_consumption_and_truncation() {
        let mut c = MtpCache::new(1, 2, 16, 2);
        c.push_hidden(0, &rows(0, 4));
        assert_eq!(c.pending(), (0, &rows(0, 4)[..]));
        c.commit_entries(0, 3);
        c.consume_pending(3);
        assert_eq!(c.pending(), (3, &rows(3, 1)[..]));
        // Contiguous push appends.
        c.push_hidden(4, &rows(4, 2));
        assert_eq!(c.pending(), (3, &rows(3, 3)[..]));
        // Rollback to 5 positions: entry 3 would use t_4 (kept), row 5 goes.
        c.truncate(5);
        assert_eq!(c.pending(), (3, &rows(3, 2)[..]));
        assert_eq!(c.positions(), &[0, 1, 2]);
        // Cutting to 2 positions: entry 1 used t_2 and goes, every pending row goes.
        c.truncate(2);
        assert_eq!(c.positions(), &[0]);
        assert_eq!(c.pending(), (2, &[][..]));
        assert_eq!(c.kv().len(), 1);
    }

    #[test]
    fn a_gap_drops_pending_rows_and_a_recomputation_replaces_them() {
        let mut c = MtpCache::new(1, 2, 16, 2);
        c.push_hidden(0, &rows(0, 3));
        c.push_hidden(5, &rows(5, 2));
        assert_eq!(
            c.pending(),
            (5, &rows(5, 2)[..]),
            "positions 3, 4 were never seen"
        );
        c.commit_entries(5, 1);
        c.consume_pending(1);
        // Positions 6.. recomputed: the old row 6 is replaced, entries >= 6 dropped.
        c.push_hidden(6, &rows(6, 1));
        assert_eq!(c.pending(), (6, &rows(6, 1)[..]));
        assert_eq!(c.positions(), &[5]);
        assert!(c.can_append(6, 3) && !c.can_append(5, 1));
        c.commit_entries(6, 3);
        c.drop_entries_from(7);
        assert_eq!(c.positions(), &[5, 6]);
        c.reset();
        assert_eq!((c.n_entries(), c.pending_end()), (0, 0));
    }
}
