//! Checks of the two programs' command lines shared by their `tests/cli.rs`: the binaries are
//! run as child processes (`env!("CARGO_BIN_EXE_…")` paths), nothing is mocked.

use std::process::Command;

/// The text `bin serve --help` prints (its stdout). Panics when `bin` cannot be run.
pub fn serve_help(bin: &str) -> String {
    let out = Command::new(bin).args(["serve", "--help"]).output().unwrap_or_else(|e| panic!("{bin} runs: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text after the line-leading `error: ` in `stderr` (how the binaries and clap end on an
/// error) is one line (no "Caused by" block) containing `want`; panics (failing the test)
/// otherwise.
pub fn assert_one_line_error(stderr: &str, want: &str) {
    let error = stderr
        .match_indices("error: ")
        .find(|&(i, _)| i == 0 || stderr.as_bytes()[i - 1] == b'\n')
        .map(|(i, _)| stderr[i + "error: ".len()..].trim_end());
    assert!(
        error.is_some_and(|e| !e.contains('\n') && e.contains(want)),
        "want one line with {want:?}, got {stderr}"
    );
}

/// `out` is a usage error: exit code 2 (clap's, and `tandem_options::exit_on_usage_error`'s),
/// stderr holding every one of `want`; panics (failing the test) otherwise.
pub fn assert_usage_error(out: &std::process::Output, want: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for w in want {
        assert!(stderr.contains(w), "{w:?} missing: {stderr}");
    }
}

/// The paragraph of `bin serve --help` between `start` and the next `end` (both exclusive).
///
/// Panics (failing the test) when the help cannot be run or holds no `start`.
pub fn serve_help_paragraph(bin: &str, start: &str, end: &str) -> String {
    let help = serve_help(bin);
    help.split(start)
        .nth(1)
        .and_then(|s| s.split(end).next())
        .unwrap_or_else(|| panic!("no {start} paragraph in:\n{help}"))
        .to_string()
}

/// The `--config` help of `bin serve` gives this program's own keys as examples: none of
/// `foreign` (the other program's keys) is in it, and every example (`key = value` in
/// backquotes, at least two), written into a file, is accepted by `serve --config FILE
/// --print-config` and printed back. Panics (failing the test) otherwise.
pub fn check_serve_config_help_examples(bin: &str, foreign: &[&str]) {
    let para = serve_help_paragraph(bin, "--config <FILE>", "--print-config");
    let examples: Vec<&str> = para.split('`').skip(1).step_by(2).filter(|e| e.contains(" = ")).collect();
    assert!(examples.len() >= 2, "{para}");
    for foreign in foreign {
        assert!(!para.contains(foreign), "{foreign} is the other program's key: {para}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, examples.join("\n")).unwrap();
    let out = Command::new(bin)
        .args(["serve", "--config", file.to_str().unwrap(), "--print-config"])
        .env_remove("TANDEM_AUTH_TOKEN_FILE")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for e in examples {
        let key = e.split(" = ").next().unwrap();
        assert!(printed.lines().any(|l| l.starts_with(&format!("{key} = "))), "{key} not printed:\n{printed}");
    }
}

/// Runs `cmd` with its standard output a pipe whose reader is gone (as `cmd | head -0`
/// leaves it) and asserts it ends as a pipeline expects: exit code 0, nothing on stderr
/// about the pipe, no panic. Panics (failing the test) otherwise.
pub fn assert_quiet_on_closed_stdout(cmd: &mut Command) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove("RUST_BACKTRACE")
        .spawn()
        .expect("the program runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("the program ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("Broken pipe") && !stderr.contains("panicked"),
        "{}: {stderr}",
        out.status
    );
}

/// Runs `cmd` to its end, as [`Command::output`], but kills it after `limit` (a server that
/// accepted what it should have refused would otherwise serve forever): its output is then
/// what it wrote so far, with no exit code. Panics when the program cannot be run.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the program runs");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait for the program").is_none() && t0.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().expect("the program ends")
}

/// A `--config` file `bin serve` cannot use is a usage error, as a bad flag is (exit code 2,
/// `error: ` and the reason on one line naming the file): one that does not exist, is not
/// TOML, has a key that is no flag of `serve`, a table where a flag takes a plain value, a
/// value of the wrong kind (text for a number, a number for a path) or one the flag's parser
/// refuses; a value's error names its key, not the `--flag` it became. `extra` are more
/// (file text, wanted error after `config file PATH: `) cases with `bin`'s own keys. Panics
/// (failing the test) otherwise.
pub fn check_bad_config_files_are_usage_errors(bin: &str, extra: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let mut cases = vec![(missing.clone(), "No such file".to_string())];
    let common = [
        ("listen = [\n", "not valid TOML"),
        ("no-such-flag = 1\n", "unknown key \"no-such-flag\"; `serve` takes: "),
        ("listen = { port = 1 }\n", "key \"listen\": expected a plain value"),
        ("listen = \"nowhere\"\n", "key \"listen\": invalid value \"nowhere\": "),
        ("grpc-max-concurrent-streams = \"abc\"\n", "key \"grpc-max-concurrent-streams\": expected a positive integer, got \"abc\""),
        ("grpc-max-concurrent-streams = 1.5\n", "key \"grpc-max-concurrent-streams\": expected a positive integer, got 1.5"),
        ("auth-token-file = 5\n", "key \"auth-token-file\": expected a path (a string in quotes), got 5"),
    ];
    for (i, (text, want)) in common.iter().chain(extra).enumerate() {
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        cases.push((file, want.to_string()));
    }
    for (file, want) in cases {
        // Bounded: a file wrongly accepted would serve forever.
        let out = output_within(
            Command::new(bin).args(["serve", "--config"]).arg(&file).env_remove("TANDEM_AUTH_TOKEN_FILE").env_remove("RUST_BACKTRACE"),
            std::time::Duration::from_secs(30),
        );
        let want = format!("config file {}: {want}", file.display());
        assert_usage_error(&out, &[&want]);
        assert_one_line_error(&String::from_utf8_lossy(&out.stderr), &want);
    }
}
