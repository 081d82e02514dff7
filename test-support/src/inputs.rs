//! The tests' real inputs (the default model, the corpus, committed fixtures, kernel backends)
//! and what a test does when one is missing.
//!
//! - **Required** inputs ([`model_path`], [`corpus_dir`], [`fixture`]): a missing one fails the
//!   test (a panic naming the input, where it was looked for, and how to get it). A test that
//!   cannot run never counts as passed.
//! - **Optional** inputs ([`optional_model_path`]): a missing one prints
//!   `UNTESTED: <test>: <what>` on stderr (not captured by the test harness, so it shows in
//!   `cargo test`'s output) and the test returns, unless `TANDEM_REQUIRE_INPUTS=1`.
//! - **Kernel backends** ([`kernel_backend`]): a backend this CPU lacks prints `UNTESTED: ...`
//!   and the test passes without running, unless the backend is required: named in
//!   `TANDEM_REQUIRE_KERNELS` (comma-separated backend names, e.g. `avx2,avx512-vnni`), or,
//!   when that variable is unset and `TANDEM_REQUIRE_INPUTS=1`, the backends
//!   [`cpuinfo_kernels`] derives from `/proc/cpuinfo`.
//!
//! `TANDEM_REQUIRE_INPUTS=1` (exported by `tools/test.sh`, hence CI) makes every input
//! required, optional ones included; `tools/test.sh` also exports `TANDEM_REQUIRE_KERNELS`,
//! computed from the CPU flags by the same rule as [`cpuinfo_kernels`].

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The switch that makes every input required (`1`).
pub const REQUIRE_INPUTS_ENV: &str = "TANDEM_REQUIRE_INPUTS";
/// The kernel backends that must be available (comma-separated names).
pub const REQUIRE_KERNELS_ENV: &str = "TANDEM_REQUIRE_KERNELS";

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const FETCH_MODEL: &str =
    "run tools/fetch_model.sh (it prints the path) and set TANDEM_MODEL=<that path>, or run tools/test.sh";
const FETCH_CORPUS: &str =
    "set TANDEM_CORPUS=<corpus>/raw (the shared corpus checkout, default <repo>/../shared/corpus/raw)";

/// Whether `TANDEM_REQUIRE_INPUTS=1`.
pub fn require_inputs() -> bool {
    std::env::var(REQUIRE_INPUTS_ENV).is_ok_and(|v| v.trim() == "1")
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("this test")
        .to_string()
}

/// Prints `UNTESTED: <test>: <what>` straight to stderr (past the harness's capture), once per
/// test and message.
pub fn untested(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let line = format!("UNTESTED: {}: {what}", test_name());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(line.clone()) {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

#[track_caller]
fn missing(what: &str, path: &Path, how: &str) -> ! {
    panic!(
        "required test input missing: {what} {} not found; {how}",
        path.display()
    )
}

/// Where the default model is looked for: `$TANDEM_MODEL`, else where `tools/fetch_model.sh`
/// puts it (`$TANDEM_CACHE/models/`, default `~/.cache/tandem/models/`; the worker's
/// `default_model_path`).
pub fn model_location() -> PathBuf {
    if let Some(p) = std::env::var_os("TANDEM_MODEL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("TANDEM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tandem")))
        .unwrap_or_else(|| PathBuf::from(".cache/tandem"));
    cache.join("models").join(MODEL_FILE)
}

/// The real SmolLM2 model (required): fails the test when the file is missing.
#[track_caller]
pub fn model_path() -> PathBuf {
    let p = model_location();
    if !p.is_file() {
        let from = if std::env::var_os("TANDEM_MODEL").is_some_and(|p| !p.is_empty()) {
            "model file (TANDEM_MODEL)"
        } else {
            "model file (default path; TANDEM_MODEL unset)"
        };
        missing(from, &p, FETCH_MODEL);
    }
    p
}

/// The real model for a test that may be skipped: `None` (with an `UNTESTED` line) when the
/// file is missing, unless `TANDEM_REQUIRE_INPUTS=1`, where it fails like [`model_path`].
#[track_caller]
pub fn optional_model_path() -> Option<PathBuf> {
    let p = model_location();
    if p.is_file() {
        Some(p)
    } else if require_inputs() {
        Some(model_path())
    } else {
        untested(&format!(
            "model file {} not found (optional here); {FETCH_MODEL}",
            p.display()
        ));
        None
    }
}

/// Where the corpus is looked for: `$TANDEM_CORPUS`, else `<repo>/../shared/corpus/raw`.
pub fn corpus_location() -> PathBuf {
    std::env::var_os("TANDEM_CORPUS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/raw"))
}

/// The corpus root (required): fails the test when it is not a folder.
#[track_caller]
pub fn corpus_dir() -> PathBuf {
    let p = corpus_location();
    if !p.is_dir() {
        missing("corpus folder", &p, FETCH_CORPUS);
    }
    p
}

/// A committed fixture file or folder (required): fails the test, saying how the fixture is
/// made (`how`), when `path` does not exist.
#[track_caller]
pub fn fixture(path: impl AsRef<Path>, how: &str) -> PathBuf {
    let p = path.as_ref();
    if !p.exists() {
        missing("fixture", p, how);
    }
    p.to_path_buf()
}

/// The backends named in `TANDEM_REQUIRE_KERNELS`, else, under `TANDEM_REQUIRE_INPUTS=1`,
/// those of [`cpuinfo_kernels`]; else none.
pub fn required_kernels() -> Vec<String> {
    match std::env::var(REQUIRE_KERNELS_ENV) {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect(),
        Err(_) if require_inputs() => cpuinfo_kernels(),
        Err(_) => Vec::new(),
    }
}

/// The SIMD kernel backends the CPU's `/proc/cpuinfo` flags allow (the rule of
/// `tools/test.sh`): avx2 + fma + f16c → `avx2`; that and avx512f, avx512bw, avx512dq,
/// avx512vl, avx512_vnni → `avx512-vnni`; asimd (aarch64) → `neon`.
pub fn cpuinfo_kernels() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: HashSet<&str> = text
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    let has = |fs: &[&str]| fs.iter().all(|f| flags.contains(f));
    let mut out = Vec::new();
    if has(&["avx2", "fma", "f16c"]) {
        out.push("avx2".to_string());
        if has(&["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"]) {
            out.push("avx512-vnni".to_string());
        }
    }
    if has(&["asimd"]) {
        out.push("neon".to_string());
    }
    out
}

/// A kernel backend for a conformance test: `backend` when available; when not, a failure if
/// `name` is required ([`required_kernels`]), else `None` after an `UNTESTED` line.
#[track_caller]
pub fn kernel_backend<B>(name: &str, backend: Option<B>) -> Option<B> {
    if backend.is_some() {
        return backend;
    }
    let required = required_kernels();
    if required.iter().any(|r| r == name) {
        panic!(
            "required kernel backend {name} is not available: {REQUIRE_KERNELS_ENV}={} (or, unset \
             under {REQUIRE_INPUTS_ENV}=1, the /proc/cpuinfo flags) names it, but this CPU lacks \
             it or the backend's run-time detection refused it",
            required.join(",")
        );
    }
    untested(&format!(
        "kernel backend {name} not available on this CPU (set {REQUIRE_KERNELS_ENV}={name} to \
         make that a failure)"
    ));
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "required test input missing: fixture")]
    fn a_missing_fixture_fails() {
        fixture("/nonexistent/fixture.gguf", "made by nothing");
    }

    #[test]
    fn an_available_backend_is_returned() {
        assert_eq!(kernel_backend("scalar", Some(7)), Some(7));
    }

    /// The only test here that touches the environment (the others never read it).
    #[test]
    fn a_missing_backend_is_untested_unless_required() {
        std::env::remove_var(REQUIRE_INPUTS_ENV);
        std::env::set_var(REQUIRE_KERNELS_ENV, "avx2");
        assert_eq!(kernel_backend::<u8>("avx9000", None), None, "not required: UNTESTED");
        std::env::set_var(REQUIRE_KERNELS_ENV, "avx2, AVX9000");
        let err = std::panic::catch_unwind(|| kernel_backend::<u8>("avx9000", None))
            .expect_err("a required backend that is missing fails");
        let msg = err.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.contains("required kernel backend avx9000 is not available"), "{msg}");
        // Unset under TANDEM_REQUIRE_INPUTS=1: the backends the CPU flags allow.
        std::env::remove_var(REQUIRE_KERNELS_ENV);
        std::env::set_var(REQUIRE_INPUTS_ENV, "1");
        assert_eq!(required_kernels(), cpuinfo_kernels());
        std::env::remove_var(REQUIRE_INPUTS_ENV);
        assert!(required_kernels().is_empty());
    }
}
