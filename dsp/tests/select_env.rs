//! `TANDEM_KERNELS=scalar` forces the scalar backend. Its own test binary (one process, one
//! test) because `select` reads the variable once and caches the choice.

#[test]
fn tandem_kernels_scalar_forces_the_scalar_backend() {
    std::env::set_var(dsp::backend::KERNELS_ENV, "scalar");
    assert_eq!(dsp::select().name(), "scalar");
}
