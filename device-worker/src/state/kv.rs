//! Attention KV cache of one slot.
//!
//! Layout: for each layer and KV head, a `[n_ctx, head_dim]` row-major block of f16 keys and
//! one of f16 values, so one head's cached span is contiguous for the attention kernel.
//! f16 storage follows llama.cpp's default cache type (`--cache-type-k/v f16`).

use half::f16;

use super::error::CheckpointError;

/// KV cache sized for `n_ctx` positions of `n_layer` layers with `n_kv_head` heads of
/// `head_dim`. Holds `len` valid positions (`0..len`).
#[derive(Clone)]
pub struct KvCache {
    n_layer: usize,
    n_kv_head: usize,
    head_dim: usize,
    n_ctx: usize,
    len: usize,
    k: Vec<f16>,
    v: Vec<f16>,
}

impl KvCache {
    /// An empty cache with `other`'s layer, head and head-dimension counts and room for
    /// `n_ctx` positions (a prompt-cache copy of a slot's first `n_ctx` positions).
    pub fn like(other: &KvCache, n_ctx: usize) -> Self {
        Self::new(other.n_layer, other.n_kv_head, other.head_dim, n_ctx)
    }

    /// Allocates `2 * n_layer * n_kv_head * n_ctx * head_dim` f16 values.
    pub fn new(n_layer: usize, n_kv_head: usize, head_dim: usize, n_ctx: usize) -> Self {
        let n = n_layer * n_kv_head * n_ctx * head_dim;
        Self {
            n_layer,
            n_kv_head,
            head_dim,
            n_ctx,
            len: 0,
            k: vec![f16::ZERO; n],
            v: vec![f16::ZERO; n],
        }
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Valid positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops positions `n..`: used for prefix reuse and rollback. `n > len` is a no-op.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Marks positions `0..n` valid after a forward pass wrote them.
    pub fn set_len(&mut self, n: usize) {
        debug_assert!(n <= self.n_ctx);
        self.len = n;
    }

    /// Bytes allocated for keys and values.
    pub fn bytes_allocated(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }

    /// Bytes of the valid positions.
    pub fn bytes_used(&self) -> usize {
        2 * 2 * self.n_layer * self.n_kv_head * self.len * self.head_dim
    }

    fn offset(&self, layer: usize, head: usize) -> usize {
        (layer * self.n_kv_head + head) * self.n_ctx * self.head_dim
    }

    /// Writes the keys and values of `n` tokens at positions `pos0..pos0+n` of `layer`.
    /// `k` and `v` are `[n, n_kv_head * head_dim]` row-major.
    pub fn write(&mut self, layer: usize, pos0: usize, n: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let row = self.n_kv_head * hd;
        for h in 0..self.n_kv_head {
            let base = self.offset(layer, h);
            for t in 0..n {
                let dst = base + (pos0 + t) * hd;
                let src = t * row + h * hd;
                for (d, s) in self.k[dst..dst + hd].iter_mut().zip(&k[src..src + hd]) {
                    *d = f16::from_f32(*s);
                }
                for (d, s) in self.v[dst..dst + hd].iter_mut().zip(&v[src..src + hd]) {
                    *d = f16::from_f32(*s);
                }
            }
        }
    }

    /// Overwrites positions `0..n` of every layer and head with those of `src` and sets the
    /// length to `n` (the KV half of moving a checkpoint to another slot; see
    /// [`crate::state::checkpoint`]). Copies `2 · n_layer · n_kv_head · n · head_dim` f16 values.
    ///
    /// Errors: [`CheckpointError::KvPrefix`] if `src` holds fewer than `n` positions, `n`
    /// exceeds this cache's `n_ctx`, or the layer/head/head-dimension counts differ.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<(), CheckpointError> {
        let fail = |reason: String| Err(CheckpointError::KvPrefix { n, reason });
        if (self.n_layer, self.n_kv_head, self.head_dim)
            != (src.n_layer, src.n_kv_head, src.head_dim)
        {
            return fail(format!(
                "source cache is [{} layers, {} heads, {} dims], destination [{}, {}, {}]",
                src.n_layer,
                src.n_kv_head,
                src.head_dim,
                self.n_layer,
                self.n_kv_head,
                self.head_dim
            ));
        }
        if n > src.len {
            return fail(format!("source holds only {} positions", src.len));
        }
        if n > self.n_ctx {
            return fail(format!(
                "destination holds at most {} positions",
                self.n_ctx
            ));
        }
        let span = n * self.head_dim;
        for layer in 0..self.n_layer {
            for head in 0..self.n_kv_head {
                let (d, s) = (self.offset(layer, head), src.offset(layer, head));
                self.k[d..d + span].copy_from_slice(&src.k[s..s + span]);
                self.v[d..d + span].copy_from_slice(&src.v[s..s + span]);
            }
        }
        self.len = n;
        Ok(())
    }

    /// Keys and values of `head` in `layer` for positions `0..n`, each `[n, head_dim]`.
    pub fn head(&self, layer: usize, head: usize, n: usize) -> (&[f16], &[f16]) {
        let base = self.offset(layer, head);
        let end = base + n * self.head_dim;
        (&self.k[base..end], &self.v[base..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_back_per_head_and_truncate() {
        let mut kv = KvCache::new(2, 2, 4, 8);
        let k: Vec<f32> = (0..2 * 8).map(|i| i as f32).collect(); // 2 tokens x (2 heads x 4)
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        kv.write(1, 3, 2, &k, &v);
        kv.set_len(5);
        let (kh, vh) = kv.head(1, 1, 5);
        assert_eq!(
            kh[3 * 4..4 * 4]
                .iter()
                .map(|x| x.to_f32())
                .collect::<Vec<_>>(),
            vec![4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(vh[4 * 4].to_f32(), -12.0);
        kv.truncate(2);
        assert_eq!(kv.len(), 2);
        assert_eq!(kv.bytes_used(), 2 * 2 * 2 * 2 * 2 * 4);
    }

    #[test]
    fn copy_prefix_copies_only_the_prefix_and_checks_shapes() {
        let mut src = KvCache::new(2, 2, 4, 8);
        let k: Vec<f32> = (0..3 * 8).map(|i| i as f32).collect(); // 3 tokens x (2 heads x 4)
        let v: Vec<f32> = k.iter().map(|x| x + 100.0).collect();
        src.write(0, 0, 3, &k, &v);
        src.write(1, 0, 3, &v, &k);
        src.set_len(3);
        let mut dst = KvCache::new(2, 2, 4, 16);
        let junk = vec![-5.0f32; 5 * 8];
        dst.write(1, 0, 5, &junk, &junk);
        dst.set_len(5);
        dst.copy_prefix_from(&src, 2).unwrap();
        assert_eq!(dst.len(), 2);
        for layer in 0..2 {
            for head in 0..2 {
                assert_eq!(dst.head(layer, head, 2), src.head(layer, head, 2));
            }
        }
        // Beyond the prefix the destination keeps its own values.
        dst.set_len(3);
        assert_eq!(dst.head(1, 0, 3).0[2 * 4].to_f32(), -5.0);
        assert!(dst.copy_prefix_from(&src, 4).is_err(), "source too short");
        assert!(KvCache::new(2, 1, 4, 8).copy_prefix_from(&src, 1).is_err());
        assert!(KvCache::new(2, 2, 4, 1).copy_prefix_from(&src, 2).is_err());
    }
}
