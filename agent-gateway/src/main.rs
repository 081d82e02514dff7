//! `agent-gateway`: serves AgentService to controllers, and replays corpus episodes.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "agent-gateway", version, about = "tandem agent-gateway: turns screen observations into agent prompts, streams action tokens from device-workers and validates the JSON actions.", after_help = tandem_options::EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve AgentService (gRPC), health and the OpenAI-compatible HTTP endpoint (reflection
    /// with `--reflection`; TLS on both with `--tls-cert`/`--tls-key`).
    Serve(agent_gateway::config::ServeOptions),
    /// Replay real corpus episodes through a running gateway and print a per-step table. A
    /// step whose connection to the gateway breaks (the gateway restarting) is retried up to
    /// three times, 1, 2 and 4 s later, on a new episode stream.
    Replay(agent_gateway::replay::ReplayConfig),
    /// Load a running gateway on loopback: N concurrent corpus episodes (RunEpisode) plus
    /// bursts of short OpenAI chat requests, per N; prints p50/p99 step latency, throughput,
    /// shed/error/lost counts and whether outputs equal a sequential baseline's. Bounded by
    /// --duration-s and --max-requests; exits non-zero when a request was lost.
    Load(agent_gateway::load::LoadConfig),
    /// Check (or wait for) a gateway's or worker's gRPC health.
    Health(agent_gateway::health::HealthArgs),
    /// Print the chat messages the gateway would send for one step of a corpus episode, as
    /// JSON `{"messages": [...]}` (history: the episode's recorded earlier actions).
    Prompt(agent_gateway::prompt_dump::PromptArgs),
    /// Moved to `tandem-tools draft-vocab` (kept, hidden, to say so).
    #[command(hide = true, disable_help_flag = true)]
    DraftVocab {
        #[arg(allow_hyphen_values = true, trailing_var_arg = true)]
        _args: Vec<String>,
    },
}

/// A client command's result, with [`agent_gateway::error::GatewayError::Config`] (a bad option
/// or a file the command line names that cannot be used: `--token-file`, `--tls-ca`,
/// `--gateway`, `--count 0`) a usage error: exit code 2, as clap's own.
fn usage_on_config<T>(result: Result<T, agent_gateway::error::GatewayError>) -> Result<T, agent_gateway::error::GatewayError> {
    match result {
        Err(e @ agent_gateway::error::GatewayError::Config(_)) => Ok(tandem_options::or_usage_error(Err(e))),
        other => other,
    }
}

fn main() -> std::process::ExitCode {
    tandem_options::exit_code(run())
}

/// The command line's work; its error is printed once, causes included, by [`main`].
fn run() -> anyhow::Result<()> {
    let cli: Cli = tandem_options::parse();
    if let Command::Serve(cfg) = &cli.command {
        if let Some(file) = cfg.config.printed(cfg).context("printing the options")? {
            tandem_options::write_stdout(|out| out.write_all(file.as_bytes()))?;
            return Ok(());
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // Log lines to stderr; spans over OTLP when `serve --otlp-endpoint` (or the env) is set. The
    // exporter's gRPC channel lives on `rt`; the guard flushes spans on exit.
    let otlp = match &cli.command {
        Command::Serve(cfg) => cfg.otel.otlp_endpoint.clone(),
        _ => None,
    };
    let _tracing = {
        let _rt = rt.enter();
        tandem_telemetry::otel::init("agent-gateway", otlp.as_deref())?
    };
    rt.block_on(async move {
        match cli.command {
            Command::Serve(cfg) => {
                // One SIGINT/SIGTERM stops both servers; listen for it before anything else
                // starts (a second one, or 30 s of draining, exits at once).
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                let interrupted = tandem_telemetry::shutdown::signal().context("cannot install the signal handlers")?;
                tokio::spawn(async move {
                    interrupted.await;
                    let _ = stop_tx.send(true);
                });
                tandem_options::exit_on_usage_error(cfg.check_workers_are_not_self());
                let listens: Vec<_> = std::iter::once(cfg.listen).chain(cfg.http_listen.0).collect();
                // Files the command line names that cannot be used are usage errors (exit 2).
                let tls = tandem_options::or_usage_error(cfg.auth.tls.load());
                let worker_tls = tandem_options::or_usage_error(cfg.worker_tls.load());
                let auth = tandem_options::or_usage_error(cfg.auth.authenticator(&listens));
                if let Some(a) = &auth {
                    a.reload_on_sighup();
                    tracing::info!(file = %a.path().display(), "AgentService and the HTTP endpoint require a bearer token");
                }
                let worker_token = match &cfg.worker_token_file {
                    Some(p) => tandem_options::or_usage_error(tandem_auth::BearerInterceptor::from_file(p)),
                    None => tandem_auth::BearerInterceptor::none(),
                };
                worker_token.reload_on_sighup();
                let metrics = agent_gateway::metrics::install()?;
                let router = agent_gateway::worker::Router::connect(&cfg.workers, worker_token, worker_tls.as_ref())?;
                // Refuse an address that answers but is no worker; an unreachable one may start later.
                router.check_workers_answer().await?;
                let screenshots = cfg.screenshot_policy();
                // Refuse at start-up what would fail every screenshot step.
                agent_gateway::screenshot::check_workers(&router, &screenshots).await?;
                tracing::info!(mode = screenshots.mode.as_str(), sparse_below = screenshots.sparse_below, "screenshots");
                let runner = Arc::new(
                    agent_gateway::step::StepRunner::new(router.clone())
                        .with_max_controls(cfg.max_controls)
                        .with_screenshots(screenshots),
                );
                let listener = tandem_auth::Listener::bind(&tandem_auth::ListenAddr::Tcp(cfg.listen)).await?;
                tracing::info!(addr = %listener.local_addr()?, workers = ?cfg.workers, tls = tls.is_some(), mutual_tls = tls.as_ref().is_some_and(|t| t.mutual()), reflection = cfg.auth.reflection, "AgentService listening");
                let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                    let _ = rx.wait_for(|s| *s).await;
                };
                let http = match cfg.http_listen.0 {
                    Some(addr) => {
                        let l = tokio::net::TcpListener::bind(addr)
                            .await
                            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (HTTP; --http-listen off disables it): {e}"))?;
                        tracing::info!(addr = %l.local_addr()?, limits = ?cfg.http_limits(), "OpenAI-compatible HTTP endpoint listening");
                        let security = agent_gateway::http::HttpSecurity {
                            auth: auth.clone(),
                            tls: tls.clone(),
                            limits: cfg.http_limits(),
                        };
                        Some(tokio::spawn(agent_gateway::http::serve_secured(
                            agent_gateway::http::HttpState { router, metrics: Some(metrics) },
                            l,
                            stopped(stop_rx.clone()),
                            security,
                        )))
                    }
                    None => None,
                };
                let security = cfg.auth.grpc_security(auth, tls);
                agent_gateway::service::serve_secured(runner, listener, stopped(stop_rx), security).await?;
                if let Some(h) = http {
                    h.await.context("HTTP server task")??;
                }
            }
            Command::Load(cfg) => {
                let reports = usage_on_config(agent_gateway::load::run(&cfg).await)?;
                agent_gateway::load::verdict(&reports).map_err(|e| anyhow::anyhow!(e))?;
            }
            Command::Health(args) => usage_on_config(agent_gateway::health::run(&args).await)?,
            Command::Prompt(args) => {
                let json = agent_gateway::prompt_dump::messages_json(&args)?;
                tandem_options::write_stdout(|out| writeln!(out, "{json}"))?;
            }
            Command::DraftVocab { .. } => {
                anyhow::bail!("draft-vocab moved to `tandem-tools draft-vocab` (same options)")
            }
            Command::Replay(cfg) if cfg.dry_run => {
                anyhow::bail!("the dry run moved to `tandem-tools dry-run` (same options; --episode, --corpus, --model, --format, --per-step, ...)")
            }
            Command::Replay(cfg) => {
                let (_records, summary) = usage_on_config(agent_gateway::replay::run(&cfg).await)?;
                if summary.steps > 0 && summary.valid_actions == 0 {
                    anyhow::bail!("no step produced a valid action");
                }
            }
        }
        Ok(())
    })
}
