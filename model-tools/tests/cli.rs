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
