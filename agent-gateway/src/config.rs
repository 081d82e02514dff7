//! Gateway configuration.

use std::net::SocketAddr;

/// The `serve` command's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeConfig {
    /// Address for AgentService (gRPC).
    #[arg(long, default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
    /// device-worker address (repeatable); episodes are pinned to one worker each.
    #[arg(long = "worker", default_value = "http://127.0.0.1:50051")]
    pub workers: Vec<String>,
}
