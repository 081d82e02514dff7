//! A gateway configured with a dead worker and a live one: steps of episodes that hash to the
//! dead worker are retried on the live one (and later episodes route around the dead one), so
//! every step gets an answer instead of a worker error.

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
