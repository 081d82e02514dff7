//! Fixed-work per-token Gated DeltaNet recurrence for timing and cycle counting, shaped as one
//! 0.8B-shape pass: `perf stat -e cycles:u target/release/examples/gdn_recurrent_cycles 4 200`
//! (tokens, repetitions, optional layers (default 18), optional threads (default 2),
//! optional `plain`). Each repetition runs the recurrence of every layer over `tokens` tokens
//! (16 heads of 128 × 128 states) as a verification pass in speculative decoding's steady
//! state: with a rollback log, after a rollback that kept `tokens − 1` tokens of the previous
//! repetition (their replay pending, fused into the pass). `plain`: a pass without either.
//! Prints the minimum and median wall time of one pass.

mod common;

use dsp::gdn::{gdn_recurrent, GdnInputs, GdnShape, ReplayInputs, RollbackLog};
use dsp::ThreadPool;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, reps, layers, threads) = (arg(1, 4).max(1), arg(2, 100).max(1), arg(3, 18), arg(4, 2));
    let plain = args.iter().any(|a| a == "plain");
    let shape = GdnShape { n_k_heads: 16, n_v_heads: 16, d_k: 128, d_v: 128 };
    let (kd, vd) = (16 * 128, 16 * 128);
    let mut lcg = common::Lcg(11);
    let qk = |lcg: &mut common::Lcg| {
        let mut v = lcg.vec(n * kd);
        for head in v.chunks_mut(128) {
            let norm = head.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            head.iter_mut().for_each(|x| *x /= norm);
        }
        v
    };
    let (q, k, v) = (qk(&mut lcg), qk(&mut lcg), lcg.vec(n * vd));
    let gate: Vec<f32> = lcg.vec(n * 16).iter().map(|x| -x.abs() * 0.1).collect();
    let beta: Vec<f32> = lcg.vec(n * 16).iter().map(|x| 0.5 + 0.4 * x).collect();
    let x = GdnInputs { shape, q: &q, k: &k, v: &v, gate: &gate, beta: &beta };
    let mut states: Vec<Vec<f32>> = (0..layers).map(|_| lcg.vec(shape.state_len())).collect();
    // This pass's logged writes and the previous pass's (pending).
    let (mut logged, mut pending): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
        ((0..layers).map(|_| vec![0f32; n * vd]).collect(), (0..layers).map(|_| vec![0f32; n * vd]).collect());
    let mut out = vec![0f32; n * vd];
    let pool = ThreadPool::new(threads).expect("pool");
    let kept = n - 1; // a rejected last draft
    let mut ms = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let t = std::time::Instant::now();
        for l in 0..layers {
            if plain {
                gdn_recurrent(&pool, x, &mut states[l], &mut out, None, None).expect("gdn");
                continue;
            }
            let pend = (rep > 0 && kept > 0).then(|| ReplayInputs {
                shape,
                k: &k[..kept * kd],
                gate: &gate[..kept * 16],
                delta: &pending[l][..kept * vd],
            });
            let log = RollbackLog { delta: &mut logged[l] };
            gdn_recurrent(&pool, x, &mut states[l], &mut out, pend, Some(log)).expect("gdn");
            // The rollback: the base stays the live state with `kept` tokens of the log pending.
        }
        if rep > 0 {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        std::mem::swap(&mut logged, &mut pending);
    }
    ms.sort_by(f64::total_cmp);
    let (min, median) = (ms[0], ms[reps / 2]);
    println!(
        "{layers} layers x {n} tokens ({}), {threads} threads: min {min:.3} ms, median {median:.3} ms, checksum {}",
        if plain { "plain".to_string() } else { format!("logged, {kept} pending") },
        out.iter().sum::<f32>()
    );
}
