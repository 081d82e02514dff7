//! Clocks for the idle timers. Idle time is measured on the boot-time clock
//! (`CLOCK_BOOTTIME`), which keeps counting while the phone is suspended, so a worker that
//! slept through a suspend releases its votes / unloads on resume instead of waiting the
//! full idle period again. Tests inject a [`ManualClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A source of "now" as a duration since an arbitrary fixed origin (boot, for
/// [`BootClock`]). Must be monotonic (never goes backwards).
pub trait Clock: Send + Sync {
    /// The current time since the clock's origin.
    fn now(&self) -> Duration;
}

/// `clock_gettime(CLOCK_BOOTTIME)`: monotonic, counts time in suspend (Linux, Android).
#[derive(Clone, Copy, Debug, Default)]
pub struct BootClock;

impl Clock for BootClock {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn now(&self) -> Duration {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::new(
            ts.tv_sec.max(0) as u64,
            ts.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    }

    /// Elsewhere: the monotonic clock (does not count suspend), measured from the first call.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn now(&self) -> Duration {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed()
    }
}

/// A clock that only moves when told to (tests). Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.nanos
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_monotonic_and_moves() {
        let c = BootClock;
        let a = c.now();
        std::thread::sleep(Duration::from_millis(5));
        let b = c.now();
        assert!(b >= a + Duration::from_millis(5), "{a:?} -> {b:?}");
    }

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = ManualClock::new();
        let c2 = c.clone();
        assert_eq!(c.now(), Duration::ZERO);
        c2.advance(Duration::from_millis(7));
        assert_eq!(c.now(), Duration::from_millis(7));
    }
}
