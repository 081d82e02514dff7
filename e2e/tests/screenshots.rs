//! Screenshots through the agent API (issue 19): real gRPC over loopback to a real worker on
//! the tiny Qwen3.5-VL fixture (`device-worker/tests/fixtures/qwen35vl/`, text GGUF + F32
//! projector) with real corpus screenshots (`llamatouch_evaluator/trace_18`, 1080×2400), and
//! gateways with each `--screenshots` policy. Figures come from the steps' `StepStats` (the
//! worker's `PrefillStats`); the expected image-token count from the worker's own sizing
//! (`smart_size`, the engine's function).

mod common;

use agent_gateway::screenshot::{ScreenshotMode, ScreenshotPolicy, DEFAULT_SPARSE_BELOW};
use agent_gateway::step::StepRunner;
use agent_gateway::worker::Router;
use device_worker::model::vision::preprocess::smart_size;
use device_worker::model::vision::ImageBudget;
use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tonic::transport::Channel;

/// The worker's `--image-max-tokens` here: small, so a step encodes quickly.
const IMAGE_MAX_TOKENS: usize = 64;

fn vl_file(name: &str) -> std::path::PathBuf {
    test_support::fixture(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-worker/tests/fixtures/qwen35vl").join(name),
        "run tools/fixtures/make_qwen35vl_fixture.py (tools/fixtures/README.md)",
    )
}

/// Worker options: the tiny VL text model, with its projector and the test's image budget
/// when `vision` (image options without a projector are refused at start-up).
fn worker_options(vision: bool) -> device_worker::config::EngineOptions {
    let text_only = common::engine_options(vl_file("tiny-qwen35vl-f32.gguf"));
    device_worker::config::EngineOptions {
        mmproj: vision.then(|| vl_file("mmproj-tiny-qwen35vl-f32.gguf")),
        image_max_tokens: if vision { IMAGE_MAX_TOKENS } else { text_only.image_max_tokens },
        micro_batch: 128,
        ..text_only
    }
}

/// Image tokens of a trace_18 screenshot (1080×2400) as the engine sizes it.
fn screenshot_tokens() -> u32 {
    let budget = ImageBudget::new(device_worker::model::vision::preprocess::DEFAULT_MIN_TOKENS, IMAGE_MAX_TOKENS).unwrap();
    let (w, h) = smart_size(1080, 2400, 32, budget);
    ((w / 32) * (h / 32)) as u32
}

fn trace_18(file: &str) -> Vec<u8> {
    let p = common::corpus().join("llamatouch_evaluator/trace_18").join(file);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn xml(i: usize) -> String {
    String::from_utf8(trace_18(&format!("{i}.xml"))).unwrap()
}

/// A screen whose tree says next to nothing (a game: its frame and one Pause button).
const SPARSE_XML: &str = r#"<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation="0"><node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="com.example.game" content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[0,0][1080,2400]"><node index="0" text="Pause" resource-id="com.example.game:id/pause" class="android.widget.Button" package="com.example.game" content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false" password="false" selected="false" bounds="[900,100][1040,200]" /></node></hierarchy>"#;

/// Serves a gateway over `worker` with `mode` (default sparse threshold).
async fn gateway(worker: &str, mode: ScreenshotMode) -> (AgentServiceClient<Channel>, tokio::sync::oneshot::Sender<()>) {
    let runner = StepRunner::new(Router::new(&[worker.to_string()]).unwrap())
        .with_screenshots(ScreenshotPolicy { mode, sparse_below: DEFAULT_SPARSE_BELOW });
    let (addr, stop) = common::serve_runner(runner).await;
    (AgentServiceClient::connect(addr).await.unwrap(), stop)
}

/// One unary `Step` of `episode` with the uiautomator `xml` (empty: no tree) and
/// `screenshot`: its result, or the status the call ended with.
async fn step(client: &mut AgentServiceClient<Channel>, episode: &str, xml: &str, screenshot: Vec<u8>) -> Result<apb::StepResult, tonic::Status> {
    let mut events = client
        .step(apb::StepRequest {
            episode_id: episode.into(),
            task: "Open the settings and turn on Wi-Fi".into(),
            observation: Some(apb::Observation {
                screen: (!xml.is_empty()).then(|| apb::observation::Screen::UiautomatorXml(xml.into())),
                screenshot_png: screenshot,
                foreground_app: String::new(),
            }),
            max_tokens: 12,
        })
        .await?
        .into_inner();
    while let Some(ev) = events.message().await? {
        if let Some(apb::step_event::Event::Result(r)) = ev.event {
            return Ok(r);
        }
    }
    panic!("the step's stream ended without a result")
}

fn stats(r: &apb::StepResult) -> apb::StepStats {
    r.stats.clone().expect("step stats")
}

/// `always`: step 1 sends the screenshot (image tokens as the engine sizes it, encoded once);
/// step 2 has another screen's text and the same screenshot: the text diverges before the
/// image, and the screenshot's embeddings come from the worker's image cache. The gateway's
/// metrics count both. Bad bytes are INVALID_ARGUMENT naming the observation (the gateway's
/// signature check, and the worker's decoder for a truncated PNG), and the next step is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_sends_the_screenshot_after_the_text_and_reuses_its_encoding() {
    let metrics = agent_gateway::metrics::install().unwrap();
    let (_engine, worker, _w) = common::serve_worker(worker_options(true)).await;
    let (mut client, _g) = gateway(&worker, ScreenshotMode::Always).await;
    let shot = trace_18("0.png");

    let r1 = step(&mut client, "shots-always", &xml(0), shot.clone()).await.unwrap();
    let s1 = stats(&r1);
    assert!(s1.screenshot_sent, "{r1:?}");
    assert_eq!(s1.image_tokens, screenshot_tokens(), "{r1:?}");
    assert_eq!((s1.images_encoded, s1.image_cache_hits), (1, 0), "{r1:?}");
    assert!(s1.encoder_ms > 0.0 && s1.encoder_ms <= s1.prefill_ms, "{r1:?}");

    let r2 = step(&mut client, "shots-always", &xml(1), shot.clone()).await.unwrap();
    let s2 = stats(&r2);
    assert!(s2.screenshot_sent);
    assert_eq!(s2.image_tokens, screenshot_tokens());
    assert_eq!((s2.images_encoded, s2.image_cache_hits), (0, 1), "step 2 finds the screenshot in the image cache: {r2:?}");
    assert!(s2.reused_tokens > 0, "the shared text before the image is reused: {r2:?}");

    let text = agent_gateway::metrics::render(&metrics);
    assert!(common::sample(&text, "agent_images_total{outcome=\"cache_hit\"}").unwrap() >= 1.0, "{text}");
    assert!(common::sample(&text, "agent_image_tokens_total").unwrap() >= f64::from(2 * screenshot_tokens()), "{text}");
    assert!(common::sample(&text, "agent_screenshots_total{outcome=\"sent\"}").unwrap() >= 2.0, "{text}");
    assert!(common::sample(&text, "agent_step_duration_seconds_count{kind=\"step\",has_image=\"true\"}").unwrap() >= 2.0, "{text}");
    assert!(common::sample(&text, "agent_encoder_duration_seconds_count").unwrap() >= 1.0, "{text}");

    // Bytes that are no image: refused by the gateway, naming the observation.
    let e = step(&mut client, "shots-bad", &xml(0), b"GIF89a not a screenshot".to_vec()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("observation.screenshot_png: not a PNG or JPEG"), "{}", e.message());
    // A truncated PNG passes the signature check; the worker's decoder refuses it, and the
    // error still names the observation.
    let e = step(&mut client, "shots-bad", &xml(0), shot[..shot.len() / 10].to_vec()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("observation.screenshot_png: "), "{}", e.message());
    assert!(!e.message().contains("messages["), "the worker's request layout stays inside: {}", e.message());
    // The next step is served.
    let r = step(&mut client, "shots-bad", &xml(0), shot).await.unwrap();
    assert!(stats(&r).screenshot_sent && stats(&r).image_tokens > 0, "{r:?}");
}

/// `never` sends no image; `auto` sends none for a dense tree (trace_18's first screen) and
/// the screenshot for a sparse one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_and_auto_attach_as_their_rules_say() {
    let (_engine, worker, _w) = common::serve_worker(worker_options(true)).await;
    let shot = trace_18("0.png");

    let (mut never, _g1) = gateway(&worker, ScreenshotMode::Never).await;
    let r = step(&mut never, "shots-never", SPARSE_XML, shot.clone()).await.unwrap();
    assert!(!stats(&r).screenshot_sent && stats(&r).image_tokens == 0, "{r:?}");

    let (mut auto, _g2) = gateway(&worker, ScreenshotMode::Auto).await;
    let dense = agent_gateway::observation::parse_uiautomator(&xml(0)).unwrap();
    assert!(dense.controls.len() >= DEFAULT_SPARSE_BELOW, "trace_18/0.xml lists {} controls", dense.controls.len());
    let r = step(&mut auto, "shots-auto-dense", &xml(0), shot.clone()).await.unwrap();
    assert!(!stats(&r).screenshot_sent && stats(&r).image_tokens == 0, "{r:?}");
    let r = step(&mut auto, "shots-auto-sparse", SPARSE_XML, shot.clone()).await.unwrap();
    assert!(stats(&r).screenshot_sent, "{r:?}");
    assert_eq!(stats(&r).image_tokens, screenshot_tokens(), "{r:?}");

    // A screenshot without a tree: the step stands on the screenshot (no control listed);
    // under `never` it has nothing and is refused as before.
    let r = step(&mut auto, "shots-auto-pixels-only", "", shot.clone()).await.unwrap();
    assert!(stats(&r).screenshot_sent && stats(&r).image_tokens == screenshot_tokens(), "{r:?}");
    assert_eq!(stats(&r).controls, 0);
    let e = step(&mut never, "shots-never-pixels-only", "", shot).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("no visible control"), "{}", e.message());
    assert!(e.message().contains("--screenshots never") && e.message().contains("--screenshots auto or always"), "{}", e.message());
}

/// `always` with a worker without a vision projector: a step with a screenshot fails with
/// FAILED_PRECONDITION (unary) or a StepResult error (episode stream, which stays open); a step
/// without one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_with_a_text_only_worker_fails_screenshot_steps_clearly() {
    let (_engine, worker, _w) = common::serve_worker(worker_options(false)).await;
    let (mut client, _g) = gateway(&worker, ScreenshotMode::Always).await;
    let e = step(&mut client, "shots-text-only", &xml(0), trace_18("0.png")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("--mmproj") && e.message().contains(&worker), "{}", e.message());
    let r = step(&mut client, "shots-text-only", &xml(0), vec![]).await.unwrap();
    assert!(!stats(&r).screenshot_sent && r.stats.is_some(), "{r:?}");

    // `auto` over this worker: a screenshot without a tree has nothing the model can read.
    let (mut auto, _g2) = gateway(&worker, ScreenshotMode::Auto).await;
    let e = step(&mut auto, "shots-text-only-pixels", "", trace_18("0.png")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("no vision projector"), "{}", e.message());

    // `serve`'s start-up check refuses this worker under `always` only.
    let router = Router::new(std::slice::from_ref(&worker)).unwrap();
    let always = ScreenshotPolicy { mode: ScreenshotMode::Always, sparse_below: DEFAULT_SPARSE_BELOW };
    let e = agent_gateway::screenshot::check_workers(&router, &always).await.unwrap_err().to_string();
    assert!(e.contains("no vision projector") && e.contains(&worker), "{e}");
    assert!(agent_gateway::screenshot::check_workers(&router, &ScreenshotPolicy::default()).await.is_ok());
    let (_e, vl_worker, _w2) = common::serve_worker(worker_options(true)).await;
    let vl = Router::new(&[vl_worker]).unwrap();
    assert!(agent_gateway::screenshot::check_workers(&vl, &always).await.is_ok());
}

/// `agent-gateway replay --screenshots always` of trace_18 through a gateway with
/// `--screenshots always` and the VL worker: every step sends its screenshot and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_trace_18_with_screenshots_completes() {
    let (_engine, worker, _w) = common::serve_worker(worker_options(true)).await;
    let runner = StepRunner::new(Router::new(&[worker]).unwrap())
        .with_screenshots(ScreenshotPolicy { mode: ScreenshotMode::Always, sparse_below: DEFAULT_SPARSE_BELOW });
    let (gateway, _g) = common::serve_runner(runner).await;
    let out = tempfile::tempdir().unwrap();
    let cfg = agent_gateway::replay::ReplayConfig {
        episodes: vec!["llamatouch/trace_18".into()],
        max_tokens: 12,
        screenshots: ScreenshotMode::Always,
        ..common::replay_config(&gateway, 0, out.path().join("replay.jsonl"))
    };
    let (records, summary) = agent_gateway::replay::run(&cfg).await.expect("replay");
    assert_eq!(summary.steps, 5, "trace_18 has five screens");
    for r in &records {
        assert!(r.screenshot_sent, "{r:?}");
        assert_eq!(r.image_tokens, screenshot_tokens(), "{r:?}");
        assert_eq!(r.images_encoded + r.image_cache_hits, 1, "{r:?}");
        assert!(r.decode_tokens > 0, "{r:?}");
    }
    let jsonl = std::fs::read_to_string(out.path().join("replay.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 5);
    assert!(jsonl.contains("\"screenshot_sent\":true"));

    // The dry run counts the image tokens the engine counted, step for step (same admission
    // code), and its first step's prompt is the engine's (later ones differ: the dry run's
    // history is the recorded actions, the replay's the model's).
    let args = model_tools::dry_run::DryRunArgs {
        model: Some(vl_file("tiny-qwen35vl-f32.gguf")),
        mmproj: Some(vl_file("mmproj-tiny-qwen35vl-f32.gguf")),
        image_max_tokens: IMAGE_MAX_TOKENS,
        screenshots: ScreenshotMode::Always,
        format: model_tools::dry_run::PromptFormat::SystemUser,
        ..Default::default()
    };
    let plans = model_tools::dry_run::plan_steps(&common::corpus(), &["llamatouch/trace_18".into()], &args).expect("dry run");
    assert_eq!(plans.len(), 5);
    for (p, r) in plans.iter().zip(&records) {
        assert_eq!(p.image_tokens as u32, r.image_tokens, "step {}", p.step);
    }
    assert_eq!(plans[0].prompt_tokens as u32, records[0].prompt_tokens);
}
