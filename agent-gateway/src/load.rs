//! `agent-gateway load`: a bounded load generator against a running gateway on loopback.
//!
//! One phase per `--concurrency` value N: N controllers each run corpus episodes over
//! `RunEpisode` (each episode's steps in order, the next screen sent once the previous action
//! came back, like a real controller), while bursts of short OpenAI chat requests
//! (`POST /v1/chat/completions`, greedy, small `max_tokens`) hit the HTTP endpoint. Before the
//! phases a sequential baseline runs the same episodes and burst prompts one request at a
//! time; every output of a phase is compared with the baseline's (greedy decoding: the same
//! prompt must give the same text).
//!
//! Per phase it reports steps, step latency p50/p99 (controller side: observation sent → step
//! result), throughput (steps/s), shed requests (retryable statuses: a step result naming
//! `ResourceExhausted` or `Unavailable`, gRPC `UNAVAILABLE`/`RESOURCE_EXHAUSTED`, HTTP 429/503;
//! each retried up to `--retries` times after a backoff), errors (anything else that is not a
//! result), lost requests (neither a result nor a status within `--request-timeout-s`: must be
//! 0), and the worker's and gateway's resident memory (`VmRSS` of `--worker-pid` and
//! `--gateway-pid`) at the start and end of the phase. Output: a table on stdout and a JSON
//! report (`--out`).
//!
//! Bounded: every phase stops starting requests after `--duration-s` or `--max-requests`,
//! whichever comes first, and abandons (counts lost) a request older than
//! `--request-timeout-s`. Targets must be loopback addresses unless `--allow-remote`.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::corpus::{load_episodes, Episode};
use crate::error::GatewayError;
use crate::replay::stdout;

/// Short chat prompts of the bursts (user messages; each burst request takes the next one).
pub const BURST_PROMPTS: [&str; 4] = [
    "Reply with one word: which app shows the weather?",
    "Name a color.",
    "Say OK.",
    "What is 2 + 2?",
];

#[derive(Clone, Debug, clap::Args)]
pub struct LoadConfig {
    /// Gateway AgentService address: `http://HOST:PORT` or `HOST:PORT` (plain, no TLS; a
    /// loopback host unless --allow-remote).
    #[arg(long, default_value = "http://127.0.0.1:50052", value_parser = tandem_auth::client::address)]
    pub gateway: String,
    /// The gateway's OpenAI HTTP endpoint for the bursts, HOST:PORT (loopback unless
    /// --allow-remote); `off`: no bursts.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Corpus folder holding the raw episodes (see its SOURCES.md).
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    pub corpus: PathBuf,
    /// Concurrent episodes (controllers), comma-separated: one phase per value.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    pub concurrency: Vec<usize>,
    /// Steps per episode: the first S screens of each corpus episode.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Episodes each controller runs per phase; 0: episodes back to back until --duration-s
    /// (a soak). Controller c's k-th episode is corpus episode (c + k·N) mod E.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Wall-time cap per phase, seconds: no request starts after it.
    #[arg(long, default_value_t = 300)]
    pub duration_s: u64,
    /// Cap on the requests (steps, retries and burst requests) a phase starts.
    #[arg(long, default_value_t = 5000)]
    pub max_requests: usize,
    /// A request with neither a result nor a status after this many seconds is counted lost
    /// and abandoned (its episode ends).
    #[arg(long, default_value_t = 180)]
    pub request_timeout_s: u64,
    /// Output budget per step, tokens (an action is ~15–40).
    #[arg(long, default_value_t = 48)]
    pub max_tokens: u32,
    /// Requests per burst of short chat requests; 0: no bursts.
    #[arg(long, default_value_t = 4)]
    pub burst_size: usize,
    /// Seconds between bursts.
    #[arg(long, default_value_t = 15)]
    pub burst_every_s: u64,
    /// `max_tokens` of a burst request.
    #[arg(long, default_value_t = 8)]
    pub burst_max_tokens: u32,
    /// Retries of a shed request (after 0.5 s, 1 s, 2 s, ... or the server's Retry-After).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Skip the sequential baseline (no output comparison).
    #[arg(long)]
    pub no_baseline: bool,
    /// The worker's process id: its VmRSS is sampled at each phase's start and end.
    #[arg(long)]
    pub worker_pid: Option<u32>,
    /// The gateway's process id (VmRSS as --worker-pid).
    #[arg(long)]
    pub gateway_pid: Option<u32>,
    /// Allow a non-loopback --gateway or --http (never needed on one machine).
    #[arg(long)]
    pub allow_remote: bool,
    /// Bearer token for a gateway that requires one: the first token of this file (sent on
    /// gRPC and HTTP).
    #[arg(long, env = "TANDEM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// JSON report.
    #[arg(long, default_value = "load-out/load.json")]
    pub out: PathBuf,
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// A retryable status: the server is full or restarting.
    Shed,
    /// A non-retryable failure (status, I/O error, result naming a worker failure).
    Error,
    /// Neither a result nor a status within the timeout, or a stream that ended without one.
    Lost,
}

/// Counters and samples of one phase (or the baseline).
#[derive(Debug, Default, serde::Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub concurrency: usize,
    pub wall_s: f64,
    /// Step results received (valid action or not).
    pub steps: usize,
    /// Of those, results whose model output was not a valid action (a model outcome, not a
    /// failure of the system).
    pub invalid_actions: usize,
    pub step_p50_ms: f64,
    pub step_p99_ms: f64,
    pub steps_per_s: f64,
    /// Step attempts answered with a retryable status.
    pub steps_shed: usize,
    pub step_errors: usize,
    pub steps_lost: usize,
    pub bursts_ok: usize,
    pub burst_p50_ms: f64,
    pub burst_p99_ms: f64,
    pub bursts_shed: usize,
    pub burst_errors: usize,
    pub bursts_lost: usize,
    /// Outputs compared with the baseline, and how many differed.
    pub compared: usize,
    pub mismatched: usize,
    /// Up to 5 differing outputs: key, baseline, this phase.
    pub mismatches: Vec<(String, String, String)>,
    /// Up to 5 error and loss messages.
    pub error_samples: Vec<String>,
    pub worker_rss_kib: Option<(u64, u64)>,
    pub gateway_rss_kib: Option<(u64, u64)>,
    /// Largest worker VmRSS seen during the phase (sampled every 5 s).
    pub worker_rss_max_kib: Option<u64>,
    /// Every output of the phase: (corpus episode and step, or burst prompt; text).
    #[serde(skip)]
    outputs: Vec<(String, String)>,
    #[serde(skip)]
    step_ms: Vec<f64>,
    #[serde(skip)]
    burst_ms: Vec<f64>,
}

/// What a phase's tasks share.
struct Shared {
    cfg: LoadConfig,
    episodes: Vec<Episode>,
    client: AgentServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, tandem_auth::BearerInterceptor>>,
    http_token: Option<String>,
    deadline: Instant,
    started: AtomicUsize,
    report: Mutex<PhaseReport>,
    run_tag: String,
}

impl Shared {
    /// Takes one request from the phase's budget; `false` when the phase is over.
    fn admit(&self) -> bool {
        Instant::now() < self.deadline && self.started.fetch_add(1, Ordering::Relaxed) < self.cfg.max_requests
    }

    fn note(&self, f: impl FnOnce(&mut PhaseReport)) {
        f(&mut self.report.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn sample_error(&self, msg: String) {
        self.note(|r| {
            if r.error_samples.len() < 5 {
                r.error_samples.push(msg);
            }
        });
    }
}

/// Checks that `host` is a loopback name or address (`localhost`, 127.0.0.0/8, ::1).
fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Refuses non-loopback targets unless `--allow-remote`.
///
/// Errors: [`GatewayError::Config`] naming the address.
fn check_targets(cfg: &LoadConfig) -> Result<(), GatewayError> {
    let uri: tonic::codegen::http::Uri = tandem_auth::client::uri(&cfg.gateway)
        .and_then(|u| u.parse().map_err(|e| format!("{e}")))
        .map_err(|e| GatewayError::Config(format!("invalid --gateway {:?}: {e}", cfg.gateway)))?;
    if uri.scheme_str() != Some("http") {
        return Err(GatewayError::Config(format!("--gateway {:?}: only plain http:// on loopback is supported", cfg.gateway)));
    }
    let host = uri.host().unwrap_or("");
    if !cfg.allow_remote && !is_loopback_host(host) {
        return Err(GatewayError::Config(format!("--gateway {}: not a loopback address (pass --allow-remote to load another machine)", cfg.gateway)));
    }
    if cfg.http != "off" {
        let host = cfg.http.rsplit_once(':').map(|(h, _)| h).unwrap_or("");
        if cfg.http.parse::<SocketAddr>().is_err() && !host.eq_ignore_ascii_case("localhost") {
            return Err(GatewayError::Config(format!("--http {:?}: expected HOST:PORT or off", cfg.http)));
        }
        if !cfg.allow_remote && !is_loopback_host(host) {
            return Err(GatewayError::Config(format!("--http {}: not a loopback address (pass --allow-remote to load another machine)", cfg.http)));
        }
    }
    if cfg.concurrency.is_empty() || cfg.concurrency.contains(&0) || cfg.steps == 0 {
        return Err(GatewayError::Config("--concurrency values and --steps must be at least 1".into()));
    }
    if cfg.rounds == 0 && cfg.duration_s == 0 {
        return Err(GatewayError::Config("--rounds 0 runs until --duration-s, which must then be above 0".into()));
    }
    Ok(())
}

/// Resident memory of `pid` in KiB (`VmRSS` of `/proc/PID/status`); `None` when unreadable.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The `q` quantile (0..=1) of `samples` by nearest rank; 0 for none.
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Whether a step result's error (the gateway's text, ending in the worker's gRPC code) is
/// a retryable status.
fn is_shed_text(error: &str) -> bool {
    error.contains("(ResourceExhausted)") || error.contains("(Unavailable)")
}

fn is_shed_code(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::Unavailable | tonic::Code::ResourceExhausted)
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64 << attempt.min(5))
}

/// Whether a load run passed, for the command's exit status: `Err` says why not when any
/// request was lost (neither a result nor a status within `--request-timeout-s`), failed with
/// a status that is not retryable (errors), gave an output that differs from the baseline's,
/// or when a phase completed no step at all (a run that did nothing, e.g. a missing token).
/// Shed requests (retryable statuses) do not fail the run.
pub fn verdict(reports: &[PhaseReport]) -> Result<(), String> {
    let sum = |f: fn(&PhaseReport) -> usize| reports.iter().map(f).sum::<usize>();
    let lost = sum(|r| r.steps_lost + r.bursts_lost);
    let errors = sum(|r| r.step_errors + r.burst_errors);
    let mismatched = sum(|r| r.mismatched);
    let mut why = Vec::new();
    if lost > 0 {
        why.push(format!("{lost} request(s) lost (neither a result nor a status within --request-timeout-s)"));
    }
    if errors > 0 {
        why.push(format!("{errors} request(s) failed with a status that is not retryable (see the error lines above)"));
    }
    if mismatched > 0 {
        why.push(format!("{mismatched} output(s) differ from the baseline's"));
    }
    if let Some(r) = reports.iter().find(|r| r.steps == 0) {
        why.push(format!("phase {} completed no step", r.name));
    }
    if why.is_empty() { Ok(()) } else { Err(why.join("; ")) }
}

/// Runs the baseline (unless `--no-baseline`) and every phase; prints the table and writes the
/// JSON report. Returns the reports, baseline first.
///
/// Errors: bad options, an unreadable corpus, an unreachable gateway, an unwritable report.
pub async fn run(cfg: &LoadConfig) -> Result<Vec<PhaseReport>, GatewayError> {
    check_targets(cfg)?;
    let episodes: Vec<Episode> = load_episodes(&cfg.corpus)?.into_iter().filter(|e| !e.steps.is_empty()).collect();
    let token = match &cfg.token_file {
        Some(p) => Some(tandem_auth::TokenSet::load(p).map_err(|e| GatewayError::Config(e.to_string()))?),
        None => None,
    };
    let http_token = token.as_ref().and_then(|t| t.first()).map(|b| String::from_utf8_lossy(b).into_owned());
    let interceptor = match (&cfg.token_file, &token) {
        (Some(p), Some(set)) => tandem_auth::BearerInterceptor::from_tokens(p, set).map_err(|e| GatewayError::Config(e.to_string()))?,
        _ => tandem_auth::BearerInterceptor::none(),
    };
    let uri = tandem_auth::client::uri(&cfg.gateway).map_err(|e| GatewayError::Config(format!("--gateway {}: {e}", cfg.gateway)))?;
    let connected = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| GatewayError::Config(format!("invalid gateway address {:?}: {e}", cfg.gateway)))?
        .connect()
        .await;
    let channel = match connected {
        Ok(c) => c,
        Err(e) => {
            let hint = tandem_auth::client::not_grpc_hint(&cfg.gateway, crate::replay::AGENT_SERVICE_IS, crate::replay::AGENT_SERVICE_ELSEWHERE).await;
            return Err(GatewayError::Gateway(format!("cannot connect to {}: {}{hint}", cfg.gateway, tandem_options::error_chain(&e))));
        }
    };
    let client = AgentServiceClient::with_interceptor(channel, interceptor);
    eprintln!(
        "load: {} corpus episode(s), {} step(s) each, phases N = {:?}, bursts of {} every {} s",
        episodes.len(), cfg.steps, cfg.concurrency, cfg.burst_size, cfg.burst_every_s
    );
    let mut reports = Vec::new();
    let tag = format!("load-{}", std::process::id());
    let baseline = if cfg.no_baseline {
        None
    } else {
        let mut b = cfg.clone();
        b.rounds = 1;
        b.duration_s = b.duration_s.max(3600);
        let r = run_phase(&b, &episodes, client.clone(), http_token.clone(), 1, true, &format!("{tag}-base")).await;
        eprintln!("load: baseline done: {} step(s) in {:.0} s", r.steps, r.wall_s);
        Some(r)
    };
    for &n in &cfg.concurrency {
        let mut r = run_phase(cfg, &episodes, client.clone(), http_token.clone(), n, false, &format!("{tag}-{n}")).await;
        if let Some(b) = &baseline {
            compare(b, &mut r);
        }
        eprintln!("load: N = {n} done in {:.0} s", r.wall_s);
        reports.push(r);
    }
    if let Some(b) = baseline {
        reports.insert(0, b);
    }
    stdout(|out| print_table(out, &reports))?;
    if let Some(dir) = cfg.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| GatewayError::Io { path: dir.to_path_buf(), source })?;
    }
    let json = serde_json::to_string_pretty(&serde_json::json!({ "config": format!("{cfg:?}"), "phases": &reports }))
        .map_err(|e| GatewayError::Gateway(format!("encoding the report: {e}")))?;
    std::fs::write(&cfg.out, json).map_err(|source| GatewayError::Io { path: cfg.out.clone(), source })?;
    stdout(|out| writeln!(out, "JSON report written to {}", cfg.out.display()))?;
    Ok(reports)
}

/// Compares every output of `r` with the baseline's output for the same key (the same corpus
/// episode and step, or the same burst prompt).
fn compare(base: &PhaseReport, r: &mut PhaseReport) {
    let base: HashMap<&str, &str> = base.outputs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut mismatches = Vec::new();
    let mut compared = 0;
    for (k, out) in &r.outputs {
        if let Some(&b) = base.get(k.as_str()) {
            compared += 1;
            if b != out {
                mismatches.push((k.clone(), b.to_string(), out.clone()));
            }
        }
    }
    r.compared = compared;
    r.mismatched = mismatches.len();
    mismatches.truncate(5);
    r.mismatches = mismatches;
}

/// One phase: `n` controllers (`sequential`: one, running every episode once, and the burst
/// prompts one at a time after it) plus the bursts.
async fn run_phase(
    cfg: &LoadConfig,
    episodes: &[Episode],
    client: AgentServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, tandem_auth::BearerInterceptor>>,
    http_token: Option<String>,
    n: usize,
    sequential: bool,
    tag: &str,
) -> PhaseReport {
    let t0 = Instant::now();
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        episodes: episodes.to_vec(),
        client,
        http_token,
        deadline: t0 + Duration::from_secs(cfg.duration_s),
        started: AtomicUsize::new(0),
        report: Mutex::new(PhaseReport {
            name: if sequential { "baseline".into() } else { format!("N={n}") },
            concurrency: n,
            ..Default::default()
        }),
        run_tag: tag.to_string(),
    });
    let rss_start = (cfg.worker_pid.and_then(rss_kib), cfg.gateway_pid.and_then(rss_kib));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = cfg.worker_pid.map(|pid| {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut max = rss_kib(pid).unwrap_or(0);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => max = max.max(rss_kib(pid).unwrap_or(0)),
                    _ = stop.wait_for(|s| *s) => return max,
                }
            }
        })
    });
    let controllers: Vec<_> = if sequential {
        let s = shared.clone();
        vec![tokio::spawn(async move {
            for i in 0..s.episodes.len() {
                run_episode(&s, i, &format!("{}-{i}", s.run_tag)).await;
            }
        })]
    } else {
        (0..n)
            .map(|c| {
                let s = shared.clone();
                tokio::spawn(controller(s, c, n))
            })
            .collect()
    };
    let bursts = (cfg.http != "off" && cfg.burst_size > 0 && !sequential).then(|| tokio::spawn(bursts(shared.clone(), stop_rx.clone())));
    for c in controllers {
        let _ = c.await;
    }
    let _ = stop_tx.send(true);
    if let Some(b) = bursts {
        let _ = b.await;
    }
    if sequential && cfg.http != "off" && cfg.burst_size > 0 {
        for i in 0..BURST_PROMPTS.len() {
            if shared.admit() {
                burst_request(&shared, i).await;
            }
        }
    }
    let worker_max = match sampler {
        Some(h) => h.await.ok(),
        None => None,
    };
    let rss_end = (cfg.worker_pid.and_then(rss_kib), cfg.gateway_pid.and_then(rss_kib));
    let mut r = std::mem::take(&mut *shared.report.lock().unwrap_or_else(|p| p.into_inner()));
    r.wall_s = t0.elapsed().as_secs_f64();
    r.step_p50_ms = percentile(&r.step_ms, 0.50);
    r.step_p99_ms = percentile(&r.step_ms, 0.99);
    r.burst_p50_ms = percentile(&r.burst_ms, 0.50);
    r.burst_p99_ms = percentile(&r.burst_ms, 0.99);
    r.steps_per_s = r.steps as f64 / r.wall_s.max(1e-9);
    r.worker_rss_kib = rss_start.0.zip(rss_end.0);
    r.gateway_rss_kib = rss_start.1.zip(rss_end.1);
    r.worker_rss_max_kib = worker_max.map(|m| m.max(rss_end.0.unwrap_or(0)));
    r
}

/// Controller `c` of `n`: episodes (corpus episode (c + k·n) mod E for its k-th) until its
/// rounds are done or the phase is over.
async fn controller(s: Arc<Shared>, c: usize, n: usize) {
    let mut k = 0usize;
    while (s.cfg.rounds == 0 || k < s.cfg.rounds) && Instant::now() < s.deadline {
        let i = (c + k * n) % s.episodes.len();
        if !run_episode(&s, i, &format!("{}-{c}-{k}", s.run_tag)).await {
            break;
        }
        k += 1;
    }
}

type EpisodeStream = (mpsc::Sender<apb::EpisodeInput>, tonic::Streaming<apb::StepEvent>);

/// Opens a `RunEpisode` stream and sends its start.
async fn open_episode(s: &Shared, id: &str, task: &str) -> Result<EpisodeStream, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    let start = apb::EpisodeInput {
        input: Some(apb::episode_input::Input::Start(apb::EpisodeStart { episode_id: id.to_string(), task: task.to_string(), max_tokens: s.cfg.max_tokens })),
    };
    tx.send(start).await.map_err(|_| tonic::Status::internal("episode input closed"))?;
    let events = s.client.clone().run_episode(ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, events))
}

/// Runs corpus episode `i` under the gateway episode id `id`, step by step. Returns `false`
/// when the phase is over (budget or time) before the episode's end.
async fn run_episode(s: &Shared, i: usize, id: &str) -> bool {
    let ep = &s.episodes[i];
    let mut stream: Option<EpisodeStream> = None;
    for (step, data) in ep.steps.iter().take(s.cfg.steps).enumerate() {
        let mut attempt = 0u32;
        loop {
            if !s.admit() {
                return false;
            }
            if stream.is_none() {
                match open_episode(s, id, &ep.task).await {
                    Ok(st) => stream = Some(st),
                    Err(st) => {
                        let shed = is_shed_code(st.code());
                        s.note(|r| if shed { r.steps_shed += 1 } else { r.step_errors += 1 });
                        if !shed || attempt >= s.cfg.retries {
                            s.sample_error(format!("{id} step {step}: RunEpisode: {st}"));
                            return true;
                        }
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                }
            }
            let (tx, events) = stream.as_mut().expect("opened above");
            let sent = Instant::now();
            let obs = apb::EpisodeInput { input: Some(apb::episode_input::Input::Observation(data.to_observation())) };
            let answer = match tx.send(obs).await {
                Ok(()) => tokio::time::timeout(Duration::from_secs(s.cfg.request_timeout_s), next_result(events)).await,
                Err(_) => Ok(Err(Some(tonic::Status::unavailable("the episode stream closed")))),
            };
            let ms = sent.elapsed().as_secs_f64() * 1e3;
            let (outcome, msg) = match answer {
                Err(_) => (Outcome::Lost, format!("no result within {} s", s.cfg.request_timeout_s)),
                Ok(Err(None)) => (Outcome::Lost, "stream ended without a result or status".into()),
                Ok(Err(Some(st))) => {
                    stream = None; // the stream is over: reopen it for a retry
                    (if is_shed_code(st.code()) { Outcome::Shed } else { Outcome::Error }, format!("status {st}"))
                }
                Ok(Ok(r)) if is_shed_text(&r.error) => (Outcome::Shed, r.error),
                Ok(Ok(r)) if !r.error.is_empty() && r.raw_output.is_empty() => (Outcome::Error, r.error),
                Ok(Ok(r)) => {
                    let key = format!("{} step {step}", ep.id);
                    s.note(|rep| {
                        rep.steps += 1;
                        rep.step_ms.push(ms);
                        if !r.error.is_empty() {
                            rep.invalid_actions += 1;
                        }
                        rep.outputs.push((key, r.raw_output));
                    });
                    break;
                }
            };
            match outcome {
                Outcome::Shed if attempt < s.cfg.retries => {
                    s.note(|r| r.steps_shed += 1);
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Outcome::Shed => {
                    s.note(|r| r.steps_shed += 1);
                    s.sample_error(format!("{id} step {step}: shed {} times, gave up: {msg}", attempt + 1));
                    return true;
                }
                Outcome::Lost => {
                    s.note(|r| r.steps_lost += 1);
                    s.sample_error(format!("{id} step {step}: LOST: {msg}"));
                    return true;
                }
                Outcome::Error => {
                    s.note(|r| r.step_errors += 1);
                    s.sample_error(format!("{id} step {step}: {msg}"));
                    return true;
                }
            }
        }
    }
    true
}

/// The next step result of an episode stream: `Err(Some(status))` when the stream ended with
/// a status, `Err(None)` when it ended without one.
async fn next_result(events: &mut tonic::Streaming<apb::StepEvent>) -> Result<apb::StepResult, Option<tonic::Status>> {
    loop {
        match events.next().await {
            Some(Ok(apb::StepEvent { event: Some(apb::step_event::Event::Result(r)) })) => return Ok(r),
            Some(Ok(_)) => {}
            Some(Err(st)) => return Err(Some(st)),
            None => return Err(None),
        }
    }
}

/// Bursts of `--burst-size` concurrent chat requests every `--burst-every-s` until `stop`.
async fn bursts(s: Arc<Shared>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut next = 0usize;
    loop {
        let mut burst = Vec::new();
        for _ in 0..s.cfg.burst_size {
            if !s.admit() {
                break;
            }
            let s2 = s.clone();
            let i = next % BURST_PROMPTS.len();
            next += 1;
            burst.push(tokio::spawn(async move { burst_request(&s2, i).await }));
        }
        for b in burst {
            let _ = b.await;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(s.cfg.burst_every_s)) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One burst request (prompt `i`), retried when shed.
async fn burst_request(s: &Shared, i: usize) {
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": BURST_PROMPTS[i]}],
        "max_tokens": s.cfg.burst_max_tokens,
        "temperature": 0,
    })
    .to_string();
    let mut attempt = 0u32;
    loop {
        let t = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(s.cfg.request_timeout_s), http_post(&s.cfg.http, s.http_token.as_deref(), &body)).await;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match answer {
            Err(_) => {
                s.note(|r| r.bursts_lost += 1);
                s.sample_error(format!("burst {i}: LOST: no answer within {} s", s.cfg.request_timeout_s));
                return;
            }
            Ok(Err(e)) => {
                s.note(|r| r.burst_errors += 1);
                s.sample_error(format!("burst {i}: {e}"));
                return;
            }
            Ok(Ok((200, _, body))) => {
                let content = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["choices"][0]["message"]["content"].as_str().map(str::to_string));
                match content {
                    Some(c) => s.note(|r| {
                        r.bursts_ok += 1;
                        r.burst_ms.push(ms);
                        r.outputs.push((format!("burst {i}"), c));
                    }),
                    None => {
                        s.note(|r| r.burst_errors += 1);
                        s.sample_error(format!("burst {i}: 200 without choices[0].message.content: {body}"));
                    }
                }
                return;
            }
            Ok(Ok((code @ (429 | 503), retry_after, body))) => {
                s.note(|r| r.bursts_shed += 1);
                if attempt >= s.cfg.retries || !s.admit() {
                    s.sample_error(format!("burst {i}: HTTP {code} {attempt} retries, gave up: {body}"));
                    return;
                }
                tokio::time::sleep(retry_after.map_or(backoff(attempt), Duration::from_secs)).await;
                attempt += 1;
            }
            Ok(Ok((code, _, body))) => {
                s.note(|r| r.burst_errors += 1);
                s.sample_error(format!("burst {i}: HTTP {code}: {body}"));
                return;
            }
        }
    }
}

/// `POST /v1/chat/completions` with `body` over HTTP/1.1 (`Connection: close`); returns the
/// status, the `Retry-After` seconds if any, and the body (not chunked: a non-streaming
/// completion has a `Content-Length`).
///
/// Errors: connection and I/O failures, an answer that is not HTTP.
async fn http_post(addr: &str, token: Option<&str>, body: &str) -> Result<(u16, Option<u64>, String), String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    s.write_all(body.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status code in {head:?}"))?;
    let retry_after = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("retry-after")).and_then(|(_, v)| v.trim().parse().ok()));
    Ok((code, retry_after, body.to_string()))
}

/// Writes the per-phase table (and each phase's mismatches and error samples) to `out`.
fn print_table(out: &mut impl Write, reports: &[PhaseReport]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<9} {:>6} {:>6} {:>9} {:>9} {:>8} {:>5} {:>5} {:>5} {:>7} {:>9} {:>6} {:>6} {:>10} {:>17}",
        "phase", "wall_s", "steps", "p50_ms", "p99_ms", "steps/s", "shed", "err", "lost", "bursts", "b_p99_ms", "b_shed", "b_lost", "equal", "worker_rss_MiB"
    )?;
    for r in reports {
        let equal = if r.name == "baseline" {
            "-".to_string()
        } else if r.compared == 0 {
            "n/a".to_string()
        } else {
            format!("{}/{}", r.compared - r.mismatched, r.compared)
        };
        let rss = r.worker_rss_kib.map_or("-".into(), |(a, b)| format!("{:.0}->{:.0}", a as f64 / 1024.0, b as f64 / 1024.0));
        writeln!(
            out,
            "{:<9} {:>6.0} {:>6} {:>9.0} {:>9.0} {:>8.2} {:>5} {:>5} {:>5} {:>7} {:>9.0} {:>6} {:>6} {:>10} {:>17}",
            r.name,
            r.wall_s,
            r.steps,
            r.step_p50_ms,
            r.step_p99_ms,
            r.steps_per_s,
            r.steps_shed,
            r.step_errors,
            r.steps_lost,
            r.bursts_ok,
            r.burst_p99_ms,
            r.bursts_shed,
            r.bursts_lost,
            equal,
            rss
        )?;
        for m in &r.mismatches {
            writeln!(out, "  differs: {}: baseline {:?} vs {:?}", m.0, m.1, m.2)?;
        }
        for e in &r.error_samples {
            writeln!(out, "  error: {e}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_fails_on_lost_errors_mismatches_or_an_empty_phase_but_not_on_shedding() {
        let ok = || PhaseReport { name: "N = 4".into(), steps: 9, steps_shed: 3, bursts_shed: 1, ..Default::default() };
        assert_eq!(verdict(&[ok(), ok()]), Ok(()));
        let lost = PhaseReport { bursts_lost: 1, ..ok() };
        assert!(verdict(&[ok(), lost]).unwrap_err().contains("1 request(s) lost"));
        let errors = PhaseReport { step_errors: 2, ..ok() };
        assert!(verdict(&[errors]).unwrap_err().contains("2 request(s) failed"));
        let differ = PhaseReport { mismatched: 1, ..ok() };
        assert!(verdict(&[differ]).unwrap_err().contains("differ from the baseline"));
        let empty = PhaseReport { steps: 0, ..ok() };
        assert!(verdict(&[ok(), empty]).unwrap_err().contains("phase N = 4 completed no step"));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn only_loopback_targets_unless_allowed() {
        assert!(is_loopback_host("127.0.0.1") && is_loopback_host("[::1]") && is_loopback_host("localhost"));
        assert!(!is_loopback_host("10.0.0.2") && !is_loopback_host("example.com"));
        let cli = |args: &[&str]| {
            #[derive(clap::Parser)]
            struct C {
                #[command(flatten)]
                l: LoadConfig,
            }
            <C as clap::Parser>::try_parse_from(std::iter::once("load").chain(args.iter().copied())).unwrap().l
        };
        let err = check_targets(&cli(&["--gateway", "http://192.168.1.5:50052"])).unwrap_err().to_string();
        assert!(err.contains("not a loopback address"), "{err}");
        let err = check_targets(&cli(&["--http", "10.1.1.1:8080"])).unwrap_err().to_string();
        assert!(err.contains("not a loopback address"), "{err}");
        assert!(check_targets(&cli(&["--gateway", "http://192.168.1.5:50052", "--http", "10.1.1.1:8080", "--allow-remote"])).is_ok());
        assert!(check_targets(&cli(&[])).is_ok());
        assert!(check_targets(&cli(&["--concurrency", "4,0"])).is_err());
    }

    #[test]
    fn shed_is_what_the_gateway_reports_as_full_or_restarting() {
        assert!(is_shed_text("worker http://127.0.0.1:1: queue full (ResourceExhausted)"));
        assert!(is_shed_text("worker stream: watchdog (Unavailable)"));
        assert!(!is_shed_text("model output is not a valid action: x"));
    }
}
