//! The `tandem-tools` binary run for real: how its command line ends in a pipeline and on
//! usage errors.

use std::process::Command;

/// `tandem-tools dry-run` on the corpus and the default model, with `args`.
fn dry_run(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem-tools"));
    cmd.arg("dry-run")
        .arg("--corpus")
        .arg(test_support::corpus_dir())
        .arg("--model")
        .arg(test_support::model_path())
        .args(args);
    cmd
}

/// `tandem-tools dry-run | head -0`: the reader going away ends the run quietly (exit 0),
/// not with "failed printing to stdout: Broken pipe" and exit code 101.
#[test]
fn dry_run_into_a_closed_pipe_ends_quietly() {
    test_support::cli::assert_quiet_on_closed_stdout(&mut dry_run(&["--per-step"]));
}

/// Limits as the worker's: `--ctx-size` below the worker's minimum (64), and image-token
/// options without `--mmproj` (no image is read), are usage errors naming the option.
#[test]
fn dry_run_usage_errors_exit_2_as_the_workers() {
    for (args, want) in [
        (&["--ctx-size", "10"][..], &["'--ctx-size <CTX_SIZE>'", "at least 64"][..]),
        (&["--image-max-tokens", "256"], &["--image-max-tokens", "needs --mmproj"]),
        (&["--image-min-tokens", "4"], &["--image-min-tokens", "needs --mmproj"]),
    ] {
        let out = dry_run(args).output().expect("tandem-tools runs");
        test_support::cli::assert_usage_error(&out, want);
    }
}

/// The error of `dry-run args` (it must fail): its stderr.
fn dry_run_error(args: &[&str]) -> String {
    let out = dry_run(args).env_remove("RUST_BACKTRACE").output().expect("tandem-tools runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} must fail: {stderr}");
    stderr
}

/// Each file's error has one accurate prefix: a bad `--state-shapes` file is named as such
/// (was "model"), and a projector that does not fit the model is the projector's error (was
/// three prefixes, "model ...: vision tokens: the model failed to load: --mmproj: ...", in a
/// run that loads nothing).
#[test]
fn dry_run_errors_name_the_file_they_are_about() {
    let dir = tempfile::tempdir().unwrap();
    let shapes = dir.path().join("shapes.gguf");
    std::fs::write(&shapes, "not a gguf").unwrap();
    let shapes = shapes.to_str().unwrap();
    let stderr = dry_run_error(&["--state-shapes", shapes]);
    test_support::cli::assert_one_line_error(&stderr, &format!("state shapes {shapes}: cannot read"));
    assert!(!stderr.contains("error: model"), "{stderr}");

    let projector = test_support::projector_metadata(576).write_temp();
    let mmproj = projector.path().to_str().unwrap();
    let stderr = dry_run_error(&["--screenshots", "always", "--mmproj", mmproj]);
    test_support::cli::assert_one_line_error(&stderr, &format!("projector {mmproj}: does not fit the model"));
    for stacked in ["failed to load", "vision tokens", ": --mmproj:"] {
        assert!(!stderr.contains(stacked), "{stacked:?} in {stderr}");
    }
}

/// `tandem-tools draft-vocab ... | head -0`: the summary meets a closed pipe and the command
/// ends quietly (exit 0), not with a panic in `println!` (exit code 101); the file is written.
#[test]
fn draft_vocab_into_a_closed_pipe_ends_quietly() {
    let model = test_support::fixture(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf"),
        "committed in device-worker/tests/fixtures/qwen35 (made by tools/fixtures/, see its README.md)",
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft.gguf");
    test_support::cli::assert_quiet_on_closed_stdout(
        Command::new(env!("CARGO_BIN_EXE_tandem-tools"))
            .args(["draft-vocab", "--top", "300", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .arg("--corpus")
            .arg(test_support::corpus_dir()),
    );
    assert!(out.exists(), "the draft vocabulary is written before the summary");
}
