//! OpenTelemetry across the gRPC hop, exported over OTLP: one real step (gateway and worker in
//! this process, the real model) with the spans going through the product's OTLP/gRPC exporter
//! (`tandem_telemetry::otel::otlp_provider`, the path `--otlp-endpoint` sets up) to an
//! in-process OTLP `TraceService` receiver. The received spans form one trace in which the
//! worker's `request` span is the child of the gateway's `generate` span (W3C `traceparent` in
//! the Generate call's metadata, flagged remote in OTLP), itself under `step`; `prefill` and
//! `decode` are children of `request`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::{Span, SpanFlags};
use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio_stream::StreamExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const EPISODE: &str = "androidworld/ContactsAddContact_base_o4-mini_trial1";
const SERVICE: &str = "tandem-e2e";

/// An OTLP/gRPC trace receiver keeping every export request it is sent.
#[derive(Clone, Debug, Default)]
struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    /// Serves the receiver on a free loopback port until `stop` fires; returns
    /// `http://127.0.0.1:PORT`.
    async fn serve(&self, stop: tokio::sync::oneshot::Receiver<()>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let svc = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(l),
                async {
                    let _ = stop.await;
                },
            ),
        );
        endpoint
    }

    /// Every received span, with the `service.name` of the resource it came under.
    fn spans(&self) -> Vec<(Option<String>, Span)> {
        let mut out = Vec::new();
        for req in self.0.lock().unwrap().iter() {
            for rs in &req.resource_spans {
                let service = rs.resource.as_ref().and_then(|r| {
                    r.attributes.iter().find(|kv| kv.key == "service.name").and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        any_value::Value::StringValue(s) => Some(s.clone()),
                        _ => None,
                    })
                });
                for ss in &rs.scope_spans {
                    out.extend(ss.spans.iter().map(|s| (service.clone(), s.clone())));
                }
            }
        }
        out
    }

    /// The received spans named `name`.
    fn named(&self, name: &str) -> Vec<Span> {
        self.spans().into_iter().map(|(_, s)| s).filter(|s| s.name == name).collect()
    }
}

/// Whether the OTLP span says its parent came from another process (OTLP `SpanFlags`).
fn parent_is_remote(s: &Span) -> bool {
    let has = SpanFlags::ContextHasIsRemoteMask as u32;
    let is = SpanFlags::ContextIsRemoteMask as u32;
    s.flags & has != 0 && s.flags & is != 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_spans_are_children_of_the_gateway_step_span_over_otlp() {
    let model = common::model_path();
    let receiver = Receiver::default();
    let (stop_receiver, stopped) = tokio::sync::oneshot::channel();
    let endpoint = receiver.serve(stopped).await;
    let provider = tandem_telemetry::otel::otlp_provider(SERVICE, &endpoint).expect("the product's OTLP exporter");
    let targets = tracing_subscriber::filter::Targets::new()
        .with_target("agent_gateway", tracing::Level::INFO)
        .with_target("device_worker", tracing::Level::INFO);
    let subscriber = tracing_subscriber::registry()
        .with(tandem_telemetry::otel::layer(&provider, SERVICE).with_filter(targets));
    // Global: the servers' tasks and the engine thread run on other threads.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");

    let episode = agent_gateway::corpus::load_episode(&common::corpus(), EPISODE).expect("corpus episode");
    let servers = common::start(model).await;
    let mut client = AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
    let mut events = common::first_step(&mut client, "trace-step", &episode).await;
    let mut result = None;
    while let Some(ev) = events.next().await {
        if let Some(apb::step_event::Event::Result(r)) = ev.unwrap().event {
            result = Some(r);
        }
    }
    let result = result.expect("the step ends with a result");
    assert!(result.stats.as_ref().is_some_and(|s| s.decode_tokens > 0), "the worker decoded: {result:?}");

    // The batch exporter sends on its schedule; flush until every span has arrived (the
    // worker's request span closes when its stream is dropped, shortly after the gateway read
    // the final event). Flushing blocks on the export, so off the runtime's workers.
    let mut waited = Duration::ZERO;
    while ["step", "route", "generate", "request", "prefill", "decode"].iter().any(|n| receiver.named(n).is_empty()) {
        assert!(
            waited < Duration::from_secs(15),
            "spans missing at the OTLP receiver; have {:?}",
            receiver.spans().iter().map(|(_, s)| s.name.clone()).collect::<Vec<_>>()
        );
        let p = provider.clone();
        tokio::task::spawn_blocking(move || p.force_flush()).await.unwrap().expect("flush over OTLP");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.shutdown()).await.unwrap().expect("OTLP exporter shutdown");

    let services: Vec<_> = receiver.spans().into_iter().map(|(svc, _)| svc).collect();
    assert!(services.iter().all(|s| s.as_deref() == Some(SERVICE)), "spans arrive under service.name {SERVICE}: {services:?}");
    let one = |name: &str| {
        let v = receiver.named(name);
        assert_eq!(v.len(), 1, "one {name} span in one step: {v:?}");
        v.into_iter().next().unwrap()
    };
    let (step, route, generate, request, prefill, decode) =
        (one("step"), one("route"), one("generate"), one("request"), one("prefill"), one("decode"));
    assert_eq!(step.trace_id.len(), 16, "a 16-byte trace id: {step:?}");
    assert!(step.trace_id.iter().any(|&b| b != 0), "a valid trace id");
    assert!(step.parent_span_id.is_empty(), "step is the root: {step:?}");
    for s in [&route, &generate, &request, &prefill, &decode] {
        assert_eq!(s.trace_id, step.trace_id, "{} is in the step's trace", s.name);
        assert_eq!(s.span_id.len(), 8, "{} has an 8-byte span id", s.name);
    }
    assert_eq!(route.parent_span_id, step.span_id, "route's parent is step");
    assert_eq!(generate.parent_span_id, step.span_id, "generate's parent is step");
    // The hop: the worker's request span's parent is the gateway's generate span, remote.
    assert_eq!(request.parent_span_id, generate.span_id, "request's parent is generate");
    assert!(parent_is_remote(&request), "the parent came over gRPC metadata: flags {:#x}", request.flags);
    assert!(!parent_is_remote(&generate), "generate's parent is local: flags {:#x}", generate.flags);
    assert_eq!(prefill.parent_span_id, request.span_id, "prefill's parent is request");
    assert_eq!(decode.parent_span_id, request.span_id, "decode's parent is request");
    // Times nest: prefill ends no later than decode starts; the step encloses the request.
    assert!(prefill.end_time_unix_nano <= decode.start_time_unix_nano);
    assert!(step.start_time_unix_nano <= request.start_time_unix_nano && request.start_time_unix_nano <= decode.end_time_unix_nano);
    let _ = stop_receiver.send(());
}
