//! Admission: turns a `GenerateRequest` into an [`EngineRequest`] on the handler's task, so
//! bad input is refused before it reaches the engine queue (INVALID_ARGUMENT) and the engine
//! thread only computes.

use std::time::Instant;

use tandem_proto::step::v1 as pb;
use tokio::sync::mpsc;

use super::images::{chat_tokens_with_parts, has_parts, mark_image_tokens, text_bytes, ImageAdmission};
use super::request::{EngineEvent, EngineRequest};
use crate::sampling::SamplingMode;
use crate::prompt::{chat_tokens_within, encode_within, line_starts, section_starts};
use gguf::chat_template::{ChatMessage, ChatTemplate};
use crate::constraint::ConstraintFactory;
use crate::error::WorkerError;
use gguf::tokenizer::Tokenizer;

/// Everything needed to validate and tokenize requests; shared by all handlers.
pub struct Admission {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub constraints: ConstraintFactory,
    /// Context length of a slot.
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub default_max_tokens: u32,
    /// How images are laid out (`--mmproj`); `None` for a text-only worker, which refuses
    /// images ([`crate::model::vision::VisionError::NoProjector`]).
    pub vision: Option<ImageAdmission>,
}

impl Admission {
    /// The most prompt tokens a request may have: the context less one position for the
    /// first generated token.
    fn max_prompt_tokens(&self) -> usize {
        self.n_ctx.saturating_sub(1)
    }

    /// Refuses a text or chat prompt whose text alone proves it over the context, before it
    /// is tokenized (so a hostile 3 MB prompt costs a length check, not a second of
    /// tokenization and its memory): `n` bytes are at least `n / max_token_bytes` tokens.
    ///
    /// Errors: [`WorkerError::PromptTextTooLong`].
    fn check_text_length(&self, req: &pb::GenerateRequest) -> Result<(), WorkerError> {
        let n_bytes = match &req.prompt {
            Some(pb::generate_request::Prompt::Text(t)) => t.len(),
            Some(pb::generate_request::Prompt::Chat(c)) => c.messages.iter().map(text_bytes).sum(),
            _ => return Ok(()),
        };
        let min_tokens = n_bytes / self.tokenizer.max_token_bytes();
        if min_tokens >= self.n_ctx {
            return Err(WorkerError::PromptTextTooLong {
                n_bytes,
                min_tokens,
                n_ctx: self.n_ctx,
            });
        }
        Ok(())
    }

    /// Renders and tokenizes the prompt, checks it fits the context, compiles the JSON schema.
    /// An over-long prompt costs a length check (its text alone proves it too long), or
    /// tokenizing about one context's worth of it (tokenizing stops once it is over,
    /// [`gguf::tokenizer::Tokenizer::encode_bounded`]), never its full length.
    ///
    /// Errors (all map to INVALID_ARGUMENT): [`WorkerError::EmptyPrompt`],
    /// [`WorkerError::PromptTooLong`] (token ids), [`WorkerError::PromptTextTooLong`],
    /// [`WorkerError::PromptOverContext`], [`WorkerError::MaxTokensOverContext`] (an explicit
    /// `max_tokens` past the context's end), [`WorkerError::InvalidRequest`] (unknown token ids;
    /// an image the worker cannot take, naming `messages[i].parts[j]`:
    /// [`super::images::chat_tokens_with_parts`]),
    /// [`WorkerError::InvalidField`] (sampling out of range, [`tandem_proto::limits`]),
    /// constraint errors for an invalid schema, template errors.
    pub fn admit(
        &self,
        req: pb::GenerateRequest,
        events: mpsc::Sender<EngineEvent>,
    ) -> Result<EngineRequest, WorkerError> {
        let enqueued_at = Instant::now();
        let mut last_user_start = None;
        let mut images = Vec::new();
        self.check_text_length(&req)?;
        let prompt = match req.prompt {
            None => return Err(WorkerError::EmptyPrompt),
            Some(pb::generate_request::Prompt::Chat(chat)) => {
                if chat.messages.is_empty() {
                    return Err(WorkerError::EmptyPrompt);
                }
                if has_parts(&chat.messages) {
                    // Content parts (text and images, issue 19): laid out in order, images as
                    // vision tokens with their image-token count.
                    let (ct, placed) = chat_tokens_with_parts(
                        &self.tokenizer,
                        &self.template,
                        self.vision.as_ref(),
                        chat.messages,
                        self.max_prompt_tokens(),
                    )?;
                    last_user_start = ct.last_user_start;
                    images = placed;
                    ct.tokens
                } else {
                    // Message contents are data: `chat_tokens` escapes special-token texts
                    // inside them so they stay text (the template's own markers are the only
                    // turn boundaries), and finds where the last user message starts.
                    let msgs: Vec<ChatMessage> = chat
                        .messages
                        .into_iter()
                        .map(|m| ChatMessage {
                            role: m.role,
                            content: m.content,
                        })
                        .collect();
                    let ct = chat_tokens_within(&self.tokenizer, &self.template, &msgs, self.max_prompt_tokens())?;
                    last_user_start = ct.last_user_start;
                    ct.tokens
                }
            }
            Some(pb::generate_request::Prompt::Text(text)) => {
                encode_within(&self.tokenizer, &text, self.max_prompt_tokens())?
            }
            Some(pb::generate_request::Prompt::Tokens(t)) => {
                if let Some(&bad) = t.ids.iter().find(|&&id| id as usize >= self.n_vocab) {
                    return Err(WorkerError::InvalidRequest(format!(
                        "token id {bad} is outside the vocabulary (size {})",
                        self.n_vocab
                    )));
                }
                t.ids
            }
        };
        if prompt.is_empty() {
            return Err(WorkerError::EmptyPrompt);
        }
        // At least one position must remain for the first generated token.
        if prompt.len() >= self.n_ctx {
            return Err(WorkerError::PromptTooLong {
                n_tokens: prompt.len(),
                n_ctx: self.n_ctx,
            });
        }
        let sampling = match req.sampling.and_then(|s| s.mode) {
            None | Some(pb::sampling::Mode::Greedy(_)) => SamplingMode::Greedy,
            Some(pb::sampling::Mode::Seeded(s)) => {
                tandem_proto::limits::check_seeded(&s)?;
                SamplingMode::Seeded {
                    seed: s.seed,
                    temperature: s.temperature,
                    top_k: s.top_k,
                    top_p: s.top_p,
                }
            }
        };
        let constraint = if req.json_schema.trim().is_empty() {
            None
        } else {
            Some(self.constraints.json_schema(&req.json_schema)?)
        };
        // An explicit budget must fit after the prompt (as OpenAI refuses it) unless the
        // client asked for it to be cut; the default one is cut at the context's end (finish
        // reason CONTEXT, in decoding).
        if prompt.len() + req.max_tokens as usize > self.n_ctx && !req.cut_max_tokens_at_context {
            return Err(WorkerError::MaxTokensOverContext {
                max_tokens: req.max_tokens,
                n_prompt: prompt.len(),
                n_ctx: self.n_ctx,
            });
        }
        let max_tokens = if req.max_tokens == 0 {
            self.default_max_tokens
        } else {
            req.max_tokens
        };
        let line_starts = line_starts(&self.tokenizer, &prompt);
        let section_starts = section_starts(&self.tokenizer, &prompt, &line_starts);
        let mut prompt = prompt;
        mark_image_tokens(&mut prompt, &images);
        Ok(EngineRequest {
            session_id: req.session_id,
            last_user_start,
            line_starts,
            section_starts,
            prompt,
            images,
            max_tokens,
            stop: req.stop.into_iter().filter(|s| !s.is_empty()).collect(),
            sampling,
            constraint,
            enqueued_at,
            events,
        })
    }
}
