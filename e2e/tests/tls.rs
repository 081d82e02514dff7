//! TLS, mutual TLS and Unix sockets across the real path (issue 20 item 2), with the real
//! default model and corpus, and certificates made here with rcgen (a test CA; a server
//! certificate for `localhost` and 127.0.0.1; a client certificate):
//! - a worker over TLS and over mutual TLS (a client without a certificate, or trusting
//!   another CA, is refused), the gateway reaching it over mutual TLS for a replay step;
//! - the gateway's gRPC service over TLS (`health` and a replay step with `--tls-ca`) and its
//!   HTTP endpoint over mutual TLS;
//! - a worker on a Unix socket (mode 0600) serving the gateway, the file removed at exit.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_gateway::replay;
use common::{model_path, replay_config};
use tandem_auth::{GrpcSecurity, Listener, ServerTls, WorkerTlsArgs};
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;
use tokio_stream::StreamExt;

/// PEM files of a test PKI in a temporary folder.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A second, unrelated CA (a client trusting it must refuse the server).
    other_ca: PathBuf,
}

fn ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate for `names` signed by `issuer`: (certificate PEM, key PEM).
fn leaf(issuer: &rcgen::Issuer<'_, rcgen::KeyPair>, names: &[&str]) -> (String, String) {
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    (
        params.signed_by(&key, issuer).unwrap().pem(),
        key.serialize_pem(),
    )
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let root = ca("tandem test CA");
    let (sc, sk) = leaf(&root, &["localhost", "127.0.0.1"]);
    let (cc, ck) = leaf(&root, &["gateway"]);
    Pki {
        ca: write("ca.pem", &root.pem()),
        server_cert: write("server.pem", &sc),
        server_key: write("server.key", &sk),
        client_cert: write("client.pem", &cc),
        client_key: write("client.key", &ck),
        other_ca: write("other-ca.pem", &ca("another CA").pem()),
        _dir: dir,
    }
}

impl Pki {
    fn server(&self, mutual: bool) -> ServerTls {
        ServerTls::load(
            &self.server_cert,
            &self.server_key,
            mutual.then_some(self.ca.as_path()),
        )
        .unwrap()
    }

    /// The gateway's `--worker-tls-*` flags: trust `ca`, present the client certificate if
    /// `with_cert`.
    fn client(&self, ca: &Path, with_cert: bool) -> tandem_auth::ClientTls {
        let args = WorkerTlsArgs {
            worker_tls_ca: Some(ca.into()),
            worker_tls_cert: with_cert.then(|| self.client_cert.clone()),
            worker_tls_key: with_cert.then(|| self.client_key.clone()),
            worker_tls_domain: None,
        };
        args.load().unwrap().unwrap()
    }
}

async fn ready_engine(model: PathBuf) -> device_worker::engine::EngineHandle {
    common::ready_engine(common::engine_options(model)).await
}

/// Replays one corpus step through `gateway` and checks it was answered with tokens.
async fn replay_one_step(gateway: &str) {
    let out = tempfile::tempdir().unwrap();
    let (records, summary) = replay::run(&replay_config(gateway, 1, out.path().join("r.jsonl")))
        .await
        .unwrap();
    assert_eq!(summary.steps, 1);
    assert!(records[0].error.is_empty(), "{:?}", records[0]);
    assert!(records[0].decode_tokens > 0);
}

/// Serves `engine` with `tls` on `listener`; returns the task (ends after `stop`) and its stop.
fn serve_worker(
    engine: &device_worker::engine::EngineHandle,
    listener: Listener,
    tls: Option<ServerTls>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let security = GrpcSecurity {
        tls,
        ..GrpcSecurity::open()
    };
    let task = tokio::spawn(device_worker::service::serve_secured(
        engine.clone(),
        listener,
        async {
            let _ = stopped.await;
        },
        security,
    ));
    (
        tokio::spawn(async move { task.await.unwrap().expect("the worker serves") }),
        stop,
    )
}

async fn loopback() -> (Listener, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (Listener::Tcp(l), port)
}

/// A short Generate over `channel`: the generated text, or the call's error.
async fn generate(channel: tonic::transport::Channel) -> Result<String, tonic::Status> {
    let mut client = StepServiceClient::new(channel);
    let req = pb::GenerateRequest {
        session_id: "tls".into(),
        prompt: Some(pb::generate_request::Prompt::Text("Hello".into())),
        max_tokens: 3,
        ..Default::default()
    };
    let mut stream = client.generate(req).await?.into_inner();
    let mut text = String::new();
    while let Some(ev) = stream.next().await {
        if let Some(pb::generate_event::Event::Token(t)) = ev?.event {
            text.push_str(&t.text);
        }
    }
    Ok(text)
}

/// A channel to `https://host:port` verified with `tls` (connect errors as a status).
async fn tls_channel(
    host: &str,
    port: u16,
    tls: &tandem_auth::ClientTls,
) -> Result<tonic::transport::Channel, String> {
    let ep = tonic::transport::Endpoint::from_shared(format!("https://{host}:{port}")).unwrap();
    let ep = ep.tls_config(tls.grpc()).unwrap();
    ep.connect()
        .await
        .map_err(|e| tandem_options::error_chain(&e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_round_trips_to_a_real_worker_and_through_the_gateway() {
    let pki = pki();
    let engine = ready_engine(model_path()).await;
    let (tls_listener, tls_port) = loopback().await;
    let (_t1, _s1) = serve_worker(&engine, tls_listener, Some(pki.server(false)));
    let (mtls_listener, mtls_port) = loopback().await;
    let (_t2, _s2) = serve_worker(&engine, mtls_listener, Some(pki.server(true)));

    // TLS: a client trusting the test CA generates; by IP SAN and by DNS name.
    for host in ["127.0.0.1", "localhost"] {
        let ch = tls_channel(host, tls_port, &pki.client(&pki.ca, false))
            .await
            .unwrap();
        let text = generate(ch).await.expect("a TLS round trip");
        assert!(!text.is_empty());
    }
    // A client trusting another CA refuses the server; a plaintext client gets no answer.
    let err = tls_channel("127.0.0.1", tls_port, &pki.client(&pki.other_ca, false))
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    let plain =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{tls_port}")).unwrap();
    let plain_result = match plain.connect().await {
        Ok(ch) => generate(ch).await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    assert!(plain_result.is_err(), "plaintext to a TLS server must fail");

    // Mutual TLS: without a client certificate the call fails; with one it passes.
    let refused = match tls_channel("127.0.0.1", mtls_port, &pki.client(&pki.ca, false)).await {
        Ok(ch) => generate(ch).await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    // Refused in the handshake: the client sees the server's CertificateRequired alert or,
    // depending on timing, the closed connection (a transport error either way, never an
    // answer from the service).
    let refused = refused.expect_err("a client without a certificate is refused");
    assert!(refused.contains("transport"), "{refused}");
    let ch = tls_channel("127.0.0.1", mtls_port, &pki.client(&pki.ca, true))
        .await
        .unwrap();
    assert!(!generate(ch).await.expect("an mTLS round trip").is_empty());

    // The gateway dials the worker over mutual TLS (`--worker https://... --worker-tls-*`) and
    // a replay step runs end to end.
    let worker = format!("https://127.0.0.1:{mtls_port}");
    let router = agent_gateway::worker::Router::connect(
        std::slice::from_ref(&worker),
        tandem_auth::BearerInterceptor::none(),
        Some(&pki.client(&pki.ca, true)),
    )
    .unwrap();
    let (gateway, _s3) = common::serve_gateway(router.clone()).await;
    replay_one_step(&gateway).await;
    // Without the CA an https:// worker is a start-up error, not a failing step.
    let Err(e) = agent_gateway::worker::Router::connect(
        &[worker],
        tandem_auth::BearerInterceptor::none(),
        None,
    ) else {
        panic!("an https:// worker needs --worker-tls-ca")
    };
    assert!(e.to_string().contains("--worker-tls-ca"), "{e}");

    gateway_grpc_and_http_over_tls(&pki, router).await;
}

/// The gateway's AgentService over TLS (a health check with the test CA) and its HTTP
/// endpoint over mutual TLS (`GET /v1/models` reaches the worker; no client certificate: no
/// HTTP answer).
async fn gateway_grpc_and_http_over_tls(pki: &Pki, router: agent_gateway::worker::Router) {
    let (listener, port) = loopback().await;
    let runner = Arc::new(agent_gateway::step::StepRunner::new(router.clone()));
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let security = GrpcSecurity {
        tls: Some(pki.server(false)),
        ..GrpcSecurity::open()
    };
    tokio::spawn(agent_gateway::service::serve_secured(
        runner,
        listener,
        async {
            let _ = stopped.await;
        },
        security,
    ));
    // `agent-gateway health --addr https://... --tls-ca` and `replay --tls-ca` reach it.
    let tls = tandem_auth::ClientTlsArgs {
        tls_ca: Some(pki.ca.clone()),
        ..Default::default()
    };
    let gateway = format!("https://localhost:{port}");
    let health = agent_gateway::health::HealthArgs {
        addr: gateway.clone(),
        service: String::new(),
        wait: 10,
        tls: tls.clone(),
    };
    agent_gateway::health::run(&health)
        .await
        .expect("health over TLS");
    let no_ca = agent_gateway::health::HealthArgs {
        tls: Default::default(),
        wait: 0,
        ..health
    };
    let e = agent_gateway::health::run(&no_ca)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no --tls-ca"), "{e}");
    let out = tempfile::tempdir().unwrap();
    let cfg = replay::ReplayConfig {
        tls,
        ..replay_config(&gateway, 1, out.path().join("r.jsonl"))
    };
    let (records, summary) = replay::run(&cfg).await.expect("a replay over TLS");
    assert_eq!(summary.steps, 1);
    assert!(records[0].error.is_empty(), "{:?}", records[0]);

    let hl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = hl.local_addr().unwrap().to_string();
    let (_hstop, hstopped) = tokio::sync::oneshot::channel::<()>();
    let state = agent_gateway::http::HttpState {
        router,
        metrics: None,
    };
    let shutdown = async {
        let _ = hstopped.await;
    };
    let security = agent_gateway::http::HttpSecurity {
        tls: Some(pki.server(true)),
        ..Default::default()
    };
    tokio::spawn(agent_gateway::http::serve_secured(state, hl, shutdown, security));
    let client = (
        std::fs::read(&pki.client_cert).unwrap(),
        std::fs::read(&pki.client_key).unwrap(),
    );
    let ca = std::fs::read(&pki.ca).unwrap();
    let (status, body) = https_get(&http, "/v1/models", &ca, Some(&client))
        .await
        .expect("HTTPS with a client certificate");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list", "{v}");
    let refused = https_get(&http, "/health", &ca, None).await;
    // No HTTP answer: the CertificateRequired alert or, depending on timing, a reset.
    refused.expect_err("no client certificate, no HTTP answer");
    // Plain HTTP to the TLS port gets no HTTP answer either.
    assert!(
        !plain_http_answers(&http).await,
        "plaintext HTTP to the TLS port"
    );
}

/// Whether plaintext `GET /health` to `addr` gets an HTTP answer (within 15 s).
async fn plain_http_answers(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(15), s.read_to_end(&mut raw)).await;
    raw.starts_with(b"HTTP/")
}

/// `GET path` over HTTPS to `addr` trusting `ca` (PEM), with a client certificate and key
/// (PEM) if given, verifying the name `localhost`: (status, body), or why it failed.
async fn https_get(
    addr: &str,
    path: &str,
    ca: &[u8],
    client: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<(u16, String), String> {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            builder
                .with_client_auth_cert(
                    chain,
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(key).unwrap(),
                )
                .unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw).await;
    // A peer closing without close_notify still delivered what it sent.
    if raw.is_empty() {
        return Err(format!("no answer: {read:?}"));
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not HTTP: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status: {head}"))?;
    Ok((status, body.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_a_unix_socket_serves_the_gateway() {
    use std::os::unix::fs::PermissionsExt;
    let engine = ready_engine(model_path()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.sock");
    let listener = Listener::bind(&format!("unix:{}", path.display()).parse().unwrap())
        .await
        .unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let (task, stop) = serve_worker(&engine, listener, None);

    let worker = format!("unix:{}", path.display());
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&worker)).unwrap();
    let (gateway, _s) = common::serve_gateway(router).await;
    replay_one_step(&gateway).await;

    // A clean stop removes the socket file.
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), task)
        .await
        .expect("the worker stops")
        .unwrap();
    assert!(!path.exists(), "the socket file is removed on exit");
}
