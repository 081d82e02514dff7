//! The engine thread: loads the model, then serves queued requests one at a time (each
//! through the stages of `step/`) and streams events back. Between requests it waits on its
//! queue until the idle controller's next deadline, releases the power votes (and parks the
//! thread pool) or unloads the model when one passes, and reloads on the next request (a
//! cold start). Every batch is bracketed for the idle controller and the watchdog
//! (`batch.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gguf::reader::GgufFile;
use gguf::{ChatTemplate, Tokenizer};
use tandem_proto::step::v1 as pb;
use tokio::sync::{mpsc, watch};

use super::admission::Admission;
use super::compute::Compute;
use super::images::ImageAdmission;
use super::request::{EngineEvent, EngineRequest};
use super::step;
use super::EngineState;
use crate::config::EngineSettings;
use crate::constraint::ConstraintFactory;
use crate::error::WorkerError;
use crate::power::{IdleController, TickAction};
use crate::speculative::Speculator;
use crate::state::slot::Slot;
use crate::watchdog::Watchdog;

/// What every engine instance of one handle shares (survives watchdog restarts).
pub(super) struct Ctx {
    pub cfg: EngineSettings,
    pub status: Arc<Mutex<pb::StatusResponse>>,
    pub idle: Arc<IdleController>,
    pub watchdog: Arc<Watchdog>,
    pub fault: FaultHook,
    pub state_tx: watch::Sender<EngineState>,
    /// Set when the engine thread has stopped for good (queue closed or load failed), after
    /// its last write (the experience memory's save).
    pub exited: Arc<ExitSignal>,
}

/// A one-shot "the engine thread has exited" flag that other threads can wait on.
#[derive(Default)]
pub struct ExitSignal {
    done: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl ExitSignal {
    fn notify(&self) {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    /// Waits up to `timeout` for the engine thread to exit; returns whether it did.
    pub fn wait(&self, timeout: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, _) = self
            .cv
            .wait_timeout_while(done, timeout, |d| !*d)
            .unwrap_or_else(PoisonError::into_inner);
        *done
    }
}

/// One engine thread's control block, shared with the handle (for the watchdog).
pub(super) struct Instance {
    pub id: u64,
    /// Set by the watchdog: the thread's later results are discarded and it exits.
    pub abandoned: AtomicBool,
    /// The queue (locked only while waiting on it, never during a batch).
    pub rx: Mutex<Receiver<EngineRequest>>,
    /// The event channel of the request being served (the watchdog fails it).
    pub current: Mutex<Option<mpsc::Sender<EngineEvent>>>,
}

impl Instance {
    pub fn new(id: u64, rx: Receiver<EngineRequest>) -> Self {
        Self {
            id,
            abandoned: AtomicBool::new(false),
            rx: Mutex::new(rx),
            current: Mutex::new(None),
        }
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    pub fn take_current(&self) -> Option<mpsc::Sender<EngineEvent>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// TEST ONLY fault injection (`--fault-hang-after-batches N`): the batch after `N` batches
/// (counted over the whole handle) hangs until the watchdog abandons its engine. Fires once.
pub(super) struct FaultHook {
    hang_after: Option<u64>,
    batches: AtomicU64,
    fired: AtomicBool,
}

impl FaultHook {
    pub fn new(hang_after: Option<u64>) -> Self {
        Self {
            hang_after,
            batches: AtomicU64::new(0),
            fired: AtomicBool::new(false),
        }
    }

    pub(super) fn should_hang(&self) -> bool {
        let Some(n) = self.hang_after else {
            return false;
        };
        self.batches.fetch_add(1, Ordering::Relaxed) >= n
            && !self.fired.swap(true, Ordering::AcqRel)
    }
}

pub(super) struct Engine {
    ctx: Arc<Ctx>,
    inst: Arc<Instance>,
    admission: Arc<Admission>,
    compute: Option<Compute>,
    logits: Vec<f32>,
    served: u64,
    /// Drafters and draft-length estimates (`None`: speculation off); outlive unloads.
    spec: Option<Speculator>,
}

/// Starts an engine thread for `inst`: loads the model (reusing `admission` after a
/// watchdog restart), publishes `Ready`, serves until its queue closes or it is abandoned.
pub(super) fn spawn(
    ctx: Arc<Ctx>,
    inst: Arc<Instance>,
    admission: Option<Arc<Admission>>,
) -> Result<(), WorkerError> {
    std::thread::Builder::new()
        .name(format!("engine-{}", inst.id))
        .spawn(move || match Engine::load(ctx.clone(), inst, admission) {
            Ok(engine) => {
                if engine.inst.is_abandoned() {
                    return;
                }
                ctx.idle.engine_loaded();
                let _ = ctx
                    .state_tx
                    .send_replace(EngineState::Ready(engine.admission.clone()));
                engine.run();
            }
            Err(e) => {
                tracing::error!(error = %e, "model failed to load");
                let _ = ctx
                    .state_tx
                    .send_replace(EngineState::Failed(e.to_string()));
                ctx.exited.notify();
            }
        })
        .map(|_| ())
        .map_err(|e| WorkerError::Internal(format!("cannot start the engine thread: {e}")))
}

impl Engine {
    fn load(
        ctx: Arc<Ctx>,
        inst: Arc<Instance>,
        admission: Option<Arc<Admission>>,
    ) -> Result<Self, WorkerError> {
        let cfg = &ctx.cfg;
        let path = cfg.model.clone();
        let t0 = Instant::now();
        let file = Arc::new(GgufFile::open(&path)?);
        let compute = Compute::load(cfg, file.clone())?;
        let admission = match admission {
            Some(a) => a,
            None => {
                let tokenizer = Tokenizer::from_gguf(&file)?;
                let template = ChatTemplate::from_gguf(&file)?;
                let constraints = ConstraintFactory::new(&tokenizer)?;
                let vision = match &compute.projector {
                    Some(p) => Some(ImageAdmission::new(&tokenizer, p.config.clone(), compute.image_options)?),
                    None => None,
                };
                Arc::new(Admission {
                    vision,
                    n_vocab: compute.model.n_vocab(),
                    tokenizer,
                    template,
                    constraints,
                    n_ctx: compute.n_ctx,
                    default_max_tokens: cfg.default_max_tokens,
                })
            }
        };
        let threads = compute.pool.n_threads();
        tracing::info!(
            model = %path.display(),
            arch = compute.model.architecture(),
            params = compute.model.n_params(),
            n_ctx = compute.n_ctx,
            slots = compute.slots.len(),
            threads,
            kernels = dsp::backend::select().name(),
            mmproj = %cfg.vision.as_ref().map_or_else(|| "none".to_string(), |v| v.mmproj.display().to_string()),
            image_tokens = %cfg.vision.as_ref().map_or_else(|| "none".to_string(), |v| format!("{}..={}", v.budget.min_tokens, v.budget.max_tokens)),
            load_ms = t0.elapsed().as_millis() as u64,
            engine = inst.id,
            "model loaded"
        );
        let served = {
            let mut s = ctx
                .status
                .lock()
                .map_err(|_| WorkerError::Internal("status lock poisoned".into()))?;
            s.model = Some(pb::ModelInfo {
                path: path.display().to_string(),
                architecture: compute.model.architecture().into(),
                name: file
                    .get_str_opt("general.name")
                    .unwrap_or_default()
                    .to_string(),
                parameters: compute.model.n_params(),
                file_bytes: file.file_bytes(),
                context_length: compute.n_ctx as u32,
                vocab_size: compute.model.n_vocab() as u32,
                threads: threads as u32,
                kernel_backend: dsp::backend::select().name().into(),
                // What the gateway's `--screenshots auto|always` reads (issue 19).
                vision: cfg.vision.as_ref().map(|v| pb::VisionInfo {
                    mmproj_path: v.mmproj.display().to_string(),
                    image_min_tokens: v.budget.min_tokens as u32,
                    image_max_tokens: v.budget.max_tokens as u32,
                }),
            });
            s.requests_served
        };
        let spec = Speculator::new(cfg.speculative.as_ref(), &cfg.model, &compute.model)?;
        let engine = Self {
            spec,
            logits: vec![0.0; compute.model.n_vocab()],
            ctx,
            inst,
            admission,
            compute: Some(compute),
            served,
        };
        engine.publish_status();
        Ok(engine)
    }

    fn run(mut self) {
        loop {
            if self.inst.is_abandoned() {
                return;
            }
            let next = {
                let rx = self.inst.rx.lock().unwrap_or_else(PoisonError::into_inner);
                match self.ctx.idle.until_next_deadline() {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(d) => rx.recv_timeout(d),
                }
            };
            match next {
                Ok(req) if self.inst.is_abandoned() => {
                    // Taken from the queue in the instant the watchdog abandoned us.
                    let _ = req
                        .events
                        .blocking_send(EngineEvent::Failed(WorkerError::Abandoned));
                    self.ctx.idle.complete();
                    return;
                }
                Ok(req) => {
                    *self
                        .inst
                        .current
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(req.events.clone());
                    let events = req.events.clone();
                    let energy = crate::telemetry::energy::begin_request();
                    let result = self.serve(req);
                    crate::telemetry::energy::end_request(energy);
                    let ours = self.inst.take_current().is_some();
                    if self.inst.is_abandoned() {
                        // The watchdog failed the request if it took it first; otherwise the
                        // request ended here and its accounting is ours.
                        if ours {
                            self.ctx.idle.complete();
                        }
                        return;
                    }
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "request failed");
                        let _ = events.blocking_send(EngineEvent::Failed(e));
                    }
                    self.ctx.idle.complete();
                    self.served += 1;
                    self.publish_status();
                }
                Err(RecvTimeoutError::Timeout) => match self.ctx.idle.tick() {
                    TickAction::Released => {
                        if let Some(c) = &self.compute {
                            c.pool.park();
                        }
                        tracing::debug!("idle: power votes released, pool parked");
                    }
                    TickAction::Unload => {
                        self.compute = None;
                        tracing::info!("idle: model unloaded (weights, slots, pool dropped)");
                        self.publish_status();
                    }
                    TickAction::None => {}
                },
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if let Some(s) = self.spec.as_mut() {
            s.save();
        }
        tracing::info!("engine queue closed; engine thread exits");
        self.ctx.exited.notify();
    }

    fn publish_status(&self) {
        let Ok(mut s) = self.ctx.status.lock() else {
            return;
        };
        let slots: &[Slot] = self.compute.as_ref().map_or(&[], |c| &c.slots);
        s.slots = slots
            .iter()
            .map(|sl| pb::SlotInfo {
                id: sl.id,
                session_id: sl.session_id.clone(),
                cached_tokens: sl.tokens.len() as u32,
                kv_bytes: sl.seq.bytes_used() as u64,
                busy: false,
            })
            .collect();
        let plan_cfg = self.compute.as_ref().map(|c| &c.plan_cfg);
        s.cache = Some(pb::CacheInfo {
            kv_bytes_total: slots.iter().map(|sl| sl.seq.bytes_allocated() as u64).sum(),
            n_slots: slots.len() as u32,
            cache_policy: self.ctx.cfg.planner.policy.name().into(),
            consolidate: self.ctx.cfg.planner.consolidate,
            checkpoints_per_slot: self.ctx.cfg.planner.n_checkpoints as u32,
            prompt_cache_bytes_limit: self.ctx.cfg.planner.prompt_cache_bytes as u64,
            checkpoint_bytes: plan_cfg.map_or(0, |p| p.checkpoint_bytes as u64),
            kv_bytes_per_token: plan_cfg.map_or(0, |p| p.kv_bytes_per_token as u64),
            checkpoint_bytes_held: self.compute.as_ref().map_or(0, |c| c.checkpoint_bytes_held() as u64),
            live_slot_evictions: self.compute.as_ref().map_or(0, |c| c.live_evictions),
            prompt_cache_entries: self.compute.as_ref().map_or(0, |c| c.prompt_cache.len() as u32),
        });
        s.requests_served = self.served;
        s.forward = self.compute.as_ref().map(|c| {
            let n = c.model.pass_counts();
            pb::ForwardCounts {
                passes: n.passes,
                tokens: n.tokens,
            }
        });
    }

    /// Reloads the model after an unload (a cold start). Returns whether it did.
    fn ensure_loaded(&mut self) -> Result<bool, WorkerError> {
        if self.compute.is_some() {
            return Ok(false);
        }
        let t0 = Instant::now();
        let file = Arc::new(GgufFile::open(&self.ctx.cfg.model)?);
        self.compute = Some(Compute::load(&self.ctx.cfg, file)?);
        self.ctx.idle.reloaded();
        tracing::info!(
            load_ms = t0.elapsed().as_millis() as u64,
            "cold start: model reloaded"
        );
        Ok(true)
    }

    /// Runs one request to completion (or cancellation): reloads the model if it was
    /// unloaded, then the stages of [`step::serve`].
    fn serve(&mut self, req: EngineRequest) -> Result<(), WorkerError> {
        let t_start = Instant::now();
        let cold_start = self.ensure_loaded()?;
        let c = self
            .compute
            .as_mut()
            .ok_or_else(|| WorkerError::Internal("the model is not loaded".into()))?;
        step::serve(
            &self.ctx,
            &self.inst,
            c,
            &self.admission,
            self.spec.as_mut(),
            &mut self.logits,
            req,
            (t_start, cold_start),
        )
    }
}
