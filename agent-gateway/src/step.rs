//! One agent step: observation → prompt → worker `Generate` (JSON-schema constrained,
//! greedy) → streamed action tokens → validated action.

use std::time::Instant;

use tandem_proto::agent::v1 as apb;
use tandem_proto::step::v1 as spb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::Status;

use crate::action::{action_json_schema_for, check_index_listed, parse_action};
use crate::episode::EpisodeStore;
use crate::error::ObservationError;
use crate::observation::{parse_android_world, parse_uiautomator, Screen};
use crate::prompt::{build_prompt, PromptInput};
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
}

impl StepRunner {
    pub fn new(router: Router) -> Self {
        Self { router, episodes: EpisodeStore::new(4096) }
    }

    /// Runs one step of episode `episode_id` on an already parsed `screen`, sending
    /// [`apb::ActionToken`] events to `events` as the worker produces them, and returns the
    /// step's result (with `error` set when no valid action came out). A closed `events`
    /// channel cancels the worker request.
    pub async fn run(
        &self,
        episode_id: &str,
        task: &str,
        foreground_app: Option<&str>,
        screen: Screen,
        max_tokens: u32,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
    ) -> apb::StepResult {
        let t0 = Instant::now();
        let state = self.episodes.begin_step(episode_id, task);
        let step = state.steps;
        let app = foreground_app.filter(|a| !a.is_empty()).map(str::to_string).or_else(|| screen.foreground_package.clone());
        let prompt = build_prompt(&PromptInput {
            task: &state.task,
            foreground_app: app.as_deref(),
            history: &state.history,
            screen: &screen,
        });
        // Indices the model may name: those of the controls listed in the prompt (AndroidWorld
        // screens keep their source indices, so this is the largest listed index + 1).
        let n_controls = screen.controls.iter().take(crate::prompt::MAX_CONTROLS).map(|c| c.index + 1).max().unwrap_or(0);
        let worker = self.router.route(episode_id);
        let request = spb::GenerateRequest {
            session_id: episode_id.to_string(),
            prompt: Some(spb::generate_request::Prompt::Chat(spb::ChatPrompt {
                messages: vec![
                    spb::ChatMessage { role: "system".into(), content: prompt.system },
                    spb::ChatMessage { role: "user".into(), content: prompt.user },
                ],
            })),
            max_tokens: if max_tokens == 0 { DEFAULT_MAX_TOKENS } else { max_tokens },
            stop: vec![],
            sampling: Some(spb::Sampling { mode: Some(spb::sampling::Mode::Greedy(spb::Greedy {})) }),
            // Indices are limited to this screen's controls, so the decoder cannot name one
            // that does not exist.
            json_schema: action_json_schema_for(n_controls).to_string(),
        };
        let mut result = apb::StepResult {
            episode_id: episode_id.to_string(),
            step,
            stats: Some(apb::StepStats { controls: screen.controls.len() as u32, worker: worker.addr.clone(), ..Default::default() }),
            ..Default::default()
        };
        let outcome = self.generate(worker.client.clone(), request, step, events, &mut result).await;
        let stats = result.stats.get_or_insert_with(Default::default);
        stats.step_ms = t0.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Err(e) => {
                result.error = e;
                self.episodes.end_step(episode_id, None);
            }
            Ok(text) => {
                result.raw_output = text.clone();
                match parse_action(&text, n_controls).and_then(|a| check_index_listed(&a, &screen).map(|_| a)) {
                    Ok(action) => {
                        let json = action.to_json().to_string();
                        result.action_type = action.action_type().to_string();
                        result.action_json = json.clone();
                        self.episodes.end_step(episode_id, Some(json));
                    }
                    Err(e) => {
                        result.error = format!("model output is not a valid action: {e}");
                        self.episodes.end_step(episode_id, None);
                    }
                }
            }
        }
        result
    }

    /// Streams the worker's tokens to `events`; returns the output text or an error message.
    async fn generate(
        &self,
        mut client: tandem_proto::step::v1::step_service_client::StepServiceClient<tonic::transport::Channel>,
        request: spb::GenerateRequest,
        step: u32,
        events: &mpsc::Sender<Result<apb::StepEvent, Status>>,
        result: &mut apb::StepResult,
    ) -> Result<String, String> {
        let mut stream = client
            .generate(request)
            .await
            .map_err(|s| format!("worker {}: {} ({:?})", result.stats.as_ref().map(|s| s.worker.as_str()).unwrap_or(""), s.message(), s.code()))?
            .into_inner();
        let stats = result.stats.get_or_insert_with(Default::default);
        while let Some(ev) = stream.next().await {
            let ev = ev.map_err(|s| format!("worker stream: {} ({:?})", s.message(), s.code()))?;
            match ev.event {
                Some(spb::generate_event::Event::Prefill(p)) => {
                    stats.prompt_tokens = p.prompt_tokens;
                    stats.reused_tokens = p.reused_tokens;
                    stats.new_tokens = p.new_tokens;
                    stats.prefill_ms = p.prefill_ms;
                }
                Some(spb::generate_event::Event::Token(t)) => {
                    let tok = apb::ActionToken { step, text: t.text, index: t.index };
                    if events.send(Ok(apb::StepEvent { event: Some(apb::step_event::Event::Token(tok)) })).await.is_err() {
                        return Err("controller went away; step cancelled".into());
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
                    return Ok(d.text);
                }
                None => {}
            }
        }
        Err("worker stream ended without a final event".into())
    }
}
