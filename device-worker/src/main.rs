//! `device-worker`: serves StepService for one GGUF model.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use device_worker::config::ServeOptions;

#[derive(Parser)]
#[command(
    name = "device-worker",
    version,
    about = "tandem device-worker: runs a GGUF model on this device and serves StepService (gRPC).",
    after_help = tandem_options::EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the model and serve StepService and gRPC health (reflection with `--reflection`;
    /// TLS with `--tls-cert`/`--tls-key`; a Unix socket with `--listen unix:PATH`; Prometheus
    /// `/metrics` with `--metrics-listen`). Options may come from a TOML file (`--config`).
    Serve(ServeOptions),
    /// Measure prefill and decode speed on the model (no server).
    Bench(device_worker::bench::BenchOptions),
    /// Send one Generate request to a running worker and print one JSON line with the
    /// client-side and server-reported times (for bench/idle_power.sh) and the output token
    /// ids and text (tools/aarch64/worker_test.sh compares them across builds).
    Request {
        #[command(flatten)]
        worker: WorkerClientArgs,
        /// Prompt text (tokenized as is).
        #[arg(long)]
        text: String,
        /// Most output tokens to generate; 0: the worker's default budget (its `serve
        /// --default-max-tokens`, 256 unless set), cut at the context's end. Generation also
        /// stops at the end-of-generation token or a full context; `finish_reason` in the
        /// output says which.
        #[arg(long, default_value_t = 8, allow_hyphen_values = true, value_parser = max_tokens)]
        max_tokens: u32,
        /// Session id: requests with the same id reuse one slot's KV cache and checkpoints
        /// (empty: no session, the worker picks a slot by the longest cached prefix).
        #[arg(long, default_value = "")]
        session: String,
    },
    /// Print a running worker's power figures as one JSON line.
    Power {
        #[command(flatten)]
        worker: WorkerClientArgs,
    },
    /// Write back the host power settings (cpufreq floors) that a `--power-backend linux`
    /// worker saved at start, after it was killed without restoring them (SIGKILL, OOM
    /// killer); removes the state file. Without a state file there is nothing to restore.
    PowerRestore {
        /// As `serve --power-root`.
        #[arg(long, default_value = "/")]
        power_root: std::path::PathBuf,
        /// As `serve --power-state-file` (default: `run/device-worker-power.json` under
        /// `--power-root`).
        #[arg(long)]
        power_state_file: Option<std::path::PathBuf>,
    },
    /// Render chat messages (JSON `{"messages":[{"role","content"}]}` on stdin) with the
    /// model's chat template and print the prompt text, as the worker would tokenize it:
    /// special-token texts inside contents (e.g. `<|im_start|>`) are escaped with a zero-width
    /// space after their first character, so they stay plain text.
    Render {
        /// GGUF model file whose template is used.
        #[arg(long, env = "TANDEM_MODEL")]
        model: Option<std::path::PathBuf>,
    },
}

/// How `request` and `power` reach a running worker: its address and, for a worker started
/// with `--auth-token-file`, the token to send (the gateway's `--worker-token-file`).
#[derive(Clone, Debug, clap::Args)]
struct WorkerClientArgs {
    /// Worker address: `http://HOST:PORT`, `HOST:PORT` or `unix:PATH`.
    #[arg(long, default_value = "http://127.0.0.1:50051", value_parser = tandem_auth::client::address)]
    addr: String,
    /// Bearer token for a worker that requires one: the first token of this file (the
    /// worker's `--auth-token-file` format; as `agent-gateway serve --worker-token-file`).
    #[arg(long, env = "TANDEM_WORKER_TOKEN_FILE")]
    worker_token_file: Option<std::path::PathBuf>,
}

type WorkerClient = tandem_proto::step::v1::step_service_client::StepServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, tandem_auth::BearerInterceptor>,
>;

impl WorkerClientArgs {
    /// A client of the worker (lazily connected, [`tandem_auth::client::channel`]) sending
    /// the token, if any.
    fn client(&self) -> anyhow::Result<WorkerClient> {
        let token = match &self.worker_token_file {
            Some(p) => tandem_options::or_usage_error(tandem_auth::BearerInterceptor::from_file(p)),
            None => tandem_auth::BearerInterceptor::none(),
        };
        let (_, channel) = tandem_auth::client::channel(&self.addr, None, "--tls-ca (not available here: use http:// or unix:)")
            .map_err(anyhow::Error::msg)?;
        Ok(tandem_proto::step::v1::step_service_client::StepServiceClient::with_interceptor(channel, token))
    }
}

/// `request --max-tokens`: a whole number from 0 (`-1` reaches this parser, not clap's
/// "unexpected argument"). Errors: a message naming the value.
fn max_tokens(s: &str) -> Result<u32, String> {
    s.trim().parse().map_err(|_| format!("expected a whole number of output tokens from 0 to 4294967295 (0: the worker's default budget), found {s:?}"))
}

fn main() -> std::process::ExitCode {
    tandem_options::exit_code(run())
}

/// The command line's work; its error is printed once, causes included, by [`main`].
fn run() -> anyhow::Result<()> {
    let cli: Cli = tandem_options::parse();
    let Command::Serve(cfg) = cli.command else {
        let _tracing = tandem_telemetry::otel::init("device-worker", None)?;
        return run_tool(cli.command);
    };
    // Checked before --print-config too, so a printed file is one serve accepts.
    tandem_options::exit_on_usage_error(cfg.engine.check_usage());
    if let Some(file) = cfg.config.printed(&cfg).context("printing the options")? {
        tandem_options::write_stdout(|out| out.write_all(file.as_bytes()))?;
        return Ok(());
    }
    let settings = cfg.engine.settings()?;
    let model_given = cfg.engine.model.is_some();
    // Files the command line names that cannot be used are usage errors (exit code 2).
    tandem_options::exit_on_usage_error(device_worker::config::check_model_paths(&settings, model_given));
    let telemetry = cfg.telemetry.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The OTLP exporter's gRPC channel lives on this runtime; the guard flushes spans on exit.
    let _tracing = {
        let _rt = rt.enter();
        tandem_telemetry::otel::init(
            "device-worker",
            telemetry.otel.otlp_endpoint.as_deref(),
        )?
    };
    let tls = tandem_options::or_usage_error(cfg.auth.tls.load());
    let auth = tandem_options::or_usage_error(cfg.auth.authenticator(cfg.listen.tcp().as_slice()));
    cfg.engine.kernels.install().map_err(anyhow::Error::msg)?;
    rt.block_on(async move {
        let model = settings.model.clone();
        device_worker::config::check_model_files(&settings, model_given)?;
        let engine = device_worker::engine::EngineHandle::spawn(settings)?;
        // The host's power settings go back on every way out: the end of serve (below), an
        // early return or a panic unwinding through here (the guard), a forced exit (which
        // skips destructors). A watchdog restart releases them in the idle controller.
        let restorer = engine.power_restorer();
        let _restore = device_worker::power::RestoreOnDrop(restorer.clone());
        if let Some(r) = restorer.clone() {
            tandem_telemetry::shutdown::before_forced_exit(move || r.restore("forced exit"));
        }
        // Detect the energy source once, at engine start.
        device_worker::telemetry::energy::publish_availability();
        let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics_server = match telemetry.metrics_listen {
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--metrics-listen): {e}"))?;
                tracing::info!(addr = %l.local_addr()?, "Prometheus /metrics listening");
                Some(tokio::spawn(device_worker::service::metrics::serve(
                    engine.clone(),
                    l,
                    async {
                        let _ = metrics_stopped.await;
                    },
                )))
            }
            None => None,
        };
        let listener = tandem_auth::Listener::bind(&cfg.listen).await?;
        tracing::info!(addr = %listener.local_addr()?, tls = tls.is_some(), mutual_tls = tls.as_ref().is_some_and(|t| t.mutual()), reflection = cfg.auth.reflection, "StepService listening (health says NOT_SERVING until the model is loaded)");
        // Stop on Ctrl-C, or when the model fails to load: a worker that can never
        // serve should exit with the reason rather than sit NOT_SERVING.
        let failed_rx = load_failure(&engine);
        let load_error = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let le = load_error.clone();
        let interrupted =
            tandem_telemetry::shutdown::signal().context("cannot install the signal handlers")?;
        let shutdown = async move {
            tokio::select! {
                _ = interrupted => {}
                Ok(m) = failed_rx => {
                    *le.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
                }
            }
        };
        let exited = engine.exit_signal();
        if let Some(a) = &auth {
            a.reload_on_sighup();
            tracing::info!(file = %a.path().display(), "StepService requires a bearer token");
        }
        let security = cfg.auth.grpc_security(auth, tls);
        device_worker::service::serve_secured(engine, listener, shutdown, security).await?;
        let _ = metrics_stop.send(());
        if let Some(h) = metrics_server {
            h.await.context("metrics server task")??;
        }
        // Every engine handle is gone now: let the engine finish and save what it keeps.
        let clean =
            tokio::task::spawn_blocking(move || exited.wait(std::time::Duration::from_secs(10)))
                .await
                .unwrap_or(false);
        if !clean {
            tracing::warn!("the engine did not stop within 10 s; exiting without waiting");
        }
        if let Some(r) = &restorer {
            r.restore("exit");
        }
        if let Some(m) = load_error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            anyhow::bail!(
                "the engine could not start (model {}): {m}",
                model.display()
            );
        }
        Ok(())
    })
}

/// Receives the engine's error when a (re)load fails, at start or after a watchdog restart.
fn load_failure(
    engine: &device_worker::engine::EngineHandle,
) -> tokio::sync::oneshot::Receiver<String> {
    let mut state = engine.state();
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        let failed = state
            .wait_for(|s| matches!(s, device_worker::engine::EngineState::Failed(_)))
            .await
            .ok()
            .and_then(|s| match &*s {
                device_worker::engine::EngineState::Failed(m) => Some(m.clone()),
                _ => None,
            });
        if let Some(m) = failed {
            let _ = failed_tx.send(m);
        }
    });
    failed_rx
}

/// The commands other than `serve`.
fn run_tool(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(_) => anyhow::bail!("serve is run by main, not as a tool"),
        Command::Bench(cfg) => {
            tandem_options::exit_on_usage_error(cfg.check_usage());
            device_worker::bench::run(&cfg)
        }
        Command::Request {
            worker,
            text,
            max_tokens,
            session,
        } => client_runtime()?.block_on(request(worker, text, max_tokens, session)),
        Command::Power { worker } => client_runtime()?.block_on(power(worker)),
        Command::PowerRestore {
            power_root,
            power_state_file,
        } => {
            let file = power_state_file
                .unwrap_or_else(|| power_root.join(device_worker::power::linux::STATE_FILE));
            let restored = device_worker::power::restore_from_state_file(&file)?;
            tandem_options::write_stdout(|out| {
                if restored.is_empty() {
                    writeln!(out, "nothing to restore: no state file at {}", file.display())?;
                }
                restored.iter().try_for_each(|s| writeln!(out, "restored {} = {}", s.path.display(), s.original))
            })?;
            Ok(())
        }
        Command::Render { model } => {
            use std::io::Read;
            let path = model.unwrap_or_else(device_worker::config::default_model_path);
            tandem_options::exit_on_usage_error(tandem_options::check_readable(&[("--model", &path)]));
            let file = gguf::reader::GgufFile::open(&path)?;
            let template = gguf::chat_template::ChatTemplate::from_gguf(&file)?;
            let tokenizer = gguf::tokenizer::Tokenizer::from_gguf(&file)?;
            let mut input = String::new();
            std::io::stdin().read_to_string(&mut input)?;
            #[derive(serde::Deserialize)]
            struct Messages {
                messages: Vec<gguf::chat_template::ChatMessage>,
            }
            let m: Messages = serde_json::from_str(&input)
                .context("stdin must be {\"messages\": [{\"role\": .., \"content\": ..}]}")?;
            // The serving path's text: special-token texts in contents escaped (they stay text).
            let text = device_worker::prompt::render_chat(&tokenizer, &template, &m.messages)?;
            tandem_options::write_stdout(|out| out.write_all(text.as_bytes()))?;
            Ok(())
        }
    }
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn request(
    worker: WorkerClientArgs,
    text: String,
    max_tokens: u32,
    session: String,
) -> anyhow::Result<()> {
    use tandem_proto::step::v1 as pb;
    use tokio_stream::StreamExt;
    let mut client = worker.client()?;
    let t0 = std::time::Instant::now();
    let stream = client
        .generate(pb::GenerateRequest {
            session_id: session,
            prompt: Some(pb::generate_request::Prompt::Text(text)),
            max_tokens,
            ..Default::default()
        })
        .await;
    let mut stream = match stream {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(worker_error(&worker.addr, &s).await),
    };
    let mut first_token_ms = None;
    let mut done = None;
    let (mut tokens, mut out_text) = (Vec::new(), String::new());
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(s) => return Err(worker_error(&worker.addr, &s).await),
        };
        match ev.event {
            Some(pb::generate_event::Event::Token(t)) => {
                first_token_ms.get_or_insert(t0.elapsed().as_secs_f64() * 1e3);
                tokens.push(t.id);
                out_text.push_str(&t.text);
            }
            Some(pb::generate_event::Event::Done(d)) => done = Some(d),
            _ => {}
        }
    }
    let d = done.context("the stream ended without final stats")?;
    let json = serde_json::json!({
        "client_ms": t0.elapsed().as_secs_f64() * 1e3,
        "first_token_ms": first_token_ms.unwrap_or(0.0),
        "wake_ms": d.wake_ms,
        "cold_start": d.cold_start,
        "server_ms": d.server_ms,
        "queue_ms": d.queue_ms,
        "prompt_tokens": d.prompt_tokens,
        "reused_tokens": d.reused_tokens,
        "decode_tokens": d.decode_tokens,
        "finish_reason": finish_reason(d.finish_reason),
        "tokens": tokens,
        "text": out_text,
    });
    tandem_options::write_stdout(|out| writeln!(out, "{json}"))?;
    Ok(())
}

/// Where a worker's gRPC port is, for the hint after a failure at an address that answers
/// HTTP/1.1 ([`tandem_auth::client::not_grpc_hint`]): after "the gateway's --http-listen port, ",
/// and for another HTTP server.
const WORKER_AT_GATEWAY_HTTP: &str = "its OpenAI endpoint; the worker's gRPC port is its `serve --listen`, default 127.0.0.1:50051 (the gateway's --worker)";
const WORKER_GRPC_IS: &str = "the worker's gRPC port is its `serve --listen`, default 127.0.0.1:50051";

/// A gRPC error from the worker at `addr`, saying what to do: a plain HTTP/1.1 server (the
/// gateway's OpenAI endpoint, a metrics port) or another gRPC server (the gateway's) at `addr`
/// is named as such; a worker that cannot be reached is said so, with the cause.
async fn worker_error(addr: &str, status: &tonic::Status) -> anyhow::Error {
    use tandem_proto::step::v1::step_service_server::SERVICE_NAME;
    if tandem_auth::client::maybe_not_grpc(status) {
        let hint = tandem_auth::client::not_grpc_hint(addr, WORKER_AT_GATEWAY_HTTP, WORKER_GRPC_IS).await;
        if !hint.is_empty() {
            return anyhow::anyhow!("{addr} is not a worker's gRPC port{hint}");
        }
    }
    let text = tandem_auth::client::status_text(status);
    match status.code() {
        tonic::Code::Unimplemented => anyhow::anyhow!(
            "{addr} does not serve {SERVICE_NAME} (is it the gateway, or another server? pass a worker's address, its `serve --listen`, as --addr)"
        ),
        // A status tonic made here (a failed connection), not the worker's.
        _ if std::error::Error::source(status).is_some() => anyhow::anyhow!(
            "cannot reach a worker at {addr}: {text} (is a worker running there? start one with `device-worker serve`, or pass --addr)"
        ),
        _ => anyhow::anyhow!("worker {addr}: {text}"),
    }
}

/// The `FinishReason` of the final stats in lower case (`"eos"`, `"length"`, `"stop"`,
/// `"grammar"`, `"context"`; `"unspecified"` for a value this build does not know).
fn finish_reason(value: i32) -> String {
    use tandem_proto::step::v1::FinishReason;
    FinishReason::try_from(value)
        .unwrap_or(FinishReason::Unspecified)
        .as_str_name()
        .trim_start_matches("FINISH_REASON_")
        .to_ascii_lowercase()
}

async fn power(worker: WorkerClientArgs) -> anyhow::Result<()> {
    use tandem_proto::step::v1 as pb;
    let mut client = worker.client()?;
    let s = match client.status(pb::StatusRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(worker_error(&worker.addr, &s).await),
    };
    let p = s.power.unwrap_or_default();
    let wl = p.wake_latency.unwrap_or_default();
    let json = serde_json::json!({
        "state": p.state,
        "backend": p.backend,
        "released_ms": p.released_ms,
        "release_cycles": p.release_cycles,
        "wake_count": wl.count,
        "wake_sum_ms": wl.sum_ms,
        "wake_max_ms": wl.max_ms,
        "cold_starts": p.cold_starts,
        "unloads": p.unloads,
        "watchdog_restarts": p.watchdog_restarts,
    });
    tandem_options::write_stdout(|out| writeln!(out, "{json}"))?;
    Ok(())
}
