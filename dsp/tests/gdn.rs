//! Gated DeltaNet kernels: the chunked form against the per-token recurrence, state
//! continuity across calls, rollback by replay (the log, the replay and the fused pending
//! replay), the pooled variants, hand-computable cases,
//! the short convolution (batch against per-token and against its definition), and shape
//! errors.

mod common;

use common::Rng;
use dsp::gdn::{
    conv1d_silu, conv1d_silu_step, conv1d_silu_taps, gdn_chunked, gdn_recurrent, gdn_replay, ConvTaps, GdnInputs,
    GdnShape, ReplayInputs, RollbackLog, DEFAULT_CHUNK,
};
use dsp::{DspError, ThreadPool};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Chunked vs recurrent: the same sums in another order (products of decays `e^{G_t−G_s}`
/// instead of running decays, a triangular solve instead of sequential updates), in f32 over
/// up to 1024 tokens; per element `|a − b| ≤ TOL · (1 + |b|)`. Observed at most 3e-6 (one
/// 150-token chunk, d_k = 16); 2e-5 leaves a 7× margin and still catches any wrong term.
const CHUNK_TOL: f32 = 2e-5;
/// f32 kernels against f64 hand evaluations of a few tokens.
const HAND_TOL: f32 = 1e-5;

// === inputs ===

#[derive(Clone)]
struct Case {
    shape: GdnShape,
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    beta: Vec<f32>,
    state0: Vec<f32>,
}

fn l2_normalise_heads(x: &mut [f32], d: usize) {
    for head in x.chunks_exact_mut(d) {
        let norm = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        for v in head {
            *v /= norm;
        }
    }
}

fn softplus(x: f32) -> f32 {
    (1.0 + x.exp()).ln()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Random inputs shaped like a Qwen3.5 GDN layer's: unit-norm q/k heads, gates
/// `-exp(A_log)·softplus(a)` with `exp(A_log)` in `[e^-1, e]`, beta through a sigmoid.
fn random_case(shape: GdnShape, n: usize, seed: u64) -> Case {
    let mut rng = Rng(seed);
    let mut q = rng.vec(n * shape.n_k_heads * shape.d_k);
    let mut k = rng.vec(n * shape.n_k_heads * shape.d_k);
    l2_normalise_heads(&mut q, shape.d_k);
    l2_normalise_heads(&mut k, shape.d_k);
    let v = rng.vec(n * shape.n_v_heads * shape.d_v);
    let gate = (0..n * shape.n_v_heads)
        .map(|_| -rng.unit().exp() * softplus(rng.normal()))
        .collect();
    let beta = (0..n * shape.n_v_heads)
        .map(|_| sigmoid(rng.normal()))
        .collect();
    let state0 = rng.vec(shape.state_len());
    Case {
        shape,
        n,
        q,
        k,
        v,
        gate,
        beta,
        state0,
    }
}

impl Case {
    fn out_len(&self) -> usize {
        self.n * self.shape.n_v_heads * self.shape.d_v
    }

    /// Tokens `a..b` as a new case starting from `state0`.
    fn slice(&self, a: usize, b: usize, state0: Vec<f32>) -> Case {
        let x = self.inputs().tokens(a..b);
        Case {
            shape: self.shape,
            n: b - a,
            q: x.q.to_vec(),
            k: x.k.to_vec(),
            v: x.v.to_vec(),
            gate: x.gate.to_vec(),
            beta: x.beta.to_vec(),
            state0,
        }
    }

    /// This case's five input tensors.
    fn inputs(&self) -> GdnInputs<'_> {
        let (q, k, v, gate, beta) = (&self.q, &self.k, &self.v, &self.gate, &self.beta);
        GdnInputs { shape: self.shape, q, k, v, gate, beta }
    }

    /// [`gdn_recurrent`] on this case's inputs, on `pool` or (`None`) the calling thread,
    /// with an optional rollback log.
    fn run_recurrent(
        &self,
        pool: Option<&ThreadPool>,
        state: &mut [f32],
        out: &mut [f32],
        log: Option<RollbackLog<'_>>,
    ) -> Result<(), DspError> {
        gdn_recurrent(pool, self.inputs(), state, out, None, log)
    }

    /// The first `j` tokens of this case with `delta` (a log of this case) as replay inputs.
    fn replay_inputs<'a>(&'a self, delta: &'a [f32], j: usize) -> ReplayInputs<'a> {
        let x = self.inputs().tokens(0..j);
        let vd = self.shape.n_v_heads * self.shape.d_v;
        ReplayInputs { shape: self.shape, k: x.k, gate: x.gate, delta: &delta[..j * vd] }
    }

    /// A logged run from `state0`: (out, the base left in `state`, `δ`).
    fn logged(&self, pool: Option<&ThreadPool>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mut out, mut state) = self.buffers();
        let mut delta = vec![f32::NAN; self.out_len()];
        self.run_recurrent(pool, &mut state, &mut out, Some(RollbackLog { delta: &mut delta })).expect("gdn_recurrent");
        (out, state, delta)
    }

    /// [`gdn_chunked`] on this case's inputs, on `pool` or (`None`) the calling thread.
    fn run_chunked(
        &self,
        pool: Option<&ThreadPool>,
        state: &mut [f32],
        out: &mut [f32],
        chunk: usize,
    ) -> Result<(), DspError> {
        gdn_chunked(pool, self.inputs(), state, out, chunk)
    }

    /// Zeroed output and a copy of `state0`: the buffers of one run.
    fn buffers(&self) -> (Vec<f32>, Vec<f32>) {
        (vec![0f32; self.out_len()], self.state0.clone())
    }

    /// (out, final state) of the recurrence.
    fn recurrent(&self) -> (Vec<f32>, Vec<f32>) {
        let (mut out, mut state) = self.buffers();
        self.run_recurrent(None, &mut state, &mut out, None)
            .expect("gdn_recurrent");
        (out, state)
    }

    /// (out, final state) of the chunked form.
    fn chunked(&self, chunk: usize) -> (Vec<f32>, Vec<f32>) {
        let (mut out, mut state) = self.buffers();
        self.run_chunked(None, &mut state, &mut out, chunk)
            .expect("gdn_chunked");
        (out, state)
    }
}

/// Largest `|a − b| / (1 + |b|)`; fails on a NaN or different lengths.
#[track_caller]
fn max_rel_err(a: &[f32], b: &[f32]) -> f32 {
    test_support::max_rel_diff(a, b)
}

fn assert_chunked_matches(case: &Case, chunk: usize) {
    let (out_r, state_r) = case.recurrent();
    let (out_c, state_c) = case.chunked(chunk);
    let (eo, es) = (max_rel_err(&out_c, &out_r), max_rel_err(&state_c, &state_r));
    assert!(
        eo <= CHUNK_TOL && es <= CHUNK_TOL,
        "n={} chunk={chunk} {:?}: out err {eo}, state err {es}",
        case.n,
        case.shape
    );
}

/// `n_k_heads` key heads, `n_v_heads` value heads, head dims `d_k` and `d_v`.
const fn gdn_shape(n_k_heads: usize, n_v_heads: usize, d_k: usize, d_v: usize) -> GdnShape {
    GdnShape {
        n_k_heads,
        n_v_heads,
        d_k,
        d_v,
    }
}

const SHAPE: GdnShape = gdn_shape(2, 4, 16, 8);

// === chunked == recurrent ===

#[test]
fn chunked_matches_recurrent_length_sweep() {
    for (i, &n) in [1, 2, 3, 63, 64, 65, 127, 128, 129, 500, 1024]
        .iter()
        .enumerate()
    {
        let case = random_case(SHAPE, n, 100 + i as u64);
        assert_chunked_matches(&case, DEFAULT_CHUNK);
    }
}

#[test]
fn chunked_matches_recurrent_qwen_head_dims() {
    // One Qwen3.5 head geometry (d_k = d_v = 128), two value heads per key head.
    let shape = gdn_shape(1, 2, 128, 128);
    let case = random_case(shape, 200, 7);
    assert_chunked_matches(&case, DEFAULT_CHUNK);
}

#[test]
fn chunked_with_chunk_one_and_odd_chunks() {
    let case = random_case(SHAPE, 150, 3);
    for chunk in [1, 5, 64, 149, 150, 151, 4096] {
        assert_chunked_matches(&case, chunk);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn chunked_matches_recurrent_random(
        n in 1usize..=1024,
        chunk in prop_oneof![Just(DEFAULT_CHUNK), 1usize..100],
        n_k in 1usize..=2,
        ratio in 1usize..=2,
        d_k in 1usize..=20,
        d_v in 1usize..=12,
        seed in any::<u64>(),
    ) {
        let shape = GdnShape { n_k_heads: n_k, n_v_heads: n_k * ratio, d_k, d_v };
        let case = random_case(shape, n, seed);
        let (out_r, state_r) = case.recurrent();
        let (out_c, state_c) = case.chunked(chunk);
        prop_assert!(max_rel_err(&out_c, &out_r) <= CHUNK_TOL, "out err {}", max_rel_err(&out_c, &out_r));
        prop_assert!(max_rel_err(&state_c, &state_r) <= CHUNK_TOL, "state err {}", max_rel_err(&state_c, &state_r));
    }
}

// === continuity and snapshots ===

#[test]
fn recurrent_two_calls_equal_one_call() {
    let case = random_case(SHAPE, 40, 11);
    let (out, state) = case.recurrent();
    for split in [1, 17, 39] {
        let (out_a, state_a) = case.slice(0, split, case.state0.clone()).recurrent();
        let (out_b, state_b) = case.slice(split, case.n, state_a).recurrent();
        assert_eq!([out_a, out_b].concat(), out, "split at {split}");
        assert_eq!(state_b, state, "split at {split}");
    }
}

#[test]
fn chunked_two_calls_equal_one_call() {
    let case = random_case(SHAPE, 200, 12);
    let (out, state) = case.chunked(DEFAULT_CHUNK);
    // At a chunk boundary the arithmetic is the same: bit-identical.
    let (out_a, state_a) = case
        .slice(0, 128, case.state0.clone())
        .chunked(DEFAULT_CHUNK);
    let (out_b, state_b) = case.slice(128, 200, state_a).chunked(DEFAULT_CHUNK);
    assert_eq!([out_a, out_b].concat(), out);
    assert_eq!(state_b, state);
    // Elsewhere the chunks differ, so the rounding does.
    let (out_a, state_a) = case
        .slice(0, 77, case.state0.clone())
        .chunked(DEFAULT_CHUNK);
    let (out_b, state_b) = case.slice(77, 200, state_a).chunked(DEFAULT_CHUNK);
    assert!(max_rel_err(&[out_a, out_b].concat(), &out) <= CHUNK_TOL);
    assert!(max_rel_err(&state_b, &state) <= CHUNK_TOL);
}

#[test]
fn rollback_prefill_chunked_then_recurrent_matches_recurrent() {
    // The speculative-decoding prefill: chunked over the first n − K + 1 tokens, then the
    // recurrence with a rollback log over the remaining K − 1.
    let (n, kk) = (100, 4);
    let case = random_case(SHAPE, n, 13);
    let (out, state) = case.recurrent();
    let head = n - kk + 1;
    let (out_a, state_a) = case
        .slice(0, head, case.state0.clone())
        .chunked(DEFAULT_CHUNK);
    let tail = case.slice(head, n, state_a.clone());
    let (out_b, base, delta) = tail.logged(None);
    assert!(max_rel_err(&[out_a, out_b].concat(), &out) <= CHUNK_TOL);
    let mut fin = base.clone();
    gdn_replay(None, tail.replay_inputs(&delta, kk - 1), &mut fin).expect("gdn_replay");
    assert!(max_rel_err(&fin, &state) <= CHUNK_TOL);
    assert_eq!(base, state_a, "the base is the state before the logged tokens");
    // One token before the end: the base with the first K − 2 logged tokens replayed.
    let (_, before_last) = case.slice(head, n - 1, state_a).recurrent();
    let mut replayed = base;
    gdn_replay(None, tail.replay_inputs(&delta, kk - 2), &mut replayed).expect("gdn_replay");
    assert_eq!(replayed, before_last);
}

/// The recurrence as its definition reads, two sweeps over the state per token and head
/// (decay and read `Sᵀk`; write `k⊗δ` and read `Sᵀq`), each element's operations in the order
/// `gdn_recurrent` documents: the kernel's one-sweep form must give these bits.
fn two_sweep_recurrent(case: &Case) -> (Vec<f32>, Vec<f32>) {
    let GdnShape { n_k_heads, n_v_heads, d_k, d_v } = case.shape;
    let (mut state, mut out) = (case.state0.clone(), vec![0f32; case.n * n_v_heads * d_v]);
    let scale = 1.0 / (d_k as f32).sqrt();
    for h in 0..n_v_heads {
        let kh = h % n_k_heads; // key heads tiled over the value heads (GdnShape::k_head_of)
        let s = &mut state[h * d_k * d_v..][..d_k * d_v];
        for t in 0..case.n {
            let k = &case.k[(t * n_k_heads + kh) * d_k..][..d_k];
            let q = &case.q[(t * n_k_heads + kh) * d_k..][..d_k];
            let v = &case.v[(t * n_v_heads + h) * d_v..][..d_v];
            let (decay, beta) = (case.gate[t * n_v_heads + h].exp(), case.beta[t * n_v_heads + h]);
            let mut delta = vec![0f32; d_v];
            for (row, &ki) in s.chunks_exact_mut(d_v).zip(k) {
                for (sv, d) in row.iter_mut().zip(delta.iter_mut()) {
                    *sv *= decay;
                    *d = ki.mul_add(*sv, *d);
                }
            }
            for (d, &vv) in delta.iter_mut().zip(v) {
                *d = beta * (vv - *d);
            }
            let o = &mut out[(t * n_v_heads + h) * d_v..][..d_v];
            for ((row, &ki), &qi) in s.chunks_exact_mut(d_v).zip(k).zip(q) {
                for ((sv, &d), o) in row.iter_mut().zip(&delta).zip(o.iter_mut()) {
                    *sv = ki.mul_add(d, *sv);
                    *o = qi.mul_add(*sv, *o);
                }
            }
            for o in o.iter_mut() {
                *o *= scale;
            }
        }
    }
    (out, state)
}

#[test]
fn recurrent_equals_the_two_sweep_definition_bitwise() {
    for (shape, n) in [(SHAPE, 1), (SHAPE, 9), (gdn_shape(2, 6, 12, 10), 5), (gdn_shape(1, 1, 128, 128), 4)] {
        let case = random_case(shape, n, 57);
        let (out, state) = case.recurrent();
        let (out_ref, state_ref) = two_sweep_recurrent(&case);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&out_ref), "out, {shape:?}, n = {n}");
        assert_eq!(bits(&state), bits(&state_ref), "state, {shape:?}, n = {n}");
    }
}

/// Bit patterns, for exact comparisons that also hold for NaN payloads.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn rollback_log_keeps_the_base_and_replays_rebuild_every_state() {
    for (shape, n) in [(SHAPE, 9), (gdn_shape(2, 6, 12, 10), 5), (gdn_shape(1, 2, 128, 160), 3)] {
        let case = random_case(shape, n, 21);
        let (out, base, delta) = case.logged(None);
        let (out_plain, _) = case.recurrent();
        assert_eq!(bits(&out), bits(&out_plain), "the log must not change the output");
        assert_eq!(bits(&base), bits(&case.state0), "the state is left as the base");
        // j = n: the pass's final state, which it does not write, is the whole log replayed.
        for j in 0..=n {
            // The state after the first j tokens: the base with j tokens replayed.
            let (_, prefix_state) = case.slice(0, j.max(1), case.state0.clone()).recurrent();
            let want = if j == 0 { case.state0.clone() } else { prefix_state };
            let mut replayed = base.clone();
            gdn_replay(None, case.replay_inputs(&delta, j), &mut replayed).expect("gdn_replay");
            assert_eq!(bits(&replayed), bits(&want), "{shape:?}: replay of {j} tokens");
        }
    }
}

#[test]
fn pending_replay_is_fused_with_the_bits_of_a_separate_replay() {
    // A pass that kept `j` tokens of a previous pass, then 4 new tokens: the pending replay
    // applied by the pass equals replaying first, with and without a log of the new pass,
    // and past the fused limit (the separate sweep).
    let shape = gdn_shape(2, 4, 16, 40);
    let prev = random_case(shape, 20, 3);
    let (_, base, delta) = prev.logged(None);
    for j in [1, 3, 17] {
        let next = random_case(shape, 4, 5 + j as u64);
        let mut settled = base.clone();
        gdn_replay(None, prev.replay_inputs(&delta, j), &mut settled).expect("gdn_replay");
        let want = next.slice(0, 4, settled.clone()).recurrent();
        for with_log in [false, true] {
            let (mut state, mut out) = (base.clone(), vec![0f32; next.out_len()]);
            let mut d = vec![0f32; next.out_len()];
            let log = with_log.then(|| RollbackLog { delta: &mut d });
            gdn_recurrent(None, next.inputs(), &mut state, &mut out, Some(prev.replay_inputs(&delta, j)), log)
                .expect("gdn_recurrent");
            assert_eq!(bits(&out), bits(&want.0), "j {j} log {with_log}: out");
            if with_log {
                assert_eq!(bits(&state), bits(&settled), "j {j}: the base is the replayed state");
                let mut end = state.clone();
                gdn_replay(None, next.replay_inputs(&d, 4), &mut end).expect("gdn_replay");
                assert_eq!(bits(&end), bits(&want.1), "j {j}: the base with the new log replayed is the final state");
            } else {
                assert_eq!(bits(&state), bits(&want.1), "j {j}: final state");
            }
        }
    }
}

#[test]
fn pooled_variants_are_bit_identical() {
    let pool = ThreadPool::new(3).expect("pool");
    let shape = gdn_shape(2, 6, 12, 10);
    let case = random_case(shape, 70, 31);

    let logged_serial = case.logged(None);
    let logged_pooled = case.logged(Some(&pool));
    assert_eq!(logged_pooled, logged_serial);
    let (out_s, state_s) = case.recurrent();
    assert_eq!(logged_pooled.0, out_s);
    let (mut serial, mut pooled) = (case.state0.clone(), case.state0.clone());
    gdn_replay(None, case.replay_inputs(&logged_serial.2, 69), &mut serial).expect("gdn_replay");
    gdn_replay(&pool, case.replay_inputs(&logged_serial.2, 69), &mut pooled).expect("gdn_replay pooled");
    assert_eq!(pooled, serial);
    gdn_replay(&pool, case.replay_inputs(&logged_serial.2, 70), &mut pooled).expect("gdn_replay pooled");
    assert_eq!(pooled, state_s, "the whole log replayed is the final state");

    let (mut out, mut state) = case.buffers();
    case.run_chunked(Some(&pool), &mut state, &mut out, DEFAULT_CHUNK)
        .expect("gdn_chunked_pooled");
    let (out_s, state_s) = case.chunked(DEFAULT_CHUNK);
    assert_eq!(out, out_s);
    assert_eq!(state, state_s);
}

// === hand-computable cases ===

/// Runs the per-token and the chunked form (chunks of `chunk`) on `[q, k, v, gate, beta]`
/// from `state0` and checks each one's outputs and final state against the hand-computed
/// values within [`HAND_TOL`].
fn assert_both_forms(
    shape: GdnShape,
    [q, k, v, gate, beta]: [&[f32]; 5],
    state0: &[f32],
    chunk: usize,
    want_out: &[f32],
    want_state: &[f32],
) {
    let x = GdnInputs { shape, q, k, v, gate, beta };
    for chunked in [false, true] {
        let (mut out, mut state) = (vec![0f32; want_out.len()], state0.to_vec());
        if chunked {
            gdn_chunked(None, x, &mut state, &mut out, chunk)
        } else {
            gdn_recurrent(None, x, &mut state, &mut out, None, None)
        }
        .expect("gdn");
        let (e_out, e_state) = (max_rel_err(&out, want_out), max_rel_err(&state, want_state));
        assert!(e_out <= HAND_TOL, "out {out:?} chunked={chunked}");
        assert!(e_state <= HAND_TOL, "state {state:?} chunked={chunked}");
    }
}

/// One head, d_k = d_v = 2, no decay (gate 0), full writes (beta 1), zero state: the delta
/// rule stores `v` under key `k`, and a second write under the same key replaces it.
#[test]
fn unit_beta_no_decay_stores_and_overwrites() {
    let shape = gdn_shape(1, 1, 2, 2);
    let scale = 1.0 / 2f32.sqrt();
    let k = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
    let q = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let v = [3.0, 4.0, 5.0, -1.0, 2.0, 7.0];
    let (gate, beta) = ([0.0; 3], [1.0; 3]);
    // Token 0: S = e1 ⊗ (3,4); o = scale·(3,4).
    // Token 1: δ = (5,−1) − (3,4) ⇒ S = e1 ⊗ (5,−1); q = e2 reads row 1 = 0.
    // Token 2: k = e2, δ = (2,7) ⇒ S = [[5,−1],[2,7]]; q = e1 reads (5,−1).
    let want_out = [3.0 * scale, 4.0 * scale, 0.0, 0.0, 5.0 * scale, -scale];
    let want_state = [5.0, -1.0, 2.0, 7.0];
    let (q, k, v) = (&q[..], &k[..], &v[..]);
    assert_both_forms(shape, [q, k, v, &gate, &beta], &[0.0; 4], 2, &want_out, &want_state);
}

/// beta = 0 writes nothing: the state only decays, `S_t = 0.5^{t+1} S₀`, and
/// `o_t = scale · S_tᵀ q_t`, evaluated here in f64.
#[test]
fn zero_beta_only_decays() {
    let shape = gdn_shape(1, 1, 3, 2);
    let n = 3;
    let case = random_case(shape, n, 41);
    let gate = vec![0.5f32.ln(); n];
    let beta = vec![0.0f32; n];
    let scale = 1.0 / 3f64.sqrt();
    let mut want_out = vec![0f32; n * 2];
    for t in 0..n {
        let f = 0.5f64.powi(t as i32 + 1);
        for j in 0..2 {
            let dotq: f64 = (0..3)
                .map(|i| case.state0[i * 2 + j] as f64 * case.q[t * 3 + i] as f64)
                .sum();
            want_out[t * 2 + j] = (scale * f * dotq) as f32;
        }
    }
    let want_state: Vec<f32> = case.state0.iter().map(|s| s * 0.125).collect();
    let qkvgb = [&case.q[..], &case.k, &case.v, &gate, &beta];
    assert_both_forms(shape, qkvgb, &case.state0, 64, &want_out, &want_state);
}

/// Value head `h` reads key head `h % n_k_heads` (GGUF tiled order): with key head 0 = e1
/// and key head 1 = e2, a write from zero state lands in row `h % 2` of head `h`'s state.
#[test]
fn value_heads_use_tiled_key_heads() {
    let shape = gdn_shape(2, 4, 2, 1);
    let k = [1.0, 0.0, 0.0, 1.0];
    let q = k;
    let v = [1.0, 2.0, 3.0, 4.0];
    let (gate, beta) = ([0.0; 4], [1.0; 4]);
    let (mut out, mut state) = ([0f32; 4], [0f32; 8]);
    let x = GdnInputs { shape, q: &q, k: &k, v: &v, gate: &gate, beta: &beta };
    gdn_recurrent(None, x, &mut state, &mut out, None, None).expect("gdn");
    for h in 0..4 {
        let row = h % 2;
        let mut want = [0f32; 2];
        want[row] = v[h];
        assert_eq!(&state[h * 2..h * 2 + 2], &want, "head {h}");
    }
}

// === short convolution ===

fn conv_reference(x: &[f32], n: usize, ch: usize, w: &[f32], state: &[f32]) -> Vec<f32> {
    let kernel = w.len() / ch;
    let ext = [state, x].concat();
    let mut out = vec![0f32; n * ch];
    for t in 0..n {
        for c in 0..ch {
            let s: f64 = (0..kernel)
                .map(|j| w[c * kernel + j] as f64 * ext[(t + j) * ch + c] as f64)
                .sum();
            out[t * ch + c] = (s / (1.0 + (-s).exp())) as f32;
        }
    }
    out
}

#[test]
fn conv_batch_equals_per_token_and_definition() {
    let ch = 37;
    let mut rng = Rng(51);
    let w = rng.vec(ch * 4);
    for n in [1, 2, 3, 4, 9] {
        let x = rng.vec(n * ch);
        let state0 = rng.vec(3 * ch);

        let (mut state_b, mut out_b) = (state0.clone(), vec![0f32; n * ch]);
        conv1d_silu(None, &x, n, ch, &w, &mut state_b, &mut out_b).expect("conv1d_silu");

        let (mut state_s, mut out_s) = (state0.clone(), vec![0f32; n * ch]);
        for t in 0..n {
            conv1d_silu_step(
                &x[t * ch..(t + 1) * ch],
                &w,
                &mut state_s,
                &mut out_s[t * ch..(t + 1) * ch],
            )
            .expect("conv1d_silu_step");
        }
        assert_eq!(out_b, out_s, "n={n}");
        assert_eq!(state_b, state_s, "n={n}");

        let want = conv_reference(&x, n, ch, &w, &state0);
        assert!(max_rel_err(&out_b, &want) <= HAND_TOL, "n={n}");
        let ext = [state0, x].concat();
        assert_eq!(
            state_b,
            ext[n * ch..],
            "state keeps the last 3 inputs, n={n}"
        );
    }
}

#[test]
fn conv_taps_select_the_right_inputs() {
    // w[c][3] = 1 passes the current token; w[c][0] = 1 the input three tokens back.
    let (ch, n) = (2, 4);
    let x = [1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0];
    let state0 = [0.5, -0.5, 0.25, -0.25, 0.125, -0.125];
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for (tap, shift) in [(3usize, 0usize), (0, 3)] {
        let mut w = [0f32; 8];
        w[tap] = 1.0;
        w[4 + tap] = 1.0;
        let (mut state, mut out) = (state0, [0f32; 8]);
        conv1d_silu(None, &x, n, ch, &w, &mut state, &mut out).expect("conv1d_silu");
        let ext = [&state0[..], &x[..]].concat();
        for t in 0..n {
            for c in 0..ch {
                let want = silu(ext[(t + 3 - shift) * ch + c]);
                assert_eq!(out[t * ch + c], want, "tap {tap} t {t} c {c}");
            }
        }
    }
}

#[test]
fn conv_two_batches_equal_one() {
    let (ch, n) = (16, 7);
    let mut rng = Rng(61);
    let (w, x, state0) = (rng.vec(ch * 4), rng.vec(n * ch), rng.vec(3 * ch));
    let (mut state, mut out) = (state0.clone(), vec![0f32; n * ch]);
    conv1d_silu(None, &x, n, ch, &w, &mut state, &mut out).expect("conv");
    for split in [1, 2, 5] {
        let (mut st, mut o) = (state0.clone(), vec![0f32; n * ch]);
        let (oa, ob) = o.split_at_mut(split * ch);
        conv1d_silu(None, &x[..split * ch], split, ch, &w, &mut st, oa).expect("conv a");
        conv1d_silu(None, &x[split * ch..], n - split, ch, &w, &mut st, ob).expect("conv b");
        assert_eq!(o, out, "split {split}");
        assert_eq!(st, state, "split {split}");
    }
}

#[test]
fn conv_taps_built_once_give_the_bits_of_the_weights() {
    let (ch, n) = (40, 3);
    let mut rng = Rng(68);
    let (w, x, state0) = (rng.vec(ch * 4), rng.vec(n * ch), rng.vec(3 * ch));
    let taps = ConvTaps::new(&w, ch).expect("taps");
    assert_eq!((taps.channels(), taps.kernel(), taps.len()), (ch, 4, 4 * ch));
    let (mut st_a, mut out_a) = (state0.clone(), vec![0f32; n * ch]);
    conv1d_silu(None, &x, n, ch, &w, &mut st_a, &mut out_a).expect("from the weights");
    let (mut st_b, mut out_b) = (state0.clone(), vec![f32::NAN; n * ch]);
    conv1d_silu_taps(None, &x, n, &taps, &mut st_b, &mut out_b).expect("from the taps");
    assert_eq!(out_a, out_b);
    assert_eq!(st_a, st_b);
    // Tap 3 multiplies the current token, tap 0 the oldest input (module docs).
    let mut one = vec![0f32; ch * 4];
    one[4 * 7 + 3] = 1.0; // channel 7, tap 3
    let taps = ConvTaps::new(&one, ch).expect("taps");
    let (mut st, mut out) = (vec![0f32; 3 * ch], vec![0f32; ch]);
    let mut x1 = vec![0f32; ch];
    x1[7] = 2.0;
    conv1d_silu_taps(None, &x1, 1, &taps, &mut st, &mut out).expect("conv");
    assert!((out[7] - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6, "{}", out[7]);
    assert!(ConvTaps::new(&w[..ch * 4 - 1], ch).is_err(), "not a multiple of ch");
}

#[test]
fn conv_pooled_is_bit_identical_to_serial() {
    // Wide enough that batches of 4 tokens or more reach the pool (2^13 outputs); fewer run
    // on the calling thread.
    let ch = 2048;
    let mut rng = Rng(67);
    for threads in [2, 3] {
        let pool = ThreadPool::new(threads).expect("pool");
        // One token, a few (a verification pass), uneven splits.
        for n in [1, 2, 4, 5, 9, 37, 64] {
            let (w, x, state0) = (rng.vec(ch * 4), rng.vec(n * ch), rng.vec(3 * ch));
            let (mut st_a, mut out_a) = (state0.clone(), vec![0f32; n * ch]);
            conv1d_silu(None, &x, n, ch, &w, &mut st_a, &mut out_a).expect("serial");
            let (mut st_b, mut out_b) = (state0.clone(), vec![f32::NAN; n * ch]);
            conv1d_silu(&pool, &x, n, ch, &w, &mut st_b, &mut out_b).expect("pooled");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out_b), bits(&out_a), "threads {threads} n {n}");
            assert_eq!(bits(&st_b), bits(&st_a), "threads {threads} n {n}");
        }
    }
}

// === errors ===

#[test]
fn shape_errors_are_reported() {
    let case = random_case(SHAPE, 5, 71);
    let (mut out, mut state) = case.buffers();
    let mut short_q = case.clone();
    short_q.q.remove(0);
    let err = short_q.run_recurrent(None, &mut state, &mut out, None);
    assert!(
        matches!(err, Err(DspError::LengthMismatch { .. })),
        "{err:?}"
    );

    let bad = Case {
        shape: GdnShape {
            n_v_heads: 3,
            ..SHAPE
        },
        gate: case.gate[..15].to_vec(),
        beta: case.beta[..15].to_vec(),
        ..case.clone()
    };
    let err = bad.run_chunked(None, &mut state, &mut out, 64);
    assert!(
        matches!(err, Err(DspError::InvalidArgument { .. })),
        "{err:?}"
    );

    let err = case.run_chunked(None, &mut state, &mut out, 0);
    assert!(
        matches!(err, Err(DspError::InvalidArgument { .. })),
        "{err:?}"
    );

    // A log sized for another token count or state, a pending replay of another shape.
    let mut delta = vec![0f32; case.out_len()];
    for delta_len in [case.out_len() - 1, case.out_len() + 1] {
        let mut d = vec![0f32; delta_len];
        let err = case.run_recurrent(None, &mut state, &mut out, Some(RollbackLog { delta: &mut d }));
        assert!(matches!(err, Err(DspError::LengthMismatch { .. })), "{delta_len}: {err:?}");
    }
    let other = gdn_shape(2, 2, 4, 4);
    let pend = ReplayInputs { shape: other, k: &[0.0; 8], gate: &[0.0; 2], delta: &[0.0; 8] };
    let log = Some(RollbackLog { delta: &mut delta });
    let err = gdn_recurrent(None, case.inputs(), &mut state, &mut out, Some(pend), log);
    assert!(matches!(err, Err(DspError::InvalidArgument { .. })), "{err:?}");
    let short = ReplayInputs { shape: SHAPE, k: &case.k[..SHAPE.n_k_heads * SHAPE.d_k], gate: &case.gate[..2 * SHAPE.n_v_heads], delta: &[0.0; 4] };
    assert!(matches!(gdn_replay(None, short, &mut state), Err(DspError::LengthMismatch { .. })));

    let mut conv_state = vec![0f32; 2 * 8];
    let err = conv1d_silu(None, &[0.0; 8], 1, 8, &[0.0; 32], &mut conv_state, &mut [0.0; 8]);
    assert!(
        matches!(err, Err(DspError::LengthMismatch { .. })),
        "{err:?}"
    );
}
