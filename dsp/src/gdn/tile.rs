//! Small dense f32 products for the chunked GDN form, written so the compiler keeps a
//! `MR × NR` block of the result in registers (safe Rust, auto-vectorised; no ISA paths).
//! Checked through `dsp/tests/gdn.rs`, where the chunked form that uses them must match the
//! per-token recurrence.

/// Rows of the register tile.
const MR: usize = 4;
/// Columns of the register tile (one AVX or two SSE registers).
const NR: usize = 8;

/// `y += a · x` with `y`: `[m, nn]`, `a`: `[m, p]`, `x`: `[p, nn]`, all row-major.
pub(crate) fn gemm_acc(y: &mut [f32], a: &[f32], x: &[f32], m: usize, p: usize, nn: usize) {
    debug_assert_eq!(y.len(), m * nn);
    debug_assert_eq!(a.len(), m * p);
    debug_assert_eq!(x.len(), p * nn);
    let mut r0 = 0;
    while r0 < m {
        let mr = MR.min(m - r0);
        let mut j0 = 0;
        while j0 < nn {
            let nr = NR.min(nn - j0);
            if mr == MR && nr == NR {
                let mut acc = [[0f32; NR]; MR];
                let a_rows: [&[f32]; MR] = std::array::from_fn(|r| &a[(r0 + r) * p..][..p]);
                for i in 0..p {
                    let xv = &x[i * nn + j0..][..NR];
                    for (acc_r, a_r) in acc.iter_mut().zip(&a_rows) {
                        let ar = a_r[i];
                        for (acc_rj, &xj) in acc_r.iter_mut().zip(xv) {
                            *acc_rj += ar * xj;
                        }
                    }
                }
                for (r, acc_r) in acc.iter().enumerate() {
                    let yr = &mut y[(r0 + r) * nn + j0..][..NR];
                    for (yj, &v) in yr.iter_mut().zip(acc_r) {
                        *yj += v;
                    }
                }
            } else {
                for r in r0..r0 + mr {
                    for j in j0..j0 + nr {
                        let mut s = 0.0f32;
                        for i in 0..p {
                            s += a[r * p + i] * x[i * nn + j];
                        }
                        y[r * nn + j] += s;
                    }
                }
            }
            j0 += nr;
        }
        r0 += mr;
    }
}

/// `a · b` with eight partial sums, so the loop vectorises.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiled product against the triple loop on edge shapes (0, 1, odd, non-multiples of
    /// the tile); exact because small integers are summed.
    #[test]
    fn gemm_acc_matches_naive() {
        for &(m, p, nn) in &[
            (0, 3, 5),
            (1, 1, 1),
            (4, 7, 8),
            (5, 9, 17),
            (9, 64, 24),
            (3, 0, 4),
        ] {
            let a: Vec<f32> = (0..m * p).map(|i| (i % 7) as f32 - 3.0).collect();
            let x: Vec<f32> = (0..p * nn).map(|i| (i % 5) as f32 - 2.0).collect();
            let y0: Vec<f32> = (0..m * nn).map(|i| (i % 3) as f32).collect();
            let mut y = y0.clone();
            gemm_acc(&mut y, &a, &x, m, p, nn);
            for r in 0..m {
                for j in 0..nn {
                    let want =
                        y0[r * nn + j] + (0..p).map(|i| a[r * p + i] * x[i * nn + j]).sum::<f32>();
                    assert_eq!(y[r * nn + j], want, "({m},{p},{nn}) at ({r},{j})");
                }
            }
        }
    }

    #[test]
    fn dot_matches_naive() {
        for n in [0, 1, 7, 8, 9, 33] {
            let a: Vec<f32> = (0..n).map(|i| (i % 4) as f32 - 1.5).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert_eq!(dot(&a, &b), want, "n={n}");
        }
    }
}
