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

/// Prints the status; errors unless SERVING (within `--wait`).
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
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(s) => return Err(GatewayError::Health(format!("{} is {}{}", args.addr, s.as_str_name(), waited(args.wait)))),
            Err(e) => {
                let how = match args.wait {
                    0 => String::new(),
                    n => format!("no answer after waiting {n}s: "),
                };
                let hint = match answers_http1(&args.addr).await {
                    true => " (this address answers plain HTTP/1.1, not gRPC: it looks like the gateway's --http-listen port, whose health is GET /health; gRPC health is on its --listen port, default 127.0.0.1:50052, or a worker's, default 127.0.0.1:50051)",
                    false => "",
                };
                return Err(GatewayError::Health(format!("{}: {how}{e}{hint}", args.addr)));
            }
        }
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
        .map_err(|s| format!("health check failed: {:?}: {}", s.code(), s.message()))?;
    Ok(ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

/// An error and its causes, `a: b: c` (tonic's transport error alone says only "transport error").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
