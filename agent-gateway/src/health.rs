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
                let hint = not_grpc_hint(&args.addr, "whose health is GET /health; gRPC health is on its --listen port, default 127.0.0.1:50052, or a worker's, default 127.0.0.1:50051").await;
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

/// What to add to a failed gRPC call's error when `addr` answers plain HTTP/1.1
/// ([`answers_http1`]): ` (this address answers plain HTTP/1.1, not gRPC: it looks like the
/// gateway's --http-listen port, {where_grpc_is})`; empty otherwise. `where_grpc_is` says
/// where the caller's gRPC service is. Used by `health`, `replay` and `load`.
pub(crate) async fn not_grpc_hint(addr: &str, where_grpc_is: &str) -> String {
    match answers_http1(addr).await {
        true => format!(" (this address answers plain HTTP/1.1, not gRPC: it looks like the gateway's --http-listen port, {where_grpc_is})"),
        false => String::new(),
    }
}

/// Whether the plain `http://` (or bare `HOST:PORT`) address `addr` answers an HTTP/1.1
/// request with an HTTP/1.1 status line: the gateway's OpenAI endpoint, say, where a gRPC
/// client only sees "transport error". False for `https://`, `unix:` and anything that does
/// not answer so within a second.
async fn answers_http1(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(uri) = tandem_auth::client::uri(addr) else { return false };
    let Some(authority) = uri.strip_prefix("http://").map(|r| r.split('/').next().unwrap_or(r)) else { return false };
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(authority).await.ok()?;
        let request = format!("GET /health HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 8];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1."))
    };
    tokio::time::timeout(Duration::from_secs(1), probe).await.ok().flatten().unwrap_or(false)
}

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
        .map_err(|s| format!("health check failed: {}", status_text(&s)))?;
    Ok(ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

/// A gRPC status as `Code: message` and the causes of its source, each once: the source's
/// chain ([`tandem_options::error_chain`]) when it holds the message (a connection refused is
/// `Unavailable: transport error: tcp connect error: Connection refused (os error 111)`, not a
/// bare "tcp connect error"), else the message and each cause it does not already say.
pub(crate) fn status_text(s: &tonic::Status) -> String {
    let code = s.code();
    let source = std::error::Error::source(s);
    if let Some(chain) = source.map(tandem_options::error_chain).filter(|c| c.contains(s.message())) {
        return format!("{code:?}: {chain}");
    }
    let mut text = format!("{code:?}: {}", s.message());
    let mut cause = source;
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}
