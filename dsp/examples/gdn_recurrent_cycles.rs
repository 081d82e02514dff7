//! Fixed-work per-token Gated DeltaNet recurrence for timing and cycle counting, shaped as one
//! 0.8B-shape pass: `perf stat -e cycles:u target/release/examples/gdn_recurrent_cycles 4 200`
//! (tokens, repetitions, optional layers (default 18), optional threads (default 2),
//! optional `nosnap`). Each repetition runs the recurrence of every layer over `tokens`
//! tokens (16 heads of 128 × 128 states), keeping the `tokens − 1` snapshots a verification
//! pass keeps unless `nosnap`. Prints the minimum and median wall time of one pass.

mod common;

use dsp::gdn::{gdn_recurrent, GdnInputs, GdnShape};
use dsp::ThreadPool;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, reps, layers, threads) = (arg(1, 4).max(1), arg(2, 100).max(1), arg(3, 18), arg(4, 2));
    let snap = !args.iter().any(|a| a == "nosnap");
    let shape = GdnShape { n_k_heads: 16, n_v_heads: 16, d_k: 128, d_v: 128 };
    let mut lcg = common::Lcg(11);
    let qk = |lcg: &mut common::Lcg| {
        let mut v = lcg.vec(n * 16 * 128);
        for head in v.chunks_mut(128) {
            let norm = head.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            head.iter_mut().for_each(|x| *x /= norm);
        }
        v
    };
    let (q, k, v) = (qk(&mut lcg), qk(&mut lcg), lcg.vec(n * 16 * 128));
    let gate: Vec<f32> = lcg.vec(n * 16).iter().map(|x| -x.abs() * 0.1).collect();
    let beta: Vec<f32> = lcg.vec(n * 16).iter().map(|x| 0.5 + 0.4 * x).collect();
    let x = GdnInputs { shape, q: &q, k: &k, v: &v, gate: &gate, beta: &beta };
    let mut states: Vec<Vec<f32>> = (0..layers).map(|_| lcg.vec(shape.state_len())).collect();
    let n_snap = if snap { n - 1 } else { 0 };
    let mut snaps: Vec<Vec<Vec<f32>>> = (0..layers).map(|_| vec![vec![0f32; shape.state_len()]; n_snap]).collect();
    let mut out = vec![0f32; n * 16 * 128];
    let pool = ThreadPool::new(threads).expect("pool");
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        for (state, snaps) in states.iter_mut().zip(snaps.iter_mut()) {
            let mut slots: Vec<&mut [f32]> = snaps.iter_mut().map(|s| &mut s[..]).collect();
            gdn_recurrent(&pool, x, state, &mut out, &mut slots).expect("gdn");
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let (min, median) = (ms[0], ms[reps / 2]);
    println!(
        "{layers} layers x {n} tokens ({n_snap} snapshots), {threads} threads: min {min:.3} ms, median {median:.3} ms, checksum {}",
        out.iter().sum::<f32>()
    );
}
