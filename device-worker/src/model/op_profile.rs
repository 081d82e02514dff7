//! Optional wall-clock profile of forward passes by operation, for `device-worker bench
//! --profile` (the per-op prefill table of the engine's closing notes). Off by default: a
//! forward pass with no [`OpProfile`] attached pays one branch per op.
//!
//! Times are wall-clock on the engine thread, so a pooled op counts its slowest worker plus
//! dispatch; the sum of all ops is the forward pass's time.

use std::time::{Duration, Instant};

/// Accumulated wall time per operation name, in first-seen order.
#[derive(Clone, Debug, Default)]
pub struct OpProfile {
    ops: Vec<(&'static str, Duration)>,
}

impl OpProfile {
    /// Adds `d` to operation `op`.
    pub fn add(&mut self, op: &'static str, d: Duration) {
        match self.ops.iter_mut().find(|(name, _)| *name == op) {
            Some((_, total)) => *total += d,
            None => self.ops.push((op, d)),
        }
    }

    /// Adds every operation's time of `other` (new operations after this one's).
    pub fn merge(&mut self, other: &OpProfile) {
        for &(op, d) in &other.ops {
            self.add(op, d);
        }
    }

    /// The time of all operations together.
    pub fn total(&self) -> Duration {
        self.ops.iter().map(|(_, d)| *d).sum()
    }

    /// `(operation, seconds, share of the total)`, largest first.
    pub fn table(&self) -> Vec<(&'static str, f64, f64)> {
        let total: f64 = self.ops.iter().map(|(_, d)| d.as_secs_f64()).sum();
        let mut rows: Vec<_> = self
            .ops
            .iter()
            .map(|(op, d)| {
                let s = d.as_secs_f64();
                (*op, s, if total > 0.0 { s / total } else { 0.0 })
            })
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        rows
    }
}

/// Lap timer over an optional [`OpProfile`]: [`Laps::lap`] charges the time since the previous
/// lap (or since [`Laps::new`]) to the named operation.
pub struct Laps<'a> {
    profile: Option<&'a mut OpProfile>,
    last: Instant,
}

impl<'a> Laps<'a> {
    pub fn new(profile: Option<&'a mut OpProfile>) -> Self {
        Self {
            profile,
            last: Instant::now(),
        }
    }

    /// Charges the time since the previous lap to `op` (nothing when profiling is off).
    #[inline]
    pub fn lap(&mut self, op: &'static str) {
        if let Some(p) = self.profile.as_deref_mut() {
            let now = Instant::now();
            p.add(op, now - self.last);
            self.last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_sums_per_op_and_sorts_by_time() {
        let mut p = OpProfile::default();
        p.add("a", Duration::from_millis(10));
        p.add("b", Duration::from_millis(30));
        p.add("a", Duration::from_millis(25));
        let t = p.table();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].0, t[1].0), ("a", "b"));
        assert!((t[0].1 - 0.035).abs() < 1e-9 && (t[1].1 - 0.030).abs() < 1e-9);
        assert!((t.iter().map(|r| r.2).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn laps_without_a_profile_record_nothing() {
        let mut laps = Laps::new(None);
        laps.lap("x");
        let mut p = OpProfile::default();
        {
            let mut laps = Laps::new(Some(&mut p));
            laps.lap("x");
            laps.lap("y");
        }
        assert_eq!(p.table().len(), 2);
    }
}
