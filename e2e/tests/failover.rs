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
