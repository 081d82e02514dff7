//! TLS with rustls (ring provider) for tandem's servers and the gateway → worker channel.
//!
//! - [`TlsArgs`]: a server's `--tls-cert`, `--tls-key` and `--tls-client-ca` (mutual TLS).
//! - [`ServerTls`]: those PEM files, read and checked at start (PEM, key matches the
//!   certificate, usable CA); [`ServerTls::grpc`] configures tonic, [`ServerTls::http_acceptor`]
//!   the HTTP endpoint ([`crate::https::TlsListener`]).
//! - [`WorkerTlsArgs`] / [`ClientTls`]: the gateway's `--worker-tls-ca` (verify `https://`
//!   workers) and `--worker-tls-cert`/`--worker-tls-key` (its client certificate for workers
//!   that ask for one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::TlsError;

/// How long a client may take for the TLS handshake before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A server's TLS flags (flattened into `serve` through [`crate::AuthArgs`]).
#[derive(Clone, Debug, Default, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TlsArgs {
    /// Serve TLS (rustls) with this certificate chain: PEM, leaf first, its names (DNS or IP
    /// SANs) as clients dial it. Needs --tls-key; clients then use https:// (or
    /// `grpc.ssl_channel_credentials`). Without it the server speaks plaintext.
    #[arg(long, env = "TANDEM_TLS_CERT", requires = "tls_key")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC); it must match the
    /// certificate.
    #[arg(long, env = "TANDEM_TLS_KEY", requires = "tls_cert")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: accept only clients presenting a certificate signed by one of these CA
    /// certificates (PEM); a client without one is refused in the handshake. Needs --tls-cert.
    #[arg(long, env = "TANDEM_TLS_CLIENT_CA", requires = "tls_cert")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The checked TLS setup, or `None` without `--tls-cert`/`--tls-key` (plaintext).
    ///
    /// Errors: [`TlsError::Incomplete`] for a key without a certificate (or the reverse) or a
    /// client CA without a certificate; as [`ServerTls::load`].
    pub fn load(&self) -> Result<Option<ServerTls>, TlsError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                ServerTls::load(cert, key, self.tls_client_ca.as_deref()).map(Some)
            }
            (Some(_), None) => Err(TlsError::Incomplete(
                "--tls-cert needs --tls-key (the certificate's private key, PEM)".into(),
            )),
            (None, Some(_)) => Err(TlsError::Incomplete(
                "--tls-key needs --tls-cert (the certificate chain, PEM)".into(),
            )),
            (None, None) if self.tls_client_ca.is_some() => Err(TlsError::Incomplete(
                "--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key".into(),
            )),
            (None, None) => Ok(None),
        }
    }
}

/// A server's certificate, key and optional client CA, checked. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
    client_ca_pem: Option<Arc<[u8]>>,
    http: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.mutual())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads and checks `cert` (PEM chain), `key` (PEM private key of the leaf) and
    /// `client_ca` (PEM CA certificates; clients must present a certificate they signed).
    ///
    /// Errors: [`TlsError::Read`] (missing file), [`TlsError::NotPem`] (no PEM item of the
    /// kind), [`TlsError::KeyMismatch`] (the key is not the certificate's),
    /// [`TlsError::BadCa`] (a CA rustls cannot use).
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let id = Identity::load(("--tls-cert", cert), ("--tls-key", key))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Incomplete(format!("TLS setup: {e}")))?;
        let (builder, client_ca_pem) = match client_ca {
            Some(path) => {
                let (pem, roots) = roots("--tls-client-ca", path)?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::BadCa {
                    flag: "--tls-client-ca",
                    path: path.into(),
                    detail: e.to_string(),
                })?;
                (builder.with_client_cert_verifier(verifier), Some(pem))
            }
            None => (builder.with_no_client_auth(), None),
        };
        let mut http = builder
            .with_single_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| id.mismatch(e))?;
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            cert_pem: id.cert_pem,
            key_pem: id.key_pem,
            client_ca_pem,
            http: Arc::new(http),
        })
    }

    /// Whether clients must present a certificate (`--tls-client-ca`).
    pub fn mutual(&self) -> bool {
        self.client_ca_pem.is_some()
    }

    /// tonic's server TLS configuration (ALPN h2, [`HANDSHAKE_TIMEOUT`]).
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let id = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        let config = tonic::transport::ServerTlsConfig::new()
            .identity(id)
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(tonic::transport::Certificate::from_pem(ca)),
            None => config,
        }
    }

    /// An acceptor for HTTP/1.1 over TLS (ALPN `http/1.1`).
    pub fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.http.clone())
    }
}

/// The gateway's flags for its channels to `https://` workers.
#[derive(Clone, Debug, Default, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkerTlsArgs {
    /// Verify the certificates of https:// workers against these CA certificates (PEM): the
    /// CA that signed the worker's certificate (deploy/README.md's openssl recipe). A plain
    /// self-signed certificate given as its own CA is refused (rustls: CaUsedAsEndEntity);
    /// one works only with basicConstraints=CA:FALSE. Needed for any https:// --worker.
    #[arg(long, env = "TANDEM_WORKER_TLS_CA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) the gateway presents to https:// workers, for workers that
    /// require mutual TLS (--tls-client-ca). Needs --worker-tls-key.
    #[arg(long, env = "TANDEM_WORKER_TLS_CERT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_cert: Option<PathBuf>,
    /// The private key of --worker-tls-cert (PEM).
    #[arg(long, env = "TANDEM_WORKER_TLS_KEY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_key: Option<PathBuf>,
    /// The name checked in the workers' certificates when it is not the host of the
    /// --worker URL (e.g. `worker.local` for a certificate without IP SANs).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_tls_domain: Option<String>,
}

impl WorkerTlsArgs {
    /// The checked client TLS setup, or `None` without `--worker-tls-ca`.
    ///
    /// Errors: [`TlsError::Incomplete`] for a client certificate without a key (or the
    /// reverse) or without `--worker-tls-ca`; as [`ServerTls::load`] for the files.
    pub fn load(&self) -> Result<Option<ClientTls>, TlsError> {
        ClientTls::load(
            ["--worker-tls-ca", "--worker-tls-cert", "--worker-tls-key"],
            [
                &self.worker_tls_ca,
                &self.worker_tls_cert,
                &self.worker_tls_key,
            ],
            self.worker_tls_domain.clone(),
        )
    }
}

/// The TLS flags of the gateway's client commands (`replay`, `health`) for an `https://`
/// server.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// Verify an https:// server's certificate against these CA certificates (PEM); needed
    /// for any https:// address.
    #[arg(long, env = "TANDEM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a server that requires mutual TLS; needs --tls-key.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The name checked in the server's certificate when it is not the address's host.
    #[arg(long)]
    pub tls_domain: Option<String>,
}

impl ClientTlsArgs {
    /// As [`WorkerTlsArgs::load`], for `--tls-ca`, `--tls-cert`, `--tls-key`.
    ///
    /// Errors: as [`WorkerTlsArgs::load`].
    pub fn load(&self) -> Result<Option<ClientTls>, TlsError> {
        ClientTls::load(
            ["--tls-ca", "--tls-cert", "--tls-key"],
            [&self.tls_ca, &self.tls_cert, &self.tls_key],
            self.tls_domain.clone(),
        )
    }
}

/// A certificate chain and its key, both PEM.
type PemPair = (Arc<[u8]>, Arc<[u8]>);

/// A client's trusted CAs and optional client certificate, checked. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Arc<[u8]>,
    /// The client certificate chain and key (PEM).
    identity: Option<PemPair>,
    domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_cert", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl ClientTls {
    /// The checked setup from the files `[ca, cert, key]` given for the flags named `flags`;
    /// `None` without a CA.
    fn load(
        flags: [&'static str; 3],
        [ca, cert, key]: [&Option<PathBuf>; 3],
        domain: Option<String>,
    ) -> Result<Option<Self>, TlsError> {
        let [ca_flag, cert_flag, key_flag] = flags;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some(Identity::load((cert_flag, c), (key_flag, k))?),
            (None, None) => None,
            _ => {
                return Err(TlsError::Incomplete(format!(
                    "{cert_flag} and {key_flag} go together"
                )))
            }
        };
        let Some(ca) = ca else {
            if identity.is_some() {
                return Err(TlsError::Incomplete(format!(
                    "{cert_flag} needs {ca_flag} (the servers' CA, PEM)"
                )));
            }
            return Ok(None);
        };
        let (ca_pem, _) = roots(ca_flag, ca)?;
        let identity = identity.map(|id| (id.cert_pem, id.key_pem));
        Ok(Some(ClientTls {
            ca_pem,
            identity,
            domain,
        }))
    }

    /// `endpoint` with this TLS setup when `uri` is `https://`, unchanged otherwise.
    ///
    /// Errors: an `https://` `uri` without a setup (`tls` is `None`), naming `ca_flag`; tonic
    /// refusing the configuration.
    pub fn for_endpoint(
        tls: Option<&ClientTls>,
        uri: &str,
        endpoint: tonic::transport::Endpoint,
        ca_flag: &str,
    ) -> Result<tonic::transport::Endpoint, String> {
        if !uri.starts_with("https://") {
            return Ok(endpoint);
        }
        let tls = tls.ok_or_else(|| {
            format!("{uri} is https:// but no {ca_flag} says which certificate to trust")
        })?;
        endpoint
            .tls_config(tls.grpc())
            .map_err(|e| format!("TLS for {uri}: {e}"))
    }

    /// tonic's channel TLS configuration: only the given CAs are trusted; the client
    /// certificate and the domain override when configured.
    pub fn grpc(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some((cert, key)) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        if let Some(d) = &self.domain {
            config = config.domain_name(d.clone());
        }
        config
    }
}

/// The ring provider: the one crypto backend built (no cmake/aws-lc).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(flag: &'static str, path: &Path) -> Result<Arc<[u8]>, TlsError> {
    std::fs::read(path)
        .map(Into::into)
        .map_err(|error| TlsError::Read {
            flag,
            path: path.into(),
            error,
        })
}

/// The PEM certificates of `pem` (at least one).
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let not_pem = |detail: String| TlsError::NotPem {
        flag,
        path: path.into(),
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(not_pem(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".into(),
        ));
    }
    Ok(certs)
}

/// The PEM CA certificates at `path` as trust anchors.
fn roots(flag: &'static str, path: &Path) -> Result<(Arc<[u8]>, rustls::RootCertStore), TlsError> {
    let pem = read(flag, path)?;
    let mut store = rustls::RootCertStore::empty();
    for cert in certificates(flag, path, &pem)? {
        store.add(cert).map_err(|e| TlsError::BadCa {
            flag,
            path: path.into(),
            detail: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok((pem, store))
}

/// A certificate chain and the private key of its leaf, checked to match.
struct Identity {
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    flags: [(&'static str, PathBuf); 2],
}

impl Identity {
    fn load(
        (cert_flag, cert): (&'static str, &Path),
        (key_flag, key): (&'static str, &Path),
    ) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = (read(cert_flag, cert)?, read(key_flag, key)?);
        let chain = certificates(cert_flag, cert, &cert_pem)?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::NotPem {
            flag: key_flag,
            path: key.into(),
            detail: match e {
                rustls_pki_types::pem::Error::NoItemsFound => {
                    "no PEM private key (-----BEGIN PRIVATE KEY-----, RSA or EC) in the file".into()
                }
                e => format!("not a PEM private key: {e}"),
            },
        })?;
        let id = Self {
            cert_pem,
            key_pem,
            chain,
            key: key_der,
            flags: [(cert_flag, cert.into()), (key_flag, key.into())],
        };
        rustls::sign::CertifiedKey::from_der(id.chain.clone(), id.key.clone_key(), &provider())
            .map_err(|e| id.mismatch(e))?;
        Ok(id)
    }

    fn mismatch(&self, e: rustls::Error) -> TlsError {
        let [(cert_flag, cert), (key_flag, key)] = self.flags.clone();
        TlsError::KeyMismatch {
            cert_flag,
            cert,
            key_flag,
            key,
            detail: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    fn args(cert: Option<&Path>, key: Option<&Path>, ca: Option<&Path>) -> TlsArgs {
        TlsArgs {
            tls_cert: cert.map(Into::into),
            tls_key: key.map(Into::into),
            tls_client_ca: ca.map(Into::into),
        }
    }

    #[test]
    fn good_files_load_and_bad_ones_get_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "a");
        let (_, other_key) = self_signed(dir.path(), "b");
        assert!(args(None, None, None).load().unwrap().is_none());
        let tls = args(Some(&cert), Some(&key), None).load().unwrap().unwrap();
        assert!(!tls.mutual());
        assert!(args(Some(&cert), Some(&key), Some(&cert))
            .load()
            .unwrap()
            .unwrap()
            .mutual());

        let err = |a: TlsArgs| {
            let e = a.load().unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
            e
        };
        let missing = dir.path().join("missing.pem");
        let e = err(args(Some(&missing), Some(&key), None));
        assert!(
            e.starts_with("cannot read --tls-cert") && e.contains("missing.pem"),
            "{e}"
        );
        let der = dir.path().join("cert.der");
        std::fs::write(&der, b"\x30\x82\x01\x00 not pem").unwrap();
        let e = err(args(Some(&der), Some(&key), None));
        assert!(
            e.contains("--tls-cert") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = err(args(Some(&cert), Some(&cert), None));
        assert!(
            e.contains("--tls-key") && e.contains("no PEM private key"),
            "{e}"
        );
        let e = err(args(Some(&cert), Some(&other_key), None));
        assert!(e.contains("does not match --tls-cert"), "{e}");
        let e = err(args(Some(&cert), Some(&key), Some(&der)));
        assert!(e.contains("--tls-client-ca"), "{e}");
        assert!(err(args(Some(&cert), None, None)).contains("needs --tls-key"));
        assert!(err(args(None, Some(&key), None)).contains("needs --tls-cert"));
        assert!(err(args(None, None, Some(&cert))).contains("needs --tls-cert"));
    }

    #[test]
    fn worker_tls_needs_a_ca_and_a_matching_client_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "a");
        let (_, other_key) = self_signed(dir.path(), "b");
        let w = |ca: Option<&Path>, c: Option<&Path>, k: Option<&Path>| WorkerTlsArgs {
            worker_tls_ca: ca.map(Into::into),
            worker_tls_cert: c.map(Into::into),
            worker_tls_key: k.map(Into::into),
            worker_tls_domain: None,
        };
        assert!(w(None, None, None).load().unwrap().is_none());
        assert!(w(Some(&cert), None, None).load().unwrap().is_some());
        assert!(w(Some(&cert), Some(&cert), Some(&key))
            .load()
            .unwrap()
            .is_some());
        let e = w(Some(&cert), Some(&cert), Some(&other_key))
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--worker-tls-key") && e.contains("does not match"),
            "{e}"
        );
        assert!(w(None, Some(&cert), Some(&key))
            .load()
            .unwrap_err()
            .to_string()
            .contains("needs --worker-tls-ca"));
        assert!(w(Some(&cert), Some(&cert), None)
            .load()
            .unwrap_err()
            .to_string()
            .contains("go together"));
        let e = w(Some(&key), None, None).load().unwrap_err().to_string();
        assert!(
            e.contains("--worker-tls-ca") && e.contains("no PEM certificate"),
            "{e}"
        );
    }
}
