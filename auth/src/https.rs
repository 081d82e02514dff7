//! HTTP/1.1 for the gateway's OpenAI-compatible endpoint: an axum listener whose connections
//! are TLS streams ([`TlsListener`]), and [`serve_http`], plaintext or TLS, with the
//! connection limits of [`HttpLimits`] (header-read timeout, idle timeout, connection cap).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::tls::{ServerTls, HANDSHAKE_TIMEOUT};

/// Connections whose handshake finished, waiting for axum.
const READY_QUEUE: usize = 64;

/// Accepts TCP connections and hands axum those that complete the TLS handshake (each
/// handshake runs in its own task, bounded by [`HANDSHAKE_TIMEOUT`], so a slow or failing
/// client holds up no other). With mutual TLS a client without an accepted certificate never
/// reaches the app.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `tcp` with `tls`'s certificate (and client CA).
    ///
    /// Errors: the listener's local address cannot be read.
    pub fn new(tcp: TcpListener, tls: &ServerTls) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = tls.http_acceptor();
        let (tx, ready) = tokio::sync::mpsc::channel(READY_QUEUE);
        let acceptor = tokio::spawn(async move {
            while !tx.is_closed() {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTPS accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake refused"),
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task ended (it only does when aborted): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

// === HttpLimits ===

/// Limits on the HTTP server's connections (`agent-gateway serve --http-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// A request's head (request line and headers) must arrive within this time of the
    /// server starting to wait for it, or the connection is closed (hyper's
    /// `header_read_timeout`). The wait starts when the connection opens and again when a
    /// kept-alive connection waits for its next request, so it also bounds idle keep-alive.
    pub header_read_timeout: Duration,
    /// A connection on which no byte is read or written for this long is closed (a client
    /// that stops sending its body or reading the response); time a handler spends before
    /// its response head (a step's wait for the worker's first event) does not count.
    pub idle_timeout: Duration,
    /// Most connections served at once; each one over it gets one `503` with
    /// `Retry-After` and OpenAI error JSON, then is closed.
    pub max_connections: usize,
}

impl HttpLimits {
    /// Default [`Self::header_read_timeout`]: 10 s (a client on a phone's loopback sends its
    /// head in microseconds; a slow network in well under a second).
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default [`Self::idle_timeout`]: 120 s (longer than any pause between two tokens of a
    /// streamed answer).
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
    /// Default [`Self::max_connections`]: 128 (a phone serves a few agents; each worker runs
    /// a few slots).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
    /// `Retry-After` of the over-the-cap `503`, seconds.
    pub const BUSY_RETRY_AFTER_S: u32 = 1;
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves (open connections finish first):
/// HTTP/1.1 over TLS with `tls`, plaintext without, each connection under `limits`.
///
/// Errors: the server failing (I/O).
pub async fn serve_http(
    listener: TcpListener,
    tls: Option<&ServerTls>,
    app: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => serve_connections(listener, app, limits, shutdown).await,
        Some(tls) => serve_connections(TlsListener::new(listener, tls)?, app, limits, shutdown).await,
    }
}

/// The accept loop: every connection gets its own task running hyper's HTTP/1.1 with the
/// header-read timeout, over an [`IdleIo`]; past `max_connections` a connection is served
/// [`busy_app`] once. On `shutdown` it stops accepting and waits for the open connections
/// (hyper's graceful shutdown: requests in progress finish, idle connections close).
async fn serve_connections<L>(
    mut listener: L,
    app: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let busy = busy_app(limits.max_connections);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, _peer) = tokio::select! {
            c = listener.accept() => c,
            _ = &mut shutdown => break,
        };
        let permit = permits.clone().try_acquire_owned().ok();
        let over_cap = permit.is_none();
        if over_cap {
            tracing::warn!(max_connections = limits.max_connections, "HTTP connection over the cap refused with 503");
        }
        let svc = if over_cap { busy.clone() } else { app.clone() };
        // Requests whose handler is still working (no response head yet): the idle clock
        // does not run for them.
        let handling = Arc::new(AtomicUsize::new(0));
        let (start, done) = (handling.clone(), handling.clone());
        let svc = svc
            .map_request(move |r: http::Request<hyper::body::Incoming>| {
                start.fetch_add(1, Ordering::SeqCst);
                r.map(axum::body::Body::new)
            })
            .map_response(move |r| {
                done.fetch_sub(1, Ordering::SeqCst);
                r
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(!over_cap);
        let conn = builder.serve_connection(
            TokioIo::new(IdleIo::new(io, limits.idle_timeout, handling)),
            hyper_util::service::TowerToHyperService::new(svc),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// What a connection over the cap is served: `503` with `Retry-After` and OpenAI error JSON
/// (code `too_many_connections`) for any request.
fn busy_app(max_connections: usize) -> axum::Router {
    let body = serde_json::json!({"error": {
        "message": format!("the server is serving its maximum of {max_connections} connections; retry later"),
        "type": "server_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    axum::Router::new().fallback(move || {
        let body = body.clone();
        async move {
            let mut resp = http::Response::new(axum::body::Body::from(body));
            *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            let h = resp.headers_mut();
            h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
            h.insert(http::header::RETRY_AFTER, http::HeaderValue::from(HttpLimits::BUSY_RETRY_AFTER_S));
            h.insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            resp
        }
    })
}

// === IdleIo ===

/// A connection that fails with `TimedOut` once no byte has been read or written for
/// `timeout` while the server waits on it and no request waits for its handler (each read or
/// write that makes progress, and each moment a handler is working, restarts the clock).
struct IdleIo<I> {
    io: I,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Requests of this connection whose handler has not produced a response head yet.
    handling: Arc<AtomicUsize>,
}

impl<I> IdleIo<I> {
    fn new(io: I, timeout: Duration, handling: Arc<AtomicUsize>) -> Self {
        Self { io, timeout, deadline: Box::pin(tokio::time::sleep(timeout)), handling }
    }

    fn progressed(&mut self) {
        let next = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// The result of polling `io`: a ready one restarts the idle clock, a pending one is
    /// [`IdleIo::idle`].
    fn observe<T>(&mut self, cx: &mut Context<'_>, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.progressed();
                Poll::Ready(r)
            }
            Poll::Pending => self.idle(cx),
        }
    }

    /// `Pending`, or the time-out error once the deadline has passed. While a handler works
    /// the clock restarts instead (once it answers, hyper writes, and the clock runs again).
    fn idle<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        if self.handling.load(Ordering::SeqCst) > 0 {
            self.progressed();
            return Poll::Pending;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("HTTP connection idle for {} ms", self.timeout.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for IdleIo<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        this.observe(cx, polled)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for IdleIo<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.observe(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.observe(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
