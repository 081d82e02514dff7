//! `TANDEM_KERNELS` handling (own test binary: it sets the process environment).

use dsp::backend::{self, KERNELS_ENV};

#[test]
fn unknown_backend_names_are_reported_and_fall_back_to_the_best() {
    std::env::set_var(KERNELS_ENV, "avx9000");
    let best = backend::available().last().expect("scalar at least").name();
    assert_eq!(backend::select().name(), best);
    // Messages list what this CPU has, never a backend of another architecture.
    let names: Vec<_> = backend::available().iter().map(|b| b.name()).collect();
    assert_eq!(names[0], "scalar");
    let warning = backend::kernels_env_warning().expect("an unknown name is reported");
    assert_eq!(
        warning,
        format!(
            "{KERNELS_ENV}=avx9000 names no kernel backend this CPU has ({}); using {best}",
            names.join(", ")
        )
    );
    std::env::set_var(KERNELS_ENV, " Scalar ");
    assert_eq!(backend::kernels_env_warning(), None, "known names are case- and space-insensitive");
    std::env::set_var(KERNELS_ENV, "");
    assert_eq!(backend::kernels_env_warning(), None);
    std::env::remove_var(KERNELS_ENV);
    assert_eq!(backend::kernels_env_warning(), None);
}
