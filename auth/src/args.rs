//! The servers' authentication, TLS and reflection flags, and the bind policy.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::AuthError;
use crate::grpc::GrpcSecurity;
use crate::layer::AuthLayer;
use crate::tls::{ServerTls, TlsArgs};
use crate::tokens::Authenticator;

/// `--auth-token-file`, `--health-requires-auth`, `--insecure`, the TLS flags ([`TlsArgs`])
/// `--reflection` and `--grpc-max-concurrent-streams` (flattened into both programs' `serve`).
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct AuthArgs {
    /// Bearer tokens this server accepts, one per line (`#` comments; at least 16 characters
    /// each, e.g. `openssl rand -hex 32 > tokens`); reloaded on SIGHUP. Without it the server
    /// listens on loopback only and warns that any local app can use it.
    #[arg(long, env = "TANDEM_AUTH_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token_file: Option<PathBuf>,
    /// Also require the token for the gRPC health service (open by default, for probes).
    #[arg(long)]
    pub health_requires_auth: bool,
    /// Allow listening on a non-loopback address without a token file (anyone who can reach
    /// the port can drive the agent).
    #[arg(long)]
    pub insecure: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsArgs,
    /// Serve gRPC reflection (what `grpcurl list` and `describe` use). Off by default: it
    /// lists every method and message to anyone who connects.
    #[arg(long)]
    pub reflection: bool,
    /// Most concurrent gRPC calls (HTTP/2 streams) one client connection may have open; a
    /// client past it waits for one of its calls to end.
    #[arg(long, default_value_t = crate::grpc::DEFAULT_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,
}

impl Default for AuthArgs {
    fn default() -> Self {
        Self {
            auth_token_file: None,
            health_requires_auth: false,
            insecure: false,
            tls: TlsArgs::default(),
            reflection: false,
            grpc_max_concurrent_streams: crate::grpc::DEFAULT_MAX_CONCURRENT_STREAMS,
        }
    }
}

impl AuthArgs {
    /// The authenticator for a server listening on `listen` (every address the server binds),
    /// after the bind policy: with a token file, its tokens; without one, `None` (auth off),
    /// on loopback addresses (logged as a warning) or with `--insecure` (a warning too). Callers
    /// leave Unix sockets out of `listen`, so an empty `listen` means every listener is a Unix
    /// socket, which [`crate::Listener::bind`] makes 0600 (only this user can connect): that is
    /// logged at INFO, not as a warning.
    ///
    /// Errors: [`AuthError::InsecureBind`] for a non-loopback address without a token file
    /// and without `--insecure`; as [`Authenticator::from_file`].
    pub fn authenticator(&self, listen: &[SocketAddr]) -> Result<Option<Authenticator>, AuthError> {
        if let Some(path) = &self.auth_token_file {
            return Authenticator::from_file(path).map(Some);
        }
        if let Some(open) = listen.iter().find(|a| !a.ip().is_loopback()) {
            if !self.insecure {
                return Err(AuthError::InsecureBind {
                    addr: open.to_string(),
                });
            }
            tracing::warn!(addr = %open, "no --auth-token-file and --insecure: anyone who can reach this address can drive the agent");
        } else if listen.is_empty() {
            tracing::info!("no --auth-token-file: access is limited by the Unix socket's file mode (0600: only this user can connect)");
        } else {
            tracing::warn!("no --auth-token-file: any process on this device can use this server (fine for local development; pass a token file on a phone)");
        }
        Ok(None)
    }

    /// A gRPC server's protections from these flags: `auth` (from [`Self::authenticator`])
    /// with `--health-requires-auth`, `tls` (from [`TlsArgs::load`]), `--reflection`,
    /// `--grpc-max-concurrent-streams`, the message budget.
    pub fn grpc_security(
        &self,
        auth: Option<Authenticator>,
        tls: Option<ServerTls>,
    ) -> GrpcSecurity {
        GrpcSecurity {
            auth: AuthLayer::grpc(auth, self.health_requires_auth),
            tls,
            reflection: self.reflection,
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            max_message_bytes: tandem_proto::MAX_MESSAGE_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_token_is_loopback_only_unless_insecure() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let args = AuthArgs::default();
        assert!(args.authenticator(&[lo]).unwrap().is_none());
        let err = args.authenticator(&[lo, any]).unwrap_err();
        assert!(matches!(err, AuthError::InsecureBind { .. }), "{err}");
        assert!(err.to_string().contains("0.0.0.0:1"));
        let insecure = AuthArgs {
            insecure: true,
            ..Default::default()
        };
        assert!(insecure.authenticator(&[any]).unwrap().is_none());
        let missing = AuthArgs {
            auth_token_file: Some("/nonexistent/tokens".into()),
            ..Default::default()
        };
        assert!(matches!(
            missing.authenticator(&[lo]),
            Err(AuthError::Read { .. })
        ));
    }
}
