//! Subnormal floats flushed to zero while a GDN kernel runs.
//!
//! The delta rule multiplies by decays `e^{G}` every token: with strong decay the state and
//! the intra-chunk decay products fall into the subnormal range (< 1.2e-38), where x86 cores
//! take a micro-code assist per operation (measured: the chunked kernel 5× slower at a gate of
//! −3 per token than at −0.1). Values that small contribute nothing at f32 precision, so the
//! kernels run with flush-to-zero and denormals-are-zero (x86 MXCSR FTZ|DAZ; AArch64 FPCR.FZ),
//! set on entry and restored on exit by [`FlushDenormals`], on whichever thread runs the head.

/// Guard: sets flush-to-zero for this thread until dropped, then restores the previous mode.
pub(crate) struct FlushDenormals {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    saved: u64,
}

#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);
#[cfg(target_arch = "aarch64")]
const FPCR_FZ: u64 = 1 << 24;

impl FlushDenormals {
    #[inline]
    pub(crate) fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let mut csr: u32 = 0;
            // SAFETY: stmxcsr/ldmxcsr only read/write the 32-bit MXCSR through a valid local;
            // FTZ|DAZ change nothing but subnormal handling, and `Drop` restores the mode.
            unsafe {
                std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
                let on = csr | FTZ_DAZ;
                std::arch::asm!("ldmxcsr [{}]", in(reg) &on, options(nostack, preserves_flags));
            }
            Self { saved: csr as u64 }
        }
        #[cfg(target_arch = "aarch64")]
        {
            let fpcr: u64;
            // SAFETY: reads and writes FPCR; FZ changes only subnormal handling; restored on drop.
            unsafe {
                std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags));
                std::arch::asm!("msr fpcr, {}", in(reg) fpcr | FPCR_FZ, options(nomem, nostack, preserves_flags));
            }
            Self { saved: fpcr }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Self {}
        }
    }
}

impl Drop for FlushDenormals {
    #[inline]
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        {
            let csr = self.saved as u32;
            // SAFETY: restores the MXCSR value saved in `new`.
            unsafe {
                std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            // SAFETY: restores the FPCR value saved in `new`.
            unsafe {
                std::arch::asm!("msr fpcr, {}", in(reg) self.saved, options(nomem, nostack, preserves_flags));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FlushDenormals;
    use std::hint::black_box;

    #[test]
    fn subnormal_results_flush_inside_the_guard_only() {
        let (a, b) = (black_box(1e-30f32), black_box(1e-10f32));
        assert!((a * b) > 0.0, "subnormal product without the guard");
        {
            let _g = FlushDenormals::new();
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            assert_eq!(black_box(a) * black_box(b), 0.0);
        }
        assert!((black_box(a) * black_box(b)) > 0.0, "mode restored after the guard");
    }
}
