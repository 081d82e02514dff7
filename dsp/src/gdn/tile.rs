//! Small dense f32 products for the chunked GDN form, written so the compiler keeps a
//! `MR × NR` block of the result in registers: [`gemm_acc_portable`] (the reference, baseline
//! target features) and, on x86_64, [`gemm_acc_avx2`] (the same loop with fused multiply-adds
//! and a wider tile). Which one runs is the kernel backend's choice
//! ([`crate::KernelBackend::gdn_chunked_head`]). Checked through `dsp/tests/gdn.rs`, where the
//! chunked form that uses them must match the per-token recurrence, and by the unit tests
//! below (AVX2 path vs portable path).

/// Rows of the register tile.
const MR: usize = 4;
/// Columns of the portable register tile (two SSE registers).
const NR: usize = 8;
/// Columns of the AVX2 register tile (two 256-bit registers per row, so `2·MR` independent
/// FMA chains hide the FMA latency).
#[cfg(target_arch = "x86_64")]
const AVX2_NR: usize = 16;

/// Signature shared by the `y += a · x` implementations: `y`: `[m, nn]`, `a`: `[m, p]`,
/// `x`: `[p, nn]`, all row-major, arguments `(y, a, x, m, p, nn)`.
#[cfg(test)]
type GemmFn = fn(&mut [f32], &[f32], &[f32], usize, usize, usize);

/// The AVX2+FMA implementation if this CPU can run it (tests).
#[cfg(test)]
fn avx2_gemm() -> Option<GemmFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Some(gemm_acc_avx2_checked);
        }
    }
    None
}

/// Safe entry to [`gemm_acc_avx2`]; only handed out by [`avx2_gemm`] after feature detection.
#[cfg(all(test, target_arch = "x86_64"))]
fn gemm_acc_avx2_checked(y: &mut [f32], a: &[f32], x: &[f32], m: usize, p: usize, nn: usize) {
    // SAFETY: this function is only reachable through `avx2_gemm`, which checked that the
    // CPU supports AVX2 and FMA.
    unsafe { gemm_acc_avx2(y, a, x, m, p, nn) }
}

/// AVX2+FMA `y += a · x`: `4 × 16` register tiles (eight 256-bit accumulators, so eight
/// independent FMA chains hide the FMA latency; `a` broadcast from memory), `1 × 16` tiles for
/// the last `m % 4` rows and fused scalar steps for the last `nn % 16` columns. Each 16-column
/// panel of `x` is first copied to a contiguous `[p, 16]` buffer: read in place, its rows sit
/// `4·nn` bytes apart (512 B for `d_v = 128`), which maps a 128-row panel onto only 8 of the
/// L1 cache's 64 sets and evicts it on every sweep. Per element the arithmetic is that of
/// [`gemm_body`] with a fused step: the sum over `p` in order from zero, then added to `y`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_acc_avx2(y: &mut [f32], a: &[f32], x: &[f32], m: usize, p: usize, nn: usize) {
    // Soundness of the raw accesses in `gemm_tile_avx2` rests on these checks.
    assert!(y.len() == m * nn && a.len() == m * p && x.len() == p * nn);
    let j_end = nn - nn % AVX2_NR;
    let mut panel = vec![0f32; p * AVX2_NR];
    for j0 in (0..j_end).step_by(AVX2_NR) {
        for (i, row) in panel.chunks_exact_mut(AVX2_NR).enumerate() {
            row.copy_from_slice(&x[i * nn + j0..][..AVX2_NR]);
        }
        let mut r0 = 0;
        while r0 + MR <= m {
            gemm_tile_avx2::<MR>(y, a, &panel, r0, j0, p, nn);
            r0 += MR;
        }
        for r in r0..m {
            gemm_tile_avx2::<1>(y, a, &panel, r, j0, p, nn);
        }
    }
    for r in 0..m {
        for j in j_end..nn {
            let mut s = 0.0f32;
            for i in 0..p {
                s = a[r * p + i].mul_add(x[i * nn + j], s);
            }
            y[r * nn + j] += s;
        }
    }
}

/// One `R × 16` tile of [`gemm_acc_avx2`]: rows `r0..r0+R`, columns `j0..j0+16` of `y`, from
/// the packed `[p, 16]` `panel` of `x`.
///
/// # Safety
/// AVX2 and FMA; `r0 + R ≤ m`, `j0 + 16 ≤ nn`, `panel.len() == 16·p` and the slice lengths
/// checked by the caller.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_tile_avx2<const R: usize>(
    y: &mut [f32],
    a: &[f32],
    panel: &[f32],
    r0: usize,
    j0: usize,
    p: usize,
    nn: usize,
) {
    use std::arch::x86_64::*;
    let (yp, ap, xp) = (y.as_mut_ptr(), a.as_ptr(), panel.as_ptr());
    let mut c = [[_mm256_setzero_ps(); 2]; R];
    for i in 0..p {
        let x0 = _mm256_loadu_ps(xp.add(i * AVX2_NR));
        let x1 = _mm256_loadu_ps(xp.add(i * AVX2_NR + 8));
        for (r, cr) in c.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*ap.add((r0 + r) * p + i));
            cr[0] = _mm256_fmadd_ps(av, x0, cr[0]);
            cr[1] = _mm256_fmadd_ps(av, x1, cr[1]);
        }
    }
    for (r, cr) in c.iter().enumerate() {
        let yr = yp.add((r0 + r) * nn + j0);
        _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), cr[0]));
        _mm256_storeu_ps(yr.add(8), _mm256_add_ps(_mm256_loadu_ps(yr.add(8)), cr[1]));
    }
}

/// Portable reference `y += a · x`: separate multiply and add, baseline target features.
pub(crate) fn gemm_acc_portable(
    y: &mut [f32],
    a: &[f32],
    x: &[f32],
    m: usize,
    p: usize,
    nn: usize,
) {
    gemm_body::<MR, NR>(y, a, x, m, p, nn, |acc, ar, xj| acc + ar * xj)
}

/// `y += a · x` with fused multiply-adds (aarch64, where FMA is baseline): the tiled body of
/// [`gemm_acc_portable`] with `f32::mul_add` steps, vectorised by the compiler. Per element
/// it is the arithmetic of [`gemm_acc_avx2`] (a fused chain over `p` in order from zero, then
/// added to `y`), so the NEON backends' GDN equals the x86 AVX2 build's bit for bit.
#[cfg(target_arch = "aarch64")]
pub(crate) fn gemm_acc_fused(y: &mut [f32], a: &[f32], x: &[f32], m: usize, p: usize, nn: usize) {
    gemm_body::<MR, 16>(y, a, x, m, p, nn, |acc, ar, xj| ar.mul_add(xj, acc))
}

/// Tiled `y += a · x`; `fma(acc, a, x)` is the multiply-add step (plain or fused). Inlined
/// into each caller so it is compiled with that caller's target features.
#[inline(always)]
fn gemm_body<const MR: usize, const NR: usize>(
    y: &mut [f32],
    a: &[f32],
    x: &[f32],
    m: usize,
    p: usize,
    nn: usize,
    fma: impl Fn(f32, f32, f32) -> f32 + Copy,
) {
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
                            *acc_rj = fma(*acc_rj, ar, xj);
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
                            s = fma(s, a[r * p + i], x[i * nn + j]);
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
            gemm_acc_portable(&mut y, &a, &x, m, p, nn);
            if let Some(fast) = avx2_gemm() {
                let mut y_fast = y0.clone();
                fast(&mut y_fast, &a, &x, m, p, nn);
                assert_eq!(y_fast, y, "avx2 vs portable on small integers ({m},{p},{nn})");
            }
            for r in 0..m {
                for j in 0..nn {
                    let want =
                        y0[r * nn + j] + (0..p).map(|i| a[r * p + i] * x[i * nn + j]).sum::<f32>();
                    assert_eq!(y[r * nn + j], want, "({m},{p},{nn}) at ({r},{j})");
                }
            }
        }
    }

    /// Relative tolerance between the AVX2+FMA and portable paths: both sum in the same
    /// order, so they differ only by the single rounding FMA skips per step (≤ p half-ulps
    /// of the running sum); 1e-5 of the summed magnitudes covers p = 64 with margin.
    #[cfg(target_arch = "x86_64")]
    const AVX2_REL_TOL: f32 = 1e-5;

    /// The AVX2+FMA build agrees with the portable reference within [`AVX2_REL_TOL`] on
    /// non-integer inputs (where FMA rounding differs), including tile remainders.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gemm_acc_avx2_matches_portable() {
        // The AVX2 GDN tiles run in the `avx2` backend (and `avx512-vnni`, which has AVX2).
        let Some(fast) = test_support::kernel_backend("avx2", avx2_gemm()) else {
            return;
        };
        for &(m, p, nn) in &[(1, 1, 1), (4, 7, 8), (5, 9, 17), (9, 64, 24), (16, 64, 128)] {
            let a: Vec<f32> = (0..m * p)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.3)
                .collect();
            let x: Vec<f32> = (0..p * nn)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 11.1)
                .collect();
            let y0: Vec<f32> = (0..m * nn).map(|i| (i % 13) as f32 / 3.0).collect();
            let (mut want, mut got) = (y0.clone(), y0.clone());
            gemm_acc_portable(&mut want, &a, &x, m, p, nn);
            fast(&mut got, &a, &x, m, p, nn);
            for r in 0..m {
                for j in 0..nn {
                    let mag: f32 = y0[r * nn + j].abs()
                        + (0..p)
                            .map(|i| (a[r * p + i] * x[i * nn + j]).abs())
                            .sum::<f32>();
                    let (w, g) = (want[r * nn + j], got[r * nn + j]);
                    assert!(
                        (w - g).abs() <= AVX2_REL_TOL * mag,
                        "({m},{p},{nn}) at ({r},{j}): portable {w}, avx2 {g}, magnitude {mag}"
                    );
                }
            }
        }
    }
}
