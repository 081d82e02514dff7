//! `agent-gateway`: serves AgentService to controllers, and replays corpus episodes.

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "agent-gateway", version, about = "tandem agent-gateway: turns screen observations into agent prompts, streams action tokens from device-workers and validates the JSON actions.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve AgentService (gRPC), health and reflection.
    Serve(agent_gateway::config::ServeConfig),
    /// Replay real corpus episodes through a running gateway and print a per-step table.
    Replay(agent_gateway::replay::ReplayConfig),
    /// Check (or wait for) a gateway's or worker's gRPC health.
    Health(agent_gateway::health::HealthArgs),
    /// Print the chat messages the gateway would send for one step of a corpus episode, as
    /// JSON `{"messages": [...]}` (history: the episode's recorded earlier actions).
    Prompt(agent_gateway::prompt_dump::PromptArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve(cfg) => {
                let router = agent_gateway::worker::Router::new(&cfg.workers)?;
                let runner = Arc::new(agent_gateway::step::StepRunner::new(router));
                let listener = tokio::net::TcpListener::bind(cfg.listen)
                    .await
                    .with_context(|| format!("cannot listen on {}", cfg.listen))?;
                tracing::info!(addr = %listener.local_addr()?, workers = ?cfg.workers, "AgentService listening");
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                    tracing::info!("shutting down");
                };
                agent_gateway::service::serve(runner, listener, shutdown).await?;
            }
            Command::Health(args) => agent_gateway::health::run(&args).await?,
            Command::Prompt(args) => println!("{}", agent_gateway::prompt_dump::messages_json(&args)?),
            Command::Replay(cfg) => {
                let (_records, summary) = agent_gateway::replay::run(&cfg).await?;
                if summary.steps > 0 && summary.valid_actions == 0 {
                    anyhow::bail!("no step produced a valid action");
                }
            }
        }
        Ok(())
    })
}
