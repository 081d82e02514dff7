//! `TANDEM_KERNELS` handling (own test binary: it sets the process environment).

use dsp::backend::{self, KERNELS_ENV};

#[test]
fn unknown_backend_names_are_reported_and_fall_back_to_the_best() {
    std::env::set_var(KERNELS_ENV, "avx9000");
    assert_eq!(backend::unknown_requested().as_deref(), Some("avx9000"));
    let best = backend::available().last().expect("scalar at least").name();
    assert_eq!(backend::select().name(), best);
    std::env::set_var(KERNELS_ENV, " Scalar ");
    assert_eq!(backend::unknown_requested(), None, "known names are case- and space-insensitive");
    std::env::set_var(KERNELS_ENV, "");
    assert_eq!(backend::unknown_requested(), None);
    std::env::remove_var(KERNELS_ENV);
    assert_eq!(backend::unknown_requested(), None);
    // Messages list what this CPU has, never a backend of another architecture.
    let names = backend::available_names();
    assert!(names.starts_with("scalar"), "{names}");
    assert_eq!(names.split(", ").count(), backend::available().len());
}
