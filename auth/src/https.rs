//! HTTP/1.1 over TLS for the gateway's OpenAI-compatible endpoint: an axum listener whose
//! connections are TLS streams ([`TlsListener`]), and [`serve_http`], plaintext or TLS.

use std::net::SocketAddr;

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

/// Serves `app` on `listener` until `shutdown` resolves (open connections finish first):
/// HTTP/1.1 over TLS with `tls`, plaintext without.
///
/// Errors: the server failing (I/O).
pub async fn serve_http(
    listener: TcpListener,
    tls: Option<&ServerTls>,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            axum::serve(TlsListener::new(listener, tls)?, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}
