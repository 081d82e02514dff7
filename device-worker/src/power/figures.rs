//! Power figures: state, time released, release cycles, wake-up latency, cold starts,
//! watchdog restarts. Plain counters and a fixed-bucket histogram, so a metrics exporter can
//! copy them as they are (counters `_total`, histogram buckets as cumulative `le` buckets).

use std::time::Duration;

use tandem_proto::step::v1 as pb;

/// Upper bounds of the wake-up latency buckets, in ms (the last bucket is `+Inf`).
pub const WAKE_LATENCY_BOUNDS_MS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0,
];

/// Power state of the worker (a `llama.cpp` `server_state` analogue).
///
/// ```text
/// Active --idle_release, nothing in flight--> Released --unload_after_idle--> Unloaded
///   ^                                            |                               |
///   +---------- next batch (votes re-applied) ---+-------- reload (cold start) ---+
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    /// Votes held.
    Active,
    /// Votes released; weights, slots and caches in memory.
    Released,
    /// Votes released and the model, slots and thread pool dropped.
    Unloaded,
}

impl PowerState {
    /// "active", "released" or "unloaded" (the `PowerInfo.state` strings).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Released => "released",
            Self::Unloaded => "unloaded",
        }
    }
}

/// A latency histogram with fixed bucket bounds (ms).
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyHistogram {
    /// Upper bounds of the finite buckets, ms, increasing.
    pub bounds_ms: &'static [f64],
    /// Non-cumulative counts; `counts.len() == bounds_ms.len() + 1` (last: above every bound).
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_ms: f64,
    pub max_ms: f64,
}

impl LatencyHistogram {
    pub fn new(bounds_ms: &'static [f64]) -> Self {
        Self {
            bounds_ms,
            counts: vec![0; bounds_ms.len() + 1],
            count: 0,
            sum_ms: 0.0,
            max_ms: 0.0,
        }
    }

    /// Adds one observation.
    pub fn record(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        let i = self
            .bounds_ms
            .iter()
            .position(|&b| ms <= b)
            .unwrap_or(self.bounds_ms.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum_ms += ms;
        self.max_ms = self.max_ms.max(ms);
    }

    pub fn to_proto(&self) -> pb::LatencyHistogram {
        pb::LatencyHistogram {
            bounds_ms: self.bounds_ms.to_vec(),
            counts: self.counts.clone(),
            count: self.count,
            sum_ms: self.sum_ms,
            max_ms: self.max_ms,
        }
    }
}

/// Everything the idle controller and the watchdog count.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerFigures {
    /// The backend's name.
    pub backend: &'static str,
    pub state: PowerState,
    /// Time with votes released (released or unloaded), the current release included.
    pub time_released: Duration,
    /// Releases so far (each Active → Released transition).
    pub release_cycles: u64,
    /// Time from a request arriving while released to its first batch starting, votes
    /// re-applied and recovered.
    pub wake_latency: LatencyHistogram,
    /// Model unloads after `unload_after_idle`.
    pub unloads: u64,
    /// Reloads after an unload (the request that triggered each reports `cold_start`).
    pub cold_starts: u64,
    /// Engines restarted by the watchdog.
    pub watchdog_restarts: u64,
}

impl PowerFigures {
    pub fn to_proto(&self) -> pb::PowerInfo {
        pb::PowerInfo {
            state: self.state.as_str().into(),
            backend: self.backend.into(),
            released_ms: self.time_released.as_secs_f64() * 1e3,
            release_cycles: self.release_cycles,
            wake_latency: Some(self.wake_latency.to_proto()),
            cold_starts: self.cold_starts,
            watchdog_restarts: self.watchdog_restarts,
            unloads: self.unloads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_puts_values_in_the_first_bucket_that_holds_them() {
        let mut h = LatencyHistogram::new(&[1.0, 10.0]);
        h.record(Duration::from_micros(500));
        h.record(Duration::from_millis(1));
        h.record(Duration::from_millis(5));
        h.record(Duration::from_millis(50));
        assert_eq!(h.counts, vec![2, 1, 1]);
        assert_eq!(h.count, 4);
        assert!((h.sum_ms - 56.5).abs() < 1e-9);
        assert!((h.max_ms - 50.0).abs() < 1e-9);
    }
}
