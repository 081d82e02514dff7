//! What the gRPC handler hands the engine, and what the engine streams back.

use std::time::Instant;

use tandem_proto::step::v1 as pb;
use tokio::sync::mpsc;

use super::images::PromptImage;
use crate::sampling::SamplingMode;
use crate::constraint::Constraint;
use crate::error::WorkerError;

/// A validated request: the prompt is tokenized, fits the context, and its schema compiled.
pub struct EngineRequest {
    pub session_id: String,
    pub prompt: Vec<u32>,
    /// Where the last user message starts in `prompt` (chat prompts), for the checkpoint
    /// planner.
    pub last_user_start: Option<usize>,
    /// Line starts of `prompt` (see [`crate::state::planner::PlanRequest::line_starts`]).
    pub line_starts: Vec<usize>,
    /// Paragraph starts of `prompt` (see [`crate::state::planner::PlanRequest::section_starts`]).
    pub section_starts: Vec<usize>,
    /// The prompt's images (chat content parts, issue 19), ascending by place: each covers
    /// `image.n_tokens` `<|image_pad|>` tokens of `prompt` from `start`.
    pub images: Vec<PromptImage>,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub sampling: SamplingMode,
    pub constraint: Option<Constraint>,
    pub enqueued_at: Instant,
    /// Events back to the caller. A closed channel means the caller is gone: the engine
    /// cancels the request at the next micro-batch or token.
    pub events: mpsc::Sender<EngineEvent>,
}

/// One event of a request's stream.
#[derive(Debug)]
pub enum EngineEvent {
    Prefill(pb::PrefillStats),
    Token(pb::TokenEvent),
    Done(pb::FinalStats),
    Failed(WorkerError),
}
