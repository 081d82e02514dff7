//! The engine thread: loads the model, then serves queued requests one at a time (prefill in
//! micro-batches, then decode) and streams events back. Between requests it waits on its
//! queue until the idle controller's next deadline, releases the power votes (and parks the
//! thread pool) or unloads the model when one passes, and reloads on the next request (a
//! cold start). Every batch is bracketed for the idle controller and the watchdog.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dsp::pool::ThreadPool;
use tandem_proto::step::v1 as pb;
use tokio::sync::{mpsc, watch};

use super::admission::Admission;
use super::request::{EngineEvent, EngineRequest};
use super::sampling::{argmax, sample, Rng, SamplingMode};
use super::speculative::{mtp_fill, DraftTally, MtpSource, Round, Speculator};
use super::EngineState;
use crate::state::planner::{self, PlanConfig, PlanRequest};
use gguf::chat_template::ChatTemplate;
use crate::config::EngineSettings;
use crate::constraint::ConstraintFactory;
use crate::error::WorkerError;
use gguf::reader::GgufFile;
use crate::model::{Model, Scratch};
use crate::power::{IdleController, TickAction};
use crate::spec::DraftContext;
use crate::state::slot::{choose_slot, common_prefix, Slot};
use gguf::tokenizer::{IncrementalDecoder, Tokenizer};
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

    fn should_hang(&self) -> bool {
        let Some(n) = self.hang_after else {
            return false;
        };
        self.batches.fetch_add(1, Ordering::Relaxed) >= n
            && !self.fired.swap(true, Ordering::AcqRel)
    }
}

/// Model, slots and pool: what an unload drops.
struct Compute {
    model: Model,
    pool: ThreadPool,
    slots: Vec<Slot>,
    scratch: Scratch,
    n_ctx: usize,
    /// The checkpoint planner's configuration for this model (policy and limits from the
    /// engine config, state sizes from the model).
    plan_cfg: PlanConfig,
}

impl Compute {
    fn load(cfg: &EngineSettings, file: Arc<GgufFile>) -> Result<Self, WorkerError> {
        let model = Model::load(file)?;
        let n_ctx = cfg.ctx_size.min(model.n_ctx_train()).max(16);
        let pool = ThreadPool::new(cfg.threads)
            .map_err(|e| WorkerError::Internal(format!("thread pool: {e}")))?;
        // MTP drafters: each slot keeps the MTP block's KV cache beside its sequence, and
        // every pass hands over the hidden state of each position it computed.
        let mtp = cfg.speculative.as_ref().is_some_and(|s| s.uses_mtp()) && model.has_mtp();
        let slots: Vec<Slot> = (0..cfg.slots as u32)
            .map(|i| {
                let mut slot = Slot::new(i, model.new_sequence_state(n_ctx));
                slot.mtp = model.new_mtp_cache(n_ctx).filter(|_| mtp);
                slot
            })
            .collect();
        let n_batch = cfg.micro_batch.clamp(1, n_ctx);
        // A verification pass (1 + n_draft tokens) is one pass whatever the prefill
        // micro-batch: the buffers hold at least that many rows.
        let rows = cfg.speculative.as_ref().map_or(n_batch, |s| n_batch.max(s.pass_tokens()));
        let mut scratch = model.new_scratch(rows);
        if let Some(s) = &cfg.speculative {
            // Every pass keeps what a rollback of its last n_draft tokens needs.
            model.set_rollback(&mut scratch, s.pass_tokens(), s.rollback_prefill);
        }
        model.set_hidden_rows(&mut scratch, mtp);
        let plan_cfg = cfg.planner.plan_config(n_batch, &model.sequence_shape());
        Ok(Self {
            model,
            pool,
            slots,
            scratch,
            n_ctx,
            plan_cfg,
        })
    }
}

/// Why a request stopped.
enum Stop {
    Finished(pb::FinishReason),
    Cancelled,
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
                Arc::new(Admission {
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
            load_ms = t0.elapsed().as_millis() as u64,
            engine = inst.id,
            "model loaded"
        );
        if let Some(warning) = dsp::backend::kernels_env_warning() {
            tracing::warn!("{warning}");
        }
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
            });
            s.requests_served
        };
        let spec = Speculator::new(cfg, &compute.model)?;
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
            checkpoint_bytes_held: slots.iter().map(|sl| sl.cache.bytes_held() as u64).sum(),
        });
        s.requests_served = self.served;
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

    /// Runs one request to completion (or cancellation).
    fn serve(&mut self, mut req: EngineRequest) -> Result<(), WorkerError> {
        let t_start = Instant::now();
        let queue_ms = ms(t_start - req.enqueued_at);
        let cold_start = self.ensure_loaded()?;
        let Self {
            ctx,
            inst,
            admission,
            compute,
            logits,
            spec,
            ..
        } = self;
        let c = compute
            .as_mut()
            .ok_or_else(|| WorkerError::Internal("the model is not loaded".into()))?;
        let mut wake: Option<Duration> = None;
        let si = choose_slot(&c.slots, &req.session_id, &req.prompt);
        touch_slot(&mut c.slots, si, &req.session_id);
        let n_prompt = req.prompt.len();

        // Cross-request reuse: the planner decides where processing resumes (the live state,
        // a checkpoint, a prompt-cache entry, or nothing), the batches, and the checkpoints
        // saved and evicted; the slot's cache executes exactly that (device-worker/src/cache).
        let plan = planner::plan(
            &c.slots[si].cache.meta,
            &PlanRequest {
                prompt: &req.prompt,
                last_user_start: req.last_user_start,
                image_start: None,
                line_starts: &req.line_starts,
            },
            &c.plan_cfg,
        );
        let (kv_bound, reused) = (plan.kv_bound, plan.resume);
        {
            let slot = &mut c.slots[si];
            // MTP entries depend only on the tokens up to their next one: those of the
            // prefix this slot's tokens share with the prompt stay valid whatever state the
            // plan resumes from (a checkpoint, the prompt cache).
            let mtp_keep = common_prefix(&slot.tokens, &req.prompt);
            if let Err(e) = slot.cache.begin(&plan, &mut slot.seq) {
                reset_slot(slot);
                return Err(WorkerError::Internal(e.to_string()));
            }
            slot.tokens.clear();
            slot.tokens.extend_from_slice(&req.prompt[..reused]);
            if let Some(m) = slot.mtp.as_mut() {
                m.truncate(mtp_keep.min(reused));
            }
        }
        if let Some(r) = plan.restored {
            tracing::debug!(slot = si, pos = r, "checkpoint restored");
        }

        // Prefill, batch by batch as planned.
        let mut passes = 0u32;
        for b in &plan.batches {
            if req.events.is_closed() {
                tracing::info!(
                    slot = si,
                    pos = b.start,
                    "client gone during prefill; request cancelled"
                );
                let slot = &mut c.slots[si];
                slot.cache.finish(&c.plan_cfg, &plan, &slot.tokens);
                return Ok(());
            }
            let last = b.end == n_prompt;
            batch_begin(ctx, inst, &c.pool, &mut wake);
            let slot = &mut c.slots[si];
            let out = c.model.forward(
                &c.pool,
                &mut slot.seq,
                &req.prompt[b.start..b.end],
                &mut c.scratch,
                last,
            );
            batch_end(ctx, inst)?;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    reset_slot(slot);
                    return Err(e.into());
                }
            };
            if let Some(l) = out {
                logits.clear();
                logits.extend_from_slice(l);
            }
            slot.tokens.extend_from_slice(&req.prompt[b.start..b.end]);
            if let Some(m) = slot.mtp.as_mut() {
                m.push_hidden(b.start, c.model.hidden_rows(&c.scratch));
                if let Err(e) = mtp_fill(&c.model, &c.pool, &mut c.scratch, m, &slot.tokens) {
                    tracing::warn!(error = %e, "MTP entries not filled (MTP cache reset)");
                }
            }
            if b.save {
                slot.cache.save(&slot.seq);
            }
            passes += 1;
        }
        let prefill_ms = ms(t_start.elapsed());
        let rollback_ms = c.model.take_rollback_ms(&mut c.scratch);
        let prompt_hidden = c.model.hidden(&c.scratch).to_vec();
        let prefill = pb::PrefillStats {
            slot_id: c.slots[si].id,
            prompt_tokens: n_prompt as u32,
            reused_tokens: reused as u32,
            new_tokens: (n_prompt - reused) as u32,
            passes,
            queue_ms,
            prefill_ms,
        };
        if req
            .events
            .blocking_send(EngineEvent::Prefill(prefill))
            .is_err()
        {
            return Ok(());
        }

        // Decode: plain greedy / sampled steps, or (greedy, drafters on) rounds of one
        // verification pass over [newest token, drafts] (engine/speculative.rs).
        let t_decode = Instant::now();
        let adm = admission.clone();
        let eog = adm.tokenizer.eog_ids().to_vec();
        let mut decoder = IncrementalDecoder::new();
        let mut text = String::new();
        let mut rng = match req.sampling {
            SamplingMode::Seeded { seed, .. } => Rng::new(seed),
            SamplingMode::Greedy => Rng::new(0),
        };
        let n_ctx = c.slots[si].seq.n_ctx();
        let n_vocab = c.model.n_vocab();
        let n_embd = c.model.n_embd();
        let mut spec = spec
            .as_mut()
            .filter(|_| req.sampling == SamplingMode::Greedy);
        // Logits rows of the last pass (1 row, or 1 + drafts after a verification) and the
        // row the next token is chosen from.
        let rows = logits;
        let mut row = 0usize;
        let mut round: Option<Round> = None;
        let mut tally = DraftTally::default();
        // Output tokens, and the hidden state of each one fed (`[n, n_embd]` by output index).
        let mut out: Vec<u32> = Vec::new();
        let mut out_hidden: Vec<f32> = Vec::new();
        let mut decode_passes = 0u32;
        // Sequence length plain decoding has when it chooses the current token.
        let mut plain_len;
        let stop = loop {
            plain_len = n_prompt + out.len();
            let lg = &mut rows[row * n_vocab..(row + 1) * n_vocab];
            let next = match (&req.sampling, req.constraint.as_mut()) {
                (SamplingMode::Greedy, None) => argmax(lg),
                // The unconstrained argmax, when the grammar allows it, is the masked argmax:
                // the mask is only computed when it is not (Constraint::is_allowed).
                (SamplingMode::Greedy, Some(con)) => match argmax(lg) {
                    Some(id) if con.is_allowed(id) => Some(id),
                    _ => {
                        con.allowed_tokens()?.apply(lg);
                        argmax(lg)
                    }
                },
                (
                    &SamplingMode::Seeded {
                        temperature,
                        top_k,
                        top_p,
                        ..
                    },
                    con,
                ) => {
                    if let Some(con) = con {
                        con.allowed_tokens()?.apply(lg);
                    }
                    sample(lg, temperature, top_k, top_p, &mut rng)
                }
            };
            let Some(id) = next else {
                return Err(WorkerError::Internal(
                    "no token is allowed by the constraint".into(),
                ));
            };
            // An open round: the token is either its next draft (already fed) or ends it.
            let drafted = round.as_mut().is_some_and(|r| r.accept(id));
            if !drafted {
                if let (Some(r), Some(sp)) = (round.take(), spec.as_mut()) {
                    sp.end_round(r, &mut tally);
                    rollback_slot(&c.model, &mut c.slots[si], &c.scratch, plain_len)?;
                }
            }
            if eog.contains(&id) {
                break Stop::Finished(pb::FinishReason::Eos);
            }
            if let Some(con) = req.constraint.as_mut() {
                con.commit(id)?;
            }
            let piece = decoder.push(&adm.tokenizer, id);
            text.push_str(&piece);
            let ev = pb::TokenEvent {
                id,
                text: piece,
                index: out.len() as u32,
            };
            out.push(id);
            if req.events.blocking_send(EngineEvent::Token(ev)).is_err() {
                break Stop::Cancelled;
            }
            if req
                .stop
                .iter()
                .any(|s| text.ends_with(s.as_str()) || text.contains(s.as_str()))
            {
                break Stop::Finished(pb::FinishReason::Stop);
            }
            if req.constraint.as_ref().is_some_and(|con| con.is_finished()) {
                break Stop::Finished(pb::FinishReason::Grammar);
            }
            if out.len() as u32 >= req.max_tokens {
                break Stop::Finished(pb::FinishReason::Length);
            }
            if drafted {
                // Fed by the verification pass: its next row predicts the token after it.
                row += 1;
                continue;
            }
            let slot = &mut c.slots[si];
            if slot.seq.len() + 1 > n_ctx {
                break Stop::Finished(pb::FinishReason::Context);
            }
            // Feed `id`, with a draft when a drafter has one.
            let draft = spec.as_mut().and_then(|sp| {
                let k = out.len();
                let hidden = if k >= 2 {
                    &out_hidden[(k - 2) * n_embd..(k - 1) * n_embd]
                } else {
                    &prompt_hidden[..]
                };
                let ctx = DraftContext {
                    prompt: &req.prompt,
                    output: &out,
                    hidden,
                };
                let room = (n_ctx - slot.seq.len() - 1).min(sp.pass_capacity() - 1);
                let mtp = slot.mtp.as_mut().map(|cache| MtpSource {
                    model: &c.model,
                    pool: &c.pool,
                    scratch: &mut c.scratch,
                    cache,
                    tokens: &slot.tokens,
                });
                sp.propose(&ctx, room, mtp)
            });
            let mut batch = vec![id];
            if let Some(d) = &draft {
                batch.extend_from_slice(&d.tokens);
            }
            batch_begin(ctx, inst, &c.pool, &mut wake);
            let pos0 = slot.seq.len();
            let t_pass = Instant::now();
            let res = if batch.len() > 1 {
                c.model
                    .verify(&c.pool, &mut slot.seq, &batch, &mut c.scratch)
                    .map(Some)
            } else {
                c.model
                    .forward(&c.pool, &mut slot.seq, &batch, &mut c.scratch, true)
            };
            let pass_ms = ms(t_pass.elapsed());
            batch_end(ctx, inst)?;
            let l = match res {
                Ok(Some(l)) => l,
                Ok(None) => {
                    reset_slot(slot);
                    return Err(WorkerError::Internal(
                        "decode step returned no logits".into(),
                    ));
                }
                Err(e) => {
                    reset_slot(slot);
                    return Err(e.into());
                }
            };
            rows.clear();
            rows.extend_from_slice(l);
            row = 0;
            out_hidden.truncate((out.len() - 1) * n_embd);
            out_hidden.extend_from_slice(c.model.hidden(&c.scratch));
            if let Some(m) = slot.mtp.as_mut() {
                m.push_hidden(pos0, c.model.hidden_rows(&c.scratch));
            }
            slot.tokens.extend_from_slice(&batch);
            if let Some(sp) = spec.as_mut() {
                sp.record_pass(batch.len() - 1, pass_ms);
            }
            round = draft.map(|draft| Round { draft, matched: 0 });
            passes += 1;
            decode_passes += 1;
        };
        // Leave the slot where plain decoding would: accepted drafts past a stop are dropped.
        if let (Some(r), Some(sp)) = (round.take(), spec.as_mut()) {
            sp.end_round(r, &mut tally);
            rollback_slot(&c.model, &mut c.slots[si], &c.scratch, plain_len)?;
        }
        if let (Some(sp), false) = (spec.as_mut(), out.is_empty()) {
            let fed = out.len() - 1;
            out_hidden.truncate(fed * n_embd);
            if out_hidden.len() == fed * n_embd {
                sp.finish(&req.prompt, &prompt_hidden, &out, &out_hidden);
            }
        }
        let n_out = out.len() as u32;
        let slot = &mut c.slots[si];
        let events = slot.cache.finish(&c.plan_cfg, &plan, &slot.tokens);
        let Stop::Finished(reason) = stop else {
            tracing::info!(
                slot = si,
                n_out,
                "client gone during decode; request cancelled"
            );
            return Ok(());
        };
        let decode_ms = ms(t_decode.elapsed());
        let done = pb::FinalStats {
            finish_reason: reason as i32,
            prompt_tokens: n_prompt as u32,
            reused_tokens: reused as u32,
            new_tokens: (n_prompt - reused) as u32,
            decode_tokens: n_out,
            passes,
            queue_ms,
            prefill_ms,
            decode_ms,
            server_ms: ms(t_start.elapsed()),
            ms_per_token: if n_out > 0 {
                decode_ms / n_out as f64
            } else {
                0.0
            },
            text,
            kv_bound_tokens: kv_bound as u32,
            cold_start,
            wake_ms: wake.map_or(0.0, ms),
            checkpoints_saved: events.saved,
            checkpoints_restored: events.restored,
            checkpoints_evicted: events.evicted,
            checkpoint_bytes_held: events.bytes_held,
            cache_policy: c.plan_cfg.policy.name().into(),
            decode_passes,
            drafts: tally.into_stats(),
            rollback_ms,
        };
        tracing::info!(
            slot = si,
            session = %req.session_id,
            prompt = n_prompt,
            reused,
            out = n_out,
            prefill_ms = format!("{prefill_ms:.1}"),
            decode_ms = format!("{decode_ms:.1}"),
            reason = ?reason,
            cold_start,
            "request done"
        );
        let _ = req.events.blocking_send(EngineEvent::Done(done));
        Ok(())
    }
}

/// Before a batch: votes re-applied if released (the pool unparked, the wake-up latency
/// noted in `wake` for the request's first batch), the watchdog told; the fault hook may hang.
fn batch_begin(ctx: &Ctx, inst: &Instance, pool: &ThreadPool, wake: &mut Option<Duration>) {
    if let Some(latency) = ctx.idle.begin_batch() {
        pool.unpark();
        wake.get_or_insert(latency);
    }
    ctx.watchdog.batch_started(inst.id);
    if ctx.fault.should_hang() {
        tracing::warn!(
            engine = inst.id,
            "fault injection: this batch hangs until the watchdog abandons the engine"
        );
        while !inst.is_abandoned() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// After a batch. Errors: [`WorkerError::Abandoned`] when the watchdog gave up on this
/// engine meanwhile (the result is discarded; the controller was already reset).
fn batch_end(ctx: &Ctx, inst: &Instance) -> Result<(), WorkerError> {
    ctx.watchdog.batch_finished(inst.id);
    if inst.is_abandoned() {
        return Err(WorkerError::Abandoned);
    }
    ctx.idle.end_batch();
    Ok(())
}

fn touch_slot(slots: &mut [Slot], si: usize, session_id: &str) {
    let next = slots.iter().map(|s| s.last_used).max().unwrap_or(0) + 1;
    let slot = &mut slots[si];
    slot.last_used = next;
    if slot.session_id != session_id {
        slot.session_id = session_id.to_string();
    }
}

/// Empties a slot whose state is no longer trustworthy (a failed batch).
/// Cuts the slot back to `len` positions inside the last pass (rejected drafts, or accepted
/// ones past a stop); a failed rollback resets the slot (nothing of it can be trusted).
fn rollback_slot(
    model: &Model,
    slot: &mut Slot,
    scratch: &Scratch,
    len: usize,
) -> Result<(), WorkerError> {
    if let Err(e) = model.rollback(&mut slot.seq, scratch, len) {
        reset_slot(slot);
        return Err(e.into());
    }
    slot.tokens.truncate(len);
    if let Some(m) = slot.mtp.as_mut() {
        m.truncate(len);
    }
    Ok(())
}

fn reset_slot(slot: &mut Slot) {
    slot.seq.reset();
    slot.tokens.clear();
    slot.cache.clear();
    if let Some(m) = slot.mtp.as_mut() {
        m.reset();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
