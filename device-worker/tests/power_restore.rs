//! The Linux power backend leaves the host as it found it, on the default model, with every
//! path under a fake root (`--power-root`: `sys/devices/system/cpu/cpufreq/policy*` files and
//! a plain file for `dev/cpu_dma_latency`):
//! - the real `device-worker serve` binary logs each setting it changes, raises the floors,
//!   and writes the originals back after SIGTERM (and removes its state file);
//! - a second SIGTERM during the drain (the forced exit) restores them too;
//! - after SIGKILL the floors stay raised, and `device-worker power-restore` writes the saved
//!   originals back;
//! - in process: the floors go back when the votes are released between bursts and are raised
//!   again for the next request; a watchdog restart releases them while the fresh engine loads.

mod common;
#[path = "support/power_root.rs"]
mod power_root;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use device_worker::config::PowerBackendKind;
use device_worker::engine::EngineHandle;
use device_worker::power::linux::{CPUFREQ_ROOT, CPU_DMA_LATENCY, STATE_FILE};
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;
use tokio_stream::StreamExt;

/// (policy, cpuinfo_min, original scaling_min, cpuinfo_max), kHz. The originals sit above
/// cpuinfo_min so that "restored" cannot be confused with "set to the minimum".
const POLICIES: [power_root::FakePolicy; 2] = [
    ("policy0", 300_000, 400_000, 2_000_000),
    ("policy4", 500_000, 700_000, 3_000_000),
];

/// A fake root ([`power_root::fake_root`]) with [`POLICIES`].
fn fake_root() -> tempfile::TempDir {
    power_root::fake_root(&POLICIES)
}

/// `scaling_min_freq` of each policy, kHz.
fn floors(root: &Path) -> Vec<u64> {
    POLICIES
        .iter()
        .map(|(name, ..)| {
            let p = root.join(CPUFREQ_ROOT).join(name).join("scaling_min_freq");
            std::fs::read_to_string(&p).unwrap().trim().parse().unwrap()
        })
        .collect()
}

fn originals() -> Vec<u64> {
    POLICIES.iter().map(|p| p.2).collect()
}

fn turbo() -> Vec<u64> {
    POLICIES.iter().map(|p| p.3).collect()
}

/// Whether process `pid` has a descriptor open on `path` (`/proc/PID/fd`).
fn holds_open(pid: u32, path: &Path) -> bool {
    let path = path.canonicalize().unwrap();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
}

/// A `device-worker serve` child on the default model with the Linux backend on `root`.
struct Served {
    child: Child,
    addr: String,
    /// Every stderr line so far (the reader thread keeps sending the rest).
    log: Vec<String>,
    lines: mpsc::Receiver<String>,
}

impl Served {
    /// Starts it and waits until the model is loaded and the port is known.
    fn start(root: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_device-worker"))
            .args(["serve", "--listen", "127.0.0.1:0", "--power-backend", "linux"])
            .arg("--model")
            .arg(model_path())
            .arg("--power-root")
            .arg(root)
            // Votes stay held for the whole test: what SIGTERM finds raised it must restore.
            .args(["--idle-release-ms", "600000", "--threads", "2"])
            .env_remove("TANDEM_AUTH_TOKEN_FILE")
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("device-worker runs");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let mut s = Served { child, addr: String::new(), log: Vec::new(), lines };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut loaded = false;
        while !(loaded && !s.addr.is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = s
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("not serving after 120 s:\n{}", s.log.join("\n")));
            if line.contains("StepService listening") {
                let addr = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next());
                s.addr = format!("http://{}", addr.expect("an addr field"));
            }
            loaded |= line.contains("model loaded");
            s.log.push(line);
        }
        s
    }

    /// Waits (up to 60 s) for a stderr line containing `needle`.
    fn wait_for_line(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {needle:?}:\n{}", self.log.join("\n")));
            let found = line.contains(needle);
            self.log.push(line);
            if found {
                return;
            }
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    /// One short request over gRPC.
    async fn request(&self) {
        let mut client = StepServiceClient::connect(self.addr.clone()).await.unwrap();
        let out = generate(&mut client, chat("p", "You are a phone agent.", "Open the camera.", 4))
            .await
            .expect("the worker serves");
        assert!(out.done.is_some() && !out.tokens.is_empty());
    }

    /// Sends `signal` (`TERM`, `KILL`) and waits for the exit; returns the exit status and
    /// the whole stderr.
    fn signal_and_wait(mut self, signal: &str) -> (std::process::ExitStatus, String) {
        self.signal(signal);
        let status = self.child.wait().unwrap();
        // The writer is gone: the reader thread ends after the last line.
        self.log.extend(self.lines.iter());
        (status, self.log.join("\n"))
    }
}

/// A worker serving on a fresh [`fake_root`] after one request: its floors are raised (checked)
/// while it holds the votes.
async fn served_after_a_request() -> (tempfile::TempDir, Served) {
    let tmp = fake_root();
    let w = Served::start(tmp.path());
    w.request().await;
    assert_eq!(floors(tmp.path()), turbo(), "the floors are raised while the votes are held");
    (tmp, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_what_it_changes_and_restores_it_after_sigterm() {
    let (tmp, w) = served_after_a_request().await;
    let root = tmp.path();
    assert!(
        holds_open(w.child.id(), &root.join(CPU_DMA_LATENCY)),
        "the PM QoS request is held open"
    );
    assert_eq!(std::fs::read(root.join(CPU_DMA_LATENCY)).unwrap(), 100i32.to_ne_bytes());
    assert!(root.join(STATE_FILE).exists(), "the originals are saved while serving");
    // At start: every setting with its path, the value found and the values written.
    for (name, _, original, max) in POLICIES {
        let path = root.join(CPUFREQ_ROOT).join(name).join("scaling_min_freq");
        let line = w.log.iter().find(|l| l.contains(&format!("path={}", path.display())));
        let line = line.unwrap_or_else(|| panic!("no start line for {}:\n{}", path.display(), w.log.join("\n")));
        assert!(
            line.contains(&format!("original_khz={original}")) && line.contains(&format!("turbo_khz={max}")),
            "{line}"
        );
    }
    assert!(
        w.log.iter().any(|l| l.contains("PM QoS") && l.contains(&root.join(CPU_DMA_LATENCY).display().to_string())),
        "{}",
        w.log.join("\n")
    );

    let (status, log) = w.signal_and_wait("TERM");
    assert!(status.success(), "a clean exit after SIGTERM: {status}\n{log}");
    assert_eq!(floors(root), originals(), "restored after SIGTERM:\n{log}");
    assert!(!root.join(STATE_FILE).exists(), "the state file is removed after the restore");
    assert!(log.contains("host settings restored"), "{log}");
}

/// A second SIGTERM during the drain exits at once (status 130, no destructor runs): the
/// forced-exit hook restores first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_exit_during_the_drain_restores_too() {
    let tmp = fake_root();
    let root = tmp.path();
    let mut w = Served::start(root);
    let mut client = StepServiceClient::connect(w.addr.clone()).await.unwrap();
    // A request that cannot end soon (the schema forbids the end of the string before 2000
    // characters) and whose stream the test stops reading: it holds the drain open.
    let mut req = chat("d", "You are a phone agent.", "Describe the screen.", 1500);
    req.json_schema = r#"{"type":"string","minLength":2000}"#.into();
    let mut stream = open_stream(&mut client, req).await;
    loop {
        let ev = stream.next().await.expect("an event").expect("no error");
        if let Some(pb::generate_event::Event::Token(_)) = ev.event {
            break;
        }
    }
    assert_eq!(floors(root), turbo());
    w.signal("TERM");
    w.wait_for_line("shutting down");
    let (status, log) = w.signal_and_wait("TERM");
    assert_eq!(status.code(), Some(130), "the forced exit: {status}\n{log}");
    assert_eq!(floors(root), originals(), "restored before the forced exit:\n{log}");
    assert!(log.contains("forced exit") && log.contains("host settings restored"), "{log}");
    assert!(!root.join(STATE_FILE).exists());
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_power_restore_writes_the_saved_originals_back() {
    let (tmp, w) = served_after_a_request().await;
    let root = tmp.path();
    let (status, _) = w.signal_and_wait("KILL");
    assert!(!status.success());
    // Nothing can run on SIGKILL: the floors stay raised, the state file stays.
    assert_eq!(floors(root), turbo());
    assert!(root.join(STATE_FILE).exists());

    let out = Command::new(env!("CARGO_BIN_EXE_device-worker"))
        .arg("power-restore")
        .arg("--power-root")
        .arg(root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(floors(root), originals());
    assert!(!root.join(STATE_FILE).exists());
    assert_eq!(stdout.lines().filter(|l| l.starts_with("restored ")).count(), POLICIES.len(), "{stdout}");
    // A second run has nothing to do and says so.
    let again = Command::new(env!("CARGO_BIN_EXE_device-worker"))
        .arg("power-restore")
        .arg("--power-root")
        .arg(root)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to restore"));
}

/// Opens a Generate stream, retrying while the model loads (the "model loaded" line comes
/// just before the engine is published ready).
async fn open_stream(
    client: &mut StepServiceClient<tonic::transport::Channel>,
    req: pb::GenerateRequest,
) -> tonic::Streaming<pb::GenerateEvent> {
    loop {
        match client.generate(req.clone()).await {
            Err(s) if s.code() == tonic::Code::Unavailable && s.message().contains("loading") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other.expect("request").into_inner(),
        }
    }
}

/// Streams one request and reads the floors when its first token arrives (the request is
/// still in flight then, so no release can have happened).
async fn floors_during_a_request(
    client: &mut StepServiceClient<tonic::transport::Channel>,
    root: &Path,
) -> Vec<u64> {
    let req = chat("q", "You are a phone agent.", "Open the camera.", 8);
    let mut stream = open_stream(client, req).await;
    let mut seen = None;
    while let Some(ev) = stream.next().await {
        if let Some(pb::generate_event::Event::Token(_)) = ev.expect("event").event {
            seen.get_or_insert_with(|| floors(root));
        }
    }
    seen.expect("at least one token")
}

/// A fresh [`fake_root`] and the test worker's options ([`config`]) with the Linux power
/// backend on it.
fn linux_power_config() -> (tempfile::TempDir, device_worker::config::EngineOptions) {
    let tmp = fake_root();
    let mut cfg = config(model_path());
    cfg.power_backend = PowerBackendKind::Linux;
    cfg.power_root = tmp.path().to_path_buf();
    (tmp, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn votes_released_between_bursts_restore_the_floors_and_the_next_burst_raises_them() {
    let (tmp, mut cfg) = linux_power_config();
    let root = tmp.path();
    cfg.idle_release_ms = 200;
    let engine = EngineHandle::spawn(cfg.settings().expect("valid options")).unwrap();
    let idle = engine.idle();
    let mut w = start_worker_with(engine).await;
    for burst in 0..2 {
        assert_eq!(floors_during_a_request(&mut w.client, root).await, turbo(), "burst {burst}");
        wait_released(&idle, Duration::from_millis(10)).await;
        assert_eq!(floors(root), originals(), "released after burst {burst}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_restart_restores_the_floors_until_the_fresh_engine_computes() {
    let (tmp, mut cfg) = linux_power_config();
    let root = tmp.path();
    cfg.idle_release_ms = 600_000;
    // Far above a healthy batch of this short chat: 1.5 s was not under load average ~10
    // (a second, real trip failed the request after the restart at `ev.expect("event")`).
    cfg.watchdog_ms = 6000;
    cfg.fault_hang_after_batches = Some(3);
    let engine = EngineHandle::spawn(cfg.settings().expect("valid options")).unwrap();
    let handle = engine.clone();
    let mut w = start_worker_with(engine).await;
    assert_eq!(floors(root), turbo(), "raised from the start");
    let err = generate(&mut w.client, chat("a", "You are a phone agent.", "Open the camera.", 16))
        .await
        .expect_err("the hung request fails");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // The request is failed after the controller released the votes.
    assert_eq!(floors(root), originals(), "restored at the watchdog restart");
    assert_eq!(handle.power().watchdog_restarts, 1);
    assert_eq!(floors_during_a_request(&mut w.client, root).await, turbo(), "raised again");
}
