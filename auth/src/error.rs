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
