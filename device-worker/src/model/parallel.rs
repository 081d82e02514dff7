//! Disjoint parallel writes for `ThreadPool::run` tasks.

use std::marker::PhantomData;

/// A mutable slice that parallel tasks write through, each to a range no other task touches.
pub struct DisjointMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only obtain non-overlapping sub-slices (the caller's contract of `chunk`).
unsafe impl<T: Send> Sync for DisjointMut<'_, T> {}
unsafe impl<T: Send> Send for DisjointMut<'_, T> {}

impl<'a, T> DisjointMut<'a, T> {
    pub fn new(slice: &'a mut [T]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _life: PhantomData,
        }
    }

    /// The sub-slice `start..start+len`.
    ///
    /// # Safety
    /// No two live sub-slices obtained from this value may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn chunk(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start + len <= self.len,
            "chunk {start}+{len} out of {}",
            self.len
        );
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

/// Runs `f` on contiguous token ranges covering `0..n`, one per thread of `pool` (the calling
/// thread alone for a single token or a one-thread pool). For per-token work whose outputs are
/// rows of the token: each task writes only its range's rows (through [`DisjointMut`]).
pub fn for_token_ranges(pool: &dsp::ThreadPool, n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let tasks = pool.n_threads().min(n).max(1);
    let per = n.div_ceil(tasks).max(1);
    pool.run(n.div_ceil(per), &|i| f(i * per..((i + 1) * per).min(n)));
}
