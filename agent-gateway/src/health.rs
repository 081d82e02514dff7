//! `agent-gateway health`: asks a gateway or worker for its gRPC health status, optionally
//! waiting until it is SERVING (scripts use it to wait for a worker to load its model).

use std::io::Write;
use std::time::{Duration, Instant};

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::error::GatewayError;

#[derive(Clone, Debug, clap::Args)]
pub struct HealthArgs {
    /// Address of the gateway or worker: `http://HOST:PORT`, `HOST:PORT`, `https://...` (with
    /// `--tls-ca`) or `unix:PATH` (a `--listen unix:PATH` server). Default: a local worker; a
    /// local gateway is :50052.
    #[arg(long, default_value = "http://127.0.0.1:50051", value_parser = tandem_auth::client::address)]
    pub addr: String,
    /// Service name to check ("" = the whole server).
    #[arg(long, default_value = "")]
    pub service: String,
    /// Keep trying for this many seconds until SERVING (0: ask once).
    #[arg(long, default_value_t = 0)]
    pub wait: u64,
    /// TLS for an https:// address (`--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-domain`).
    #[command(flatten)]
    pub tls: tandem_auth::ClientTlsArgs,
}

/// Prints the status; errors unless SERVING (within `--wait`). An address that answers plain
/// HTTP/1.1 ends the wait at once: that server will not start answering gRPC.
pub async fn run(args: &HealthArgs) -> Result<(), GatewayError> {
    let tls = args.tls.load().map_err(|e| GatewayError::Config(e.to_string()))?;
    let deadline = Instant::now() + Duration::from_secs(args.wait);
    loop {
        let status = check(&args.addr, &args.service, tls.as_ref()).await;
        match &status {
            Ok(ServingStatus::Serving) => {
                return tandem_options::write_stdout(|out| writeln!(out, "{}: SERVING", args.addr))
                    .map_err(|source| GatewayError::Io { path: "standard output".into(), source });
            }
            Ok(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(s) => return Err(GatewayError::Health(format!("{} is {}{}", args.addr, s.as_str_name(), waited(args.wait)))),
            Err(e) => {
                let hint = tandem_auth::client::not_grpc_hint(&args.addr, HEALTH_AT_GATEWAY_HTTP, GRPC_HEALTH_IS).await;
                if hint.is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let how = match args.wait {
                    n if n > 0 && hint.is_empty() => format!("no answer after waiting {n}s: "),
                    _ => String::new(),
                };
                return Err(GatewayError::Health(format!("{}: {how}{e}{hint}", args.addr)));
            }
        }
    }
}

/// Where gRPC health is, for the hint after a failure at an address that answers HTTP/1.1
/// ([`tandem_auth::client::not_grpc_hint`]): after "the gateway's --http-listen port, ", and
/// for another HTTP server.
const HEALTH_AT_GATEWAY_HTTP: &str =
    "whose health is GET /health; gRPC health is on its --listen port, default 127.0.0.1:50052, or a worker's, default 127.0.0.1:50051";
const GRPC_HEALTH_IS: &str = "gRPC health is on a gateway's --listen port, default 127.0.0.1:50052, or a worker's, default 127.0.0.1:50051";

/// `" after waiting Ns"` when `--wait` was given, so a timeout says it waited.
fn waited(wait: u64) -> String {
    match wait {
        0 => String::new(),
        n => format!(" after waiting {n}s"),
    }
}

async fn check(addr: &str, service: &str, tls: Option<&tandem_auth::ClientTls>) -> Result<ServingStatus, String> {
    // The addresses `--listen` and `serve --worker` take (host:port, unix:PATH), dialled the
    // one way every client does.
    let (_, channel) = tandem_auth::client::channel(addr, tls, "--tls-ca")?;
    let mut client = HealthClient::new(channel);
    let resp = client
        .check(HealthCheckRequest { service: service.to_string() })
        .await
        .map_err(|s| format!("health check failed: {}", tandem_auth::client::status_text(&s)))?;
    Ok(ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

/// A tandem gRPC server, told by the services its gRPC health knows ([`grpc_server`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcServer {
    /// Its health knows `tandem.step.v1.StepService`.
    Worker,
    /// Its health knows `tandem.agent.v1.AgentService`.
    Gateway,
}

impl GrpcServer {
    /// What it is, for a message.
    pub fn what(self) -> &'static str {
        match self {
            GrpcServer::Worker => "a device-worker's gRPC port (its `serve --listen`)",
            GrpcServer::Gateway => "an agent-gateway's gRPC port (its --listen)",
        }
    }
}

/// Which tandem server answers gRPC on `channel` (a call there said UNIMPLEMENTED): a
/// device-worker or an agent-gateway, by the service its gRPC health knows (health needs no
/// token unless `--health-requires-auth`); `None` for another server, or no answer within a
/// second.
pub async fn grpc_server(channel: tonic::transport::Channel) -> Option<GrpcServer> {
    use tandem_proto::agent::v1::agent_service_server::SERVICE_NAME as AGENT;
    use tandem_proto::step::v1::step_service_server::SERVICE_NAME as STEP;
    let mut client = HealthClient::new(channel);
    for (service, server) in [(STEP, GrpcServer::Worker), (AGENT, GrpcServer::Gateway)] {
        let check = client.check(HealthCheckRequest { service: service.to_string() });
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), check).await {
            return Some(server);
        }
    }
    None
}
