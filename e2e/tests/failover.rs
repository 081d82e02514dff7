//! A gateway configured with a dead worker and a live one: steps of episodes that hash to the
//! dead worker are retried on the live one (and later episodes route around the dead one), so
//! every step gets an answer instead of a worker error; and the gateway's gRPC health
//! follows whether a worker answers.

mod common;

use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;

const EPISODE: &str = "androidworld/ContactsAddContact_base_o4-mini_trial1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_for_a_dead_worker_are_served_by_the_live_one() {
    let (_engine, live, _s1) = common::serve_worker(common::engine_options(common::model_path())).await;
    // A port nothing listens on (bound then released).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let router = agent_gateway::worker::Router::new(&[dead.clone(), live.clone()]).unwrap();
    let on_dead: Vec<String> = (0..40).map(|i| format!("failover-{i}")).filter(|e| router.route(e).addr == dead).take(2).collect();
    assert_eq!(on_dead.len(), 2, "some episodes hash to the dead worker");
    let (gateway, _s2) = common::serve_gateway(router).await;

    let episode = agent_gateway::corpus::load_episode(&common::corpus(), EPISODE).expect("corpus episode");
    let mut client = AgentServiceClient::connect(gateway).await.expect("connect");
    for id in &on_dead {
        let mut stream = common::first_step(&mut client, id, &episode).await;
        let mut result = None;
        while let Some(ev) = stream.message().await.expect("stream") {
            if let Some(apb::step_event::Event::Result(r)) = ev.event {
                result = Some(r);
            }
        }
        let r = result.expect("a step result");
        let stats = r.stats.expect("stats");
        assert_eq!(stats.worker, live, "{id}: served by the live worker");
        assert!(stats.decode_tokens > 0, "{id}: the model ran (error: {:?})", r.error);
        assert!(!r.error.contains("unavailable") && !r.error.contains("connect"), "{id}: {}", r.error);
    }
}

/// The gateway's gRPC health of `service` ("" = the whole server), or the error's text.
async fn gateway_health(gateway: &str, service: &str) -> Result<i32, String> {
    let ch = tonic::transport::Endpoint::from_shared(gateway.to_string()).unwrap().connect().await.map_err(|e| e.to_string())?;
    let r = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: service.to_string() })
        .await
        .map_err(|s| s.to_string())?;
    Ok(r.into_inner().status)
}

/// Waits up to 20 s for the gateway's health of "" and of AgentService to be `want`.
async fn wait_health(gateway: &str, want: tonic_health::pb::health_check_response::ServingStatus) {
    let t0 = std::time::Instant::now();
    let mut seen = vec![];
    while t0.elapsed() < std::time::Duration::from_secs(20) {
        seen = vec![gateway_health(gateway, "").await, gateway_health(gateway, "tandem.agent.v1.AgentService").await];
        if seen.iter().all(|s| s.as_ref() == Ok(&(want as i32))) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("gateway health is not {want:?} after 20 s: {seen:?}");
}

/// The gateway's gRPC health follows its workers, as `GET /health` does: SERVING while its
/// worker answers, NOT_SERVING once the worker is gone (not SERVING with nothing to serve
/// steps), SERVING again when a worker answers on that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_health_follows_its_worker() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let engine = common::ready_engine(common::engine_options(common::model_path())).await;
    let serve_on = |l: tokio::net::TcpListener| {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(device_worker::service::serve(engine.clone(), l, async {
            let _ = stopped.await;
        }));
        (stop, task)
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, task) = serve_on(l);
    let router = agent_gateway::worker::Router::new(&[format!("http://{addr}")]).unwrap();
    let (gateway, _s2) = common::serve_gateway(router).await;
    wait_health(&gateway, ServingStatus::Serving).await;

    let _ = stop.send(());
    // The listener is closed once the server's accept loop ends (its connections may linger).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
    wait_health(&gateway, ServingStatus::NotServing).await;

    let (_stop, _task) = serve_on(tokio::net::TcpListener::bind(addr).await.unwrap());
    wait_health(&gateway, ServingStatus::Serving).await;
}

/// Addresses that answer but are no device-worker, with a real worker's ports beside: the
/// gateway's start-up check refuses each as `--worker`, naming what it seems to be (the
/// worker's Prometheus port, the gateway's HTTP port, the gateway's gRPC port) while the real
/// worker and an address where nothing listens (yet) pass; `GET /health` says in words why
/// such a worker is down (was `" (Unimplemented)"`); `agent-gateway health` at the metrics
/// port says it is a metrics endpoint (it said "the gateway's --http-listen port"); `replay
/// --gateway` at the worker says it is a device-worker (it said a bare `Unimplemented: `).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_that_are_no_worker_are_named_as_such() {
    let mut servers = common::start(common::model_path()).await;
    let metrics = format!("http://{}", common::start_worker_metrics(&mut servers).await);
    let http = format!("http://{}", common::start_http(&mut servers).await);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let check = |addr: &str| {
        let router = agent_gateway::worker::Router::new(&[servers.worker.clone(), addr.to_string()]).unwrap();
        async move { router.check_workers_answer().await.map_err(|e| e.to_string()) }
    };
    check(&dead).await.expect("a worker that does not answer (yet) is no configuration error");
    for (addr, what) in [
        (&metrics, "it answers plain HTTP/1.1, not gRPC: it looks like a Prometheus metrics endpoint (GET /metrics), such as a worker's --metrics-listen"),
        (&http, "it answers plain HTTP/1.1, not gRPC: it looks like the gateway's --http-listen port"),
        (&servers.gateway, "it is an agent-gateway's gRPC port (its --listen)"),
    ] {
        let err = check(addr).await.expect_err(addr);
        assert!(err.contains(&format!("--worker {addr} is not a device-worker: {what}; pass a worker's gRPC address")), "{err}");
    }

    // GET /health of a gateway routed to the worker and to the gateway's own gRPC port.
    let router = agent_gateway::worker::Router::new(&[servers.worker.clone(), servers.gateway.clone()]).unwrap();
    let (health_http, _stop) = common::serve_http_over(router).await;
    let (status, body) = common::http_get(&health_http, "/health").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, &json["status"]), (200, &"degraded".into()), "{body}");
    assert_eq!(json["workers"][1]["error"], "not a device-worker: it is an agent-gateway's gRPC port (its --listen)", "{body}");

    let args = agent_gateway::health::HealthArgs { addr: metrics.clone(), service: String::new(), wait: 0, tls: Default::default() };
    let err = agent_gateway::health::run(&args).await.expect_err("metrics is no gRPC server").to_string();
    assert!(
        err.contains("(this address answers plain HTTP/1.1, not gRPC: it looks like a Prometheus metrics endpoint (GET /metrics), such as a worker's --metrics-listen; gRPC health is on a gateway's --listen port"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = common::replay_config(&servers.worker, 1, dir.path().join("replay.jsonl"));
    let err = agent_gateway::replay::run(&cfg).await.expect_err("a worker serves no AgentService").to_string();
    assert!(err.contains("Unimplemented") && err.contains("(this is a device-worker; replay talks to the agent-gateway's gRPC port, its --listen, default 127.0.0.1:50052)"), "{err}");
}
