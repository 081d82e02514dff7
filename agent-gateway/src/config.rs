//! Gateway configuration: the `serve` options as clap flags, mirrored by the keys of a
//! `--config` TOML file (the long flag names; precedence defaults < file < environment <
//! flags, `tandem_options`), serialisable so `--print-config` writes such a file.

use std::net::SocketAddr;
use std::str::FromStr;

use tandem_auth::https::HttpLimits;

use crate::screenshot::{ScreenshotMode, ScreenshotPolicy};

/// `serve --config`'s help, with this program's keys as examples.
const CONFIG_HELP: &str = "TOML file of options: its keys are this command's long flags (`worker = [\"http://127.0.0.1:50051\"]`, `listen = \"127.0.0.1:50052\"`, `max-controls = 60`); flags and environment variables override it. `--print-config` writes one";

/// The `serve` command's options.
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[command(mut_arg("config", |a| a.help(CONFIG_HELP)))]
pub struct ServeOptions {
    #[command(flatten)]
    #[serde(skip)]
    pub config: tandem_options::ConfigArgs,
    /// Address for AgentService (gRPC), IP:PORT.
    #[arg(long, default_value = "127.0.0.1:50052", value_parser = tandem_auth::listen::socket_addr)]
    pub listen: SocketAddr,
    /// device-worker address (repeatable); episodes are pinned to one worker each:
    /// `http://HOST:PORT`, `https://HOST:PORT` (TLS, verified with --worker-tls-ca) or
    /// `unix:PATH` (a worker's `--listen unix:PATH` socket).
    #[arg(long = "worker", default_value = "http://127.0.0.1:50051", value_parser = tandem_auth::client::address)]
    #[serde(rename = "worker")]
    pub workers: Vec<String>,
    /// Most screen controls one prompt lists (at least 1); a larger screen lists the most
    /// important ones (focused control, navigation bars and tabs, editable fields, clickable
    /// controls with text, then the rest) and says how many were left out.
    #[arg(long, default_value_t = crate::observation::DEFAULT_MAX_CONTROLS, value_parser = max_controls)]
    pub max_controls: usize,
    /// When an observation's screenshot (`Observation.screenshot_png`, PNG or JPEG) is sent to
    /// the model, after the text of the step's user message: `never` (text-only steps), `auto`
    /// (when the episode's worker has a vision projector, `device-worker serve --mmproj`, and
    /// the screen lists fewer controls than --screenshot-sparse-below: the tree then says
    /// little and the pixels matter; dense screens stay text-only, which is faster), `always`
    /// (every screenshot; a step with one fails with FAILED_PRECONDITION when its worker has
    /// no vision projector, and the gateway refuses to start when a worker already answers
    /// without one).
    #[arg(long, value_enum, default_value_t = ScreenshotMode::Auto)]
    pub screenshots: ScreenshotMode,
    /// `--screenshots auto` attaches the screenshot when the prompt lists fewer controls than
    /// this (after --max-controls selection). Default 4: the sparsest real screens of the
    /// corpus (confirmation dialogs, 4–5 controls; the launcher, 9) are fully described by
    /// their tree, while a tree with fewer holds next to nothing of the screen (a game, a map,
    /// a canvas or a video with a button or two).
    #[arg(long, default_value_t = crate::screenshot::DEFAULT_SPARSE_BELOW)]
    pub screenshot_sparse_below: usize,
    /// Address for the OpenAI-compatible HTTP endpoint (`/v1/chat/completions`,
    /// `/v1/models`, `/health`), or `off`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    #[serde(serialize_with = "as_display")]
    pub http_listen: HttpListen,
    /// HTTP: a request's head (request line and headers) must arrive within this many ms, or
    /// the connection is closed (also bounds how long a kept-alive connection waits idle for
    /// its next request).
    #[arg(long, default_value_t = HttpLimits::DEFAULT_HEADER_READ_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_read_timeout_ms: u64,
    /// HTTP: a connection with no byte read or written for this many ms is closed (a client
    /// that stops sending or reading); a handler's wait for the worker's first event does not
    /// count.
    #[arg(long, default_value_t = HttpLimits::DEFAULT_IDLE_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,
    /// HTTP: most connections served at once; one more gets a 503 with Retry-After and is
    /// closed.
    #[arg(long, default_value_t = HttpLimits::DEFAULT_MAX_CONNECTIONS, value_parser = max_connections)]
    pub http_max_connections: usize,
    /// OTLP span export (`--otlp-endpoint`, env `OTEL_EXPORTER_OTLP_ENDPOINT`).
    #[command(flatten)]
    #[serde(flatten)]
    pub otel: tandem_telemetry::otel::OtelArgs,
    /// Bearer tokens for AgentService and the HTTP endpoint (`--auth-token-file`, ...).
    #[command(flatten)]
    #[serde(flatten)]
    pub auth: tandem_auth::AuthArgs,
    /// The token the gateway sends to its workers: the first token of this file (the same
    /// format as a worker's `--auth-token-file`; give both the same file on one phone);
    /// reloaded on SIGHUP, like the accepted tokens (rotate the file, then SIGHUP both).
    #[arg(long, env = "TANDEM_WORKER_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_token_file: Option<std::path::PathBuf>,
    /// TLS to https:// workers (`--worker-tls-ca`, `--worker-tls-cert`, ...).
    #[command(flatten)]
    #[serde(flatten)]
    pub worker_tls: tandem_auth::WorkerTlsArgs,
}

impl ServeOptions {
    /// The screenshot policy from `--screenshots` and `--screenshot-sparse-below`.
    pub fn screenshot_policy(&self) -> ScreenshotPolicy {
        ScreenshotPolicy { mode: self.screenshots, sparse_below: self.screenshot_sparse_below }
    }

    /// The HTTP endpoint's connection limits from the `--http-*` flags.
    pub fn http_limits(&self) -> HttpLimits {
        HttpLimits {
            header_read_timeout: std::time::Duration::from_millis(self.http_header_read_timeout_ms),
            idle_timeout: std::time::Duration::from_millis(self.http_idle_timeout_ms),
            max_connections: self.http_max_connections,
        }
    }
}

/// `--http-max-connections`: a whole number of at least 1. Errors: a message naming the bad
/// value.
fn max_connections(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of connections, at least 1, found {s:?}")),
    }
}

/// `--max-controls`: a whole number of at least 1. Errors: a message naming the bad value.
fn max_controls(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of controls, at least 1, found {s:?}")),
    }
}

fn as_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// `--http-listen`: an address, or `off` (no HTTP endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpListen(pub Option<SocketAddr>);

impl std::fmt::Display for HttpListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("off"),
        }
    }
}

impl FromStr for HttpListen {
    type Err = String;

    /// `"off"` (any case) → `HttpListen(None)`; otherwise a socket address such as
    /// `127.0.0.1:8080`. Errors: a message naming the bad value.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(HttpListen(None));
        }
        tandem_auth::listen::socket_addr_or(s, "off").map(|a| HttpListen(Some(a)))
    }
}

impl ServeOptions {
    /// Refuses a `--worker` that is this gateway's own `--listen` or `--http-listen` address
    /// (the same port on a loopback or the same IP, for a wildcard or that IP listen address):
    /// the start-up check of the workers runs before the gateway listens, so it cannot tell,
    /// and a gateway that connects to its own HTTP port fills its connection cap with itself.
    ///
    /// Errors: a message naming the `--worker` and the flag it equals.
    pub fn check_workers_are_not_self(&self) -> Result<(), String> {
        let own = std::iter::once((self.listen, "--listen")).chain(self.http_listen.0.map(|a| (a, "--http-listen")));
        let own: Vec<(SocketAddr, &str)> = own.collect();
        for w in &self.workers {
            let Some(target) = worker_socket_addr(w) else { continue };
            for &(l, flag) in &own {
                let same_host = target.ip() == l.ip()
                    || (target.ip().is_loopback() && (l.ip().is_loopback() || l.ip().is_unspecified()));
                if target.port() == l.port() && same_host {
                    return Err(format!(
                        "--worker {w} is this gateway's own {flag} address; pass a worker's gRPC address, its `device-worker serve --listen` (default 127.0.0.1:50051)"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The IP and port of an `http://` or `https://` worker address whose host is an IP literal
/// or `localhost` (`None` for other hosts and `unix:` sockets).
fn worker_socket_addr(worker: &str) -> Option<SocketAddr> {
    let rest = worker.strip_prefix("http://").or_else(|| worker.strip_prefix("https://"))?;
    let authority = rest.split('/').next()?;
    if let Ok(a) = authority.parse::<SocketAddr>() {
        return Some(a);
    }
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost").then(|| SocketAddr::from(([127, 0, 0, 1], port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_at_the_gateways_own_address_is_refused() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeOptions,
        }
        let opts = |listen: &str, http: &str, worker: &str| {
            use clap::Parser;
            Cli::parse_from(["agent-gateway", "--listen", listen, "--http-listen", http, "--worker", worker]).serve
        };
        for (listen, http, worker, flag) in [
            ("127.0.0.1:50052", "127.0.0.1:8080", "http://127.0.0.1:50052", "--listen"),
            ("127.0.0.1:50052", "127.0.0.1:8080", "http://localhost:8080", "--http-listen"),
            ("0.0.0.0:50052", "off", "https://127.0.0.1:50052/", "--listen"),
            ("[::1]:50052", "off", "http://[::1]:50052", "--listen"),
        ] {
            let err = opts(listen, http, worker).check_workers_are_not_self().expect_err(worker);
            assert!(err.contains(&format!("--worker {worker} is this gateway's own {flag} address")), "{err}");
        }
        for (listen, http, worker) in [
            ("127.0.0.1:50052", "127.0.0.1:8080", "http://127.0.0.1:50051"),
            ("10.0.0.2:50052", "off", "http://10.0.0.3:50052"),
            ("127.0.0.1:50052", "off", "unix:/tmp/worker.sock"),
            ("127.0.0.1:50052", "off", "http://worker.local:50052"),
        ] {
            assert_eq!(opts(listen, http, worker).check_workers_are_not_self(), Ok(()), "{worker}");
        }
    }

    #[test]
    fn http_listen_parses_addresses_and_off() {
        assert_eq!("off".parse::<HttpListen>().unwrap(), HttpListen(None));
        assert_eq!("OFF".parse::<HttpListen>().unwrap(), HttpListen(None));
        assert_eq!("0.0.0.0:9000".parse::<HttpListen>().unwrap().0.unwrap().port(), 9000);
        assert!("localhost".parse::<HttpListen>().unwrap_err().contains("\"localhost\" has no port"));
        let err = ":99999".parse::<HttpListen>().unwrap_err();
        assert!(err.contains("no host before the port") && err.ends_with(", or off)"), "{err}");
        for s in ["off", "127.0.0.1:8080"] {
            assert_eq!(s.parse::<HttpListen>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn printed_config_keys_are_the_serve_flags() {
        use clap::{Args, FromArgMatches};
        let cmd = ServeOptions::augment_args(clap::Command::new("serve"));
        let m = cmd.clone().try_get_matches_from(["serve"]).unwrap();
        let opts = ServeOptions::from_arg_matches(&m).unwrap();
        let text = toml::to_string(&opts).unwrap();
        let table: toml::Table = text.parse().unwrap();
        for key in table.keys() {
            assert!(cmd.get_arguments().any(|a| a.get_long() == Some(key.as_str())), "{key} is no flag");
        }
    }
}
