//! The engine: an actor on its own OS thread, sole owner of the model, the slots and the
//! thread pool (see `actor.rs`). Handlers send it admitted requests over a bounded queue; it
//! runs them one at a time (prefill in micro-batches, then decode) and streams events back.
//! A request whose event channel is closed (the client went away) is cancelled at the next
//! micro-batch or token, and its slot keeps only what was fully computed.
//!
//! The [`EngineHandle`] also owns what outlives one engine thread: the idle controller (power
//! votes, shared with [`EngineHandle::submit`] under one lock), and the batch watchdog. When a
//! batch overruns `--watchdog-ms`, the handle abandons the engine thread (its later results are
//! discarded), releases the power votes (the host's settings go back while the fresh engine
//! loads), fails its in-flight request with UNAVAILABLE, moves the queued requests to a
//! fresh engine thread that reloads the model with empty slots, and publishes
//! `Restarting` → `Ready` (health NOT_SERVING → SERVING).

mod actor;
pub mod admission;
mod batch;
mod compute;
pub mod images;
pub mod request;
mod step;

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tandem_proto::step::v1 as pb;
use tokio::sync::watch;

use crate::config::{EngineSettings, PowerBackendKind};
use crate::error::WorkerError;
use crate::power::{
    BootClock, IdleController, LinuxBackend, NoPowerBackend, PowerBackend, PowerFigures,
    RecordingBackend,
};
use crate::watchdog::{Overrun, Watchdog};
pub use actor::ExitSignal;
use actor::{Ctx, FaultHook, Instance};
pub use admission::Admission;
pub use request::{EngineEvent, EngineRequest};

/// Lifecycle of the engine, published on a watch channel (drives gRPC health).
///
/// `Loading → Ready`, or `Loading → Failed`; after a watchdog timeout `Ready → Restarting →
/// Ready` (requests are still admitted and queued while restarting).
#[derive(Clone)]
pub enum EngineState {
    Loading,
    Ready(Arc<Admission>),
    /// The watchdog abandoned a hung engine; a fresh one is loading the model.
    Restarting(Arc<Admission>),
    Failed(String),
}

/// The handlers' side of the engine. Clones share the same engine.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    state: watch::Receiver<EngineState>,
}

struct Shared {
    ctx: Arc<Ctx>,
    /// The current engine's queue (swapped by a watchdog restart; sends hold the lock).
    tx: Mutex<SyncSender<EngineRequest>>,
    instance: Mutex<Arc<Instance>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ctx.watchdog.shutdown();
    }
}

/// The backend `--power-backend` names (the Linux one on the files under `--power-root`,
/// its originals saved in `--power-state-file`).
pub fn power_backend(cfg: &EngineSettings) -> Box<dyn PowerBackend> {
    match cfg.power_backend {
        PowerBackendKind::Linux => Box::new(LinuxBackend::with_root(
            &cfg.power_root,
            cfg.power_state_file.as_deref(),
        )),
        PowerBackendKind::Recording => Box::new(RecordingBackend::new(Arc::new(BootClock))),
        PowerBackendKind::None => Box::new(NoPowerBackend),
    }
}

impl EngineHandle {
    /// Starts the engine thread, which loads the model and then serves, with the power
    /// backend `cfg.power_backend`. Returns at once; watch [`EngineHandle::state`] for
    /// readiness.
    ///
    /// Errors: [`WorkerError::Internal`] when a thread cannot be started.
    pub fn spawn(cfg: EngineSettings) -> Result<Self, WorkerError> {
        let backend = power_backend(&cfg);
        Self::spawn_with_backend(cfg, backend)
    }

    /// As [`spawn`](Self::spawn) with a given power backend (tests pass a
    /// [`RecordingBackend`] and keep a clone to read its log).
    pub fn spawn_with_backend(
        cfg: EngineSettings,
        backend: Box<dyn PowerBackend>,
    ) -> Result<Self, WorkerError> {
        let (tx, rx) = sync_channel(cfg.max_queue);
        let (state_tx, state) = watch::channel(EngineState::Loading);
        let status = Arc::new(Mutex::new(pb::StatusResponse::default()));
        let idle = Arc::new(IdleController::new(
            backend,
            Arc::new(BootClock),
            cfg.idle,
        ));
        let ctx = Arc::new(Ctx {
            status,
            idle,
            watchdog: Arc::new(Watchdog::new(cfg.watchdog)),
            fault: FaultHook::new(cfg.fault_hang_after_batches),
            state_tx,
            exited: Arc::new(ExitSignal::default()),
            cfg,
        });
        let inst = Arc::new(Instance::new(0, rx));
        let shared = Arc::new(Shared {
            ctx: ctx.clone(),
            tx: Mutex::new(tx),
            instance: Mutex::new(inst.clone()),
        });
        let weak = Arc::downgrade(&shared);
        let wd = ctx.watchdog.clone();
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch_batches(&wd, &weak))
            .map_err(|e| WorkerError::Internal(format!("cannot start the watchdog thread: {e}")))?;
        actor::spawn(ctx, inst, None)?;
        Ok(Self { shared, state })
    }

    pub fn state(&self) -> watch::Receiver<EngineState> {
        self.state.clone()
    }

    /// Set once the engine thread has exited for good: after every handle is dropped (its
    /// queue closes) it finishes the queued requests, saves the experience memory and exits;
    /// or its model failed to load. `main` waits on it so that last save is not cut short.
    pub fn exit_signal(&self) -> Arc<ExitSignal> {
        self.shared.ctx.exited.clone()
    }

    /// The admission front once the model is loaded (also while a watchdog restart reloads
    /// it: requests then wait in the queue).
    ///
    /// Errors: [`WorkerError::Loading`] while loading, [`WorkerError::LoadFailed`].
    pub fn admission(&self) -> Result<Arc<Admission>, WorkerError> {
        match &*self.state.borrow() {
            EngineState::Ready(a) | EngineState::Restarting(a) => Ok(a.clone()),
            EngineState::Loading => Err(WorkerError::Loading),
            EngineState::Failed(m) => Err(WorkerError::LoadFailed(m.clone())),
        }
    }

    /// Queues an admitted request; counts it as submitted for the idle controller in the
    /// same critical section (no release can slip between the two).
    ///
    /// Errors: [`WorkerError::QueueFull`], [`WorkerError::EngineStopped`].
    pub fn submit(&self, req: EngineRequest) -> Result<(), WorkerError> {
        let tx = self
            .shared
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let idle = &self.shared.ctx.idle;
        idle.submit();
        tx.try_send(req).map_err(|e| {
            idle.complete();
            match e {
                TrySendError::Full(_) => WorkerError::QueueFull,
                TrySendError::Disconnected(_) => WorkerError::EngineStopped,
            }
        })
    }

    /// Snapshot of model, slots and cache figures (updated after every request) and the
    /// live power figures.
    pub fn status(&self) -> pb::StatusResponse {
        let mut s = self
            .shared
            .ctx
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        s.power = Some(self.power().to_proto());
        s
    }

    /// Power state, release cycles, wake-up latency, cold starts, watchdog restarts.
    pub fn power(&self) -> PowerFigures {
        self.shared.ctx.idle.figures()
    }

    /// The power backend's exit restore (`main` runs it when `serve` ends, on a forced exit
    /// and from a drop guard); `None` when the backend changes nothing system-wide.
    pub fn power_restorer(&self) -> Option<crate::power::Restorer> {
        self.shared.ctx.idle.restorer()
    }

    /// The idle controller (for tests and the metrics exporter).
    pub fn idle(&self) -> Arc<IdleController> {
        self.shared.ctx.idle.clone()
    }
}

/// The watchdog thread: restarts the engine on every overrun until the handle is dropped.
fn watch_batches(wd: &Watchdog, shared: &Weak<Shared>) {
    while let Some(o) = wd.wait_for_overrun() {
        match shared.upgrade() {
            Some(sh) => sh.restart(o),
            None => return,
        }
    }
}

impl Shared {
    /// Abandons the engine whose batch overran, fails its request with UNAVAILABLE, moves
    /// its queue to a fresh engine thread.
    fn restart(&self, o: Overrun) {
        let old = self
            .instance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if old.id != o.instance || old.is_abandoned() {
            return;
        }
        let ctx = &self.ctx;
        let limit_ms = ctx.watchdog.limit().as_millis() as u64;
        let elapsed_ms = o.elapsed.as_millis() as u64;
        tracing::error!(
            engine = old.id,
            limit_ms,
            elapsed_ms,
            "watchdog: batch overran; restarting the engine"
        );
        old.abandoned
            .store(true, std::sync::atomic::Ordering::Release);
        let failed = old.take_current();
        ctx.idle.abandon(usize::from(failed.is_some()));
        if let Some(events) = failed {
            // blocking_send may wait for a slow client: not on the watchdog thread.
            let _ = std::thread::Builder::new()
                .name("watchdog-fail".into())
                .spawn(move || {
                    let _ =
                        events.blocking_send(EngineEvent::Failed(WorkerError::WatchdogTimeout {
                            limit_ms,
                            elapsed_ms,
                        }));
                });
        }
        let admission = match &*ctx.state_tx.borrow() {
            EngineState::Ready(a) | EngineState::Restarting(a) => Some(a.clone()),
            _ => None,
        };
        if let Some(a) = &admission {
            ctx.state_tx
                .send_replace(EngineState::Restarting(a.clone()));
        } else {
            ctx.state_tx.send_replace(EngineState::Loading);
        }
        let (tx, rx) = sync_channel(ctx.cfg.max_queue);
        let inst = Arc::new(Instance::new(old.id + 1, rx));
        // Swap the queue (dropping the old sender), then move what was queued.
        *self.tx.lock().unwrap_or_else(PoisonError::into_inner) = tx.clone();
        *self.instance.lock().unwrap_or_else(PoisonError::into_inner) = inst.clone();
        {
            let old_rx = old.rx.lock().unwrap_or_else(PoisonError::into_inner);
            while let Ok(req) = old_rx.try_recv() {
                if let Err(e) = tx.try_send(req) {
                    let req = match e {
                        TrySendError::Full(r) | TrySendError::Disconnected(r) => r,
                    };
                    ctx.idle.complete();
                    let _ = req
                        .events
                        .try_send(EngineEvent::Failed(WorkerError::QueueFull));
                }
            }
        }
        if let Err(e) = actor::spawn(ctx.clone(), inst, admission) {
            tracing::error!(error = %e, "watchdog: cannot start a fresh engine");
            ctx.state_tx
                .send_replace(EngineState::Failed(e.to_string()));
        }
    }
}
