//! Gateway configuration.

use std::net::SocketAddr;
use std::str::FromStr;

/// The `serve` command's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeConfig {
    /// Address for AgentService (gRPC).
    #[arg(long, default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
    /// device-worker address (repeatable); episodes are pinned to one worker each.
    #[arg(long = "worker", default_value = "http://127.0.0.1:50051")]
    pub workers: Vec<String>,
    /// Address for the OpenAI-compatible HTTP endpoint (`/v1/chat/completions`,
    /// `/v1/models`, `/health`), or `off`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: HttpListen,
    /// OTLP span export (`--otlp-endpoint`, env `OTEL_EXPORTER_OTLP_ENDPOINT`).
    #[command(flatten)]
    pub otel: tandem_telemetry::otel::OtelArgs,
}

/// `--http-listen`: an address, or `off` (no HTTP endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpListen(pub Option<SocketAddr>);

impl FromStr for HttpListen {
    type Err = String;

    /// `"off"` (any case) → `HttpListen(None)`; otherwise a socket address such as
    /// `127.0.0.1:8080`. Errors: a message naming the bad value.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(HttpListen(None));
        }
        s.trim()
            .parse()
            .map(|a| HttpListen(Some(a)))
            .map_err(|e| format!("expected an address like 127.0.0.1:8080 or \"off\", found {s:?}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_listen_parses_addresses_and_off() {
        assert_eq!("off".parse::<HttpListen>().unwrap(), HttpListen(None));
        assert_eq!("OFF".parse::<HttpListen>().unwrap(), HttpListen(None));
        assert_eq!("0.0.0.0:9000".parse::<HttpListen>().unwrap().0.unwrap().port(), 9000);
        assert!("localhost".parse::<HttpListen>().unwrap_err().contains("\"localhost\""));
    }
}
