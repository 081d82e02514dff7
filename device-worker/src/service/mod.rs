//! The worker's servers: the gRPC `StepService` (handlers only admit — validate, tokenize —,
//! enqueue and stream), gRPC health and reflection, and the Prometheus `GET /metrics`
//! endpoint ([`metrics`]).

pub mod metrics;

use std::pin::Pin;

use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_server::{StepService, StepServiceServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::engine::{EngineEvent, EngineHandle, EngineState};
use crate::error::WorkerError;
use crate::telemetry::request::{record_refusal, RequestObserver};

/// Events buffered per stream before the engine waits for the client.
const STREAM_BUFFER: usize = 64;

pub struct StepServiceImpl {
    engine: EngineHandle,
}

impl StepServiceImpl {
    pub fn new(engine: EngineHandle) -> Self {
        Self { engine }
    }

    /// Admits `request` (ids, template, tokenization, limits, schema) and enqueues it; returns
    /// its event stream and its `request` span.
    ///
    /// Errors: what admission refuses ([`crate::engine::Admission::admit`]), the session id's
    /// rule ([`tandem_proto::limits::check_id`]), loading, a full queue.
    async fn admit(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<(mpsc::Receiver<EngineEvent>, tracing::Span), WorkerError> {
        let admission = self.engine.admission()?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        // The request's span: a child of the caller's (W3C traceparent in the metadata).
        let span = tracing::info_span!("request", session = tracing::field::Empty);
        tandem_telemetry::otel::set_remote_parent(&span, request.metadata());
        let req = request.into_inner();
        // Bounded before it is logged or bound to a slot (a refusal names a prefix only).
        tandem_proto::limits::check_id("session_id", &req.session_id)?;
        span.record("session", req.session_id.as_str());
        // Tokenizing and compiling a schema take milliseconds: keep them off the async workers.
        let engine_req = tokio::task::spawn_blocking(move || admission.admit(req, tx))
            .await
            .map_err(|e| WorkerError::Internal(format!("admission task failed: {e}")))??;
        self.engine.submit(engine_req)?;
        Ok((rx, span))
    }

    /// The tonic service, decoding requests up to `max_message_bytes` (the path's budget,
    /// [`tandem_proto::MAX_MESSAGE_BYTES`], in [`tandem_auth::GrpcSecurity`]); a larger one
    /// gets OUT_OF_RANGE ("decoded message length too large") from tonic before a handler
    /// runs.
    pub fn into_server(self, max_message_bytes: usize) -> StepServiceServer<Self> {
        StepServiceServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, Status>> + Send>>;

#[tonic::async_trait]
impl StepService for StepServiceImpl {
    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // A refusal is counted (outcome "refused", reason its gRPC code) and logged once.
        let (rx, span) = self.admit(request).await.map_err(|e| {
            record_refusal(e.grpc_class().as_str(), &e);
            Status::from(e)
        })?;
        // Metrics and spans of the request from here to its last event (or its cancellation).
        let mut observer = RequestObserver::new(span);
        let stream = ReceiverStream::new(rx).map(move |ev| match ev {
            EngineEvent::Prefill(p) => {
                observer.on_prefill(&p);
                Ok(pb::GenerateEvent {
                    event: Some(pb::generate_event::Event::Prefill(p)),
                })
            }
            EngineEvent::Token(t) => {
                observer.on_token();
                Ok(pb::GenerateEvent {
                    event: Some(pb::generate_event::Event::Token(t)),
                })
            }
            EngineEvent::Done(d) => {
                observer.on_done(&d);
                Ok(pb::GenerateEvent {
                    event: Some(pb::generate_event::Event::Done(d)),
                })
            }
            EngineEvent::Failed(e) => {
                observer.on_failed(&e);
                Err(Status::from(e))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let mut s = self.engine.status();
        let state = match &*self.engine.state().borrow() {
            EngineState::Loading | EngineState::Restarting(_) => Some("loading"),
            EngineState::Failed(_) => Some("unloaded"),
            EngineState::Ready(_) => None,
        };
        if let (Some(st), Some(p)) = (state, s.power.as_mut()) {
            p.state = st.into();
        }
        Ok(Response::new(s))
    }
}

impl From<WorkerError> for Status {
    fn from(e: WorkerError) -> Self {
        let msg = e.to_string();
        match e.grpc_class() {
            crate::error::ErrorClass::InvalidArgument => Status::invalid_argument(msg),
            crate::error::ErrorClass::ResourceExhausted => Status::resource_exhausted(msg),
            crate::error::ErrorClass::Unavailable => Status::unavailable(msg),
            crate::error::ErrorClass::Internal => Status::internal(msg),
        }
    }
}

/// Serves StepService and gRPC health (`tandem.step.v1.StepService` and "") on `listener`
/// until `shutdown` resolves, without authentication, TLS or reflection (tests, local
/// development; see [`serve_secured`]). Health is NOT_SERVING until the model is loaded and
/// while the watchdog restarts the engine.
pub async fn serve(
    engine: EngineHandle,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    serve_secured(engine, tandem_auth::Listener::Tcp(listener), shutdown, tandem_auth::GrpcSecurity::open()).await
}

/// [`serve`] on a TCP or Unix-socket `listener` with `security`: the bearer-token layer,
/// TLS (mutual with a client CA), if asked reflection (v1 and v1alpha), the per-connection
/// stream limit and the message budget. Calls the layer refuses for their token are counted
/// as `worker_requests_total{outcome="refused",reason="unauthenticated"}`.
///
/// Errors: [`WorkerError::Internal`] when the server cannot start or fails.
pub async fn serve_secured(
    engine: EngineHandle,
    listener: tandem_auth::Listener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    mut security: tandem_auth::GrpcSecurity,
) -> Result<(), WorkerError> {
    // Calls refused for their token never reach `generate`: the layer counts them.
    security.auth = security.auth.on_refusal(|_| crate::telemetry::request::record_unauthenticated());
    let health = health_following(&engine).await;
    let router = tandem_auth::grpc::server(&security)
        .map_err(|e| WorkerError::Internal(format!("gRPC server TLS: {e}")))?
        .add_service(health)
        .add_service(StepServiceImpl::new(engine).into_server(security.max_message_bytes));
    let sets = [tandem_proto::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    tandem_auth::grpc::serve_reflected(router, &security, &sets, listener, shutdown)
        .await
        .map_err(|e| WorkerError::Internal(e.to_string()))
}

/// The health service, NOT_SERVING until `engine` is ready, then following its state for the
/// server's whole life (NOT_SERVING while loading, restarting after a watchdog timeout, or
/// failed).
async fn health_following(
    engine: &EngineHandle,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_not_serving::<StepServiceServer<StepServiceImpl>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let mut state = engine.state();
    let rep = reporter.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            // The borrow must end before any await.
            let serving = matches!(&*state.borrow_and_update(), EngineState::Ready(_));
            if last != Some(serving) {
                last = Some(serving);
                let st = if serving {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                if serving {
                    rep.set_serving::<StepServiceServer<StepServiceImpl>>()
                        .await;
                } else {
                    rep.set_not_serving::<StepServiceServer<StepServiceImpl>>()
                        .await;
                }
                rep.set_service_status("", st).await;
            }
            if state.changed().await.is_err() {
                break;
            }
        }
    });
    health
}
