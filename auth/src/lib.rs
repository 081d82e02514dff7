//! Bearer-token authentication for tandem's servers (the worker's StepService, the
//! gateway's AgentService and its OpenAI-compatible HTTP endpoint).
//!
//! On a phone, loopback is shared by every installed app and `adb forward` exposes a port to
//! the controller PC, so a server that anyone on the device can reach should ask for a token:
//!
//! - [`tokens`]: the accepted tokens, read from a file (one per line), swapped atomically on
//!   reload (SIGHUP), checked in constant time ([`tokens::Authenticator`]).
//! - [`layer`]: a tower layer that rejects a request without a valid
//!   `authorization: Bearer <token>` header before any handler runs: gRPC `UNAUTHENTICATED`
//!   or HTTP 401 with an OpenAI error object; the gRPC health service may stay open.
//! - [`client`]: the interceptor with which a client (the gateway → worker channel) sends
//!   its token.
//! - [`args`]: the `--auth-token-file`, `--health-requires-auth`, `--insecure` flags and the
//!   bind policy: without a token a server listens on loopback only (with a warning) unless
//!   `--insecure` is given.
//! - [`tls`]: `--tls-cert`, `--tls-key`, `--tls-client-ca` (mutual TLS) of the servers and
//!   the gateway's `--worker-tls-*`, rustls with the ring provider, files checked at start.
//! - [`listen`]: `--listen` as a TCP address or `unix:PATH` (a 0600 Unix socket).
//! - [`grpc`]: a gRPC server behind the auth layer, TLS and reflection flag, served on a
//!   [`listen::Listener`]; [`https`]: the HTTP endpoint over TLS.

pub mod args;
pub mod client;
pub mod error;
pub mod grpc;
pub mod https;
pub mod layer;
pub mod listen;
pub mod tls;
pub mod tokens;

pub use args::AuthArgs;
pub use client::BearerInterceptor;
pub use error::{AuthError, GrpcServeError, ListenError, TlsError};
pub use grpc::GrpcSecurity;
pub use layer::{AuthLayer, Rejection};
pub use listen::{ListenAddr, Listener};
pub use tls::{ClientTls, ClientTlsArgs, ServerTls, TlsArgs, WorkerTlsArgs};
pub use tokens::{Authenticator, TokenSet};
