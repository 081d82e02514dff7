//! Qwen3.5's Gated DeltaNet block (linear attention with a gated delta rule; Yang, Kautz &
//! Hatamizadeh 2024, "Gated Delta Networks", the recurrence in [`dsp::gdn`]).
//!
//! `qkv = W_qkv h` → causal conv + SiLU (state in the layer's conv state) → split `q | k | v`
//! → L2-normalise `q`, `k` per head → `gate = ssm_a · softplus(alpha + dt_bias)`,
//! `beta = sigmoid(W_beta h)` → delta rule (state in the layer's delta-rule state) → per value
//! head `rms_norm(o_h) · ssm_norm · silu(z_h)` → `W_out` (Hugging Face
//! `Qwen3_5GatedDeltaNet.forward`, llama.cpp `build_layer_attn_linear` in
//! `src/models/qwen35.cpp`).

use std::time::Instant;

use dsp::gdn::{self, GdnInputs, GdnShape};
use dsp::ops;
use dsp::pool::ThreadPool;

use super::{Qwen35Config, CHUNKED_MIN_TOKENS, L2_NORM_EPS};
use crate::model::blocks::{sigmoid, Ctx, RmsNorm};
use crate::model::loader::Loader;
use crate::model::op_profile::Laps;
use crate::model::parallel::{for_token_ranges, DisjointMut};
use crate::model::project::{kernel, mm, mm_shared};
use crate::model::weights::Linear;
use crate::model::ModelError;
use crate::state::recurrent::{GdnLayerState, PendingReplay};
use crate::state::rollback::{RollbackPrefill, RollbackStates};

/// Weights of one Gated DeltaNet block (GGUF `blk.{i}.attn_qkv|attn_gate|ssm_*`).
pub(super) struct GatedDeltaNet {
    shape: GdnShape,
    /// `[conv_channels, n_embd]`, rows `q | k | v`.
    wqkv: Linear,
    /// `z`, `[n_v_heads·d_v, n_embd]`.
    wgate: Linear,
    /// `[n_v_heads, n_embd]` each.
    walpha: Linear,
    wbeta: Linear,
    /// `ssm_conv1d.weight` (GGUF `[conv_channels, K]`) as rows of taps.
    conv: gdn::ConvTaps,
    /// `[n_v_heads]`: `−exp(A_log)` and `dt_bias`.
    a: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `ssm_norm` `[d_v]`, shared by all heads.
    norm: RmsNorm,
    /// `[n_embd, n_v_heads·d_v]`.
    wout: Linear,
    /// Index of this layer in the [`crate::state::recurrent::RecurrentState`].
    state_layer: usize,
}

/// Buffers of [`GatedDeltaNet::forward`] for micro-batches of up to `n_batch` tokens.
pub(super) struct GdnScratch {
    qkv: Vec<f32>,
    conv_out: Vec<f32>,
    z: Vec<f32>,
    alpha: Vec<f32>,
    beta: Vec<f32>,
    gq: Vec<f32>,
    gk: Vec<f32>,
    gv: Vec<f32>,
    gout: Vec<f32>,
}

impl GdnScratch {
    /// Buffers for `n` tokens of the GDN layers of `c`.
    pub(super) fn new(n: usize, c: &Qwen35Config) -> Self {
        let g = c.gdn;
        let (kd, vd) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v);
        Self {
            qkv: vec![0.0; n * c.conv_channels()],
            conv_out: vec![0.0; n * c.conv_channels()],
            z: vec![0.0; n * vd],
            alpha: vec![0.0; n * g.n_v_heads],
            beta: vec![0.0; n * g.n_v_heads],
            gq: vec![0.0; n * kd],
            gk: vec![0.0; n * kd],
            gv: vec![0.0; n * vd],
            gout: vec![0.0; n * vd],
        }
    }
}

impl GatedDeltaNet {
    /// Binds `{prefix}.attn_qkv|attn_gate|ssm_alpha|ssm_beta|ssm_conv1d|ssm_norm|ssm_out
    /// .weight`, `{prefix}.ssm_a` and `{prefix}.ssm_dt.bias`; the block's recurrent state is
    /// layer `state_layer` of the sequence's.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub(super) fn new(
        loader: &Loader<'_>,
        prefix: &str,
        c: &Qwen35Config,
        state_layer: usize,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| Loader::weight_name(prefix, t);
        let e = c.n_embd;
        let g = c.gdn;
        let vd = g.n_v_heads * g.d_v;
        Ok(Self {
            shape: g,
            wqkv: loader.linear(&n("attn_qkv"), c.conv_channels(), e)?,
            wgate: loader.linear(&n("attn_gate"), vd, e)?,
            walpha: loader.linear(&n("ssm_alpha"), g.n_v_heads, e)?,
            wbeta: loader.linear(&n("ssm_beta"), g.n_v_heads, e)?,
            conv: gdn::ConvTaps::new(&loader.vector(&n("ssm_conv1d"), c.conv_channels() * c.conv_kernel)?, c.conv_channels())
                .map_err(kernel("ssm_conv1d"))?,
            a: loader.vector(&format!("{prefix}.ssm_a"), g.n_v_heads)?,
            dt_bias: loader.vector(&format!("{prefix}.ssm_dt.bias"), g.n_v_heads)?,
            norm: RmsNorm::new(loader, &format!("{prefix}.ssm_norm"), g.d_v, c.rms_eps)?,
            wout: loader.linear(&n("ssm_out"), e, vd)?,
            state_layer,
        })
    }

    /// Index of this layer in the recurrent state.
    pub(super) fn state_layer(&self) -> usize {
        self.state_layer
    }

    /// Weights in the block.
    pub(super) fn numel(&self) -> usize {
        self.wqkv.numel()
            + self.wgate.numel()
            + self.walpha.numel()
            + self.wbeta.numel()
            + self.conv.len()
            + self.a.len()
            + self.dt_bias.len()
            + self.norm.len()
            + self.wout.numel()
    }

    fn channels(&self) -> usize {
        self.wqkv.rows
    }

    /// The block on the normalised input `h` `[n, n_embd]`; writes `out` `[n, n_embd]` and
    /// advances `st`. With `rollback` states the conv and delta-rule states after each of the
    /// last `slots_for(n)` tokens are also kept (Tandem §3.3: aware = the head of the batch
    /// chunked, the rest per token; per-token = all per token). Returns the milliseconds
    /// spent on rollback states.
    ///
    /// Errors: [`ModelError::Kernel`] naming the weight or op.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        ctx: Ctx<'_>,
        st: &mut GdnLayerState,
        h: &[f32],
        n: usize,
        s: &mut GdnScratch,
        mut rollback: Option<&mut RollbackStates>,
        out: &mut [f32],
        laps: &mut Laps<'_>,
    ) -> Result<f64, ModelError> {
        let m = rollback.as_ref().map_or(0, |r| r.slots_for(n));
        let rb = rollback.as_deref_mut().filter(|_| m > 0);
        let mut rb_ms = self.project_and_conv(ctx, &mut st.conv, h, n, s, rb, m, laps)?;
        self.normalise_and_gate(ctx.pool, n, s);
        laps.lap("gdn l2norm + gates");
        rb_ms += self.delta(ctx.pool, st, n, s, rollback.filter(|_| m > 0), m)?;
        laps.lap("gdn delta rule (chunked / recurrent)");
        self.gated_norm(ctx.pool, n, s)?;
        laps.lap("gdn gated norm");
        let vd = self.shape.n_v_heads * self.shape.d_v;
        let r = mm(ctx.pool, &self.wout, ctx.bytes, &s.gv[..n * vd], n, out);
        laps.lap("gdn out projection");
        r.map(|()| rb_ms)
    }

    /// Projections `qkv, z, alpha, beta`, the conv states of rollback (`m − 1` of them; the
    /// last of the `m` states is the live one), then
    /// the causal conv + SiLU into `s.conv_out`, advancing the layer's conv state
    /// `conv_state` `[K − 1, channels]`. Returns the milliseconds of the conv-state copies.
    #[allow(clippy::too_many_arguments)]
    fn project_and_conv(
        &self,
        ctx: Ctx<'_>,
        conv_state: &mut [f32],
        h: &[f32],
        n: usize,
        s: &mut GdnScratch,
        rollback: Option<&mut RollbackStates>,
        m: usize,
        laps: &mut Laps<'_>,
    ) -> Result<f64, ModelError> {
        let g = self.shape;
        let ch = self.channels();
        let (vd, hv) = (g.n_v_heads * g.d_v, g.n_v_heads);
        mm_shared(
            ctx.pool,
            ctx.bytes,
            h,
            n,
            &mut [
                (&self.wqkv, &mut s.qkv[..n * ch]),
                (&self.wgate, &mut s.z[..n * vd]),
                (&self.walpha, &mut s.alpha[..n * hv]),
                (&self.wbeta, &mut s.beta[..n * hv]),
            ],
        )?;
        laps.lap("gdn projections (qkv, z, alpha, beta)");
        let t_rb = Instant::now();
        if let Some(rb) = rollback.filter(|_| m > 1) {
            // Slots 0..m − 1 (the last state is the live one, module docs of `rollback`).
            conv_snapshots(conv_state, &s.qkv[..n * ch], n, ch, m, &mut rb.layer_mut(self.state_layer).conv);
        }
        let rb_ms = ms_since(t_rb);
        gdn::conv1d_silu_taps(
            Some(ctx.pool),
            &s.qkv[..n * ch],
            n,
            &self.conv,
            conv_state,
            &mut s.conv_out[..n * ch],
        )
        .map_err(kernel("ssm_conv1d"))?;
        laps.lap("gdn conv1d + silu");
        Ok(rb_ms)
    }

    /// Per token: split `conv_out` into `q | k | v`, L2-normalise `q`, `k` per head into
    /// `gq`, `gk` (`v` into `gv`), and turn `alpha`, `beta` into the decay
    /// `ssm_a · softplus(alpha + dt_bias)` and `sigmoid(beta)` in place.
    fn normalise_and_gate(&self, pool: &ThreadPool, n: usize, s: &mut GdnScratch) {
        let g = self.shape;
        let ch = self.channels();
        let (kd, vd, hv) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v, g.n_v_heads);
        let (gq, gk) = (DisjointMut::new(&mut s.gq[..n * kd]), DisjointMut::new(&mut s.gk[..n * kd]));
        let gv = DisjointMut::new(&mut s.gv[..n * vd]);
        let (alpha, beta) = (DisjointMut::new(&mut s.alpha[..n * hv]), DisjointMut::new(&mut s.beta[..n * hv]));
        let conv_out = &s.conv_out[..n * ch];
        for_token_ranges(pool, n, &|r| {
            for t in r {
                let row = &conv_out[t * ch..(t + 1) * ch];
                let (q, rest) = row.split_at(kd);
                let (k, v) = rest.split_at(kd);
                // SAFETY: token t's rows; the ranges of the tasks are disjoint.
                let (gq, gk, gv, alpha, beta) = unsafe {
                    (gq.chunk(t * kd, kd), gk.chunk(t * kd, kd), gv.chunk(t * vd, vd), alpha.chunk(t * hv, hv), beta.chunk(t * hv, hv))
                };
                l2_normalize_heads(q, g.d_k, gq);
                l2_normalize_heads(k, g.d_k, gk);
                gv.copy_from_slice(v);
                for h in 0..hv {
                    alpha[h] = self.a[h] * softplus(alpha[h] + self.dt_bias[h]);
                    beta[h] = sigmoid(beta[h]);
                }
            }
        });
    }

    /// The delta rule over the batch into `s.gout`, keeping `m` rollback states when given
    /// (module docs). Returns the milliseconds of the passes that wrote rollback states.
    fn delta(
        &self,
        pool: &ThreadPool,
        st: &mut GdnLayerState,
        n: usize,
        s: &mut GdnScratch,
        rollback: Option<&mut RollbackStates>,
        m: usize,
    ) -> Result<f64, ModelError> {
        let g = self.shape;
        let (kd, vd, hv) = (g.n_k_heads * g.d_k, g.n_v_heads * g.d_v, g.n_v_heads);
        let inputs = GdnInputs {
            shape: g,
            q: &s.gq[..n * kd],
            k: &s.gk[..n * kd],
            v: &s.gv[..n * vd],
            gate: &s.alpha[..n * hv],
            beta: &s.beta[..n * hv],
        };
        let out = &mut s.gout[..n * vd];
        // The pending replay of the last pass's log or of a rollback inside it
        // (`state/recurrent.rs`): the first kernel call applies it.
        let pending = st.pending.take();
        let mut pend = pending.as_ref().map(PendingReplay::inputs);
        let Some(rb) = rollback else {
            return delta_rule(pool, &inputs, 0..n, &mut st.ssm, out, pend).map(|()| 0.0);
        };
        // Tokens before `start` run in place (chunked when long enough in aware mode); the
        // rest through the per-token recurrence with a rollback log: the state before them
        // is kept as the base and their writes `δ` logged and left pending, so the next pass
        // replays them, or a rollback the kept ones (module docs of `rollback`).
        let mode = rb.mode;
        let start = log_start(mode, n, m);
        if start > 0 {
            match mode {
                RollbackPrefill::Aware => delta_rule(pool, &inputs, 0..start, &mut st.ssm, out, pend.take())?,
                RollbackPrefill::PerToken => per_token(pool, &inputs, 0..start, &mut st.ssm, out, pend.take(), None)?,
            }
        }
        let mut rb_ms = 0.0;
        if start < n {
            let t = Instant::now();
            let logged = n - start;
            let log = &mut rb.layer_mut(self.state_layer).log;
            let delta = gdn::RollbackLog { delta: &mut log.delta[..logged * vd] };
            per_token(pool, &inputs, start..n, &mut st.ssm, out, pend.take(), Some(delta))?;
            let freed = pending.map(|p| p.log);
            log.k[..logged * kd].copy_from_slice(&inputs.k[start * kd..]);
            log.gate[..logged * hv].copy_from_slice(&inputs.gate[start * hv..]);
            // `st.ssm` is the base: the state after the pass is the base with the log replayed.
            st.pending = Some(rb.hand_log(self.state_layer, logged, freed));
            rb_ms = ms_since(t);
        } else if let Some(p) = pending {
            rb.keep_free_log(self.state_layer, p.log);
        }
        Ok(rb_ms)
    }

    /// Gated RMSNorm per value head (weights shared by all heads): `gv = rms_norm(gout_h) ·
    /// ssm_norm · silu(z_h)` (`gv` is free after the delta rule).
    fn gated_norm(&self, pool: &ThreadPool, n: usize, s: &mut GdnScratch) -> Result<(), ModelError> {
        let vd = self.shape.n_v_heads * self.shape.d_v;
        let (gout, norm) = (&s.gout[..n * vd], &self.norm);
        let (gv, z) = (DisjointMut::new(&mut s.gv[..n * vd]), DisjointMut::new(&mut s.z[..n * vd]));
        let failed = std::sync::Mutex::new(None);
        for_token_ranges(pool, n, &|r| {
            let (a, len) = (r.start * vd, r.len() * vd);
            // SAFETY: the rows of this task's tokens; the ranges are disjoint.
            let (gv, z) = unsafe { (gv.chunk(a, len), z.chunk(a, len)) };
            if let Err(e) = norm.forward(&gout[a..a + len], gv) {
                *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                return;
            }
            ops::silu_inplace(z);
            for (o, &zi) in gv.iter_mut().zip(z.iter()) {
                *o *= zi;
            }
        });
        match failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The gated delta rule over the tokens `range` of a micro-batch's inputs `x`, no rollback
/// states: chunked for [`CHUNKED_MIN_TOKENS`] tokens or more (after a separate sweep for a
/// pending replay), else [`per_token`] (the replay fused); `out` is the whole batch's output
/// `[n, H·d_v]`.
fn delta_rule(
    pool: &ThreadPool,
    x: &GdnInputs<'_>,
    range: std::ops::Range<usize>,
    ssm: &mut [f32],
    out: &mut [f32],
    pending: Option<gdn::ReplayInputs<'_>>,
) -> Result<(), ModelError> {
    if range.len() < CHUNKED_MIN_TOKENS {
        return per_token(pool, x, range, ssm, out, pending, None);
    }
    if let Some(p) = pending {
        gdn::gdn_replay(pool, p, ssm).map_err(kernel("gated_delta_net replay"))?;
    }
    let vd = x.shape.n_v_heads * x.shape.d_v;
    let out = &mut out[range.start * vd..range.end * vd];
    gdn::gdn_chunked_pooled(pool, x.tokens(range), ssm, out, gdn::DEFAULT_CHUNK).map_err(kernel("gated_delta_net"))
}

/// The per-token gated delta rule over the tokens `range` (per token also when long: a
/// rollback must replay the recurrence's own writes), applying a pending replay first and
/// keeping a rollback log when given ([`gdn::gdn_recurrent`]); `out` as [`delta_rule`].
fn per_token(
    pool: &ThreadPool,
    x: &GdnInputs<'_>,
    range: std::ops::Range<usize>,
    ssm: &mut [f32],
    out: &mut [f32],
    pending: Option<gdn::ReplayInputs<'_>>,
    log: Option<gdn::RollbackLog<'_>>,
) -> Result<(), ModelError> {
    let vd = x.shape.n_v_heads * x.shape.d_v;
    let out = &mut out[range.start * vd..range.end * vd];
    gdn::gdn_recurrent_pooled(pool, x.tokens(range), ssm, out, pending, log).map_err(kernel("gated_delta_net"))
}

/// The first token of a pass of `n` tokens keeping `m` rollback states that the per-token
/// recurrence logs for a rollback by replay (`n`: nothing to log, `m ≤ 1`). The states kept
/// are those after tokens `n − m ..= n − 1`; the log starts at `n − m` (the state before it
/// is the base, so every kept state is one replay away), or at `n − m + 1` when the aware
/// prefill runs the tokens before it chunked (Tandem §3.3; the base is then the state after
/// token `n − m` itself).
pub(super) fn log_start(mode: RollbackPrefill, n: usize, m: usize) -> usize {
    let head = n + 1 - m.max(1);
    match mode {
        _ if m <= 1 => n,
        RollbackPrefill::Aware if head >= CHUNKED_MIN_TOKENS => head,
        _ => n - m,
    }
}

/// Conv states after each of the last `m` tokens of a batch but the last, for rollback
/// (`m ≥ 2`): with `x_ext = conv_state ++ x` (`[K − 1 + n, ch]`), the state after token
/// `j = n − m + i` is `x_ext[j + 1 .. j + K]`, so rows `n − m + 1 .. n + K − 2` of `x_ext`
/// hold all `m − 1` of them (slot `i` = rows `i .. i + K − 1`; module docs of `rollback`).
/// They go to the front of `rows`.
fn conv_snapshots(conv_state: &[f32], x: &[f32], n: usize, ch: usize, m: usize, rows: &mut [f32]) {
    let hist = conv_state.len() / ch;
    let (first, count) = (n - m + 1, m + hist - 2);
    let rows = &mut rows[..count * ch];
    // Rows of x_ext below `hist` come from the conv state, the rest from `x`.
    let from_state = hist.saturating_sub(first).min(count);
    if from_state > 0 {
        rows[..from_state * ch].copy_from_slice(&conv_state[first * ch..][..from_state * ch]);
    }
    let x0 = (first + from_state - hist) * ch;
    rows[from_state * ch..].copy_from_slice(&x[x0..x0 + (count - from_state) * ch]);
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// `out_h = x_h / sqrt(Σ x_h² + ε)` for every `d`-wide head (HF `l2norm`, ε = [`L2_NORM_EPS`];
/// the sum in f64).
fn l2_normalize_heads(x: &[f32], d: usize, out: &mut [f32]) {
    for (xh, oh) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f64 = xh.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = (1.0 / (ss + L2_NORM_EPS as f64).sqrt()) as f32;
        for (o, &v) in oh.iter_mut().zip(xh) {
            *o = v * inv;
        }
    }
}

/// `log(1 + e^x)`, linear above 20 (PyTorch `F.softplus` threshold; ggml `ggml_softplus`).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_norm_gives_unit_heads_and_softplus_matches_definition() {
        let x = [3.0f32, 4.0, 0.0, 1.0, 0.0, 0.0];
        let mut o = [0f32; 6];
        l2_normalize_heads(&x, 3, &mut o);
        assert!(
            (o[0] - 0.6).abs() < 1e-6 && (o[1] - 0.8).abs() < 1e-6 && (o[3] - 1.0).abs() < 1e-6
        );
        for v in [-5.0f32, 0.0, 2.0, 19.0] {
            assert!((softplus(v) - (1.0 + v.exp()).ln()).abs() < 1e-5);
        }
        assert_eq!(softplus(30.0), 30.0);
    }
}
