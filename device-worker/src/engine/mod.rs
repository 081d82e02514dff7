//! The engine: an actor on its own OS thread, sole owner of the model, the slots and the
//! thread pool. Handlers send it admitted requests over a bounded queue; it runs them one at
//! a time (prefill in micro-batches, then decode) and streams events back. A request whose
//! event channel is closed (the client went away) is cancelled at the next micro-batch or
//! token, and its slot keeps only what was fully computed.

pub mod admission;
pub mod request;
pub mod sampling;

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dsp::pool::ThreadPool;
use tandem_proto::step::v1 as pb;
use tokio::sync::watch;

use crate::chat_template::ChatTemplate;
use crate::config::EngineConfig;
use crate::constraint::ConstraintFactory;
use crate::error::WorkerError;
use crate::model::gguf::GgufFile;
use crate::model::{Model, Scratch};
use crate::state::slot::{choose_slot, common_prefix, Slot};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};
pub use admission::Admission;
pub use request::{EngineEvent, EngineRequest};
use sampling::{argmax, sample, Rng, SamplingMode};

/// Lifecycle of the engine, published on a watch channel (drives gRPC health).
#[derive(Clone)]
pub enum EngineState {
    Loading,
    Ready(Arc<Admission>),
    Failed(String),
}

/// The handlers' side of the engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: SyncSender<EngineRequest>,
    state: watch::Receiver<EngineState>,
    status: Arc<Mutex<pb::StatusResponse>>,
}

impl EngineHandle {
    /// Starts the engine thread, which loads the model and then serves. Returns at once;
    /// watch [`EngineHandle::state`] for readiness.
    pub fn spawn(cfg: EngineConfig) -> Result<Self, WorkerError> {
        let (tx, rx) = sync_channel(cfg.max_queue.max(1));
        let (state_tx, state) = watch::channel(EngineState::Loading);
        let status = Arc::new(Mutex::new(pb::StatusResponse {
            power: Some(pb::PowerInfo {
                state: "active".into(),
                backend: "none".into(),
            }),
            ..Default::default()
        }));
        let st = status.clone();
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || match Engine::load(&cfg, st) {
                Ok((engine, admission)) => {
                    let _ = state_tx.send(EngineState::Ready(admission));
                    engine.run(rx);
                }
                Err(e) => {
                    tracing::error!(error = %e, "model failed to load");
                    let _ = state_tx.send(EngineState::Failed(e.to_string()));
                }
            })
            .map_err(|e| WorkerError::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(Self { tx, state, status })
    }

    pub fn state(&self) -> watch::Receiver<EngineState> {
        self.state.clone()
    }

    /// The admission front once the model is loaded.
    ///
    /// Errors: [`WorkerError::Loading`] while loading, [`WorkerError::LoadFailed`].
    pub fn admission(&self) -> Result<Arc<Admission>, WorkerError> {
        match &*self.state.borrow() {
            EngineState::Ready(a) => Ok(a.clone()),
            EngineState::Loading => Err(WorkerError::Loading),
            EngineState::Failed(m) => Err(WorkerError::LoadFailed(m.clone())),
        }
    }

    /// Queues an admitted request. Errors: [`WorkerError::QueueFull`], [`WorkerError::EngineStopped`].
    pub fn submit(&self, req: EngineRequest) -> Result<(), WorkerError> {
        self.tx.try_send(req).map_err(|e| match e {
            TrySendError::Full(_) => WorkerError::QueueFull,
            TrySendError::Disconnected(_) => WorkerError::EngineStopped,
        })
    }

    /// Snapshot of model, slots and cache figures (updated after every request).
    pub fn status(&self) -> pb::StatusResponse {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

struct Engine {
    model: Model,
    admission: Arc<Admission>,
    pool: ThreadPool,
    slots: Vec<Slot>,
    scratch: Scratch,
    logits: Vec<f32>,
    n_batch: usize,
    served: u64,
    status: Arc<Mutex<pb::StatusResponse>>,
}

/// Why a request stopped.
enum Stop {
    Finished(pb::FinishReason),
    Cancelled,
}

impl Engine {
    fn load(
        cfg: &EngineConfig,
        status: Arc<Mutex<pb::StatusResponse>>,
    ) -> Result<(Self, Arc<Admission>), WorkerError> {
        let path = cfg.model_path();
        let t0 = Instant::now();
        let file = Arc::new(GgufFile::open(&path)?);
        let model = Model::load(file.clone())?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let constraints = ConstraintFactory::new(&tokenizer)?;
        let n_ctx = cfg.ctx_size.min(model.n_ctx_train()).max(16);
        let threads = cfg.n_threads();
        let pool = ThreadPool::new(threads)
            .map_err(|e| WorkerError::Internal(format!("thread pool: {e}")))?;
        let slots: Vec<Slot> = (0..cfg.slots.max(1) as u32)
            .map(|i| Slot::new(i, model.new_sequence_state(n_ctx)))
            .collect();
        let n_batch = cfg.micro_batch.clamp(1, n_ctx);
        let scratch = model.new_scratch(n_batch);
        let admission = Arc::new(Admission {
            n_vocab: model.n_vocab(),
            tokenizer,
            template,
            constraints,
            n_ctx,
            default_max_tokens: cfg.default_max_tokens,
        });
        tracing::info!(
            model = %path.display(),
            arch = model.architecture(),
            params = model.n_params(),
            n_ctx,
            slots = slots.len(),
            threads,
            kernels = dsp::backend::select().name(),
            load_ms = t0.elapsed().as_millis() as u64,
            "model loaded"
        );
        let engine = Self {
            logits: vec![0.0; model.n_vocab()],
            model,
            admission: admission.clone(),
            pool,
            slots,
            scratch,
            n_batch,
            served: 0,
            status,
        };
        {
            let mut s = engine
                .status
                .lock()
                .map_err(|_| WorkerError::Internal("status lock poisoned".into()))?;
            s.model = Some(pb::ModelInfo {
                path: path.display().to_string(),
                architecture: engine.model.architecture().into(),
                name: file
                    .get_str_opt("general.name")
                    .unwrap_or_default()
                    .to_string(),
                parameters: engine.model.n_params(),
                file_bytes: file.file_bytes(),
                context_length: n_ctx as u32,
                vocab_size: engine.model.n_vocab() as u32,
                threads: threads as u32,
                kernel_backend: dsp::backend::select().name().into(),
            });
        }
        engine.publish_status();
        Ok((engine, admission))
    }

    fn run(mut self, rx: Receiver<EngineRequest>) {
        while let Ok(req) = rx.recv() {
            let events = req.events.clone();
            if let Err(e) = self.serve(req) {
                tracing::warn!(error = %e, "request failed");
                let _ = events.blocking_send(EngineEvent::Failed(e));
            }
            self.served += 1;
            self.publish_status();
        }
        tracing::info!("engine queue closed; engine thread exits");
    }

    fn publish_status(&self) {
        let Ok(mut s) = self.status.lock() else {
            return;
        };
        s.slots = self
            .slots
            .iter()
            .map(|sl| pb::SlotInfo {
                id: sl.id,
                session_id: sl.session_id.clone(),
                cached_tokens: sl.tokens.len() as u32,
                kv_bytes: sl.seq.bytes_used() as u64,
                busy: false,
            })
            .collect();
        s.cache = Some(pb::CacheInfo {
            kv_bytes_total: self
                .slots
                .iter()
                .map(|sl| sl.seq.bytes_allocated() as u64)
                .sum(),
            n_slots: self.slots.len() as u32,
        });
        s.requests_served = self.served;
    }

    /// Runs one request to completion (or cancellation).
    fn serve(&mut self, mut req: EngineRequest) -> Result<(), WorkerError> {
        let t_start = Instant::now();
        let queue_ms = ms(t_start - req.enqueued_at);
        let si = choose_slot(&self.slots, &req.session_id, &req.prompt);
        self.served_counter_touch(si, &req.session_id);
        let n_prompt = req.prompt.len();

        // Prefix reuse: keep the longest common prefix, but always recompute the last prompt
        // token so its logits exist. A hybrid model's recurrent state is only valid at the
        // slot's full cached length, so it keeps the prefix only when the prompt extends the
        // cached sequence; otherwise the slot is reset (`Slot::truncate` returns what it kept).
        let kv_bound = common_prefix(&self.slots[si].tokens, &req.prompt);
        let reused = self.slots[si].truncate(kv_bound.min(n_prompt - 1));

        // Prefill in micro-batches.
        let mut passes = 0u32;
        let mut pos = reused;
        while pos < n_prompt {
            if req.events.is_closed() {
                tracing::info!(
                    slot = si,
                    pos,
                    "client gone during prefill; request cancelled"
                );
                return Ok(());
            }
            let end = (pos + self.n_batch).min(n_prompt);
            let last = end == n_prompt;
            let slot = &mut self.slots[si];
            let out = self.model.forward(
                &self.pool,
                &mut slot.seq,
                &req.prompt[pos..end],
                &mut self.scratch,
                last,
            )?;
            if let Some(l) = out {
                self.logits.copy_from_slice(l);
            }
            slot.tokens.extend_from_slice(&req.prompt[pos..end]);
            passes += 1;
            pos = end;
        }
        let prefill_ms = ms(t_start.elapsed());
        let prefill = pb::PrefillStats {
            slot_id: self.slots[si].id,
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

        // Decode.
        let t_decode = Instant::now();
        let adm = self.admission.clone();
        let eog = adm.tokenizer.eog_ids().to_vec();
        let mut decoder = IncrementalDecoder::new();
        let mut text = String::new();
        let mut n_out = 0u32;
        let mut rng = match req.sampling {
            SamplingMode::Seeded { seed, .. } => Rng::new(seed),
            SamplingMode::Greedy => Rng::new(0),
        };
        let n_ctx = self.slots[si].seq.n_ctx();
        let stop = loop {
            if let Some(c) = req.constraint.as_mut() {
                c.allowed_tokens()?.apply(&mut self.logits);
            }
            let next = match req.sampling {
                SamplingMode::Greedy => argmax(&self.logits),
                SamplingMode::Seeded {
                    temperature,
                    top_k,
                    top_p,
                    ..
                } => sample(&self.logits, temperature, top_k, top_p, &mut rng),
            };
            let Some(id) = next else {
                return Err(WorkerError::Internal(
                    "no token is allowed by the constraint".into(),
                ));
            };
            if eog.contains(&id) {
                break Stop::Finished(pb::FinishReason::Eos);
            }
            if let Some(c) = req.constraint.as_mut() {
                c.commit(id)?;
            }
            let piece = decoder.push(&adm.tokenizer, id);
            text.push_str(&piece);
            let ev = pb::TokenEvent {
                id,
                text: piece,
                index: n_out,
            };
            n_out += 1;
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
            if req.constraint.as_ref().is_some_and(|c| c.is_finished()) {
                break Stop::Finished(pb::FinishReason::Grammar);
            }
            if n_out >= req.max_tokens {
                break Stop::Finished(pb::FinishReason::Length);
            }
            let slot = &mut self.slots[si];
            if slot.seq.len() + 1 > n_ctx {
                break Stop::Finished(pb::FinishReason::Context);
            }
            let l =
                self.model
                    .forward(&self.pool, &mut slot.seq, &[id], &mut self.scratch, true)?;
            self.logits.copy_from_slice(l.expect("logits requested"));
            slot.tokens.push(id);
            passes += 1;
        };
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
            "request done"
        );
        let _ = req.events.blocking_send(EngineEvent::Done(done));
        Ok(())
    }

    fn served_counter_touch(&mut self, si: usize, session_id: &str) {
        let next = self.slots.iter().map(|s| s.last_used).max().unwrap_or(0) + 1;
        let slot = &mut self.slots[si];
        slot.last_used = next;
        if slot.session_id != session_id {
            slot.session_id = session_id.to_string();
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
