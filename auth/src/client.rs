//! The client side: a tonic interceptor that sends `authorization: Bearer <token>`, and the
//! one way every tandem client dials a server address ([`channel`]: `unix:PATH`,
//! `HOST:PORT`, `http://`, `https://` with TLS).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use tonic::metadata::MetadataValue;

use crate::error::AuthError;
use crate::tokens::TokenSet;

/// Adds the bearer token to every request of a tonic client (none when built with
/// [`BearerInterceptor::none`]). Used by the gateway's worker client
/// (`--worker-token-file`). Clones share the token, so [`BearerInterceptor::reload`] (on
/// SIGHUP: [`BearerInterceptor::reload_on_sighup`]) changes it for every client at once.
#[derive(Clone, Default)]
pub struct BearerInterceptor {
    value: Arc<RwLock<Option<MetadataValue<tonic::metadata::Ascii>>>>,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for BearerInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.path.is_some() { "BearerInterceptor(token)" } else { "BearerInterceptor(none)" })
    }
}

impl BearerInterceptor {
    /// Sends no token.
    pub fn none() -> Self {
        Self::default()
    }

    /// Sends the first token of the token file `path` (the format of
    /// [`TokenSet::parse`]).
    ///
    /// Errors: as [`TokenSet::load`]; [`AuthError::BadTokens`] for a token that is not a
    /// valid header value.
    pub fn from_file(path: &Path) -> Result<Self, AuthError> {
        Self::from_tokens(path, &TokenSet::load(path)?)
    }

    /// Sends the first token of `set`, already loaded from the token file `path` (reloaded
    /// from it by [`BearerInterceptor::reload`]): for a client that also needs the token
    /// itself (`agent-gateway load`'s HTTP requests).
    ///
    /// Errors: [`AuthError::BadTokens`] for a token that is not a valid header value.
    pub fn from_tokens(path: &Path, set: &TokenSet) -> Result<Self, AuthError> {
        let value = Self::header(path, set)?;
        Ok(Self { value: Arc::new(RwLock::new(Some(value))), path: Some(path.to_path_buf()) })
    }

    fn read(path: &Path) -> Result<MetadataValue<tonic::metadata::Ascii>, AuthError> {
        Self::header(path, &TokenSet::load(path)?)
    }

    /// `Bearer <the first token of set>` as a header value.
    fn header(path: &Path, set: &TokenSet) -> Result<MetadataValue<tonic::metadata::Ascii>, AuthError> {
        let token = set.first().expect("a parsed token set is not empty");
        let text = format!("Bearer {}", String::from_utf8_lossy(token));
        text.parse().map_err(|_| AuthError::BadTokens {
            path: path.to_path_buf(),
            detail: "the token cannot be sent as a header value".into(),
        })
    }

    /// Reads the token file again (the first token is sent from now on). Without a file
    /// ([`BearerInterceptor::none`]) nothing changes.
    ///
    /// Errors: as [`BearerInterceptor::from_file`]; the previous token stays.
    pub fn reload(&self) -> Result<(), AuthError> {
        let Some(path) = &self.path else { return Ok(()) };
        let value = Self::read(path)?;
        *self.value.write().unwrap_or_else(|p| p.into_inner()) = Some(value);
        Ok(())
    }

    /// Spawns a task (on the current Tokio runtime) that reloads the token file on every
    /// SIGHUP and logs the outcome, as the servers' accepted tokens
    /// ([`crate::tokens::Authenticator::reload_on_sighup`]): rotating a token file shared by
    /// the gateway and its workers takes one SIGHUP to each. Does nothing without a file or
    /// where SIGHUP does not exist.
    pub fn reload_on_sighup(&self) {
        let Some(path) = self.path.clone() else { return };
        let me = self.clone();
        crate::tokens::on_sighup("a new worker token needs a restart", move || match me.reload() {
            Ok(()) => tracing::info!(file = %path.display(), "worker token reloaded"),
            Err(e) => tracing::error!("worker token not reloaded (the previous one stays): {e}"),
        });
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &*self.value.read().unwrap_or_else(|p| p.into_inner()) {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// How long a client waits for a connection (TCP and TLS handshakes).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 keep-alive of every client channel: a PING after this long without a frame from the
/// server (also while no call is open) ...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// ... and the connection is closed when its answer has not come within this long, failing
/// the calls on it as unavailable. A server that stops answering (a frozen or stopped
/// process, a peer that accepts but never speaks) is then found within about 20 s, not never.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A lazily connecting channel to `addr` and the address as shown (`http://` added to a bare
/// `HOST:PORT`): `unix:PATH` dials a Unix socket (a server's `--listen unix:PATH`), `https://`
/// needs `tls` (`ca_flag` names the flag that gives it, for the error), anything else is
/// plain HTTP/2. Used by the gateway's workers, `agent-gateway health` and `device-worker
/// request` / `power`.
///
/// Errors: a message naming `addr` for an empty socket path, an invalid URI, or `https://`
/// without `tls`.
pub fn channel(addr: &str, tls: Option<&crate::ClientTls>, ca_flag: &str) -> Result<(String, Channel), String> {
    let invalid = |e: &dyn std::fmt::Display| format!("invalid address {addr:?}: {e}");
    let uri = address_uri(addr).map_err(|e| invalid(&e))?;
    if let Some(path) = addr.strip_prefix("unix:") {
        let path = std::path::PathBuf::from(path);
        // The URI is only the `:authority` sent; the connector dials the socket.
        let ep = keepalive(Endpoint::from_static("http://localhost").connect_timeout(CONNECT_TIMEOUT));
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        });
        return Ok((addr.to_string(), ep.connect_with_connector_lazy(connector)));
    }
    let ep = Endpoint::from_shared(uri.clone()).map_err(|e| invalid(&e))?.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true);
    let ep = crate::ClientTls::for_endpoint(tls, &uri, keepalive(ep), ca_flag)?;
    Ok((uri, ep.connect_lazy()))
}

/// `ep` with [`KEEPALIVE_INTERVAL`] and [`KEEPALIVE_TIMEOUT`], pinging while idle too.
fn keepalive(ep: Endpoint) -> Endpoint {
    ep.http2_keep_alive_interval(KEEPALIVE_INTERVAL).keep_alive_timeout(KEEPALIVE_TIMEOUT).keep_alive_while_idle(true)
}

/// What [`address_uri`] accepts, for its errors.
const EXPECTED: &str = "expected http://HOST:PORT, https://HOST:PORT, HOST:PORT or unix:PATH";

/// The URI [`channel`] dials for `addr` (`http://` added to `HOST:PORT`; `unix:PATH` as is).
///
/// Errors: an empty socket path, a scheme other than `http://` or `https://`, a bare address
/// without a port, a port outside 1-65535, a path or query after the port (a gRPC server is
/// dialled at its root), or no valid URI.
fn address_uri(addr: &str) -> Result<String, String> {
    if let Some(path) = addr.strip_prefix("unix:") {
        return match path.is_empty() {
            true => Err("unix: needs a socket path (a server's --listen unix:PATH)".into()),
            false => Ok(addr.to_string()),
        };
    }
    let uri = match addr.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => addr.to_string(),
        Some((scheme, _)) => return Err(format!("{scheme}:// is not a gRPC scheme ({EXPECTED})")),
        None => format!("http://{addr}"),
    };
    let parsed: tonic::transport::Uri = uri.parse().map_err(|e| format!("{e} ({EXPECTED})"))?;
    // A gRPC server is dialled at its root: the service and method make the request path.
    let path = parsed.path();
    if (!path.is_empty() && path != "/") || parsed.query().is_some() {
        let rest = parsed.path_and_query().map(|p| p.as_str()).unwrap_or_default();
        return Err(format!("{rest:?} after the port: a gRPC address has no path or query, only the scheme, host and port ({EXPECTED})"));
    }
    let authority = parsed.authority().map(|a| a.as_str()).unwrap_or_default();
    // The port is after the last ':' outside an IPv6 literal's brackets.
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match host_port.rsplit_once(':').filter(|(host, _)| !host.starts_with('[') || host.ends_with(']')) {
        Some((_, port)) if !matches!(port.parse::<u16>(), Ok(1..)) => {
            return Err(format!("port {port:?} is not a number from 1 to 65535 ({EXPECTED})"));
        }
        None if !addr.contains("://") => return Err(format!("no port ({EXPECTED})")),
        _ => {}
    }
    Endpoint::from_shared(uri.clone()).map_err(|e| format!("{e} ({EXPECTED})"))?;
    Ok(uri)
}

/// The URI to dial for a TCP server address (`http://` added to a bare `HOST:PORT`) for a
/// client that builds its own endpoint (`agent-gateway replay`); `unix:PATH` comes back as
/// is.
///
/// Errors: as [`address_uri`].
pub fn uri(addr: &str) -> Result<String, String> {
    address_uri(addr)
}

/// Clap value parser for a server address (`agent-gateway serve --worker`, `health --addr`,
/// `replay --gateway`, `device-worker request --addr`): the syntax [`channel`] accepts, so a bad one is a usage error (exit
/// code 2) naming the flag, before anything starts.
///
/// Errors: as [`address_uri`].
pub fn address(addr: &str) -> Result<String, String> {
    address_uri(addr).map(|_| addr.to_string())
}

/// A gRPC status as `Code: message` and the causes of its source, each once: the source's
/// chain ([`tandem_options::error_chain`]) when it holds the message (a connection refused is
/// `Unavailable: transport error: tcp connect error: Connection refused (os error 111)`, not a
/// bare "tcp connect error"), else the message and each cause it does not already say.
pub fn status_text(s: &tonic::Status) -> String {
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

/// Whether a failed call's `s` may come from a server that is no gRPC server, so that
/// [`http1_server`] is worth asking: a status tonic made here (a failed connection or HTTP/2
/// handshake, e.g. with an HTTP/1.1-only server; it carries the transport error as its
/// source), or one tonic mapped from an HTTP answer without `grpc-status` (an HTTP/2-capable
/// server such as a worker's metrics port answers the call's path with a 404, which tonic
/// reports as UNIMPLEMENTED "grpc-status header missing, mapped from HTTP status code 404").
pub fn maybe_not_grpc(s: &tonic::Status) -> bool {
    std::error::Error::source(s).is_some()
        || s.message().starts_with("grpc-status header missing")
        || s.message().contains("missing grpc-status trailer")
}

/// What a server that answers plain HTTP/1.1 (no gRPC) at a client's address seems to be
/// ([`http1_server`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http1Server {
    /// `GET /health` answers the gateway's JSON (a `workers` list): an agent-gateway's
    /// `--http-listen` port (its OpenAI endpoint).
    GatewayHttp,
    /// `GET /metrics` answers Prometheus text: a metrics endpoint, such as a worker's
    /// `--metrics-listen`.
    Metrics,
    /// Another HTTP/1.1 server.
    Other,
}

impl Http1Server {
    /// What it seems to be, for a message after "answers plain HTTP/1.1, not gRPC": ": it
    /// looks like the gateway's --http-listen port", ": it looks like a Prometheus metrics
    /// endpoint (GET /metrics), such as a worker's --metrics-listen", or "" for another server.
    pub fn looks_like(self) -> &'static str {
        match self {
            Http1Server::GatewayHttp => ": it looks like the gateway's --http-listen port",
            Http1Server::Metrics => ": it looks like a Prometheus metrics endpoint (GET /metrics), such as a worker's --metrics-listen",
            Http1Server::Other => "",
        }
    }
}

/// How long [`http1_server`] waits for each answer.
const HTTP1_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What answers at the plain `http://` (or bare `HOST:PORT`) address `addr` when it answers
/// an HTTP/1.1 request with an HTTP/1.1 status line (where a gRPC client only sees "transport
/// error" or "h2 protocol error"): `GET /health`, then `GET /metrics` tell the gateway's
/// OpenAI endpoint from a Prometheus metrics server and other servers. `None` for
/// `https://`, `unix:` and anything that does not answer so within a second.
pub async fn http1_server(addr: &str) -> Option<Http1Server> {
    let (_, body) = http1_get(addr, "/health").await?;
    if body.contains("\"workers\"") {
        return Some(Http1Server::GatewayHttp);
    }
    match http1_get(addr, "/metrics").await {
        Some((200, body)) if body.contains("# TYPE ") || body.contains("# HELP ") => Some(Http1Server::Metrics),
        _ => Some(Http1Server::Other),
    }
}

/// What to add to a failed gRPC call's error when `addr` answers plain HTTP/1.1
/// ([`http1_server`]): ` (this address answers plain HTTP/1.1, not gRPC: it looks like the
/// gateway's --http-listen port, {at_gateway_http})` for the gateway's OpenAI endpoint, else
/// ` (this address answers plain HTTP/1.1, not gRPC{what it looks like}; {grpc_is})`; empty
/// otherwise. `at_gateway_http` goes on about the gateway ("whose health is GET /health; ...");
/// `grpc_is` says where the caller's gRPC service is. Used by `agent-gateway health`,
/// `replay`, `load` and `device-worker request`, `power`.
pub async fn not_grpc_hint(addr: &str, at_gateway_http: &str, grpc_is: &str) -> String {
    let answers = "this address answers plain HTTP/1.1, not gRPC";
    match http1_server(addr).await {
        Some(s @ Http1Server::GatewayHttp) => format!(" ({answers}{}, {at_gateway_http})", s.looks_like()),
        Some(s) => format!(" ({answers}{}; {grpc_is})", s.looks_like()),
        None => String::new(),
    }
}

/// `GET path` over HTTP/1.1 at the plain address `addr` (`Connection: close`): the status code
/// and up to 64 KiB of the body, or `None` when nothing answers with an HTTP/1.x status line
/// within [`HTTP1_PROBE_TIMEOUT`] (the body read within another one).
async fn http1_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let uri = uri(addr).ok()?;
    let authority = uri.strip_prefix("http://").map(|r| r.split('/').next().unwrap_or(r))?;
    let answer = async {
        let mut s = tokio::net::TcpStream::connect(authority).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        // "HTTP/1.1 200"
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        head.starts_with(b"HTTP/1.").then_some((s, head))
    };
    let (s, head) = tokio::time::timeout(HTTP1_PROBE_TIMEOUT, answer).await.ok()??;
    let code = std::str::from_utf8(&head[9..]).ok().and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(HTTP1_PROBE_TIMEOUT, s.take(64 * 1024).read_to_end(&mut rest)).await;
    Some((code, String::from_utf8_lossy(&rest).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::{address, BearerInterceptor};
    use tonic::service::Interceptor;

    fn sent(i: &mut BearerInterceptor) -> Option<String> {
        let req = i.call(tonic::Request::new(())).expect("the interceptor passes every call");
        req.metadata().get("authorization").map(|v| v.to_str().expect("ascii").to_string())
    }

    /// A reload (what SIGHUP triggers) makes every clone send the file's new first token; a
    /// file that no longer parses keeps the previous token and says why.
    #[test]
    fn worker_token_reloads_for_every_clone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        std::fs::write(&path, format!("{a}\n")).expect("write");
        let mut first = BearerInterceptor::from_file(&path).expect("token file");
        let mut clone = first.clone();
        assert_eq!(sent(&mut clone), Some(format!("Bearer {a}")));
        std::fs::write(&path, format!("{b}\n{a}\n")).expect("write");
        first.reload().expect("reload");
        assert_eq!(sent(&mut clone), Some(format!("Bearer {b}")));
        assert_eq!(sent(&mut first), Some(format!("Bearer {b}")));
        std::fs::write(&path, "# no token here\n").expect("write");
        assert!(first.reload().is_err(), "an empty token file is refused");
        assert_eq!(sent(&mut clone), Some(format!("Bearer {b}")));
        let mut none = BearerInterceptor::none();
        none.reload().expect("nothing to reload");
        assert_eq!(sent(&mut none), None);
    }

    /// http://, https://, HOST:PORT (IPv6 in brackets) and unix:PATH pass (a lone `/` after
    /// the port too); another scheme, a port outside 1-65535, a bare host without a port and a
    /// path or query after the port are refused, saying why.
    #[test]
    fn addresses_are_http_or_https_with_a_port_in_range() {
        for ok in ["http://127.0.0.1:50051", "HTTPS://worker.example:443", "https://worker.example", "localhost:1", "[::1]:65535", "http://[::1]:50051", "http://127.0.0.1:50051/", "unix:/tmp/w.sock"] {
            assert_eq!(address(ok).as_deref(), Ok(ok));
        }
        for (bad, why) in [
            ("ftp://host:1", "ftp:// is not a gRPC scheme"),
            ("grpc://host:50051", "grpc:// is not a gRPC scheme"),
            ("host:99999", "port \"99999\" is not a number from 1 to 65535"),
            ("http://host:65536", "port \"65536\" is not a number from 1 to 65535"),
            ("host:0", "port \"0\" is not a number from 1 to 65535"),
            ("host:", "port \"\" is not a number from 1 to 65535"),
            ("[::1]:0", "port \"0\""),
            ("host", "no port"),
            ("[::1]", "no port"),
            ("unix:", "needs a socket path"),
            ("http://host:50051/path?q", "\"/path?q\" after the port: a gRPC address has no path or query"),
            ("host:50051/v1", "\"/v1\" after the port"),
            ("https://host:443/?q=1", "\"/?q=1\" after the port"),
        ] {
            let err = address(bad).expect_err(bad);
            assert!(err.contains(why) && (why.contains("socket") || err.contains("expected http://HOST:PORT")), "{bad}: {err}");
        }
    }
}
