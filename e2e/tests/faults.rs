//! Faults under load, with real processes on loopback (issue 20, "Load, soak and faults"):
//!
//! - a worker killed mid-stream: the step in flight ends within seconds (served again by the
//!   healthy second worker, the gateway having routed around the dead one; with no healthy
//!   worker left, a step result naming `Unavailable`), and the episode's next step goes to the
//!   healthy worker;
//! - a worker restarted on the same address: the episode's next step is served, cold (no
//!   prompt token reused);
//! - a gateway restarted on the same address: the controller's open episode stream ends with
//!   a status at once (tonic's client reports the broken connection as `Unknown` "h2 protocol
//!   error"), a new episode stream is refused with `UNAVAILABLE` while the gateway is down,
//!   and the same client reconnects after the restart and its next step is served;
//! - a gateway restarted under `agent-gateway replay`: the step whose connection broke is
//!   retried on a new episode stream once the gateway is back, and the replay goes on;
//! - a watchdog trip under concurrent requests: the tripped request ends with UNAVAILABLE
//!   naming the watchdog, every other request is served, and so are the later ones; through the
//!   gateway every concurrent step gets its action (the tripped one retried on the fresh
//!   engine).
//!
//! Processes to kill are this test binary run again ([`fault_child`]) as a worker or a
//! gateway, serving on an address the test chose (so a restart can take the same one). A
//! worker process can be told to hang after some batches (`fault_hang_after_batches`, test
//! only): killing it then is killing it mid-stream, deterministically.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use device_worker::config::EngineOptions;
use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tandem_proto::step::v1 as spb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Set in the environment of the processes [`fault_child`] runs as: `worker ADDR [HANG]` or
/// `gateway ADDR WORKER_URL`.
const CHILD_ENV: &str = "TANDEM_E2E_FAULT_CHILD";

/// The corpus episode the steps come from (its screens; the model's answers do not matter).
const EPISODE: &str = "androidworld/ContactsAddContact_base_o4-mini_trial1";

/// How long a step may take to end after its worker or gateway died.
const PROMPT_END: Duration = Duration::from_secs(10);

/// Worker options of every worker here: the default model, 2 compute threads, small
/// context, prefill in one micro-batch.
fn worker_options(hang_after_batches: Option<u64>) -> EngineOptions {
    EngineOptions {
        model: Some(common::model_path()),
        threads: Some(2),
        ctx_size: 2048,
        slots: 2,
        micro_batch: 2048,
        fault_hang_after_batches: hang_after_batches,
        ..Default::default()
    }
}

/// Not a test of its own: a worker or gateway process of the tests below (this test binary run
/// again with [`CHILD_ENV`] set). Serves on the given address, prints `READY`, and serves
/// until killed.
#[test]
#[ignore = "a worker or gateway process of the fault tests (started by them)"]
fn fault_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let words: Vec<&str> = spec.split_whitespace().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(words[1]).await.expect("bind the given address");
        let stop = std::future::pending::<()>();
        match words[0] {
            "worker" => {
                let hang = words.get(2).map(|h| h.parse().unwrap());
                let engine = device_worker::engine::EngineHandle::spawn(worker_options(hang).settings().unwrap()).unwrap();
                engine.state().wait_for(|s| !matches!(s, device_worker::engine::EngineState::Loading)).await.unwrap();
                assert!(engine.admission().is_ok(), "the model failed to load");
                // libtest has printed "test fault_child ... " without a newline.
                println!("\nREADY");
                device_worker::service::serve(engine, listener, stop).await.unwrap();
            }
            "gateway" => {
                let router = agent_gateway::worker::Router::new(&[words[2].to_string()]).unwrap();
                let runner = std::sync::Arc::new(agent_gateway::step::StepRunner::new(router));
                println!("\nREADY");
                agent_gateway::service::serve(runner, listener, stop).await.unwrap();
            }
            other => panic!("unknown child kind {other}"),
        }
    });
}

/// A worker or gateway process; killed (SIGKILL) on drop or by [`Child::kill`].
struct Child {
    process: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    url: String,
}

impl Child {
    /// Starts `kind` (`worker [HANG]` or `gateway WORKER_URL`, see [`CHILD_ENV`]) on `addr`
    /// (`127.0.0.1:PORT`) and waits until it serves.
    fn start(kind: &str, addr: &str, rest: &str) -> Self {
        let mut process = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["fault_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{kind} {addr} {rest}"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the child process");
        let mut lines = BufReader::new(process.stdout.take().unwrap()).lines();
        assert!(
            lines.by_ref().map_while(Result::ok).any(|l| l.trim() == "READY"),
            "the {kind} process did not start"
        );
        // Keep reading, so the child never writes to a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { process, url: format!("http://{addr}") }
    }

    /// SIGKILL, and wait for the process to be gone (its sockets closed).
    fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback address (bound, then released for a child to take).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn episode() -> agent_gateway::corpus::Episode {
    agent_gateway::corpus::load_episode(&common::corpus(), EPISODE).expect("corpus episode")
}

/// A controller's open `RunEpisode` stream.
struct Controller {
    tx: mpsc::Sender<apb::EpisodeInput>,
    events: tonic::Streaming<apb::StepEvent>,
}

impl Controller {
    /// Opens episode `id` (output budget `max_tokens`) on `client`.
    async fn open(client: &mut AgentServiceClient<tonic::transport::Channel>, id: &str, max_tokens: u32) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        let start = apb::EpisodeStart { episode_id: id.into(), task: episode().task, max_tokens };
        tx.send(apb::EpisodeInput { input: Some(apb::episode_input::Input::Start(start)) }).await.unwrap();
        let events = client.run_episode(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { tx, events })
    }

    /// Sends screen `i` of the corpus episode.
    async fn send(&self, i: usize) {
        let obs = episode().steps[i].to_observation();
        self.tx.send(apb::EpisodeInput { input: Some(apb::episode_input::Input::Observation(obs)) }).await.unwrap();
    }

    /// The next event: a token's index, or the step result.
    async fn next(&mut self) -> Result<Option<apb::step_event::Event>, tonic::Status> {
        Ok(self.events.message().await?.and_then(|e| e.event))
    }

    /// Reads to the step's result (skipping tokens).
    async fn result(&mut self) -> Result<apb::StepResult, tonic::Status> {
        loop {
            match self.next().await? {
                Some(apb::step_event::Event::Result(r)) => return Ok(r),
                Some(_) => {}
                None => return Err(tonic::Status::unknown("stream ended without a result")),
            }
        }
    }

    /// Screen `i`, then its result.
    async fn step(&mut self, i: usize) -> apb::StepResult {
        self.send(i).await;
        tokio::time::timeout(Duration::from_secs(120), self.result()).await.expect("a result within 120 s").expect("a result")
    }
}

/// A step the worker answered: model output came back (valid action or not) and no worker
/// failure is reported.
fn assert_served(r: &apb::StepResult, what: &str) {
    let stats = r.stats.clone().unwrap_or_default();
    assert!(stats.decode_tokens > 0 && !r.raw_output.is_empty(), "{what}: the model ran: {r:?}");
    assert!(!r.error.contains("worker"), "{what}: {}", r.error);
}

/// Reads events of the step in flight until the first action token, then kills `worker`;
/// returns the step's result and the time from the kill to it.
async fn kill_after_first_token(c: &mut Controller, worker: &mut Child) -> (Result<apb::StepResult, tonic::Status>, Duration) {
    loop {
        match tokio::time::timeout(Duration::from_secs(120), c.next()).await.expect("a token within 120 s") {
            Ok(Some(apb::step_event::Event::Token(_))) => break,
            Ok(Some(apb::step_event::Event::Result(r))) => panic!("the step ended before the worker hung: {r:?}"),
            other => panic!("unexpected before the first token: {other:?}"),
        }
    }
    // Give the worker time to hang (its third batch), then kill it mid-stream.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.kill();
    let killed = Instant::now();
    // Bounded by a whole step on the other worker (a cold prefill, slow on a loaded machine).
    let r = tokio::time::timeout(Duration::from_secs(120), c.result()).await.expect("the step ends after the kill");
    (r, killed.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_stream_fails_over_to_the_healthy_worker() {
    // Worker A streams its first tokens then hangs (prefill = batch 0, decode batches 1 and 2,
    // batch 3 hangs; the watchdog's 60 s never fires here); B is healthy.
    let mut a = Child::start("worker", &free_addr(), "3");
    let b = Child::start("worker", &free_addr(), "");
    let router = agent_gateway::worker::Router::new(&[a.url.clone(), b.url.clone()]).unwrap();
    let id = (0..64).map(|i| format!("kill-{i}")).find(|e| router.route(e).addr == a.url).expect("an episode routed to A");
    let (gateway, _stop) = common::serve_gateway(router).await;
    let mut client = AgentServiceClient::connect(gateway).await.unwrap();
    let mut c = Controller::open(&mut client, &id, 64).await.unwrap();
    c.send(0).await;
    let (r, waited) = kill_after_first_token(&mut c, &mut a).await;
    let r = r.expect("a step result, the episode stream stays open");
    let stats = r.stats.clone().unwrap_or_default();
    eprintln!("after the kill ({waited:?}, B's own time {:.0} ms): worker {:?} error {:?}", stats.server_ms, stats.worker, r.error);
    assert_eq!(stats.worker, b.url, "the step in flight was served again by B: {r:?}");
    // Kill → result is B's whole step (a cold prefill) plus the failover, which must be prompt.
    let failover = waited.saturating_sub(Duration::from_secs_f64(stats.server_ms / 1e3));
    assert!(failover < PROMPT_END, "the failover took {failover:?} (kill to result {waited:?})");
    assert_served(&r, "the interrupted step");
    // The episode's next step goes to B.
    let r = c.step(1).await;
    assert_eq!(r.stats.as_ref().unwrap().worker, b.url);
    assert_served(&r, "the next step");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_stream_with_no_other_ends_the_step_as_unavailable() {
    let mut a = Child::start("worker", &free_addr(), "3");
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&a.url)).unwrap();
    let (gateway, _stop) = common::serve_gateway(router).await;
    let mut client = AgentServiceClient::connect(gateway).await.unwrap();
    let mut c = Controller::open(&mut client, "kill-alone", 64).await.unwrap();
    c.send(0).await;
    let (r, waited) = kill_after_first_token(&mut c, &mut a).await;
    let r = r.expect("a step result, the episode stream stays open");
    eprintln!("after the kill ({waited:?}): error {:?}", r.error);
    assert!(waited < PROMPT_END, "the step ended {waited:?} after the kill");
    assert!(r.error.contains("Unavailable"), "a retryable status: {:?}", r.error);
    assert!(r.action_json.is_empty());
}

/// A worker killed in the middle of an OpenAI chat request: the client is told to retry, as
/// the README promises ("an unreachable or failing worker is a 503 or 502 saying whether to
/// retry"), like for a worker killed before the request. Before any byte of the answer: 503
/// with `Retry-After: 5` (was a 502 without); in a stream (killed after its first content
/// chunk): an error event saying "retry in 5 s". The worker hangs in its third batch (its
/// second decode step) until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_chat_request_says_to_retry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut a = Child::start("worker", &free_addr(), "3");
    let (http, _stop) = common::serve_http_over(agent_gateway::worker::Router::new(std::slice::from_ref(&a.url)).unwrap()).await;
    let chat = |stream: bool| format!(r#"{{"messages":[{{"role":"user","content":"Count from one to fifty."}}],"max_tokens":64,"stream":{stream}}}"#);

    // Streaming: read to the first content chunk, then kill the worker.
    let body = chat(true);
    let mut s = tokio::net::TcpStream::connect(&http).await.unwrap();
    s.write_all(common::post_head(&http, "/v1/chat/completions", "", &body).as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(r#""delta":{"content":""#) {
        let n = tokio::time::timeout(Duration::from_secs(120), s.read(&mut buf)).await.expect("a content chunk within 120 s").unwrap();
        assert!(n > 0, "the stream ended before a content chunk: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    a.kill();
    tokio::time::timeout(PROMPT_END, s.read_to_end(&mut seen)).await.expect("the stream ends after the kill").unwrap();
    let text = String::from_utf8_lossy(&seen);
    let error = text.lines().find(|l| l.contains(r#""error""#)).unwrap_or_else(|| panic!("no error event: {text}"));
    assert!(error.contains("retry in 5 s") && error.contains(r#""type":"server_error""#), "{error}");
    assert!(!text.contains("[DONE]"), "{text}");

    // Non-streaming: the worker restarted (hanging again in its third batch), killed while
    // the gateway waits for the whole answer (it is hung from well before the kill).
    let mut a = Child::start("worker", a.url.trim_start_matches("http://"), "3");
    let request = tokio::spawn(async move { common::http_post_with_head(&http, "/v1/chat/completions", &chat(false)).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!request.is_finished(), "the request ended before the kill");
    a.kill();
    let (status, head, body) = tokio::time::timeout(PROMPT_END, request).await.expect("an answer after the kill").unwrap();
    eprintln!("{head}\n\n{body}");
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(head.lines().any(|l| l.eq_ignore_ascii_case("retry-after: 5")), "{head}");
    assert!(body.contains("retry in 5 s"), "{body}");
}

/// A worker that stops answering without closing its connection (a frozen or stopped
/// process: `SIGSTOP` here, as Android's app freezer does to a background app) fails the
/// request within a bound, as unavailable with "retry" (503 + Retry-After), instead of
/// holding it for as long as the worker stays frozen (it hung for minutes before the client
/// channels pinged: HTTP/2 keep-alive, `tandem_auth::client::KEEPALIVE_TIMEOUT`). After
/// `SIGCONT` the worker serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_fails_the_request_as_unavailable_within_a_bound() {
    let mut w = Child::start("worker", &free_addr(), "");
    let (http, _stop) = common::serve_http_over(agent_gateway::worker::Router::new(std::slice::from_ref(&w.url)).unwrap()).await;
    let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let (status, _, body) = common::http_post_with_head(&http, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &w.process.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    let t = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(120), common::http_post_with_head(&http, "/v1/chat/completions", chat)).await;
    signal("-CONT");
    let (status, head, body) = answer.expect("an answer within 120 s while the worker is frozen");
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(head.lines().any(|l| l.eq_ignore_ascii_case("retry-after: 5")), "{head}");
    assert!(body.contains("retry in 5 s"), "{body}");
    eprintln!("frozen worker: 503 after {:.1} s", t.elapsed().as_secs_f64());
    // Thawed, it serves again (the gateway's down mark lasts a few seconds).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = common::http_post_with_head(&http, "/v1/chat/completions", chat).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no 200 within 60 s of SIGCONT: {status} {body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    w.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_on_its_address_serves_the_episode_cold() {
    let addr = free_addr();
    let mut w = Child::start("worker", &addr, "");
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&w.url)).unwrap();
    let (gateway, _stop) = common::serve_gateway(router).await;
    let mut client = AgentServiceClient::connect(gateway).await.unwrap();
    let mut c = Controller::open(&mut client, "restart-worker", 24).await.unwrap();
    assert_served(&c.step(0).await, "step 0");
    let warm = c.step(1).await;
    assert_served(&warm, "step 1");
    assert!(warm.stats.as_ref().unwrap().reused_tokens > 0, "the live worker reuses the episode's prefix: {warm:?}");

    w.kill();
    let _w = Child::start("worker", &addr, "");
    let cold = c.step(2).await;
    assert_served(&cold, "step 2 on the restarted worker");
    let s = cold.stats.unwrap();
    assert_eq!(s.reused_tokens, 0, "the restarted worker starts cold");
    assert_eq!(s.new_tokens, s.prompt_tokens);
    assert_eq!(cold.step, 2, "the gateway kept the episode");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_is_reached_again_by_the_same_client() {
    let (_engine, worker, _stop) = common::serve_worker(worker_options(None)).await;
    let addr = free_addr();
    let mut g = Child::start("gateway", &addr, &worker);
    let mut client = AgentServiceClient::connect(g.url.clone()).await.unwrap();
    let mut c = Controller::open(&mut client, "restart-gateway", 24).await.unwrap();
    assert_served(&c.step(0).await, "step 0");

    g.kill();
    let t = Instant::now();
    let end = tokio::time::timeout(PROMPT_END, c.next()).await.expect("the open stream ends, not hangs");
    eprintln!("open episode stream after the gateway died ({:?}): {end:?}", t.elapsed());
    assert!(!matches!(end, Ok(Some(_))), "no event from a dead gateway: {end:?}");
    // While the gateway is down, reopening the episode is refused at once, retryably.
    let t = Instant::now();
    let down = Controller::open(&mut client, "restart-gateway", 24).await.err().expect("no gateway to open an episode on");
    assert_eq!(down.code(), tonic::Code::Unavailable, "{down:?}");
    assert!(t.elapsed() < PROMPT_END, "refused after {:?}", t.elapsed());

    let _g = Child::start("gateway", &addr, &worker);
    // The controller's retry loop: reopen the episode on the same client (its channel
    // reconnects), backing off on UNAVAILABLE.
    let mut attempts = Vec::new();
    let mut c = loop {
        match Controller::open(&mut client, "restart-gateway", 24).await {
            Ok(c) => break c,
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "a retryable status: {s:?}");
                attempts.push(s.code());
                assert!(attempts.len() < 20, "reconnected within 10 s");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    eprintln!("reconnected after {} refused attempt(s)", attempts.len());
    assert_served(&c.step(1).await, "the step after the gateway restart");
}

/// `agent-gateway replay` goes on when its gateway restarts mid-episode: the step whose
/// connection broke is retried (a WARN line says so) on a new `RunEpisode` once the gateway
/// serves again on its address, and every step of the episode gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_goes_on_when_its_gateway_restarts_mid_episode() {
    let logs = common::capture_logs(tracing::Level::WARN);
    let (_engine, worker, _stop) = common::serve_worker(worker_options(None)).await;
    let addr = free_addr();
    let w = worker.clone();
    let a = addr.clone();
    let mut g = tokio::task::spawn_blocking(move || Child::start("gateway", &a, &w)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("replay.jsonl");
    let mut cfg = common::replay_config(&g.url, 4, out.clone());
    cfg.episodes = vec![EPISODE.into()];
    cfg.max_tokens = 24;
    let replay = tokio::spawn(async move { agent_gateway::replay::run(&cfg).await });
    // Step 0's record written: the replay is on step 1 when the gateway dies.
    let t = Instant::now();
    while std::fs::read_to_string(&out).map_or(0, |s| s.lines().count()) < 1 {
        assert!(t.elapsed() < Duration::from_secs(120), "no step within 120 s");
        if replay.is_finished() {
            panic!("the replay ended before its first step: {:?}", replay.await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.kill();
    let _g = tokio::task::spawn_blocking(move || Child::start("gateway", &addr, &worker)).await.unwrap();
    let (records, summary) = tokio::time::timeout(Duration::from_secs(300), replay).await.expect("the replay ends").unwrap().expect("the replay goes on after the restart");
    assert_eq!(records.iter().map(|r| r.step).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(summary.steps, 4);
    for r in &records {
        assert!(r.decode_tokens > 0 && !r.raw_output.is_empty() && !r.error.contains("worker"), "step {}: {r:?}", r.step);
    }
    let logs = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    eprintln!("{logs}");
    assert!(logs.lines().any(|l| l.contains("WARN") && l.contains("RunEpisode at http://") && l.contains("retry 1 of 3")), "{logs}");
}

/// A short chat for the watchdog test's direct requests.
fn chat(session: &str) -> spb::GenerateRequest {
    spb::GenerateRequest {
        session_id: session.into(),
        prompt: Some(spb::generate_request::Prompt::Chat(spb::ChatPrompt {
            messages: vec![spb::ChatMessage { role: "user".into(), content: "Open the camera app.".into(), parts: vec![] }],
        })),
        max_tokens: 8,
        sampling: Some(spb::Sampling { mode: Some(spb::sampling::Mode::Greedy(spb::Greedy {})) }),
        ..Default::default()
    }
}

/// Reads a Generate stream to its end: the decoded token count, or the status it ended with.
async fn generate(mut client: tandem_proto::step::v1::step_service_client::StepServiceClient<tonic::transport::Channel>, req: spb::GenerateRequest) -> Result<u32, tonic::Status> {
    let mut s = client.generate(req).await?.into_inner();
    while let Some(ev) = s.message().await? {
        if let Some(spb::generate_event::Event::Done(d)) = ev.event {
            return Ok(d.decode_tokens);
        }
    }
    Err(tonic::Status::unknown("stream ended without final stats"))
}

/// Watchdog limit: far above a batch here (a short chat's, or a 64-token prefill micro-batch)
/// on a loaded 2-core machine. 4 s was not: a healthy 64-token batch of the debug build took
/// 4012 ms under load average 8 (this binary's other tests plus builds), tripped the watchdog a
/// second time and failed the gateway's retried step. A trip costs the test this long once.
const WATCHDOG_MS: u64 = 15_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_trip_under_concurrent_requests_fails_only_the_tripped_one() {
    // Direct to the worker: 4 concurrent requests, the 6th batch hangs.
    let mut cfg = worker_options(Some(5));
    cfg.watchdog_ms = WATCHDOG_MS;
    cfg.micro_batch = 64;
    let (engine, worker, _s1) = common::serve_worker(cfg.clone()).await;
    let client = tandem_proto::step::v1::step_service_client::StepServiceClient::connect(worker.clone()).await.unwrap();
    let t = Instant::now();
    let runs: Vec<_> = (0..4).map(|i| tokio::spawn(generate(client.clone(), chat(&format!("wd-{i}"))))).collect();
    let mut outcomes = Vec::new();
    for r in runs {
        outcomes.push(tokio::time::timeout(Duration::from_secs(60), r).await.expect("every request ends").unwrap());
    }
    eprintln!("4 concurrent requests in {:?}: {outcomes:?}", t.elapsed());
    let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(failed.len(), 1, "exactly the tripped request fails: {outcomes:?}");
    assert_eq!(failed[0].code(), tonic::Code::Unavailable);
    assert!(failed[0].message().contains("watchdog"), "{}", failed[0].message());
    assert!(outcomes.iter().filter_map(|o| o.as_ref().ok()).all(|&n| n > 0));
    assert_eq!(engine.power().watchdog_restarts, 1);
    let after = generate(client.clone(), chat("wd-after")).await.expect("a later request is served");
    assert!(after > 0);

    // Through the gateway: 3 concurrent episodes on a fresh worker whose 6th batch hangs; every
    // step is served (the tripped one retried once on the restarted engine).
    let (engine, worker, _s2) = common::serve_worker(cfg).await;
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&worker)).unwrap();
    let (gateway, _s3) = common::serve_gateway(router).await;
    let client = AgentServiceClient::connect(gateway).await.unwrap();
    let steps: Vec<_> = (0..3)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut c = Controller::open(&mut client, &format!("wd-episode-{i}"), 8).await.unwrap();
                c.step(0).await
            })
        })
        .collect();
    for s in steps {
        let r = tokio::time::timeout(Duration::from_secs(120), s).await.expect("every step ends").unwrap();
        assert_served(&r, "a concurrent step");
    }
    assert_eq!(engine.power().watchdog_restarts, 1, "the trip happened under the gateway's load");
}
