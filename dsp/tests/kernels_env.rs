//! Choosing a backend by name (`backend::resolve`; a name this CPU cannot run is an error) and
//! fixing it for the process (`backend::install`). Its own test binary: the installed backend
//! is process-wide.

use dsp::backend;

#[test]
fn names_resolve_to_backends_and_names_this_cpu_cannot_run_are_errors() {
    let best = backend::best().name();
    assert_eq!(backend::available().last().expect("scalar at least").name(), best);
    for asked in [None, Some(""), Some("  ")] {
        assert_eq!(backend::resolve(asked).map(|b| b.name()), Ok(best), "{asked:?}");
    }
    assert_eq!(backend::resolve(Some(" Scalar ")).map(|b| b.name()), Ok("scalar"), "case- and space-insensitive");

    // Messages list what this CPU has, never a backend of another architecture as usable.
    let names: Vec<_> = backend::available().iter().map(|b| b.name()).collect();
    assert_eq!(names[0], "scalar");
    let err = backend::resolve(Some("avx9000")).map(|b| b.name()).expect_err("an unknown name is an error");
    assert_eq!(
        err.to_string(),
        format!(
            "unknown kernel backend \"avx9000\": the names are scalar, avx2, avx512-vnni, neon, neon-dotprod, neon-i8mm; this CPU has {}",
            names.join(", ")
        )
    );
    // Every known name this CPU does not have says why: another architecture's, or the
    // features it lacks.
    for name in ["avx2", "avx512-vnni", "neon", "neon-dotprod", "neon-i8mm"] {
        match backend::resolve(Some(name)) {
            Ok(b) => assert!(names.contains(&b.name()) && b.name() == name),
            Err(e) => {
                let text = e.to_string();
                assert!(!names.contains(&name), "{name} is available: {text}");
                assert!(text.contains(" CPUs, this one is ") || text.contains("it lacks the CPU feature(s) "), "{text}");
                assert!(text.ends_with(&format!("has {}", names.join(", "))), "{text}");
            }
        }
    }
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
