//! One agent step: observation → prompt → worker `Generate` (JSON-schema constrained,
//! greedy) → streamed action tokens → validated action.

use std::time::Instant;

use tandem_proto::agent::v1 as apb;
use tandem_proto::step::v1 as spb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::Status;
use tracing::Instrument;

use crate::action::{action_json_schema_for, check_on_screen, parse_action};
use crate::episode::EpisodeStore;
use crate::error::ObservationError;
use crate::metrics::{
    record_first_token, record_retry, record_step, InFlight, StepKind, StepOutcome,
};
use crate::observation::{parse_android_world, parse_uiautomator, select_controls, Screen, DEFAULT_MAX_CONTROLS};
use crate::prompt::{build_prompt, PromptInput};
use crate::screenshot::{
    observation_error, step_messages, sniff, unsent_screenshot_only, Decision, ScreenshotPolicy, WorkerVision, OBSERVATION_PATH,
};
use crate::worker::Router;

/// Output budget per step when the caller gives none. An action is ~15–40 tokens.
pub const DEFAULT_MAX_TOKENS: u32 = 96;

/// Parses an observation into a screen.
///
/// Errors: [`ObservationError`] for malformed XML/JSON or a screen without controls.
pub fn parse_observation(obs: &apb::Observation) -> Result<Screen, ObservationError> {
    match &obs.screen {
        Some(apb::observation::Screen::UiautomatorXml(x)) => parse_uiautomator(x),
        Some(apb::observation::Screen::UiElementsJson(j)) => parse_android_world(j),
        None => Err(ObservationError::Empty),
    }
}

/// Runs steps against the workers.
pub struct StepRunner {
    pub router: Router,
    pub episodes: EpisodeStore,
    /// Most controls a prompt lists (`serve --max-controls`; see [`crate::prompt`]).
    pub max_controls: usize,
    /// When a step's screenshot goes to the model (`serve --screenshots`, see
    /// [`crate::screenshot`]).
    pub screenshots: ScreenshotPolicy,
}

/// What one step is asked to do, besides the screen.
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    pub episode_id: &'a str,
    pub task: &'a str,
    /// The controller's foreground app, if it sent one (else the screen's package).
    pub foreground_app: Option<&'a str>,
    /// Output budget, tokens (0: [`DEFAULT_MAX_TOKENS`]).
    pub max_tokens: u32,
    /// The API the step came through (metric label).
    pub kind: StepKind,
    /// The observation's screenshot (PNG or JPEG bytes; empty: none). Whether it is sent is
    /// [`StepRunner::screenshots`]' decision.
    pub screenshot: &'a [u8],
}

/// A finished step: its result, and for a step refused because of its input (a screenshot
/// the model cannot take, a prompt over the worker's context) the status a unary `Step` answers with instead of the result.
#[derive(Debug)]
pub struct Finished {
    /// The result (`error` set when no valid action came out; also for a refusal).
    pub result: apb::StepResult,
    /// INVALID_ARGUMENT naming `observation.screenshot_png` (bytes that are no PNG/JPEG, or
    /// that the worker could not decode) or with the worker's own INVALID_ARGUMENT message (a
    /// prompt over its context, `max_tokens` past the context's end), or FAILED_PRECONDITION
    /// (`--screenshots always` and a worker without a vision projector).
    pub refusal: Option<Status>,
}

impl StepRunner {
    pub fn new(router: Router) -> Self {
        Self {
            router,
            episodes: EpisodeStore::new(4096),
            max_controls: DEFAULT_MAX_CONTROLS,
            screenshots: ScreenshotPolicy::default(),
        }
    }

    /// The screen of `obs` ([`parse_observation`]); an observation without any listable
    /// control (or without a tree) but with a screenshot that may be sent (`--screenshots`
    /// not `never`) is an empty screen: the step stands on its screenshot, and [`Self::run`]
    /// refuses it when the screenshot is not sent after all.
    ///
    /// Errors: those of [`parse_observation`]; [`ObservationError::ScreenshotNotSent`] for
    /// such an observation under `--screenshots never` (saying what to do).
    pub fn screen_of(&self, obs: &apb::Observation) -> Result<Screen, ObservationError> {
        let has_screenshot = !obs.screenshot_png.is_empty();
        match parse_observation(obs) {
            Err(ObservationError::Empty) if self.screenshots.may_attach(has_screenshot) => Ok(Screen::default()),
            Err(ObservationError::Empty) if has_screenshot => {
                Err(ObservationError::ScreenshotNotSent(unsent_screenshot_only(Decision::Off, "", &self.screenshots)))
            }
            other => other,
        }
    }

    /// Refuses a controller's `max_tokens` that no step can fit: one at least the context of
    /// the worker `episode_id` routes to (its Status' `context_length`) leaves no room for the
    /// prompt, so every step of the episode would fail with the same worker error. Checked once
    /// per episode (RunEpisode's start) or call (Step); a worker whose context is unknown (it
    /// does not answer) leaves the check to the worker's own, per request.
    ///
    /// Errors: INVALID_ARGUMENT naming `max_tokens`, the context and what to ask for instead.
    pub async fn check_max_tokens(&self, episode_id: &str, max_tokens: u32) -> Result<(), Status> {
        if max_tokens == 0 {
            return Ok(());
        }
        let n_ctx = self.router.route(episode_id).model(false).await.map_or(0, |m| m.context_length);
        if n_ctx == 0 || max_tokens < n_ctx {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "max_tokens {max_tokens} does not fit: the model's context holds {n_ctx} tokens, the prompt included; expected max_tokens below {n_ctx} (0: the gateway's default, {DEFAULT_MAX_TOKENS})"
        )))
    }

    /// The runner with the screenshot policy `screenshots`.
    pub fn with_screenshots(mut self, screenshots: ScreenshotPolicy) -> Self {
        self.screenshots = screenshots;
        self
    }

    /// The runner with prompts listing at most `max_controls` controls.
    pub fn with_max_controls(mut self, max_controls: usize) -> Self {
        self.max_controls = max_controls;
        self
    }

    /// Runs one step on an already parsed `screen`, sending [`apb::ActionToken`] events to
    /// `events` as the worker produces them, and returns the step's result (with `error` set
    /// when no valid action came out, and a refusal status for a screenshot the model cannot
    /// take, see [`Finished`]). A closed `events` channel cancels the worker request.
    ///
    /// Records the step's metrics ([`crate::metrics::record_step`]) and runs inside a `step`
    /// span (children: `route`, `generate`; see [`crate::telemetry`]).
    pub async fn run(
        &self,
        input: StepInput<'_>,
        screen: Screen,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
    ) -> Finished {
        let span = tracing::info_span!("step", episode = %input.episode_id, step = tracing::field::Empty, kind = input.kind.as_str());
        self.run_in_span(input, screen, events)
            .instrument(span)
            .await
    }

    async fn run_in_span(
        &self,
        input: StepInput<'_>,
        screen: Screen,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
    ) -> Finished {
        let StepInput {
            episode_id,
            task,
            foreground_app,
            max_tokens,
            kind,
            screenshot,
        } = input;
        let _in_flight = InFlight::enter();
        let t0 = Instant::now();
        let state = self.episodes.begin_step(episode_id, task);
        let step = state.steps;
        tracing::Span::current().record("step", step);
        let app = foreground_app
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .or_else(|| screen.foreground_package.clone());
        let prompt = build_prompt(&PromptInput {
            task: &state.task,
            foreground_app: app.as_deref(),
            history: &state.history,
            screen: &screen,
            max_controls: self.max_controls,
        });
        // Indices the model may name: those of the controls listed in the prompt (they keep
        // their indices from the full list, so this is the largest listed index + 1).
        let listed = select_controls(&screen, self.max_controls).shown;
        let n_controls = listed.index_bound();
        let worker = tracing::info_span!("route").in_scope(|| {
            let w = self.router.route(episode_id);
            tracing::debug!(worker = %w.addr, "routed");
            w
        });
        let has_screenshot = !screenshot.is_empty();
        let vision = if self.screenshots.may_attach(has_screenshot) {
            worker.vision().await
        } else {
            WorkerVision::Unknown
        };
        let decision = self.screenshots.decide(has_screenshot, listed.controls.len(), vision);
        let refused = match decision {
            // A screenshot-only step whose screenshot does not go to the model has nothing.
            d if listed.controls.is_empty() && d != Decision::Sent && d != Decision::Refused => {
                Some(Status::invalid_argument(unsent_screenshot_only(d, &worker.addr, &self.screenshots)))
            }
            Decision::Refused => Some(Status::failed_precondition(format!(
                "{OBSERVATION_PATH}: the gateway runs with --screenshots always, but worker {} has no vision projector (start it with --mmproj, or run the gateway with --screenshots auto or never)",
                worker.addr
            ))),
            Decision::Sent => sniff(screenshot)
                .err()
                .map(|e| Status::invalid_argument(format!("{OBSERVATION_PATH}: {e}"))),
            _ => None,
        };
        crate::metrics::record_screenshot(decision);
        let sent = decision == Decision::Sent;
        if let Some(status) = refused {
            let outcome = if status.code() == tonic::Code::InvalidArgument {
                StepOutcome::ObservationError
            } else {
                StepOutcome::WorkerError
            };
            return self.refuse(episode_id, step, t0, kind, outcome, status, worker.addr.clone());
        }
        let request = spb::GenerateRequest {
            session_id: episode_id.to_string(),
            prompt: Some(spb::generate_request::Prompt::Chat(spb::ChatPrompt {
                messages: step_messages(prompt, sent.then(|| screenshot.to_vec())),
            })),
            max_tokens: if max_tokens == 0 {
                DEFAULT_MAX_TOKENS
            } else {
                max_tokens
            },
            // The controller gave no budget: the default one is cut at the context's end
            // (as a request without max_tokens on the worker) rather than refused.
            cut_max_tokens_at_context: max_tokens == 0,
            stop: vec![],
            sampling: Some(spb::Sampling {
                mode: Some(spb::sampling::Mode::Greedy(spb::Greedy {})),
            }),
            // Indices are limited to this screen's controls, so the decoder cannot name one
            // that does not exist.
            json_schema: action_json_schema_for(n_controls).to_string(),
        };
        let mut result = apb::StepResult {
            episode_id: episode_id.to_string(),
            step,
            stats: Some(apb::StepStats {
                controls: screen.controls.len() as u32,
                worker: worker.addr.clone(),
                screenshot_sent: sent,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut progress = Progress::new(step, t0);
        let generate = tracing::info_span!("generate", worker = %worker.addr);
        let outcome = self
            .generate(worker.client.clone(), request, events, &mut result, &mut progress)
            .instrument(generate)
            .await;
        if let Some(d) = progress.first_token {
            record_first_token(kind, d.as_secs_f64());
        }
        let stats = result.stats.get_or_insert_with(Default::default);
        stats.step_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut refusal = None;
        let metric_outcome = match outcome {
            // The worker refused the attached screenshot: the observation's fault.
            Err(Attempt::Image(why)) => {
                result.error = format!("observation rejected: {why}");
                refusal = Some(Status::invalid_argument(why));
                self.episodes.end_step(episode_id, None);
                StepOutcome::ObservationError
            }
            // The worker refused the request (its prompt over the context, `max_tokens` past
            // the context's end): a unary Step answers INVALID_ARGUMENT with the same message.
            Err(Attempt::Invalid(why)) => {
                refusal = Some(Status::invalid_argument(why.clone()));
                result.error = why;
                self.episodes.end_step(episode_id, None);
                StepOutcome::WorkerError
            }
            Err(e) => {
                result.error = e.into_message();
                self.episodes.end_step(episode_id, None);
                StepOutcome::WorkerError
            }
            Ok(text) => {
                result.raw_output = text.clone();
                match parse_action(&text, n_controls)
                    .and_then(|a| check_on_screen(&a, &listed).map(|_| a))
                {
                    Ok(action) => {
                        let json = action.to_json().to_string();
                        result.action_type = action.action_type().to_string();
                        result.action_json = json.clone();
                        self.episodes.end_step(episode_id, Some(json));
                        StepOutcome::Ok
                    }
                    Err(e) => {
                        result.error = format!("model output is not a valid action: {e}");
                        self.episodes.end_step(episode_id, None);
                        StepOutcome::InvalidAction
                    }
                }
            }
        };
        record_step(kind, sent, metric_outcome, &result);
        if !result.error.is_empty() {
            tracing::info!(step, outcome = metric_outcome.as_str(), error = %result.error, "step failed");
        }
        Finished { result, refusal }
    }

    /// Ends step `step` of `episode_id` (started at `t0`) without a worker call, refused with
    /// `status`; records it as `outcome`.
    #[allow(clippy::too_many_arguments)]
    fn refuse(
        &self,
        episode_id: &str,
        step: u32,
        t0: Instant,
        kind: StepKind,
        outcome: StepOutcome,
        status: Status,
        worker: String,
    ) -> Finished {
        self.episodes.end_step(episode_id, None);
        let result = apb::StepResult {
            episode_id: episode_id.to_string(),
            step,
            error: format!("observation rejected: {}", status.message()),
            stats: Some(apb::StepStats {
                worker,
                step_ms: t0.elapsed().as_secs_f64() * 1e3,
                ..Default::default()
            }),
            ..Default::default()
        };
        record_step(kind, false, outcome, &result);
        tracing::info!(step, outcome = outcome.as_str(), error = %result.error, "step refused");
        Finished { result, refusal: Some(status) }
    }

    /// Streams the worker's tokens to `events`; returns the output text or an error message.
    /// A worker UNAVAILABLE (its watchdog restarted the engine, or it is reloading) is retried
    /// once with the same request on the worker's fresh state; tokens the controller already
    /// received are not sent again (greedy output on a fresh state repeats them).
    async fn generate(
        &self,
        client: crate::worker::WorkerClient,
        request: spb::GenerateRequest,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
        result: &mut apb::StepResult,
        progress: &mut Progress,
    ) -> Result<String, Attempt> {
        match self
            .generate_once(client.clone(), request.clone(), events, result, progress)
            .await
        {
            Err(Attempt::Unavailable(msg)) => {
                tracing::warn!(step = progress.step, error = %msg, "worker unavailable; retrying the step once");
                record_retry();
                // Route around the worker for a while: with several workers the retry (and the
                // episode's next steps) go to the next healthy one; with one, it is retried.
                let failed = result
                    .stats
                    .as_ref()
                    .map(|s| s.worker.clone())
                    .unwrap_or_default();
                self.router.mark_down(&failed);
                let next = self.router.route(&request.session_id).clone();
                let client = if next.addr != failed {
                    if let Some(s) = result.stats.as_mut() {
                        s.worker = next.addr.clone();
                    }
                    next.client
                } else {
                    client
                };
                self.generate_once(client, request, events, result, progress).await
            }
            other => other,
        }
    }

    /// One Generate call; `progress.sent` counts the tokens already forwarded to `events`.
    async fn generate_once(
        &self,
        mut client: crate::worker::WorkerClient,
        request: spb::GenerateRequest,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
        result: &mut apb::StepResult,
        progress: &mut Progress,
    ) -> Result<String, Attempt> {
        let worker = result
            .stats
            .as_ref()
            .map(|s| s.worker.clone())
            .unwrap_or_default();
        let mut stream = client
            .generate(crate::telemetry::with_trace_context(request))
            .await
            .map_err(|s| {
                Attempt::from_status(
                    format!("worker {worker}: {} ({:?})", s.message(), effective_code(&s)),
                    &s,
                )
            })?
            .into_inner();
        let stats = result.stats.get_or_insert_with(Default::default);
        loop {
            // A controller that leaves during prefill must cancel the worker's request too
            // (dropping `stream` does), not only when the next token fails to send.
            let ev = tokio::select! {
                ev = stream.next() => match ev {
                    Some(ev) => ev,
                    None => break,
                },
                _ = events.closed() => {
                    return Err(Attempt::Failed(
                        "controller went away; step cancelled".into(),
                    ));
                }
            };
            let ev = ev.map_err(|s| {
                Attempt::from_status(
                    format!("worker stream: {} ({:?})", s.message(), effective_code(&s)),
                    &s,
                )
            })?;
            match ev.event {
                Some(spb::generate_event::Event::Prefill(p)) => {
                    stats.prompt_tokens = p.prompt_tokens;
                    stats.reused_tokens = p.reused_tokens;
                    stats.new_tokens = p.new_tokens;
                    stats.prefill_ms = p.prefill_ms;
                    stats.image_tokens = p.image_tokens;
                    stats.images_encoded = p.images_encoded;
                    stats.image_cache_hits = p.image_cache_hits;
                    stats.encoder_ms = p.encoder_ms;
                }
                Some(spb::generate_event::Event::Token(t)) => {
                    if t.index < progress.sent {
                        continue; // a retry repeating what the controller already has
                    }
                    progress.sent = t.index + 1;
                    progress
                        .first_token
                        .get_or_insert_with(|| progress.t0.elapsed());
                    let tok = apb::ActionToken {
                        step: progress.step,
                        text: t.text,
                        index: t.index,
                    };
                    if events
                        .send(Ok(apb::StepEvent {
                            event: Some(apb::step_event::Event::Token(tok)),
                        }))
                        .await
                        .is_err()
                    {
                        return Err(Attempt::Failed(
                            "controller went away; step cancelled".into(),
                        ));
                    }
                }
                Some(spb::generate_event::Event::Done(d)) => {
                    stats.prompt_tokens = d.prompt_tokens;
                    stats.reused_tokens = d.reused_tokens;
                    stats.new_tokens = d.new_tokens;
                    stats.kv_bound_tokens = d.kv_bound_tokens;
                    stats.decode_tokens = d.decode_tokens;
                    stats.passes = d.passes;
                    stats.server_ms = d.server_ms;
                    stats.prefill_ms = d.prefill_ms;
                    stats.decode_ms = d.decode_ms;
                    stats.ms_per_token = d.ms_per_token;
                    stats.decode_passes = d.decode_passes;
                    stats.drafts = d
                        .drafts
                        .iter()
                        .map(|ds| apb::DraftTally {
                            drafter: ds.drafter.clone(),
                            proposed: ds.proposed,
                            accepted: ds.accepted,
                        })
                        .collect();
                    return Ok(d.text);
                }
                None => {}
            }
        }
        Err(Attempt::Failed(
            "worker stream ended without a final event".into(),
        ))
    }
}

/// What a step has forwarded so far, across a retry.
struct Progress {
    /// The step's number in its episode (as the controller's tokens carry it).
    step: u32,
    /// Tokens forwarded to the controller.
    sent: u32,
    /// Step start to the first forwarded token.
    first_token: Option<std::time::Duration>,
    /// Step start.
    t0: Instant,
}

impl Progress {
    /// Nothing forwarded yet of step `step`, started at `t0`.
    fn new(step: u32, t0: Instant) -> Self {
        Self {
            step,
            sent: 0,
            first_token: None,
            t0,
        }
    }
}

/// How one Generate attempt failed.
enum Attempt {
    /// UNAVAILABLE from the worker: worth one retry.
    Unavailable(String),
    /// INVALID_ARGUMENT about the attached screenshot, as the controller's error
    /// (`observation.screenshot_png: ...`, [`observation_error`]).
    Image(String),
    /// Any other INVALID_ARGUMENT from the worker (a prompt over its context, a `max_tokens`
    /// past the context's end): the request's fault, answered as that status.
    Invalid(String),
    Failed(String),
}

/// The code a worker call failed with, as the gateway treats it: a status tonic made here
/// from a broken connection (the worker process died mid-stream: "h2 protocol error: error
/// reading a body from connection", `Unknown` or `Internal`; or a call on the dying connection
/// that hyper cancelled, "operation was canceled", `Cancelled`; each carrying the transport
/// error as its source) is `Unavailable`, like a worker that cannot be reached; a status the
/// worker sent (no source) keeps its code. (The controller's own cancellation never reaches
/// here: the gateway drops the call instead of reading its status.)
pub(crate) fn effective_code(s: &Status) -> tonic::Code {
    let local = std::error::Error::source(s).is_some();
    match s.code() {
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled if local => tonic::Code::Unavailable,
        code => code,
    }
}

impl Attempt {
    fn from_status(msg: String, s: &Status) -> Self {
        match effective_code(s) {
            tonic::Code::Unavailable => Self::Unavailable(msg),
            tonic::Code::InvalidArgument => match observation_error(s.message()) {
                Some(why) => Self::Image(why),
                None => Self::Invalid(msg),
            },
            _ => Self::Failed(msg),
        }
    }

    fn into_message(self) -> String {
        match self {
            Self::Unavailable(m) | Self::Image(m) | Self::Invalid(m) | Self::Failed(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tandem_proto::step::v1::step_service_server::{StepService, StepServiceServer};
    use tokio_stream::Stream;
    use tonic::{Request, Response};

    use super::*;

    /// A status tonic made from a broken connection (it carries the transport error as its
    /// source) counts as the worker being unavailable; the same codes sent by a worker (no
    /// source) keep their meaning.
    #[test]
    fn locally_made_transport_statuses_count_as_unavailable() {
        let broken = || Arc::new(std::io::Error::other("connection reset")) as Arc<dyn std::error::Error + Send + Sync>;
        for code in [tonic::Code::Unknown, tonic::Code::Internal, tonic::Code::Cancelled] {
            let sent = Status::new(code, "sent by the worker");
            assert_eq!(effective_code(&sent), code);
            let mut local = Status::new(code, "operation was canceled");
            local.set_source(broken());
            assert_eq!(effective_code(&local), tonic::Code::Unavailable, "{code:?}");
        }
        let mut invalid = Status::invalid_argument("bad");
        invalid.set_source(broken());
        assert_eq!(effective_code(&invalid), tonic::Code::InvalidArgument);
    }

    /// A worker whose first Generate streams two tokens then fails (UNAVAILABLE or, with
    /// `code`, another code); later calls stream three tokens and the final stats.
    struct FlakyWorker {
        calls: Arc<AtomicUsize>,
        code: tonic::Code,
    }

    type Events = Pin<Box<dyn Stream<Item = Result<spb::GenerateEvent, Status>> + Send>>;

    fn token(i: u32) -> Result<spb::GenerateEvent, Status> {
        Ok(spb::GenerateEvent {
            event: Some(spb::generate_event::Event::Token(spb::TokenEvent {
                id: i,
                text: format!("t{i}"),
                index: i,
            })),
        })
    }

    #[tonic::async_trait]
    impl StepService for FlakyWorker {
        type GenerateStream = Events;

        async fn generate(
            &self,
            _r: Request<spb::GenerateRequest>,
        ) -> Result<Response<Events>, Status> {
            let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
            let evs: Vec<Result<spb::GenerateEvent, Status>> = if first {
                vec![
                    token(0),
                    token(1),
                    Err(Status::new(self.code, "watchdog: engine restarting")),
                ]
            } else {
                let done = spb::GenerateEvent {
                    event: Some(spb::generate_event::Event::Done(spb::FinalStats {
                        text: "t0t1t2".into(),
                        ..Default::default()
                    })),
                };
                vec![token(0), token(1), token(2), Ok(done)]
            };
            Ok(Response::new(Box::pin(tokio_stream::iter(evs))))
        }

        async fn status(
            &self,
            _r: Request<spb::StatusRequest>,
        ) -> Result<Response<spb::StatusResponse>, Status> {
            Ok(Response::new(Default::default()))
        }
    }

    async fn run_against(code: tonic::Code) -> (Result<String, String>, Vec<u32>, usize) {
        let calls = Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let svc = StepServiceServer::new(FlakyWorker {
            calls: calls.clone(),
            code,
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let runner = StepRunner::new(Router::new(&[addr]).unwrap());
        let (tx, mut rx) = mpsc::channel(16);
        let client = runner.router.route("e").client.clone();
        let mut result = apb::StepResult::default();
        let mut progress = Progress::new(0, Instant::now());
        let out = runner
            .generate(
                client,
                spb::GenerateRequest::default(),
                &tx,
                &mut result,
                &mut progress,
            )
            .await
            .map_err(Attempt::into_message);
        drop(tx);
        let mut seen = Vec::new();
        while let Some(Ok(ev)) = rx.recv().await {
            if let Some(apb::step_event::Event::Token(t)) = ev.event {
                seen.push(t.index);
            }
        }
        (out, seen, calls.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn unavailable_is_retried_once_without_repeating_tokens() {
        let (out, seen, calls) = run_against(tonic::Code::Unavailable).await;
        assert_eq!(out.as_deref(), Ok("t0t1t2"));
        assert_eq!(calls, 2);
        assert_eq!(seen, vec![0, 1, 2], "tokens reach the controller once each");
    }

    #[tokio::test]
    async fn other_errors_are_not_retried() {
        let (out, _, calls) = run_against(tonic::Code::Internal).await;
        assert!(out.is_err());
        assert_eq!(calls, 1);
    }
}
