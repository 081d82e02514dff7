//! The `agent-gateway` binary's start-up checks, run for real: `serve --help` explains the
//! TLS, Unix-socket and reflection flags; an https:// worker without `--worker-tls-ca` and a
//! certificate file that is not PEM stop the start with one line; `health` reaches a
//! `unix:PATH` server.

use std::process::Command;
use test_support::cli::{assert_one_line_error, serve_help};

/// `agent-gateway serve` with `args` (ephemeral ports): (success, stderr).
fn serve(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "off"])
        .args(args)
        .env_remove("TANDEM_AUTH_TOKEN_FILE")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("agent-gateway runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn serve_help_explains_tls_workers_and_reflection() {
    let help = serve_help(env!("CARGO_BIN_EXE_agent-gateway"));
    for want in [
        "--tls-cert",
        "--tls-key",
        "--tls-client-ca",
        "Mutual TLS",
        "--worker-tls-ca",
        "--worker-tls-cert",
        "--worker-tls-key",
        "--worker-tls-domain",
        "unix:PATH",
        "https://",
        "--reflection",
        "Off by default",
        "--http-header-read-timeout-ms <HTTP_HEADER_READ_TIMEOUT_MS>",
        "[default: 10000]",
        "--http-idle-timeout-ms <HTTP_IDLE_TIMEOUT_MS>",
        "[default: 120000]",
        "--http-max-connections <HTTP_MAX_CONNECTIONS>",
        "[default: 128]",
        "--grpc-max-concurrent-streams <GRPC_MAX_CONCURRENT_STREAMS>",
        "[default: 64]",
        "--screenshots <SCREENSHOTS>",
        "FAILED_PRECONDITION",
        "--screenshot-sparse-below <SCREENSHOT_SPARSE_BELOW>",
        "[default: 4]",
    ] {
        assert!(
            help.contains(want),
            "{want} missing from serve --help:\n{help}"
        );
    }
}

#[test]
fn bad_tls_setups_stop_the_start_with_one_line() {
    let (ok, stderr) = serve(&["--worker", "https://127.0.0.1:1"]);
    assert!(!ok);
    assert_one_line_error(&stderr, "no --worker-tls-ca");
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.der");
    std::fs::write(&not_pem, b"\x30\x82 binary").unwrap();
    let (ok, stderr) = serve(&[
        "--worker",
        "https://127.0.0.1:1",
        "--worker-tls-ca",
        not_pem.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert_one_line_error(&stderr, "--worker-tls-ca");
}

/// Usage errors exit 2 naming the flag, as clap's own: a `--worker` that is no address, has
/// a scheme other than http:// or https://, or a port outside 1-65535; a TLS key without its
/// certificate (or the reverse).
#[test]
fn bad_worker_addresses_and_lone_tls_files_are_usage_errors() {
    for (args, want) in [
        (&["--worker", "garbage:::"][..], &["'--worker <WORKERS>'", "garbage:::", "invalid"][..]),
        (&["--worker", "ftp://host:1"], &["'--worker <WORKERS>'", "ftp:// is not a gRPC scheme", "expected http://HOST:PORT"]),
        (&["--worker", "host:99999"], &["'--worker <WORKERS>'", "port \"99999\" is not a number from 1 to 65535"]),
        (&["--worker", "http://127.0.0.1:50051/step"], &["'--worker <WORKERS>'", "\"/step\" after the port: a gRPC address has no path or query"]),
        (&["--tls-key", "/k.pem"], &["--tls-cert", "required"]),
        (&["--tls-cert", "/c.pem"], &["--tls-key", "required"]),
    ] {
        // Killed after 30 s: a serve that accepted the address would not end.
        let out = test_support::cli::output_within(
            Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
                .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "off"])
                .args(args)
                .env_remove("TANDEM_AUTH_TOKEN_FILE"),
            std::time::Duration::from_secs(30),
        );
        test_support::cli::assert_usage_error(&out, want);
    }
}

/// `agent-gateway health --addr unix:PATH` reaches a server listening on a Unix socket (as
/// `serve --worker unix:PATH` and `device-worker request --addr unix:PATH` do): a server
/// serving gRPC health alone answers SERVING (and `health ... | head -0` ends quietly); a
/// gateway served in this process whose worker is down answers NOT_SERVING (its health
/// follows its workers); a missing socket is an error naming the address.
#[test]
fn health_accepts_a_unix_socket_address() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, plain_sock) = (dir.path().join("gw.sock"), dir.path().join("health.sock"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.block_on(async {
        let listener = tandem_auth::Listener::bind(&tandem_auth::ListenAddr::Unix(sock.clone())).await.unwrap();
        let router = agent_gateway::worker::Router::new(&["http://127.0.0.1:1".to_string()]).unwrap();
        let runner = std::sync::Arc::new(agent_gateway::step::StepRunner::new(router));
        let security = tandem_auth::GrpcSecurity::auth(tandem_auth::AuthLayer::grpc(None, false));
        // Health alone ("" SERVING, tonic-health's start), on its own socket.
        let plain = tandem_auth::Listener::bind(&tandem_auth::ListenAddr::Unix(plain_sock.clone())).await.unwrap();
        let (_, health) = tonic_health::server::health_reporter();
        let open = tandem_auth::GrpcSecurity::open();
        let router_plain = tandem_auth::grpc::server(&open).unwrap().add_service(health);
        tokio::spawn(async move { tandem_auth::grpc::serve_reflected(router_plain, &open, &[], plain, std::future::pending()).await });
        tokio::spawn(agent_gateway::service::serve_secured(runner, listener, async { let _ = stopped.await; }, security))
    });
    let health = |addr: &str| {
        Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
            .args(["health", "--addr", addr])
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .expect("agent-gateway runs")
    };
    let plain = format!("unix:{}", plain_sock.display());
    let out = health(&plain);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), format!("{plain}: SERVING"));
    // `health ... | head -0`: the answer meets a closed pipe, the command ends quietly.
    test_support::cli::assert_quiet_on_closed_stdout(Command::new(env!("CARGO_BIN_EXE_agent-gateway")).args(["health", "--addr", &plain]));
    let addr = format!("unix:{}", sock.display());
    let out = health(&addr);
    assert!(!out.status.success());
    assert_one_line_error(&String::from_utf8_lossy(&out.stderr), &format!("{addr} is NOT_SERVING"));
    let missing = format!("unix:{}", dir.path().join("none.sock").display());
    let out = health(&missing);
    assert!(!out.status.success());
    assert_one_line_error(&String::from_utf8_lossy(&out.stderr), &missing);
    let _ = stop.send(());
    rt.block_on(server).unwrap().unwrap();
}

/// The `--config` help of `serve` gives this program's own keys as examples (not the other
/// program's): every example, written into a file, is accepted by `serve --config FILE
/// --print-config` and printed back.
#[test]
fn serve_config_help_examples_are_this_programs_keys() {
    test_support::cli::check_serve_config_help_examples(env!("CARGO_BIN_EXE_agent-gateway"), &["micro-batch", "ctx-size", "model = "]);
}

/// `--worker-tls-ca`'s help says what rustls accepts: a separate CA (deploy/README.md's
/// recipe), not a plain self-signed certificate as its own CA.
#[test]
fn worker_tls_ca_help_matches_what_rustls_accepts() {
    let para = test_support::cli::serve_help_paragraph(env!("CARGO_BIN_EXE_agent-gateway"), "--worker-tls-ca <WORKER_TLS_CA>", "\n      --");
    assert!(!para.contains("works for a self-signed"), "{para}");
    for want in ["signed the worker's certificate", "deploy/README.md", "CaUsedAsEndEntity", "basicConstraints=CA:FALSE"] {
        assert!(para.contains(want), "{want}: {para}");
    }
}

/// `health --addr`, `replay --gateway` and `load --gateway` take the addresses `serve --worker`
/// takes: another scheme, a port out of range or a path after the port is a usage error naming
/// the flag, before anything is dialled.
#[test]
fn health_and_replay_refuse_bad_addresses_as_usage_errors() {
    for (addr, want) in [
        ("ftp://host:1", "ftp:// is not a gRPC scheme"),
        ("host:99999", "port \"99999\" is not a number from 1 to 65535"),
        ("http://127.0.0.1:50052/v1?x=1", "\"/v1?x=1\" after the port: a gRPC address has no path or query"),
    ] {
        for (command, flag) in [("health", "--addr"), ("replay", "--gateway"), ("load", "--gateway")] {
            let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway")).args([command, flag, addr]).output().expect("agent-gateway runs");
            let named = format!("'{flag} <{}>'", flag.trim_start_matches('-').to_uppercase());
            test_support::cli::assert_usage_error(&out, &[&named, addr, want]);
        }
    }
}

/// `health --addr` and `replay --gateway` pointed at the gateway's HTTP port (its OpenAI
/// endpoint, served here in this process) say that the address answers plain HTTP/1.1, not
/// gRPC, and where the gRPC service is, instead of a bare "transport error"; `health --wait`
/// says so at once instead of retrying the wrong protocol until its timeout.
#[test]
fn health_and_replay_at_the_http_port_say_it_is_not_grpc() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let router = agent_gateway::worker::Router::new(&["http://127.0.0.1:1".to_string()]).unwrap();
        let state = agent_gateway::http::HttpState { router, metrics: None };
        tokio::spawn(agent_gateway::http::serve(state, l, std::future::pending()));
        addr
    });
    let run = |args: &[&str]| {
        let t = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
            .args(args)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .expect("agent-gateway runs");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("{stderr}");
        (stderr, t.elapsed())
    };
    let not_grpc = "this address answers plain HTTP/1.1, not gRPC: it looks like the gateway's --http-listen port";
    let (stderr, _) = run(&["health", "--addr", &addr]);
    assert_one_line_error(&stderr, &format!("{not_grpc}, whose health is GET /health"));
    let (stderr, took) = run(&["health", "--addr", &addr, "--wait", "60"]);
    assert_one_line_error(&stderr, &format!("{not_grpc}, whose health is GET /health"));
    assert!(took < std::time::Duration::from_secs(30), "health --wait 60 retried the wrong protocol for {took:?}");
    assert!(!stderr.contains("no answer after waiting"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("replay.jsonl");
    let corpus = test_support::corpus_dir();
    let (stderr, _) = run(&["replay", "--gateway", &addr, "--max-steps", "1", "--corpus", corpus.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_one_line_error(&stderr, &format!("{not_grpc}, its OpenAI endpoint; AgentService (gRPC) is on its --listen port, default 127.0.0.1:50052"));
    assert!(!stderr.contains("retry"), "a protocol mismatch is not retried: {stderr}");
}

/// `serve --worker ADDR` at an address that answers but is no device-worker stops the start
/// (exit 1, one line naming the address and what it seems to be) instead of starting and
/// answering every chat with a 502: the gateway's HTTP port, an agent-gateway's gRPC port,
/// another HTTP server (all served here in this process). A worker address where nothing
/// listens still starts, with a warning (the worker may start later).
/// A `--worker` equal to the gateway's own `--listen` or `--http-listen` address is a usage
/// error (exit 2) before anything listens: the start-up probe of the workers runs before the
/// gateway's own ports are open, so it would find nothing there (found by the fresh-user
/// trial: the gateway started, and connected to its own HTTP port until its cap was full).
#[test]
fn serve_refuses_its_own_address_as_worker() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (grpc, http) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{}", port.wrapping_add(1).max(1024)));
    for (worker, flag) in [(format!("http://{grpc}"), "--listen"), (format!("http://localhost:{}", port.wrapping_add(1).max(1024)), "--http-listen")] {
        let out = test_support::cli::output_within(
            Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
                .args(["serve", "--listen", &grpc, "--http-listen", &http, "--worker", &worker])
                .env_remove("TANDEM_AUTH_TOKEN_FILE")
                .env_remove("RUST_BACKTRACE")
                .env_remove("RUST_LIB_BACKTRACE"),
            std::time::Duration::from_secs(30),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_one_line_error(&stderr, &format!("--worker {worker} is this gateway's own {flag} address"));
    }
}

#[test]
fn serve_refuses_a_worker_address_that_is_no_worker() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let bind = || rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let (http, grpc, other) = (bind(), bind(), bind());
    let addrs = [&http, &grpc, &other].map(|l| format!("http://{}", l.local_addr().unwrap()));
    rt.block_on(async {
        let router = agent_gateway::worker::Router::new(&["http://127.0.0.1:1".to_string()]).unwrap();
        tokio::spawn(agent_gateway::http::serve(agent_gateway::http::HttpState { router: router.clone(), metrics: None }, http, std::future::pending()));
        let runner = std::sync::Arc::new(agent_gateway::step::StepRunner::new(router));
        tokio::spawn(agent_gateway::service::serve(runner, grpc, std::future::pending()));
        // Any request: a 404 without a body.
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = other.accept().await {
                tokio::spawn(async move {
                    let _ = s.read(&mut [0u8; 1024]).await;
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                });
            }
        });
    });
    let serve = |worker: &str, limit: u64| {
        test_support::cli::output_within(
            Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
                .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "off", "--worker", worker])
                .env_remove("TANDEM_AUTH_TOKEN_FILE")
                .env_remove("RUST_BACKTRACE")
                .env_remove("RUST_LIB_BACKTRACE"),
            std::time::Duration::from_secs(limit),
        )
    };
    let pass = "; pass a worker's gRPC address, its `device-worker serve --listen` (default 127.0.0.1:50051)";
    for (addr, what) in [
        (&addrs[0], "it answers plain HTTP/1.1, not gRPC: it looks like the gateway's --http-listen port"),
        (&addrs[1], "it is an agent-gateway's gRPC port (its --listen)"),
        (&addrs[2], "it answers plain HTTP/1.1, not gRPC"),
    ] {
        let out = serve(addr, 30);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_one_line_error(&stderr, &format!("--worker {addr} is not a device-worker: {what}{pass}"));
        assert!(!stderr.contains("listening"), "{stderr}");
    }
    // Nothing listens there: the gateway serves (killed after 3 s), warning once.
    let out = serve("127.0.0.1:1", 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), None, "killed while serving: {stderr}");
    assert!(stderr.contains("AgentService listening"), "{stderr}");
    assert_eq!(stderr.matches("worker does not answer (yet); starting anyway").count(), 1, "{stderr}");
}

/// A connection refused is said once, with its cause: tonic's "tcp connect error" appears
/// once (it was printed twice, its source repeating it) and the OS error follows.
#[test]
fn connection_errors_print_each_cause_once() {
    let corpus = test_support::corpus_dir();
    for args in [&["health", "--addr", "127.0.0.1:1"][..], &["replay", "--gateway", "127.0.0.1:1", "--corpus", corpus.to_str().unwrap()]] {
        let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway")).args(args).env_remove("RUST_BACKTRACE").output().expect("agent-gateway runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_one_line_error(&stderr, "transport error: tcp connect error: Connection refused (os error 111)");
        assert_eq!(stderr.matches("tcp connect error").count(), 1, "{stderr}");
    }
}

/// `health --wait N` against nothing listening says it waited, on one line.
#[test]
fn health_wait_timeout_says_it_waited() {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
        .args(["health", "--addr", "127.0.0.1:1", "--wait", "1"])
        .output()
        .expect("agent-gateway runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert_one_line_error(&stderr, "no answer after waiting 1s");
}

/// `agent-gateway replay --list | head -0`: the reader going away ends the listing quietly
/// (exit 0), not with "failed printing to stdout: Broken pipe" and exit code 101.
#[test]
fn replay_list_into_a_closed_pipe_ends_quietly() {
    test_support::cli::assert_quiet_on_closed_stdout(
        Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
            .args(["replay", "--list", "--corpus"])
            .arg(test_support::corpus_dir()),
    );
}

/// `agent-gateway prompt --episode ID | head -0`: the messages meet a closed pipe and the
/// command ends quietly (exit 0), not with a panic in `println!` (exit code 101).
#[test]
fn prompt_into_a_closed_pipe_ends_quietly() {
    test_support::cli::assert_quiet_on_closed_stdout(
        Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
            .args(["prompt", "--episode", "androidworld/ContactsAddContact_base_o4-mini_trial1", "--corpus"])
            .arg(test_support::corpus_dir()),
    );
}

/// Loading the corpus warns once per problem, and not about what is no problem: the folders
/// known to hold no episodes and the file the corpus keeps invalid on purpose
/// (`TRUNCATED_INVALID_*`) are logged at debug level only (they were warned about on every
/// run); another unreadable episode file is one WARN line.
#[test]
fn corpus_warnings_are_one_per_problem() {
    let list = |corpus: &std::path::Path, log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-gateway"));
        cmd.args(["replay", "--list", "--corpus"]).arg(corpus).env_remove("RUST_LOG");
        if let Some(level) = log {
            cmd.env("RUST_LOG", level);
        }
        let out = cmd.output().expect("agent-gateway runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let stderr = list(&test_support::corpus_dir(), None);
    assert!(!stderr.contains("WARN"), "{stderr}");
    let stderr = list(&test_support::corpus_dir(), Some("agent_gateway=debug"));
    assert!(
        stderr.lines().any(|l| l.contains("DEBUG") && l.contains("TRUNCATED_INVALID") && l.contains("not valid JSON")),
        "{stderr}"
    );
    // A copy of one episode log beside a broken log and one invalid on purpose.
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("androidworld_episodes_t3a");
    std::fs::create_dir(&logs).unwrap();
    std::fs::copy(test_support::corpus_dir().join("androidworld_episodes_t3a/demo.json"), logs.join("demo.json")).unwrap();
    std::fs::write(logs.join("broken.json"), "{\"goal\": ").unwrap();
    std::fs::write(logs.join("TRUNCATED_INVALID_cut.json"), "{\"goal\": ").unwrap();
    let stderr = list(dir.path(), None);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("broken.json") && warnings[0].contains("not valid JSON"), "{stderr}");
}

/// A file the command line names that cannot be read or used is a usage error (exit code 2,
/// as a bad flag and a bad `--config` file; it was 1), on one line naming it: serve's token
/// and TLS files, replay's and load's `--token-file`. `--help` says what the exit codes mean.
#[test]
fn unreadable_files_on_the_command_line_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let empty = dir.path().join("empty-tokens");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let corpus = test_support::corpus_dir();
    let corpus = corpus.to_str().unwrap();
    for (args, want) in [
        (vec!["serve", "--auth-token-file", missing], format!("cannot read the token file {missing}")),
        (vec!["serve", "--worker-token-file", empty], format!("token file {empty}: ")),
        (vec!["serve", "--worker-tls-ca", missing], format!("cannot read --worker-tls-ca {missing}")),
        (vec!["replay", "--corpus", corpus, "--token-file", missing], format!("cannot read the token file {missing}")),
        (vec!["load", "--corpus", corpus, "--token-file", empty], format!("token file {empty}: ")),
    ] {
        let out = test_support::cli::output_within(
            Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
                .args(&args)
                .args(if args[0] == "serve" { &["--listen", "127.0.0.1:0", "--http-listen", "off"][..] } else { &[] })
                .env_remove("TANDEM_AUTH_TOKEN_FILE")
                .env_remove("TANDEM_WORKER_TOKEN_FILE")
                .env_remove("TANDEM_TOKEN_FILE")
                .env_remove("RUST_BACKTRACE"),
            std::time::Duration::from_secs(30),
        );
        test_support::cli::assert_usage_error(&out, &[]);
        assert_one_line_error(&String::from_utf8_lossy(&out.stderr), &want);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("Exit codes: 0 done; 1 failed while running") && help.contains("2 usage error: "), "{help}");
}

/// A `--config` file `serve` cannot use (missing, not TOML, an unknown key, a table value, a
/// value of the wrong kind or one the flag refuses) exits 2 as a bad flag does, not 1, with an
/// error naming the file and the key.
#[test]
fn bad_config_files_are_usage_errors() {
    test_support::cli::check_bad_config_files_are_usage_errors(
        env!("CARGO_BIN_EXE_agent-gateway"),
        &[
            ("max-controls = \"abc\"\n", "key \"max-controls\": expected a positive integer, got \"abc\""),
            ("worker = [5]\n", "key \"worker\": expected a string (in quotes), got 5"),
        ],
    );
}

/// Values a user may well type get a usage error that says what is wrong (exit code 2): a
/// negative `prompt --step` (was clap's "unexpected argument '-1'"), a listen address without
/// a host or with a port past 65535 (was "invalid socket address syntax").
#[test]
fn negative_steps_and_bad_listen_addresses_are_clear_usage_errors() {
    let corpus = test_support::corpus_dir();
    let corpus = corpus.to_str().unwrap();
    for (args, want) in [
        (&["prompt", "--episode", "androidworld/ContactsAddContact_base_o4-mini_trial1", "--corpus", corpus, "--step", "-1"][..], &["'--step <STEP>'", "expected a 0-based step number", "found \"-1\""][..]),
        (&["prompt", "--episode", "x", "--step", "two"], &["'--step <STEP>'", "found \"two\""]),
        (&["serve", "--listen", ":99999"], &["'--listen <LISTEN>'", "no host before the port, port \"99999\" is not a number from 0 to 65535", "e.g. 127.0.0.1:50051"]),
        (&["serve", "--http-listen", ":99999"], &["'--http-listen <HTTP_LISTEN>'", "no host before the port", "or off"]),
        (&["serve", "--listen", "localhost:50052"], &["'--listen <LISTEN>'", "host \"localhost\" is not an IP address"]),
    ] {
        let out = test_support::cli::output_within(
            Command::new(env!("CARGO_BIN_EXE_agent-gateway")).args(args).env_remove("TANDEM_AUTH_TOKEN_FILE"),
            std::time::Duration::from_secs(30),
        );
        test_support::cli::assert_usage_error(&out, want);
    }
}

/// `prompt --help` shows only `--episode` as required: `--corpus` has a default and an
/// environment variable, `--step` a default.
#[test]
fn prompt_help_requires_only_the_episode() {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-gateway")).args(["prompt", "--help"]).env_remove("TANDEM_CORPUS").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: agent-gateway prompt [OPTIONS] --episode <EPISODE>"), "{help}");
    for want in ["[env: TANDEM_CORPUS=]", "[default: ../shared/corpus/raw]", "[default: 0]"] {
        assert!(help.contains(want), "{want}: {help}");
    }
}

/// `agent-gateway load ... | head -0`: the table meets a closed pipe and `load` ends quietly
/// (exit 0), not with a panic in `println!` (exit code 101). The gateway is served in this
/// process; its worker is down, so the one step ends at once (as shed) and the table follows.
#[test]
fn load_into_a_closed_pipe_ends_quietly() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", l.local_addr().unwrap());
        let router = agent_gateway::worker::Router::new(&["http://127.0.0.1:1".to_string()]).unwrap();
        let runner = std::sync::Arc::new(agent_gateway::step::StepRunner::new(router));
        tokio::spawn(agent_gateway::service::serve(runner, l, std::future::pending()));
        addr
    });
    let dir = tempfile::tempdir().unwrap();
    test_support::cli::assert_quiet_on_closed_stdout(
        Command::new(env!("CARGO_BIN_EXE_agent-gateway"))
            .args(["load", "--gateway", &addr, "--http", "off", "--concurrency", "1", "--steps", "1", "--no-baseline", "--retries", "0", "--corpus"])
            .arg(test_support::corpus_dir())
            .arg("--out")
            .arg(dir.path().join("load.json")),
    );
}
