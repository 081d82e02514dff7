//! The idle controller: counts requests submitted and batches running; after
//! [`IdleConfig::idle_release`] with none, releases every vote (weights, slots and caches stay
//! in memory); before the next batch re-applies them and waits for recovery. After
//! [`IdleConfig::unload_after_idle`] it tells the engine to unload the model.
//!
//! One mutex guards the backend and the counters: a submission and a release cannot
//! interleave, and a batch starts only after the votes are back (the invariant the proptest
//! in `tests/power_idle.rs` checks against the recording backend).
//! Time is read from an injectable [`Clock`] (boot time in production).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::clock::Clock;
use super::figures::{LatencyHistogram, PowerFigures, PowerState, WAKE_LATENCY_BOUNDS_MS};
use super::{PowerBackend, Restorer, Votes};

/// Idle timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleConfig {
    /// Time without requests or batches after which every vote is released.
    pub idle_release: Duration,
    /// Time without requests or batches after which the model is unloaded; `None`: never.
    pub unload_after_idle: Option<Duration>,
}

/// What the engine must do after [`IdleController::tick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickAction {
    /// Nothing changed.
    None,
    /// Votes were just released: park the thread pool.
    Released,
    /// The unload deadline passed: drop the model, slots and pool.
    Unload,
}

struct Inner {
    backend: Box<dyn PowerBackend>,
    state: PowerState,
    /// Requests submitted and not yet completed.
    submitted: usize,
    /// Batches started and not yet ended.
    batches: usize,
    /// Last submission, completion or batch end.
    last_activity: Duration,
    /// Arrival of the first request since the votes were released.
    wake_pending_since: Option<Duration>,
    released_since: Option<Duration>,
    figures: PowerFigures,
}

/// See the module docs. Shared (`Arc`) by the handlers (submit) and the engine thread.
pub struct IdleController {
    cfg: IdleConfig,
    clock: Arc<dyn Clock>,
    /// The backend's exit restore (taken at start; it needs no lock of ours).
    restorer: Option<Restorer>,
    inner: Mutex<Inner>,
}

impl IdleController {
    /// Starts active: applies [`Votes::ACTIVE`] at once (the model is about to load).
    pub fn new(mut backend: Box<dyn PowerBackend>, clock: Arc<dyn Clock>, cfg: IdleConfig) -> Self {
        let restorer = backend.restorer();
        backend.apply(&Votes::ACTIVE);
        let now = clock.now();
        let figures = PowerFigures {
            backend: backend.name(),
            state: PowerState::Active,
            time_released: Duration::ZERO,
            release_cycles: 0,
            wake_latency: LatencyHistogram::new(WAKE_LATENCY_BOUNDS_MS),
            unloads: 0,
            cold_starts: 0,
            watchdog_restarts: 0,
        };
        Self {
            cfg,
            clock,
            restorer,
            inner: Mutex::new(Inner {
                backend,
                state: PowerState::Active,
                submitted: 0,
                batches: 0,
                last_activity: now,
                wake_pending_since: None,
                released_since: None,
                figures,
            }),
        }
    }

    pub fn config(&self) -> IdleConfig {
        self.cfg
    }

    /// The backend's exit restore ([`PowerBackend::restorer`]); `None` for backends that
    /// change nothing system-wide.
    pub fn restorer(&self) -> Option<Restorer> {
        self.restorer.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request entered the queue. Call before sending it to the engine, so no release
    /// can happen between the send and the engine picking it up.
    pub fn submit(&self) {
        let now = self.clock.now();
        let mut g = self.lock();
        g.submitted += 1;
        g.last_activity = now;
        if g.state != PowerState::Active && g.wake_pending_since.is_none() {
            g.wake_pending_since = Some(now);
        }
    }

    /// Undoes [`submit`](Self::submit) for a request that never reached the engine (queue
    /// full) or that the engine finished (done, failed or cancelled).
    pub fn complete(&self) {
        self.end_one(|g| &mut g.submitted);
    }

    /// A batch (a prefill micro-batch or a decode step) is about to start. If the votes were
    /// released, re-applies them, waits for recovery and returns the wake-up latency (from
    /// the first request that arrived while released, or from now when none did).
    pub fn begin_batch(&self) -> Option<Duration> {
        let mut g = self.lock();
        g.batches += 1;
        if g.state == PowerState::Active {
            return None;
        }
        let t0 = self.clock.now();
        g.backend.apply(&Votes::ACTIVE);
        g.backend.wait_recovered();
        let now = self.clock.now();
        let since = g.wake_pending_since.take().unwrap_or(t0);
        let latency = now.saturating_sub(since);
        if let Some(s) = g.released_since.take() {
            g.figures.time_released += now.saturating_sub(s);
        }
        g.state = PowerState::Active;
        g.figures.wake_latency.record(latency);
        Some(latency)
    }

    /// The batch started by [`begin_batch`](Self::begin_batch) ended.
    pub fn end_batch(&self) {
        self.end_one(|g| &mut g.batches);
    }

    /// One unit of the work that `count` counts (requests or batches) ended: the count goes
    /// down (not below 0) and the time is the last activity.
    fn end_one(&self, count: fn(&mut Inner) -> &mut usize) {
        let now = self.clock.now();
        let mut g = self.lock();
        let n = count(&mut g);
        *n = n.saturating_sub(1);
        g.last_activity = now;
    }

    /// Time until the next deadline (release or unload); `None` when there is none (something
    /// is in flight, or the model is unloaded): the engine then waits on its queue without
    /// a timeout.
    pub fn until_next_deadline(&self) -> Option<Duration> {
        let now = self.clock.now();
        let g = self.lock();
        if g.submitted > 0 || g.batches > 0 {
            return None;
        }
        let idle = now.saturating_sub(g.last_activity);
        match g.state {
            PowerState::Active => Some(self.cfg.idle_release.saturating_sub(idle)),
            PowerState::Released => self.cfg.unload_after_idle.map(|u| u.saturating_sub(idle)),
            PowerState::Unloaded => None,
        }
    }

    /// Releases the votes or asks for an unload when a deadline has passed and nothing is in
    /// flight.
    pub fn tick(&self) -> TickAction {
        let now = self.clock.now();
        let mut g = self.lock();
        if g.submitted > 0 || g.batches > 0 {
            return TickAction::None;
        }
        let idle = now.saturating_sub(g.last_activity);
        match g.state {
            PowerState::Active if idle >= self.cfg.idle_release => {
                g.backend.apply(&Votes::RELEASED);
                g.state = PowerState::Released;
                g.released_since = Some(now);
                g.figures.release_cycles += 1;
                TickAction::Released
            }
            PowerState::Released if self.cfg.unload_after_idle.is_some_and(|u| idle >= u) => {
                g.state = PowerState::Unloaded;
                g.figures.unloads += 1;
                TickAction::Unload
            }
            _ => TickAction::None,
        }
    }

    /// The engine reloaded the model after an unload (a cold start). Votes stay released
    /// until the first batch.
    /// The load time counts as a cold start, not as wake-up latency.
    pub fn reloaded(&self) {
        let now = self.clock.now();
        let mut g = self.lock();
        if g.state == PowerState::Unloaded {
            g.state = PowerState::Released;
        }
        if g.wake_pending_since.is_some() {
            g.wake_pending_since = Some(now);
        }
        g.figures.cold_starts += 1;
    }

    /// The watchdog abandoned an engine: its running batches will never end and
    /// `failed_requests` of the submitted requests were failed. Every vote is released (the
    /// host's settings go back to their originals while the fresh engine loads, counted as a
    /// release cycle); the fresh engine's first batch re-applies them.
    pub fn abandon(&self, failed_requests: usize) {
        let now = self.clock.now();
        let mut g = self.lock();
        g.batches = 0;
        g.submitted = g.submitted.saturating_sub(failed_requests);
        g.last_activity = now;
        g.figures.watchdog_restarts += 1;
        if g.state == PowerState::Active {
            g.backend.apply(&Votes::RELEASED);
            g.state = PowerState::Released;
            g.released_since = Some(now);
            g.figures.release_cycles += 1;
        }
    }

    /// An engine thread finished loading the model (at start or after a watchdog restart):
    /// the idle timer starts now, and the state is no longer `Unloaded`. As after a cold
    /// start, the load time does not count as wake-up latency.
    pub fn engine_loaded(&self) {
        let now = self.clock.now();
        let mut g = self.lock();
        g.last_activity = now;
        if g.wake_pending_since.is_some() {
            g.wake_pending_since = Some(now);
        }
        if g.state == PowerState::Unloaded {
            g.state = PowerState::Released;
        }
    }

    pub fn state(&self) -> PowerState {
        self.lock().state
    }

    /// Requests submitted and not completed, batches running.
    pub fn in_flight(&self) -> (usize, usize) {
        let g = self.lock();
        (g.submitted, g.batches)
    }

    /// A snapshot of the figures (time released includes the current release).
    pub fn figures(&self) -> PowerFigures {
        let now = self.clock.now();
        let g = self.lock();
        let mut f = g.figures.clone();
        f.state = g.state;
        if let Some(s) = g.released_since {
            f.time_released += now.saturating_sub(s);
        }
        f
    }
}

impl Drop for IdleController {
    fn drop(&mut self) {
        // Leave nothing voted when the worker goes away.
        self.lock().backend.apply(&Votes::RELEASED);
    }
}
