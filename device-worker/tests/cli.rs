//! The `device-worker` binary's start-up choices, run for real: the kernel backend
//! (`bench --kernels NAME` or `TANDEM_KERNELS` installs it, an unknown name is warned about
//! and the fastest is used; on the tiny Qwen3.5 fixture) and the bind policy (no token file:
//! loopback only).

use std::process::Command;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen35/tiny-qwen35-f16.gguf");

/// `bench --json` on the tiny model with `args` and `TANDEM_KERNELS=env`: (the `kernels`
/// field of its JSON, its stderr).
fn bench(env: Option<&str>, args: &[&str]) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_device-worker"));
    cmd.args(["bench", "--model", TINY, "--json", "--prompt-tokens", "8", "--gen-tokens", "2"])
        .args(["-r", "1", "-t", "1"])
        .args(args)
        .env_remove("TANDEM_KERNELS");
    if let Some(v) = env {
        cmd.env("TANDEM_KERNELS", v);
    }
    let out = cmd.output().expect("device-worker runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "bench failed: {stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --json prints one JSON object");
    (json["kernels"].as_str().expect("a kernels field").to_string(), stderr)
}

#[test]
fn the_flag_or_the_environment_names_the_backend() {
    let best = dsp::backend::best().name();
    let (kernels, stderr) = bench(None, &[]);
    assert_eq!(kernels, best);
    assert!(!stderr.contains("warning"), "{stderr}");

    assert_eq!(bench(Some("scalar"), &[]).0, "scalar");
    // The flag wins over the environment.
    let (kernels, stderr) = bench(Some("avx9000"), &["--kernels", "scalar"]);
    assert_eq!(kernels, "scalar");
    assert!(!stderr.contains("warning"), "{stderr}");

    let (kernels, stderr) = bench(Some("avx9000"), &[]);
    assert_eq!(kernels, best);
    assert!(
        stderr.contains("avx9000 names no kernel backend this CPU has") && stderr.contains(best),
        "{stderr}"
    );
}

#[test]
fn serve_on_a_non_loopback_address_without_a_token_refuses_to_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_device-worker"))
        .args(["serve", "--model", TINY, "--listen", "0.0.0.0:0"])
        .env_remove("TANDEM_AUTH_TOKEN_FILE")
        .output()
        .expect("device-worker runs");
    assert!(!out.status.success(), "it must not serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without authentication")
            && stderr.contains("--auth-token-file"),
        "{stderr}"
    );
}
