//! The gRPC `AgentService`: `RunEpisode` (bidirectional) and `Step` (unary in, stream out).

use std::pin::Pin;
use std::sync::Arc;

use tandem_proto::agent::v1 as apb;
use tandem_proto::limits::{brief, check_id};
use tandem_proto::agent::v1::agent_service_server::{AgentService, AgentServiceServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::error::GatewayError;
use crate::metrics::{record_step, StepKind, StepOutcome};
use crate::step::{StepInput, StepRunner};

const STREAM_BUFFER: usize = 64;

/// How often the gateway's gRPC health asks its workers for `Status` ([`health_following`]).
const WORKER_POLL: std::time::Duration = std::time::Duration::from_secs(2);

type EventStream = Pin<Box<dyn Stream<Item = Result<apb::StepEvent, Status>> + Send>>;

pub struct AgentServiceImpl {
    runner: Arc<StepRunner>,
}

impl AgentServiceImpl {
    pub fn new(runner: Arc<StepRunner>) -> Self {
        Self { runner }
    }
}

fn new_episode_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    format!("ep-{t:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn result_event(r: apb::StepResult) -> apb::StepEvent {
    apb::StepEvent { event: Some(apb::step_event::Event::Result(r)) }
}

#[tonic::async_trait]
impl AgentService for AgentServiceImpl {
    type RunEpisodeStream = EventStream;
    type StepStream = EventStream;

    async fn run_episode(&self, request: Request<Streaming<apb::EpisodeInput>>) -> Result<Response<Self::RunEpisodeStream>, Status> {
        let mut inputs = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let runner = self.runner.clone();
        tokio::spawn(async move {
            let mut episode: Option<apb::EpisodeStart> = None;
            while let Some(msg) = inputs.next().await {
                let input = match msg {
                    Ok(m) => m,
                    Err(s) => {
                        tracing::info!(status = %s, "controller stream ended with an error");
                        break;
                    }
                };
                match input.input {
                    Some(apb::episode_input::Input::Start(mut start)) => {
                        if let Err(e) = check_id("episode_id", &start.episode_id) {
                            tracing::warn!(error = %e, "episode refused");
                            let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                            break;
                        }
                        if start.episode_id.is_empty() {
                            start.episode_id = new_episode_id();
                        }
                        // A budget no step can fit ends the stream now, not every step later.
                        if let Err(status) = runner.check_max_tokens(&start.episode_id, start.max_tokens).await {
                            tracing::warn!(episode = %start.episode_id, error = %status.message(), "episode refused");
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                        tracing::info!(episode = %start.episode_id, task = %brief(&start.task), "episode started");
                        episode = Some(start);
                    }
                    Some(apb::episode_input::Input::Observation(obs)) => {
                        let Some(ep) = episode.as_ref() else {
                            let _ = tx
                                .send(Err(Status::failed_precondition("send EpisodeStart before the first observation")))
                                .await;
                            break;
                        };
                        let result = match runner.screen_of(&obs) {
                            Ok(screen) => {
                                let input = StepInput {
                                    episode_id: &ep.episode_id,
                                    task: &ep.task,
                                    foreground_app: Some(&obs.foreground_app),
                                    max_tokens: ep.max_tokens,
                                    kind: StepKind::Episode,
                                    screenshot: &obs.screenshot_png,
                                };
                                // A refused screenshot is the step's error; the stream stays open.
                                runner.run(input, screen, &tx).await.result
                            }
                            Err(e) => {
                                let st = runner.episodes.begin_step(&ep.episode_id, &ep.task);
                                runner.episodes.end_step(&ep.episode_id, None);
                                let r = apb::StepResult {
                                    episode_id: ep.episode_id.clone(),
                                    step: st.steps,
                                    error: format!("observation rejected: {e}"),
                                    ..Default::default()
                                };
                                record_step(StepKind::Episode, false, StepOutcome::ObservationError, &r);
                                r
                            }
                        };
                        if tx.send(Ok(result_event(result))).await.is_err() {
                            break;
                        }
                    }
                    None => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn step(&self, request: Request<apb::StepRequest>) -> Result<Response<Self::StepStream>, Status> {
        let req = request.into_inner();
        check_id("episode_id", &req.episode_id).map_err(|e| {
            tracing::warn!(error = %e, "step refused");
            Status::invalid_argument(e.to_string())
        })?;
        let obs = req.observation.ok_or_else(|| Status::invalid_argument("observation is missing"))?;
        let screen = self.runner.screen_of(&obs).map_err(|e| {
            record_step(StepKind::Step, false, StepOutcome::ObservationError, &apb::StepResult::default());
            Status::invalid_argument(format!("observation rejected: {e}"))
        })?;
        let episode_id = if req.episode_id.is_empty() { new_episode_id() } else { req.episode_id };
        self.runner.check_max_tokens(&episode_id, req.max_tokens).await?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let runner = self.runner.clone();
        tokio::spawn(async move {
            let input = StepInput {
                episode_id: &episode_id,
                task: &req.task,
                foreground_app: Some(&obs.foreground_app),
                max_tokens: req.max_tokens,
                kind: StepKind::Step,
                screenshot: &obs.screenshot_png,
            };
            let done = runner.run(input, screen, &tx).await;
            // A screenshot the model cannot take, or a request the worker refuses (a prompt
            // over its context), ends the call with its status (INVALID_ARGUMENT or
            // FAILED_PRECONDITION) instead of a result.
            let event = match done.refusal {
                Some(status) => Err(status),
                None => Ok(result_event(done.result)),
            };
            let _ = tx.send(event).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Serves AgentService and health on `listener` until `shutdown` resolves, without
/// authentication, TLS or reflection (tests, local development; see [`serve_secured`]).
pub async fn serve(
    runner: Arc<StepRunner>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    serve_secured(runner, tandem_auth::Listener::Tcp(listener), shutdown, tandem_auth::GrpcSecurity::open()).await
}

/// [`serve`] on a TCP or Unix-socket `listener` with `security`: the bearer-token layer,
/// TLS (mutual with a client CA) and, if asked, reflection (v1 and v1alpha). Health (the
/// whole server and AgentService) is SERVING while at least one worker answers, as the HTTP
/// `GET /health` says ([`health_following`]).
///
/// Errors: [`GatewayError::Config`] when the server cannot start or fails.
pub async fn serve_secured(
    runner: Arc<StepRunner>,
    listener: tandem_auth::Listener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    security: tandem_auth::GrpcSecurity,
) -> Result<(), GatewayError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // NOT_SERVING until a worker answers (set before the first connection can ask).
    reporter.set_not_serving::<AgentServiceServer<AgentServiceImpl>>().await;
    reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
    let follower = tokio::spawn(health_following(reporter, runner.router.clone()));
    let router = tandem_auth::grpc::server(&security)
        .map_err(|e| GatewayError::Config(format!("gRPC server TLS: {e}")))?
        .add_service(health)
        .add_service(
            AgentServiceServer::new(AgentServiceImpl::new(runner))
                .max_decoding_message_size(security.max_message_bytes),
        );
    let sets = [tandem_proto::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    let served = tandem_auth::grpc::serve_reflected(router, &security, &sets, listener, shutdown)
        .await
        .map_err(|e| GatewayError::Config(e.to_string()));
    follower.abort();
    served
}

/// Keeps the health of the whole server ("") and of AgentService at SERVING while at least
/// one of `router`'s workers answers `Status` within [`crate::http::models::STATUS_TIMEOUT`],
/// NOT_SERVING otherwise (the reporter starts so: until one answers, and while all are down);
/// asks every [`WORKER_POLL`], logging each change.
async fn health_following(reporter: tonic_health::server::HealthReporter, router: crate::worker::Router) {
    use tonic_health::ServingStatus;
    let mut last = false;
    loop {
        let mut up = false;
        for w in router.workers() {
            if crate::http::models::status_of(w).await.is_ok() {
                up = true;
                break;
            }
        }
        if up != last {
            last = up;
            let status = if up { ServingStatus::Serving } else { ServingStatus::NotServing };
            if up {
                reporter.set_serving::<AgentServiceServer<AgentServiceImpl>>().await;
                tracing::info!("a worker answers; health SERVING");
            } else {
                reporter.set_not_serving::<AgentServiceServer<AgentServiceImpl>>().await;
                tracing::warn!(workers = ?router.workers().iter().map(|w| &w.addr).collect::<Vec<_>>(), "no worker answers; health NOT_SERVING");
            }
            reporter.set_service_status("", status).await;
        }
        tokio::time::sleep(WORKER_POLL).await;
    }
}
