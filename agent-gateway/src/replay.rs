//! `agent-gateway replay`: drives real corpus episodes through a running gateway (and its
//! workers) over gRPC, like a controller would: one observation at a time, waiting for the
//! action before sending the next screen. Prints a per-step table and writes JSONL. A step
//! whose connection to the gateway breaks is retried a few times on a new episode stream
//! ([`is_connection_error`], `step_with_retries`); an answer (INVALID_ARGUMENT, ...) is not.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::corpus::{load_episode, load_episodes, Episode};
use crate::error::GatewayError;
use crate::screenshot::ScreenshotMode;

#[derive(Clone, Debug, clap::Args)]
pub struct ReplayConfig {
    /// Gateway address (AgentService): `http://HOST:PORT`, `HOST:PORT` or `https://HOST:PORT`
    /// (with `--tls-ca`).
    #[arg(long, default_value = "http://127.0.0.1:50052", value_parser = tandem_auth::client::address)]
    pub gateway: String,
    /// Corpus folder holding the raw episodes (see its SOURCES.md).
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    pub corpus: PathBuf,
    /// Episode ids to replay (repeatable). Default: the first `--count` episodes.
    #[arg(long = "episode")]
    pub episodes: Vec<String>,
    /// How many episodes to replay when no --episode is given.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Replay at most this many steps per episode (0: all).
    #[arg(long, default_value_t = 0)]
    pub max_steps: usize,
    /// Output budget per step (0: the gateway's default). One that the first step cannot fit
    /// in the worker's context stops the replay, saying so.
    #[arg(long, default_value_t = 0)]
    pub max_tokens: u32,
    /// Send the corpus screenshots (`N.png` of the LlamaTouch traces) in the observations:
    /// `auto` and `always` send every step's screenshot (whether the model sees it is the
    /// gateway's own `serve --screenshots`; give both the same value), `never` sends
    /// text-only observations.
    #[arg(long, value_enum, default_value_t = ScreenshotMode::Never)]
    pub screenshots: ScreenshotMode,
    /// Bearer token for a gateway that requires one: the first token of this file (the
    /// gateway's `--auth-token-file` format).
    #[arg(long, env = "TANDEM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// TLS for an https:// gateway (`--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-domain`).
    #[command(flatten)]
    pub tls: tandem_auth::ClientTlsArgs,
    /// JSONL file with one object per step.
    #[arg(long, default_value = "replay-out/replay.jsonl")]
    pub out: PathBuf,
    /// List the episodes found in the corpus and exit.
    #[arg(long)]
    pub list: bool,
    /// Moved: the dry-run planner is `tandem-tools dry-run` (same options). Kept, hidden, to
    /// say so instead of clap's "unexpected argument".
    #[arg(long, hide = true)]
    pub dry_run: bool,
}

/// One replayed step, as written to the JSONL file.
#[derive(Debug, serde::Serialize)]
pub struct StepRecord {
    pub episode: String,
    pub source: String,
    pub step: u32,
    pub prompt_tokens: u32,
    pub reused_tokens: u32,
    pub new_tokens: u32,
    pub kv_bound_tokens: u32,
    pub decode_tokens: u32,
    pub server_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub ms_per_token: f64,
    /// Target-model passes of the decode phase (plain steps + verification passes).
    pub decode_passes: u32,
    /// Draft tokens proposed and accepted, per drafter (speculative decoding).
    pub drafts: Vec<DraftRecord>,
    pub step_ms: f64,
    /// The step's screenshot went to the model (`StepStats.screenshot_sent`).
    pub screenshot_sent: bool,
    /// Image tokens of the prompt, images encoded or found in the worker's image cache, and
    /// the worker's encoder time, ms.
    pub image_tokens: u32,
    pub images_encoded: u32,
    pub image_cache_hits: u32,
    pub encoder_ms: f64,
    /// Milliseconds from sending the observation to the first action token.
    pub first_token_ms: Option<f64>,
    pub action: String,
    pub error: String,
    pub raw_output: String,
    pub recorded_action: Option<String>,
}

/// One drafter's draft tokens in a step.
#[derive(Debug, serde::Serialize)]
pub struct DraftRecord {
    pub drafter: String,
    pub proposed: u32,
    pub accepted: u32,
}

/// Summary of a replay run.
#[derive(Debug, Default)]
pub struct ReplaySummary {
    pub steps: usize,
    pub valid_actions: usize,
    pub errors: usize,
}

/// Runs the replay; returns the per-step records.
///
/// Errors: corpus problems, an unreachable gateway, a broken stream.
pub async fn run(cfg: &ReplayConfig) -> Result<(Vec<StepRecord>, ReplaySummary), GatewayError> {
    if cfg.list {
        let episodes = load_episodes(&cfg.corpus)?;
        stdout(|out| {
            episodes.iter().try_for_each(|e| {
                writeln!(out, "{:<48} {:>3} steps  {}  task: {}", e.id, e.steps.len(), e.source, e.task)
            })
        })?;
        return Ok((vec![], ReplaySummary::default()));
    }
    if cfg.episodes.is_empty() && cfg.count == 0 {
        return Err(GatewayError::Config(
            "--count must be at least 1 (or name episodes with --episode)".into(),
        ));
    }
    let episodes: Vec<Episode> = if cfg.episodes.is_empty() {
        load_episodes(&cfg.corpus)?
            .into_iter()
            .take(cfg.count)
            .collect()
    } else {
        cfg.episodes
            .iter()
            .map(|id| load_episode(&cfg.corpus, id))
            .collect::<Result<_, _>>()?
    };
    let token = match &cfg.token_file {
        Some(p) => tandem_auth::BearerInterceptor::from_file(p)
            .map_err(|e| GatewayError::Config(e.to_string()))?,
        None => tandem_auth::BearerInterceptor::none(),
    };
    let tls = cfg.tls.load().map_err(|e| GatewayError::Config(e.to_string()))?;
    let uri = tandem_auth::client::uri(&cfg.gateway).map_err(|e| GatewayError::Config(format!("--gateway {}: {e}", cfg.gateway)))?;
    let endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| GatewayError::Config(format!("invalid gateway address {:?}: {e}", cfg.gateway)))?;
    let connected = tandem_auth::ClientTls::for_endpoint(tls.as_ref(), &uri, endpoint, "--tls-ca")
        .map_err(GatewayError::Config)?
        .connect()
        .await;
    let channel = match connected {
        Ok(c) => c,
        Err(e) => {
            let hint = tandem_auth::client::not_grpc_hint(&cfg.gateway, AGENT_SERVICE_IS, AGENT_SERVICE_ELSEWHERE).await;
            return Err(GatewayError::Gateway(format!("cannot connect to {}: {}{hint}", cfg.gateway, tandem_options::error_chain(&e))));
        }
    };
    let mut client = AgentServiceClient::with_interceptor(channel.clone(), token);
    if let Some(dir) = cfg.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| GatewayError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let mut out = std::fs::File::create(&cfg.out).map_err(|source| GatewayError::Io {
        path: cfg.out.clone(),
        source,
    })?;
    let total_steps: usize = episodes.iter().map(|e| steps_of(e, cfg.max_steps)).sum();
    eprintln!(
        "replaying {} episode(s), {} step(s) via {}",
        episodes.len(),
        total_steps,
        cfg.gateway
    );
    stdout(print_header)?;
    let mut records = Vec::new();
    let mut summary = ReplaySummary::default();
    let mut done = 0usize;
    for ep in &episodes {
        let n = steps_of(ep, cfg.max_steps);
        stdout(|out| writeln!(out, "# episode {} ({} steps) task: {}", ep.id, n, ep.task))?;
        let start = apb::EpisodeStart {
            episode_id: format!("replay-{}-{}", ep.id, std::process::id()),
            task: ep.task.clone(),
            max_tokens: cfg.max_tokens,
        };
        let mut stream = None;
        for (i, st) in ep.steps.iter().take(n).enumerate() {
            let obs = if cfg.screenshots == ScreenshotMode::Never {
                st.to_observation()
            } else {
                st.to_observation_with_screenshot()?
            };
            let at = format!("episode {}, step {i}", ep.id);
            let (result, first_token_ms) = step_with_retries(&mut client, &channel, &mut stream, &start, obs, &cfg.gateway, &at).await?;
            // A budget the first step cannot fit would fail (nearly) every step alike.
            if let Some(why) = budget_refused(&result.error, cfg.max_tokens).filter(|_| done == 0) {
                return Err(GatewayError::Gateway(format!(
                    "--max-tokens {} does not fit the first step ({at}): {why}; pass a smaller --max-tokens, or 0 for the gateway's default",
                    cfg.max_tokens
                )));
            }
            let s = result.stats.clone().unwrap_or_default();
            let rec = StepRecord {
                episode: ep.id.clone(),
                source: ep.source.clone(),
                step: i as u32,
                prompt_tokens: s.prompt_tokens,
                reused_tokens: s.reused_tokens,
                new_tokens: s.new_tokens,
                kv_bound_tokens: s.kv_bound_tokens,
                decode_tokens: s.decode_tokens,
                server_ms: s.server_ms,
                prefill_ms: s.prefill_ms,
                decode_ms: s.decode_ms,
                ms_per_token: s.ms_per_token,
                decode_passes: s.decode_passes,
                drafts: s
                    .drafts
                    .iter()
                    .map(|d| DraftRecord {
                        drafter: d.drafter.clone(),
                        proposed: d.proposed,
                        accepted: d.accepted,
                    })
                    .collect(),
                step_ms: s.step_ms,
                screenshot_sent: s.screenshot_sent,
                image_tokens: s.image_tokens,
                images_encoded: s.images_encoded,
                image_cache_hits: s.image_cache_hits,
                encoder_ms: s.encoder_ms,
                first_token_ms,
                action: result.action_json.clone(),
                error: result.error.clone(),
                raw_output: result.raw_output.clone(),
                recorded_action: st.recorded_action.clone(),
            };
            done += 1;
            stdout(|out| print_row(out, &rec, done, total_steps))?;
            summary.steps += 1;
            if rec.error.is_empty() {
                summary.valid_actions += 1;
            } else {
                summary.errors += 1;
            }
            let line = serde_json::to_string(&rec)
                .map_err(|e| GatewayError::Gateway(format!("encoding a record: {e}")))?;
            writeln!(out, "{line}").map_err(|source| GatewayError::Io {
                path: cfg.out.clone(),
                source,
            })?;
            records.push(rec);
        }
    }
    stdout(|out| print_summary(out, &records, &summary, cfg))?;
    Ok((records, summary))
}

/// The worker's refusal of `--max-tokens` `max_tokens` in a step's error (`worker ADDR:
/// max_tokens N does not fit: the context holds ...; expected max_tokens at most M
/// (InvalidArgument)`): its text from "the context holds" on, without the worker's address
/// and code. `None` for any other error, and without `--max-tokens`.
fn budget_refused(error: &str, max_tokens: u32) -> Option<&str> {
    let refusal = format!("max_tokens {max_tokens} does not fit: ");
    let at = error.find(&refusal).filter(|_| max_tokens > 0)?;
    let why = &error[at + refusal.len()..];
    Some(why.strip_suffix(" (InvalidArgument)").unwrap_or(why))
}

/// Where AgentService is, for the hint after a failure at an address that answers HTTP/1.1
/// ([`tandem_auth::client::not_grpc_hint`]): after "the gateway's --http-listen port, ", and
/// for another HTTP server.
pub(crate) const AGENT_SERVICE_IS: &str = "its OpenAI endpoint; AgentService (gRPC) is on its --listen port, default 127.0.0.1:50052";
pub(crate) const AGENT_SERVICE_ELSEWHERE: &str = "AgentService (gRPC) is on the gateway's --listen port, default 127.0.0.1:50052";

/// What to add to a call's UNIMPLEMENTED at `channel`: that the server is a device-worker (or
/// another gRPC server), not the agent-gateway.
async fn not_agent_service_hint(channel: &tonic::transport::Channel) -> String {
    use tandem_proto::agent::v1::agent_service_server::SERVICE_NAME;
    match crate::health::grpc_server(channel.clone()).await {
        Some(crate::health::GrpcServer::Worker) => {
            " (this is a device-worker; replay talks to the agent-gateway's gRPC port, its --listen, default 127.0.0.1:50052)".into()
        }
        _ => format!(" (this server does not serve {SERVICE_NAME}; {AGENT_SERVICE_ELSEWHERE})"),
    }
}

/// The waits before each retry of a step whose connection to the gateway failed
/// ([`is_connection_error`]): three retries, the last 7 s after the failure.
const RECONNECT_BACKOFF: [Duration; 3] = [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4)];

type Client = AgentServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, tandem_auth::BearerInterceptor>>;

/// One open `RunEpisode` call: the observations go in through `tx`, the events come back.
struct EpisodeStream {
    tx: mpsc::Sender<apb::EpisodeInput>,
    events: tonic::Streaming<apb::StepEvent>,
}

impl EpisodeStream {
    /// Opens `RunEpisode` and sends `start`.
    ///
    /// Errors: the call's status.
    async fn open(client: &mut Client, start: &apb::EpisodeStart) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        let input = apb::EpisodeInput { input: Some(apb::episode_input::Input::Start(start.clone())) };
        tx.send(input).await.map_err(|_| closed())?;
        let events = client.run_episode(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { tx, events })
    }

    /// Sends `obs` and waits for its step's result; returns it with the milliseconds from
    /// sending to the first action token.
    ///
    /// Errors: the stream's status; UNAVAILABLE when the stream closed before the result.
    async fn step(&mut self, obs: apb::Observation) -> Result<(apb::StepResult, Option<f64>), tonic::Status> {
        let sent = Instant::now();
        let input = apb::EpisodeInput { input: Some(apb::episode_input::Input::Observation(obs)) };
        // A send fails when the gateway already ended the stream (it refused the episode's
        // settings at its start): its status, read below, says why, so the failure itself
        // is no error (it was reported as a closed stream, a race with that status).
        let _ = self.tx.send(input).await;
        let mut first_token_ms = None;
        loop {
            match self.events.next().await {
                Some(Ok(apb::StepEvent { event: Some(apb::step_event::Event::Token(_)) })) => {
                    first_token_ms.get_or_insert_with(|| sent.elapsed().as_secs_f64() * 1e3);
                }
                Some(Ok(apb::StepEvent { event: Some(apb::step_event::Event::Result(r)) })) => return Ok((r, first_token_ms)),
                Some(Ok(_)) => {}
                Some(Err(s)) => return Err(s),
                None => return Err(closed()),
            }
        }
    }
}

/// The status of a `RunEpisode` stream that closed before the step's result.
fn closed() -> tonic::Status {
    tonic::Status::unavailable("the RunEpisode stream closed before the step's result")
}

/// Whether `s` says the connection to the gateway failed (it went away, is restarting, or
/// cannot be reached), not that the gateway answered the request with an error: UNAVAILABLE,
/// and the UNKNOWN tonic's client reports for a broken HTTP/2 connection ("h2 protocol
/// error", "transport error"). INVALID_ARGUMENT and every other code are answers.
pub fn is_connection_error(s: &tonic::Status) -> bool {
    match s.code() {
        tonic::Code::Unavailable => true,
        tonic::Code::Unknown => ["h2 protocol error", "transport error", "connection"].iter().any(|m| s.message().contains(m)),
        _ => false,
    }
}

/// Runs one step of the episode on `stream` (opened with `start` first when `None`). A
/// connection error ([`is_connection_error`]) is retried up to [`RECONNECT_BACKOFF`]`.len()`
/// times, each after its wait and logged, on a newly opened `RunEpisode` (the same episode
/// id; a restarted gateway starts the episode again at this screen); an address that answers
/// plain HTTP/1.1 is not retried (it will not start speaking gRPC). `at` names the step for
/// the messages.
///
/// Errors: [`GatewayError::Gateway`] with the last status (and the HTTP/1.1 hint, or for
/// UNIMPLEMENTED what `channel` serves instead, e.g. a device-worker) when the
/// step failed with any other status or after the last retry.
async fn step_with_retries(
    client: &mut Client,
    channel: &tonic::transport::Channel,
    stream: &mut Option<EpisodeStream>,
    start: &apb::EpisodeStart,
    obs: apb::Observation,
    gateway: &str,
    at: &str,
) -> Result<(apb::StepResult, Option<f64>), GatewayError> {
    let mut retry = 0;
    loop {
        let outcome = match stream {
            Some(s) => s.step(obs.clone()).await,
            None => match EpisodeStream::open(client, start).await {
                Ok(s) => stream.insert(s).step(obs.clone()).await,
                Err(e) => Err(e),
            },
        };
        let status = match outcome {
            Ok(r) => return Ok(r),
            Err(s) => s,
        };
        *stream = None;
        let mut hint = tandem_auth::client::not_grpc_hint(gateway, AGENT_SERVICE_IS, AGENT_SERVICE_ELSEWHERE).await;
        if hint.is_empty() && status.code() == tonic::Code::Unimplemented {
            hint = not_agent_service_hint(channel).await;
        }
        let error = format!("RunEpisode at {gateway} ({at}): {}", tandem_auth::client::status_text(&status));
        match RECONNECT_BACKOFF.get(retry) {
            Some(wait) if is_connection_error(&status) && hint.is_empty() => {
                retry += 1;
                tracing::warn!("{error}; retry {retry} of {} in {wait:?}, on a new RunEpisode", RECONNECT_BACKOFF.len());
                tokio::time::sleep(*wait).await;
            }
            _ => {
                let after = match retry {
                    0 => String::new(),
                    n => format!(" (after {n} retries)"),
                };
                return Err(GatewayError::Gateway(format!("{error}{after}{hint}")));
            }
        }
    }
}

/// Writes to standard output with [`tandem_options::write_stdout`]: a reader that went away
/// (`replay ... | head -1`, `load ... | head -1`) ends the process quietly with exit code 0.
///
/// Errors: any other error writing to standard output.
pub(crate) fn stdout(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) -> Result<(), GatewayError> {
    tandem_options::write_stdout(write).map_err(|source| GatewayError::Io { path: "standard output".into(), source })
}

/// The run's last lines: steps, valid actions and errors; screenshots and decode figures
/// when there were any.
fn print_summary(out: &mut impl Write, records: &[StepRecord], summary: &ReplaySummary, cfg: &ReplayConfig) -> std::io::Result<()> {
    writeln!(
        out,
        "{} step(s): {} valid action(s), {} error(s); JSONL written to {}",
        summary.steps,
        summary.valid_actions,
        summary.errors,
        cfg.out.display()
    )?;
    let tokens: u32 = records.iter().map(|r| r.decode_tokens).sum();
    let passes: u32 = records.iter().map(|r| r.decode_passes).sum();
    let decode_ms: f64 = records.iter().map(|r| r.decode_ms).sum();
    let (proposed, accepted) = records
        .iter()
        .flat_map(|r| &r.drafts)
        .fold((0u32, 0u32), |(p, a), d| (p + d.proposed, a + d.accepted));
    let shots = records.iter().filter(|r| r.screenshot_sent).count();
    if shots > 0 {
        let sum = |f: fn(&StepRecord) -> u32| records.iter().map(f).sum::<u32>();
        writeln!(
            out,
            "screenshots: {shots} sent, {} image token(s), {} image(s) encoded in {:.1} ms, {} from the image cache",
            sum(|r| r.image_tokens),
            sum(|r| r.images_encoded),
            records.iter().map(|r| r.encoder_ms).sum::<f64>(),
            sum(|r| r.image_cache_hits)
        )?;
    }
    if tokens > 0 {
        writeln!(
            out,
            "decode: {tokens} token(s), {:.1} ms/token, {:.2} target passes/token; drafts {accepted}/{proposed} accepted",
            decode_ms / tokens as f64,
            passes as f64 / tokens as f64
        )?;
    }
    Ok(())
}

fn steps_of(ep: &Episode, max_steps: usize) -> usize {
    if max_steps == 0 {
        ep.steps.len()
    } else {
        ep.steps.len().min(max_steps)
    }
}

fn print_header(out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>9} {:>4} {:>7} {:>7} {:>5} {:>9} {:>8}  action",
        "progress", "step", "prompt", "reused", "new", "server_ms", "ms/token"
    )
}

fn print_row(out: &mut impl Write, r: &StepRecord, done: usize, total: usize) -> std::io::Result<()> {
    let action = if r.error.is_empty() {
        r.action.clone()
    } else {
        format!("ERROR: {}", r.error)
    };
    writeln!(
        out,
        "{:>9} {:>4} {:>7} {:>7} {:>5} {:>9.1} {:>8.1}  {}",
        format!("{done}/{total}"),
        r.step,
        r.prompt_tokens,
        r.reused_tokens,
        r.new_tokens,
        r.server_ms,
        r.ms_per_token,
        action
    )
}

#[cfg(test)]
mod tests {
    use super::is_connection_error;
    use tonic::{Code, Status};

    /// Retried: the gateway unreachable or restarting (UNAVAILABLE) and a broken connection
    /// (tonic's UNKNOWN "h2 protocol error" / "transport error"). Never an answer: an invalid
    /// request, a missing token, any other UNKNOWN.
    #[test]
    fn only_connection_failures_are_retried() {
        for s in [
            Status::unavailable("tcp connect error"),
            Status::unavailable("the RunEpisode stream closed before the step's result"),
            Status::unknown("h2 protocol error: error reading a body from connection"),
            Status::unknown("transport error"),
        ] {
            assert!(is_connection_error(&s), "{s:?}");
        }
        for s in [
            Status::invalid_argument("prompt over the context"),
            Status::unauthenticated("invalid bearer token"),
            Status::new(Code::Cancelled, "operation was canceled"),
            Status::failed_precondition("no vision projector"),
            Status::unknown("model output is not an action"),
        ] {
            assert!(!is_connection_error(&s), "{s:?}");
        }
    }
}
