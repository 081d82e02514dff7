//! Image embeddings by content (issue 19): the projector's output for an image, keyed by the
//! SHA-256 of its bytes, kept within a byte limit (`--image-cache-mib`) and evicted least
//! recently used first, so an unchanged screenshot in the next step is not encoded again.
//! The embeddings depend only on the bytes, the projector and the token budget, all fixed
//! for a loaded engine (the cache is dropped with it).

use std::sync::Arc;

/// One image's embeddings `[n_tokens, n_embd]` f32.
pub type Embeddings = Arc<Vec<f32>>;

/// Embeddings by image hash, within a byte limit.
#[derive(Debug, Default)]
pub struct ImageCache {
    limit_bytes: usize,
    bytes: usize,
    /// `(hash, embeddings, last use)`.
    entries: Vec<([u8; 32], Embeddings, u64)>,
    clock: u64,
}

impl ImageCache {
    /// An empty cache of at most `limit_bytes` bytes of embeddings (0: keeps nothing).
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            limit_bytes,
            ..Self::default()
        }
    }

    /// The embeddings of the image with `hash`, marked used now.
    pub fn get(&mut self, hash: &[u8; 32]) -> Option<Embeddings> {
        self.clock += 1;
        let now = self.clock;
        self.entries.iter_mut().find(|e| &e.0 == hash).map(|e| {
            e.2 = now;
            e.1.clone()
        })
    }

    /// Keeps `embd` for `hash`, evicting the least recently used entries until it fits; an
    /// entry larger than the whole limit is not kept.
    pub fn insert(&mut self, hash: [u8; 32], embd: Embeddings) {
        let size = embd.len() * size_of::<f32>();
        if size > self.limit_bytes || self.entries.iter().any(|e| e.0 == hash) {
            return;
        }
        while self.bytes + size > self.limit_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.2)
                .map(|(i, _)| i)
            else {
                break;
            };
            let gone = self.entries.swap_remove(oldest);
            self.bytes -= gone.1.len() * size_of::<f32>();
        }
        self.clock += 1;
        self.bytes += size;
        self.entries.push((hash, embd, self.clock));
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of embeddings held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(n: usize, v: f32) -> Embeddings {
        Arc::new(vec![v; n])
    }

    #[test]
    fn a_kept_image_is_found_by_its_hash() {
        let mut c = ImageCache::new(1 << 10);
        assert!(c.get(&[1; 32]).is_none());
        c.insert([1; 32], e(4, 1.0));
        assert_eq!(c.get(&[1; 32]).as_deref(), Some(&vec![1.0; 4]));
        assert!(c.get(&[2; 32]).is_none());
        assert_eq!(c.bytes(), 16);
    }

    #[test]
    fn the_least_recently_used_goes_first_and_the_limit_holds() {
        // Room for two entries of 16 bytes.
        let mut c = ImageCache::new(32);
        c.insert([1; 32], e(4, 1.0));
        c.insert([2; 32], e(4, 2.0));
        assert!(c.get(&[1; 32]).is_some()); // 2 is now the oldest use
        c.insert([3; 32], e(4, 3.0));
        assert!(c.get(&[2; 32]).is_none());
        assert!(c.get(&[1; 32]).is_some() && c.get(&[3; 32]).is_some());
        assert_eq!((c.len(), c.bytes()), (2, 32));
    }

    #[test]
    fn nothing_is_kept_over_the_limit_or_with_the_cache_off() {
        let mut c = ImageCache::new(8);
        c.insert([1; 32], e(4, 1.0));
        assert!(c.is_empty());
        let mut off = ImageCache::new(0);
        off.insert([1; 32], e(1, 1.0));
        assert!(off.get(&[1; 32]).is_none());
    }
}
