//! Errors of loading tokens and of the bind policy.

use std::path::PathBuf;

/// What went wrong setting authentication up.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no token, or a token that is too short to be a secret.
    #[error("token file {path}: {detail}")]
    BadTokens { path: PathBuf, detail: String },
    /// A non-loopback listen address without a token file and without `--insecure`.
    #[error(
        "refusing to listen on {addr} without authentication: anyone who can reach it could drive the agent; \
         pass --auth-token-file PATH (one token per line), listen on 127.0.0.1, or pass --insecure"
    )]
    InsecureBind { addr: String },
}

/// What went wrong loading TLS certificates and keys (`--tls-*`, `--worker-tls-*`). Every
/// message is one line naming the flag's file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file could not be read (the I/O error is in the message, not
    /// a `source`, so that `Error: ...` stays one line).
    #[error("cannot read {flag} {path}: {error}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file holds no PEM item of the expected kind (or is not PEM at all, e.g. DER).
    #[error("{flag} {path}: {detail}")]
    NotPem {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    /// The private key is not the key of the certificate (or rustls refuses the pair).
    #[error("{key_flag} {key} does not match {cert_flag} {cert}: {detail}")]
    KeyMismatch {
        cert_flag: &'static str,
        cert: PathBuf,
        key_flag: &'static str,
        key: PathBuf,
        detail: String,
    },
    /// A CA file whose certificates rustls cannot use as trust anchors.
    #[error("{flag} {path}: {detail}")]
    BadCa {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    /// Flags that only work together, given alone (`--tls-cert` without `--tls-key`, ...).
    #[error("{0}")]
    Incomplete(String),
}

/// What went wrong opening a listener (`--listen`).
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Binding failed (address in use, no permission, a path too long for a socket); the
    /// I/O error is in the message.
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    /// Another process serves on the Unix socket path, or the path is not a socket.
    #[error("cannot listen on {addr}: {detail}")]
    InUse { addr: String, detail: String },
}

/// How [`crate::grpc::serve_reflected`] failed; the message names the stage.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    /// A descriptor set for reflection does not decode.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The server could not start or failed (tonic's transport error).
    #[error("gRPC server: {0}")]
    Server(#[from] tonic::transport::Error),
}
