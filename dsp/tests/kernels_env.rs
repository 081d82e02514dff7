//! Choosing a backend by name (`backend::resolve`) and fixing it for the process
//! (`backend::install`). Its own test binary: the installed backend is process-wide.

use dsp::backend;

#[test]
fn names_resolve_to_backends_and_unknown_names_fall_back_to_the_best() {
    let best = backend::best().name();
    assert_eq!(backend::available().last().expect("scalar at least").name(), best);
    for asked in [None, Some(""), Some("  ")] {
        let sel = backend::resolve(asked);
        assert_eq!((sel.backend.name(), sel.unknown.as_deref()), (best, None), "{asked:?}");
    }
    let sel = backend::resolve(Some(" Scalar "));
    assert_eq!(sel.backend.name(), "scalar", "case- and space-insensitive");
    assert_eq!(sel.warning("TANDEM_KERNELS"), None);

    let sel = backend::resolve(Some("avx9000"));
    assert_eq!(sel.backend.name(), best);
    // Messages list what this CPU has, never a backend of another architecture.
    let names: Vec<_> = backend::available().iter().map(|b| b.name()).collect();
    assert_eq!(names[0], "scalar");
    assert_eq!(
        sel.warning("TANDEM_KERNELS").expect("an unknown name is reported"),
        format!(
            "TANDEM_KERNELS=avx9000 names no kernel backend this CPU has ({}); using {best}",
            names.join(", ")
        )
    );
}

#[test]
fn an_installed_backend_is_the_one_selected_and_cannot_be_replaced() {
    backend::install(backend::scalar()).expect("first install");
    assert_eq!(dsp::select().name(), "scalar");
    backend::install(backend::scalar()).expect("the same backend again is fine");
    if backend::best().name() != "scalar" {
        let err = backend::install(backend::best()).expect_err("a second backend is refused");
        assert_eq!(err.in_use, "scalar");
        assert_eq!(dsp::select().name(), "scalar");
    }
}
