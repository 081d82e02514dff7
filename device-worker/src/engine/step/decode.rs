//! Stage 3, decode: one token at a time (plain greedy or sampled steps, `crate::sampling`),
//! or — greedy with drafters on — speculative rounds: **draft** (the speculator's proposal),
//! **verify** (one pass over the newest token and the draft, logits of every position),
//! **accept** (each draft token while it equals greedy decoding's choice from the previous
//! row), **rollback** (the sequence cut back to the last accepted position). The output is
//! plain greedy decoding's, token for token.

use std::time::Instant;

use gguf::tokenizer::IncrementalDecoder;
use tandem_proto::step::v1 as pb;

use super::super::admission::Admission;
use super::super::compute::Compute;
use super::super::request::{EngineEvent, EngineRequest};
use super::prefill::Prefilled;
use super::restore::Restored;
use super::{ms, StepEnv};
use crate::error::WorkerError;
use crate::sampling::{choose, Rng, SamplingMode};
use crate::speculative::{Draft, DraftContext, DraftTally, ModelAccess, Round, Speculator};

/// Why decoding stopped.
pub(super) enum Stop {
    Finished(pb::FinishReason),
    /// The client went away.
    Cancelled,
}

/// What decoding produced.
pub(super) struct Decoded {
    pub stop: Stop,
    /// Output tokens and their text.
    pub out: Vec<u32>,
    pub text: String,
    pub decode_ms: f64,
    /// Target-model passes of this stage (plain steps and verification passes).
    pub decode_passes: u32,
    pub tally: DraftTally,
}

/// The decode loop's state.
struct Decoder<'a> {
    spec: Option<&'a mut Speculator>,
    /// Output tokens, and the hidden state of each one fed (`[n, n_embd]` by output index).
    out: Vec<u32>,
    out_hidden: Vec<f32>,
    text: String,
    pieces: IncrementalDecoder,
    rng: Rng,
    /// The open verification round, if any.
    round: Option<Round>,
    tally: DraftTally,
    /// The logits row of the last pass the next token is chosen from.
    row: usize,
    decode_passes: u32,
}

/// Decodes until end of generation, a stop string, the grammar's end, the token budget, the
/// context's end or the client's leaving; the slot is left where plain decoding leaves it.
///
/// Errors: a failed pass or rollback (the slot is reset), a grammar that allows no token,
/// a watchdog abandonment.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    env: &mut StepEnv<'_>,
    c: &mut Compute,
    admission: &Admission,
    spec: Option<&mut Speculator>,
    restored: &Restored,
    prefilled: &Prefilled,
    req: &mut EngineRequest,
    rows: &mut Vec<f32>,
) -> Result<Decoded, WorkerError> {
    let t_decode = Instant::now();
    let si = restored.slot;
    let n_prompt = req.prompt.len();
    let n_vocab = c.model.n_vocab();
    let mut d = Decoder {
        spec,
        out: Vec::new(),
        out_hidden: Vec::new(),
        text: String::new(),
        pieces: IncrementalDecoder::new(),
        rng: match req.sampling {
            SamplingMode::Seeded { seed, .. } => Rng::new(seed),
            SamplingMode::Greedy => Rng::new(0),
        },
        round: None,
        tally: DraftTally::default(),
        row: 0,
        decode_passes: 0,
    };
    let stop = loop {
        // Sequence length plain decoding has when it chooses this token.
        let plain_len = n_prompt + d.out.len();
        let logits = &mut rows[d.row * n_vocab..(d.row + 1) * n_vocab];
        let id = choose(&req.sampling, req.constraint.as_mut(), logits, &mut d.rng)?
            .ok_or_else(|| WorkerError::Internal("no token is allowed by the constraint".into()))?;
        // An open round: the token is either its next draft (already fed) or ends it.
        let drafted = d.round.as_mut().is_some_and(|r| r.accept(id));
        if !drafted {
            d.close_round(c, si, plain_len)?;
        }
        if let Some(stop) = d.emit(admission, req, id)? {
            d.close_round(c, si, plain_len)?;
            break stop;
        }
        // Prompt and output fill the context: no token after this one (prompt + output never
        // exceed it, so `usage.total_tokens` stays within the context size).
        if n_prompt + d.out.len() >= c.slots[si].seq.n_ctx() {
            d.close_round(c, si, plain_len)?;
            break Stop::Finished(pb::FinishReason::Context);
        }
        if drafted {
            // Fed by the verification pass: its next row predicts the token after it.
            d.row += 1;
            continue;
        }
        d.feed(env, c, si, req, &prefilled.prompt_hidden, id, rows)?;
    };
    d.learn(req, &prefilled.prompt_hidden, c.model.n_embd());
    Ok(Decoded {
        stop,
        out: d.out,
        text: d.text,
        decode_ms: ms(t_decode.elapsed()),
        decode_passes: d.decode_passes,
        tally: d.tally,
    })
}

impl Decoder<'_> {
    /// **accept**/**rollback**: ends the open round (its acceptance recorded) and cuts the
    /// slot back to `plain_len`, dropping the rejected drafts (or accepted ones past a stop).
    /// A failed rollback resets the slot.
    fn close_round(&mut self, c: &mut Compute, si: usize, plain_len: usize) -> Result<(), WorkerError> {
        let (Some(r), Some(sp)) = (self.round.take(), self.spec.as_deref_mut()) else {
            return Ok(());
        };
        sp.end_round(r, &mut self.tally);
        let slot = &mut c.slots[si];
        if let Err(e) = c.model.rollback(&mut slot.seq, plain_len) {
            slot.reset();
            return Err(e.into());
        }
        slot.tokens.truncate(plain_len);
        if let Some(m) = slot.mtp.as_mut() {
            m.truncate(plain_len);
        }
        Ok(())
    }

    /// Commits and streams token `id`; the reason to stop after it, if any (end of
    /// generation, the client gone, a stop string, the grammar complete, the budget spent).
    fn emit(
        &mut self,
        admission: &Admission,
        req: &mut EngineRequest,
        id: u32,
    ) -> Result<Option<Stop>, WorkerError> {
        if admission.tokenizer.eog_ids().contains(&id) {
            return Ok(Some(Stop::Finished(pb::FinishReason::Eos)));
        }
        if let Some(con) = req.constraint.as_mut() {
            con.commit(id)?;
        }
        let piece = self.pieces.push(&admission.tokenizer, id);
        self.text.push_str(&piece);
        let ev = pb::TokenEvent {
            id,
            text: piece,
            index: self.out.len() as u32,
        };
        self.out.push(id);
        if req.events.blocking_send(EngineEvent::Token(ev)).is_err() {
            return Ok(Some(Stop::Cancelled));
        }
        let text = &self.text;
        if req.stop.iter().any(|s| text.ends_with(s.as_str()) || text.contains(s.as_str())) {
            return Ok(Some(Stop::Finished(pb::FinishReason::Stop)));
        }
        if req.constraint.as_ref().is_some_and(|con| con.is_finished()) {
            return Ok(Some(Stop::Finished(pb::FinishReason::Grammar)));
        }
        if self.out.len() as u32 >= req.max_tokens {
            return Ok(Some(Stop::Finished(pb::FinishReason::Length)));
        }
        Ok(None)
    }

    /// **draft** + **verify**: feeds `id` — with a draft when a drafter has one, as one
    /// verification pass — and keeps the pass's logits rows, hidden states and tokens.
    #[allow(clippy::too_many_arguments)]
    fn feed(
        &mut self,
        env: &mut StepEnv<'_>,
        c: &mut Compute,
        si: usize,
        req: &EngineRequest,
        prompt_hidden: &[f32],
        id: u32,
        rows: &mut Vec<f32>,
    ) -> Result<(), WorkerError> {
        let draft = self.draft(c, si, req, prompt_hidden);
        let mut batch = vec![id];
        if let Some(d) = &draft {
            batch.extend_from_slice(&d.tokens);
        }
        let Compute { model, pool, slots, .. } = c;
        let slot = &mut slots[si];
        let pos0 = slot.seq.len();
        env.begin_batch(pool);
        let t_pass = Instant::now();
        let res = if batch.len() > 1 {
            model.verify(pool, &mut slot.seq, &batch).map(Some)
        } else {
            model.forward(pool, &mut slot.seq, &batch, true)
        };
        let pass_ms = ms(t_pass.elapsed());
        env.end_batch()?;
        let logits = match res {
            Ok(Some(l)) => l,
            Ok(None) => {
                slot.reset();
                return Err(WorkerError::Internal("decode step returned no logits".into()));
            }
            Err(e) => {
                slot.reset();
                return Err(e.into());
            }
        };
        rows.clear();
        rows.extend_from_slice(logits);
        self.row = 0;
        let n_embd = model.n_embd();
        self.out_hidden.truncate((self.out.len() - 1) * n_embd);
        self.out_hidden.extend_from_slice(model.hidden());
        if let Some(m) = slot.mtp.as_mut() {
            m.push_hidden(pos0, model.hidden_rows());
        }
        slot.tokens.extend_from_slice(&batch);
        if let Some(sp) = self.spec.as_deref_mut() {
            sp.record_pass(batch.len() - 1, pass_ms);
        }
        self.round = draft.map(|draft| Round { draft, matched: 0 });
        self.decode_passes += 1;
        Ok(())
    }

    /// The speculator's proposal to follow the newest output token (none with speculation
    /// off), at most what the context and the verification pass hold.
    fn draft(
        &mut self,
        c: &mut Compute,
        si: usize,
        req: &EngineRequest,
        prompt_hidden: &[f32],
    ) -> Option<Draft> {
        let sp = self.spec.as_deref_mut()?;
        let n_embd = c.model.n_embd();
        let k = self.out.len();
        let hidden = if k >= 2 {
            &self.out_hidden[(k - 2) * n_embd..(k - 1) * n_embd]
        } else {
            prompt_hidden
        };
        let ctx = DraftContext {
            prompt: &req.prompt,
            output: &self.out,
            hidden,
        };
        let slot = &mut c.slots[si];
        let room = (slot.seq.n_ctx() - slot.seq.len() - 1).min(sp.pass_capacity() - 1);
        let model = slot.mtp.as_mut().map(|cache| ModelAccess {
            model: &mut c.model,
            pool: &c.pool,
            cache,
            tokens: &slot.tokens,
        });
        sp.propose(&ctx, room, model)
    }

    /// The request's output goes to the drafters that learn from outputs (experience).
    fn learn(&mut self, req: &EngineRequest, prompt_hidden: &[f32], n_embd: usize) {
        let (Some(sp), false) = (self.spec.as_deref_mut(), self.out.is_empty()) else {
            return;
        };
        let fed = self.out.len() - 1;
        self.out_hidden.truncate(fed * n_embd);
        if self.out_hidden.len() == fed * n_embd {
            sp.finish(&req.prompt, prompt_hidden, &self.out, &self.out_hidden);
        }
    }
}
