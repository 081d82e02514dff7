//! The batch watchdog: a thread apart from the engine that sees when the running batch (a
//! prefill micro-batch or a decode step) started, and reports an overrun when one takes
//! longer than the limit. The engine handle then abandons the engine (a Rust thread cannot
//! be killed), fails its in-flight request with UNAVAILABLE and starts a fresh one.
//!
//! Batch times use the monotonic clock ([`Instant`]), which stops in suspend: a batch
//! interrupted by a suspend is not a hang.
//! The watchdog thread waits on a condition variable: without a running batch it sleeps
//! with no timeout (no periodic wake-ups while idle).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A batch that ran past the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrun {
    /// The engine instance whose batch hung.
    pub instance: u64,
    /// How long the batch had run when the watchdog noticed, ≥ the limit.
    pub elapsed: Duration,
}

#[derive(Default)]
struct State {
    running: Option<(u64, Instant)>,
    shutdown: bool,
}

/// See the module docs.
pub struct Watchdog {
    limit: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Watchdog {
    /// A watchdog that reports batches running longer than `limit`.
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            state: Mutex::default(),
            cv: Condvar::new(),
        }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Engine `instance` starts a batch now.
    pub fn batch_started(&self, instance: u64) {
        self.lock().running = Some((instance, Instant::now()));
        self.cv.notify_one();
    }

    /// Engine `instance`'s batch ended (ignored if another instance's batch is registered).
    pub fn batch_finished(&self, instance: u64) {
        let mut g = self.lock();
        if g.running.is_some_and(|(i, _)| i == instance) {
            g.running = None;
        }
    }

    /// Makes [`wait_for_overrun`](Self::wait_for_overrun) return `None`.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.cv.notify_all();
    }

    /// Blocks until a batch overruns the limit (and forgets that batch) or until
    /// [`shutdown`](Self::shutdown) (`None`).
    pub fn wait_for_overrun(&self) -> Option<Overrun> {
        let mut g = self.lock();
        loop {
            if g.shutdown {
                return None;
            }
            match g.running {
                None => g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner),
                Some((instance, t0)) => {
                    let elapsed = t0.elapsed();
                    if elapsed >= self.limit {
                        g.running = None;
                        return Some(Overrun { instance, elapsed });
                    }
                    g = self
                        .cv
                        .wait_timeout(g, self.limit - elapsed)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn reports_a_batch_that_overruns_and_not_one_that_ends_in_time() {
        let wd = Arc::new(Watchdog::new(Duration::from_millis(60)));
        let w = wd.clone();
        let t = std::thread::spawn(move || w.wait_for_overrun());
        // A batch that ends in time is not reported.
        wd.batch_started(1);
        std::thread::sleep(Duration::from_millis(10));
        wd.batch_finished(1);
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "a batch that ended in time was reported");
        // One that hangs is, after at least the limit.
        let t0 = Instant::now();
        wd.batch_started(2);
        let o = t.join().unwrap().expect("overrun");
        assert_eq!(o.instance, 2);
        assert!(o.elapsed >= Duration::from_millis(60));
        assert!(t0.elapsed() < Duration::from_millis(1000));
    }

    #[test]
    fn shutdown_wakes_the_waiter() {
        let wd = Arc::new(Watchdog::new(Duration::from_secs(60)));
        let w = wd.clone();
        let t = std::thread::spawn(move || w.wait_for_overrun());
        std::thread::sleep(Duration::from_millis(20));
        wd.shutdown();
        assert_eq!(t.join().unwrap(), None);
    }
}
