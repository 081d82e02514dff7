//! Numeric comparisons for the tests: NaN-aware and length-checked.
//!
//! `iter().map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)` reads a NaN difference as 0
//! (`f32::max` ignores NaN) and `zip` drops the tail of the longer side, so a NaN logit or a
//! truncated output would pass. These helpers fail instead: different lengths or a NaN on
//! either side panic with the index and both values (at the caller's line), and an infinity
//! against anything but the same infinity is an infinite difference.

use std::fmt::{Debug, Display};

/// `f32` or `f64`.
pub trait Real: Copy + PartialOrd + Debug + Display {
    const ZERO: Self;
    fn is_nan(self) -> bool;
    fn is_infinite(self) -> bool;
    fn abs(self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn one_plus(self) -> Self;
    fn infinity() -> Self;
    fn to_bits_u64(self) -> u64;
}

/// [`Real`] for a float type: every method is the type's own operation.
macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_infinite(self) -> bool {
                <$t>::is_infinite(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn one_plus(self) -> Self {
                1.0 + self
            }
            fn infinity() -> Self {
                <$t>::INFINITY
            }
            fn to_bits_u64(self) -> u64 {
                u64::from(self.to_bits())
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

#[track_caller]
fn check_comparable<T: Real>(a: &[T], b: &[T], what: &str) {
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: lengths differ ({} vs {})",
        a.len(),
        b.len()
    );
    if let Some(i) = (0..a.len()).find(|&i| a[i].is_nan() || b[i].is_nan()) {
        panic!(
            "{what}: NaN at index {i} (left {}, right {}); a NaN is never close to anything",
            a[i], b[i]
        );
    }
}

/// `|x − y|`, with equal values (equal infinities included) 0 and any other infinity inf.
fn abs_diff<T: Real>(x: T, y: T) -> T {
    if x == y {
        T::ZERO
    } else if x.is_infinite() || y.is_infinite() {
        T::infinity()
    } else {
        x.sub(y).abs()
    }
}

/// The largest `|a_i − b_i|`. Panics when the lengths differ or either side has a NaN.
#[track_caller]
pub fn max_abs_diff<T: Real>(a: &[T], b: &[T]) -> T {
    check_comparable(a, b, "max_abs_diff");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| abs_diff(x, y))
        .fold(T::ZERO, |m, d| if d > m { d } else { m })
}

/// The largest `|a_i − b_i| / (1 + |b_i|)`. Panics when the lengths differ or either side has a
/// NaN.
#[track_caller]
pub fn max_rel_diff<T: Real>(a: &[T], b: &[T]) -> T {
    check_comparable(a, b, "max_rel_diff");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| match abs_diff(x, y) {
            // inf / (1 + inf) would be NaN.
            d if d.is_infinite() => d,
            d => d.div(y.abs().one_plus()),
        })
        .fold(T::ZERO, |m, d| if d > m { d } else { m })
}

/// Asserts `a` and `b` have the same length, no NaN, and every `|a_i − b_i| <= tol`; with
/// `tol == 0` the elements must be bitwise equal (so `-0.0` differs from `0.0`). `what` names
/// the comparison in the failure message, which gives the worst index and both values.
#[track_caller]
pub fn assert_close<T: Real>(a: &[T], b: &[T], tol: T, what: &str) {
    check_comparable(a, b, what);
    if tol == T::ZERO {
        if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits_u64() != b[i].to_bits_u64()) {
            panic!(
                "{what}: not bitwise equal at index {i}: {:?} vs {:?} (|Δ| = {})",
                a[i],
                b[i],
                abs_diff(a[i], b[i])
            );
        }
        return;
    }
    let worst = (0..a.len()).fold(None, |w: Option<(usize, T)>, i| {
        let d = abs_diff(a[i], b[i]);
        match w {
            Some((_, m)) if !(d > m) => w,
            _ => Some((i, d)),
        }
    });
    if let Some((i, d)) = worst {
        assert!(
            d <= tol,
            "{what}: max |Δ| {d} > tol {tol} at index {i} ({} vs {})",
            a[i],
            b[i]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "NaN at index 2")]
    fn a_nan_on_the_left_is_a_failure() {
        max_abs_diff(&[1.0f32, 2.0, f32::NAN], &[1.0, 2.0, 3.0]);
    }

    #[test]
    #[should_panic(expected = "NaN at index 0")]
    fn a_nan_on_the_right_is_a_failure() {
        max_rel_diff(&[1.0f64], &[f64::NAN]);
    }

    #[test]
    #[should_panic(expected = "logits: NaN at index 1")]
    fn assert_close_rejects_a_nan_even_with_a_huge_tolerance() {
        assert_close(&[0.0f32, f32::NAN], &[0.0, 0.0], f32::MAX, "logits");
    }

    #[test]
    #[should_panic(expected = "lengths differ (2 vs 3)")]
    fn different_lengths_are_a_failure() {
        max_abs_diff(&[1.0f32, 2.0], &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn the_old_fold_hid_the_nan() {
        // What the tests did before: a NaN logit read as difference 0.
        let (a, b) = ([1.0f32, f32::NAN], [1.0f32, 5.0]);
        let old = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert_eq!(old, 0.0);
        assert!(std::panic::catch_unwind(|| max_abs_diff(&a, &b)).is_err());
    }

    #[test]
    fn infinities() {
        let inf = f32::INFINITY;
        assert_eq!(max_abs_diff(&[inf, -inf, 1.0], &[inf, -inf, 1.0]), 0.0);
        assert_eq!(max_abs_diff(&[inf], &[1.0]), inf);
        assert_eq!(max_abs_diff(&[1.0], &[-inf]), inf);
        assert_eq!(max_rel_diff(&[f32::MAX], &[inf]), inf);
    }

    #[test]
    fn differences() {
        assert_eq!(max_abs_diff(&[1.0f32, 2.0, 3.5], &[1.5, 2.0, 3.0]), 0.5);
        assert_eq!(max_rel_diff(&[3.0f64], &[1.0]), 1.0);
        assert_eq!(max_abs_diff::<f32>(&[], &[]), 0.0);
        assert_close(&[1.0f32, 2.0], &[1.0, 2.25], 0.25, "within");
        assert_close(&[1.0f32, -2.0], &[1.0, -2.0], 0.0, "bitwise");
    }

    #[test]
    #[should_panic(expected = "max |Δ| 0.5 > tol 0.25 at index 1")]
    fn beyond_the_tolerance() {
        assert_close(&[1.0f32, 2.5], &[1.0, 2.0], 0.25, "x");
    }

    #[test]
    #[should_panic(expected = "not bitwise equal at index 0")]
    fn tolerance_zero_is_bitwise() {
        assert_close(&[-0.0f32], &[0.0], 0.0, "x");
    }
}
