//! OpenTelemetry across the gRPC hop: one real step (gateway and worker in this process, the
//! real model) exported to an in-process span exporter shows one trace in which the worker's
//! `request` span is the child of the gateway's `generate` span (W3C `traceparent` in the
//! Generate call's metadata), itself under `step`; `prefill` and `decode` are children of
//! `request`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio_stream::StreamExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const EPISODE: &str = "androidworld/ContactsAddContact_base_o4-mini_trial1";

/// Keeps every exported span in memory.
#[derive(Clone, Debug, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.0.lock().unwrap().extend(batch);
        std::future::ready(Ok(()))
    }
}

impl Collected {
    /// The spans named `name` so far.
    fn named(&self, name: &str) -> Vec<SpanData> {
        self.0.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }
}

fn observation(step: &agent_gateway::corpus::EpisodeStepData) -> apb::Observation {
    let screen = match &step.observation {
        agent_gateway::corpus::ObservationSource::Xml(x) => apb::observation::Screen::UiautomatorXml(x.clone()),
        agent_gateway::corpus::ObservationSource::UiElementsJson(j) => apb::observation::Screen::UiElementsJson(j.clone()),
    };
    apb::Observation { screen: Some(screen), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_spans_are_children_of_the_gateway_step_span() {
    let Some(model) = common::model_path() else { return };
    let spans = Collected::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
    let targets = tracing_subscriber::filter::Targets::new()
        .with_target("agent_gateway", tracing::Level::INFO)
        .with_target("device_worker", tracing::Level::INFO);
    let subscriber = tracing_subscriber::registry()
        .with(device_worker::telemetry::otel::layer(&provider, "tandem-e2e").with_filter(targets));
    // Global: the servers' tasks and the engine thread run on other threads.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");

    let episode = agent_gateway::corpus::load_episode(&common::corpus(), EPISODE).expect("corpus episode");
    let servers = common::start(model).await;
    let mut client = AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
    let mut events = client
        .step(apb::StepRequest {
            episode_id: "trace-step".into(),
            task: episode.task.clone(),
            observation: Some(observation(&episode.steps[0])),
            max_tokens: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut result = None;
    while let Some(ev) = events.next().await {
        if let Some(apb::step_event::Event::Result(r)) = ev.unwrap().event {
            result = Some(r);
        }
    }
    let result = result.expect("the step ends with a result");
    assert!(result.stats.as_ref().is_some_and(|s| s.decode_tokens > 0), "the worker decoded: {result:?}");

    // Spans are exported as they close; the worker's request span closes when its stream is
    // dropped, shortly after the gateway read the final event.
    let mut waited = Duration::ZERO;
    while ["step", "generate", "request", "prefill", "decode"].iter().any(|n| spans.named(n).is_empty()) {
        assert!(waited < Duration::from_secs(10), "spans missing; have {:?}", spans.0.lock().unwrap().iter().map(|s| s.name.clone()).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    let one = |name: &str| {
        let v = spans.named(name);
        assert_eq!(v.len(), 1, "one {name} span in one step: {v:?}");
        v.into_iter().next().unwrap()
    };
    let (step, route, generate, request, prefill, decode) =
        (one("step"), one("route"), one("generate"), one("request"), one("prefill"), one("decode"));
    let trace = step.span_context.trace_id();
    for s in [&route, &generate, &request, &prefill, &decode] {
        assert_eq!(s.span_context.trace_id(), trace, "{} is in the step's trace", s.name);
    }
    assert_eq!(route.parent_span_id, step.span_context.span_id());
    assert_eq!(generate.parent_span_id, step.span_context.span_id());
    // The hop: the worker's request span's parent is the gateway's generate span, remote.
    assert_eq!(request.parent_span_id, generate.span_context.span_id(), "request's parent is generate");
    assert!(request.parent_span_is_remote, "the parent came over gRPC metadata");
    assert_eq!(prefill.parent_span_id, request.span_context.span_id());
    assert_eq!(decode.parent_span_id, request.span_context.span_id());
    // Times nest: prefill ends no later than decode starts; the step encloses the request.
    assert!(prefill.end_time <= decode.start_time);
    assert!(step.start_time <= request.start_time && request.start_time <= decode.end_time);
    let _ = provider.shutdown();
}
