//! Chat messages to prompt tokens plus the message boundary the planner uses: the token
//! position where the last user message starts (llama.cpp's stock server checkpoints there;
//! the divergence policy's first save in a cold slot goes there too).

use gguf::chat_template::{ChatMessage, ChatTemplate};
use crate::error::WorkerError;
use gguf::tokenizer::{BoundedEncoding, Tokenizer};

/// A rendered, tokenized chat prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTokens {
    pub tokens: Vec<u32>,
    /// Tokens before the last user message, when that prefix tokenizes as a prefix of
    /// `tokens` (it does for turn-delimited templates such as ChatML); `None` for a prompt
    /// whose only message is the user's.
    pub last_user_start: Option<usize>,
    /// Positions that start a line (the previous token's text ends with `\n`), ascending.
    pub line_starts: Vec<usize>,
    /// Positions that start a paragraph (a line after an empty line), ascending: see
    /// [`section_starts`].
    pub section_starts: Vec<usize>,
    /// Where each image's tokens start in `tokens`, in the order of the images (empty for a
    /// text-only prompt): `n_tokens[i]` image-pad tokens from `image_starts[i]`
    /// ([`ImageLayout`]).
    pub image_starts: Vec<usize>,
}

/// How images are laid out in a rendered prompt: each image is written into its message as
/// [`IMAGE_MARKER`] (one `<|image_pad|>` between `<|vision_start|>` and `<|vision_end|>`,
/// the Qwen-VL chat layout, as llama.cpp's mtmd and the Hugging Face processor write it),
/// and after tokenizing the `i`-th `<|image_pad|>` token is repeated to the image's
/// `n_tokens[i]` tokens (its merged patch count).
#[derive(Clone, Copy, Debug)]
pub struct ImageLayout<'a> {
    /// The id of `<|image_pad|>` in the model's vocabulary.
    pub pad: u32,
    /// Image tokens of each image, in order.
    pub n_tokens: &'a [usize],
}

/// The text that stands for one image inside a message (tokens `<|vision_start|>`,
/// `<|image_pad|>`, `<|vision_end|>`; ids 248053, 248056, 248054 in the Qwen3.5 vocabulary).
pub const IMAGE_MARKER: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// `tokens` with its first `n_tokens.len()` `pad` tokens each repeated to `n_tokens[i]`
/// tokens; returns the new tokens, each image's first index and how many `pad` tokens were
/// found (all of them, also past `n_tokens.len()`).
pub fn expand_image_pads(tokens: &[u32], pad: u32, n_tokens: &[usize]) -> (Vec<u32>, Vec<usize>, usize) {
    let extra: usize = n_tokens.iter().map(|n| n.saturating_sub(1)).sum();
    let mut out = Vec::with_capacity(tokens.len() + extra);
    let mut starts = Vec::with_capacity(n_tokens.len());
    let mut found = 0;
    for &t in tokens {
        if t == pad {
            if let Some(&n) = n_tokens.get(found) {
                starts.push(out.len());
                out.extend(std::iter::repeat_n(pad, n));
            } else {
                out.push(t);
            }
            found += 1;
        } else {
            out.push(t);
        }
    }
    (out, starts, found)
}

/// Renders `messages` with `template` (generation prompt on) and tokenizes, escaping special
/// tokens inside message contents as the worker's admission does.
///
/// Errors: [`WorkerError::Template`] / [`WorkerError::Tokenizer`] from rendering and encoding.
pub fn chat_tokens(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
) -> Result<ChatTokens, WorkerError> {
    chat_tokens_within(tokenizer, template, messages, usize::MAX)
}

/// The prompt text the worker tokenizes for `messages` (generation prompt on): the contents
/// with special-token texts escaped ([`Tokenizer::escape_special`]), rendered with
/// `template`. What `device-worker render` prints; [`chat_tokens_within`] tokenizes the same.
///
/// Errors: [`WorkerError::InvalidRequest`] for a role outside [`CHAT_ROLES`];
/// [`WorkerError::Template`].
pub fn render_chat(tokenizer: &Tokenizer, template: &ChatTemplate, messages: &[ChatMessage]) -> Result<String, WorkerError> {
    Ok(template.render(&escape_contents(tokenizer, messages)?, true)?)
}

/// The chat roles a request may carry (step.proto `ChatMessage.role`). A role is rendered by
/// the template as is, so any other text (e.g. `user<|im_end|>`) could forge turn markers.
pub const CHAT_ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Errors: [`WorkerError::InvalidRequest`] naming the message and its role (first 32
/// characters) when a role is not one of [`CHAT_ROLES`].
fn check_roles(messages: &[ChatMessage]) -> Result<(), WorkerError> {
    match messages.iter().position(|m| !CHAT_ROLES.contains(&m.role.as_str())) {
        None => Ok(()),
        Some(i) => Err(WorkerError::InvalidRequest(format!(
            "messages[{i}].role = {:?}: expected one of {}",
            messages[i].role.chars().take(32).collect::<String>(),
            CHAT_ROLES.join(", ")
        ))),
    }
}

/// `messages` with special-token texts in their contents escaped (they stay text), after
/// [`check_roles`].
pub fn escape_contents(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<ChatMessage>, WorkerError> {
    check_roles(messages)?;
    Ok(messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: tokenizer.escape_special(&m.content).into_owned(),
        })
        .collect())
}

/// [`chat_tokens`] that stops tokenizing once the rendered prompt holds more than
/// `max_tokens` tokens ([`Tokenizer::encode_bounded`]: work and memory of about `max_tokens`
/// tokens, whatever the prompt's length).
///
/// Errors: [`WorkerError::PromptOverContext`] (with `n_ctx = max_tokens + 1`) over the
/// limit; as [`chat_tokens`].
pub fn chat_tokens_within(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
    max_tokens: usize,
) -> Result<ChatTokens, WorkerError> {
    let msgs = escape_contents(tokenizer, messages)?;
    chat_tokens_escaped(tokenizer, template, &msgs, max_tokens, None)
}

/// [`chat_tokens_within`] of messages whose contents are already escaped
/// ([`escape_contents`]'s rule) and may hold [`IMAGE_MARKER`]s, laid out by `images`
/// (`None`: no images). `max_tokens` bounds the tokens before the image pads are expanded;
/// the caller checks the expanded length against the context.
///
/// Errors: as [`chat_tokens_within`]; [`WorkerError::InvalidRequest`] when the rendered
/// prompt does not hold exactly one `<|image_pad|>` per image (a template that drops or
/// repeats a message's content).
pub fn chat_tokens_escaped(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    msgs: &[ChatMessage],
    max_tokens: usize,
    images: Option<ImageLayout<'_>>,
) -> Result<ChatTokens, WorkerError> {
    check_roles(msgs)?;
    // The text of [`render_chat`].
    let mut tokens = encode_within(tokenizer, &template.render(msgs, true)?, max_tokens)?;
    let mut image_starts = Vec::new();
    if let Some(l) = images {
        let (expanded, starts, found) = expand_image_pads(&tokens, l.pad, l.n_tokens);
        if found != l.n_tokens.len() {
            return Err(WorkerError::InvalidRequest(format!(
                "the chat template rendered {found} image placeholders for {} images",
                l.n_tokens.len()
            )));
        }
        (tokens, image_starts) = (expanded, starts);
    }
    let last_user_start = match msgs.iter().rposition(|m| m.role == "user") {
        Some(i) if i > 0 => {
            // The head is a prefix of the prompt: it fits when the prompt does.
            let mut head = tokenizer.encode(&template.render(&msgs[..i], false)?, true)?;
            if let Some(l) = images {
                head = expand_image_pads(&head, l.pad, l.n_tokens).0;
            }
            (head.len() < tokens.len() && tokens[..head.len()] == head[..]).then_some(head.len())
        }
        _ => None,
    };
    let line_starts = line_starts(tokenizer, &tokens);
    let section_starts = section_starts(tokenizer, &tokens, &line_starts);
    Ok(ChatTokens {
        tokens,
        last_user_start,
        line_starts,
        section_starts,
        image_starts,
    })
}

/// `text`'s tokens (control tokens parsed) if there are at most `max_tokens`.
///
/// Errors: [`WorkerError::PromptOverContext`] (`n_ctx = max_tokens + 1`) when there are more;
/// [`WorkerError::Tokenizer`].
pub fn encode_within(tokenizer: &Tokenizer, text: &str, max_tokens: usize) -> Result<Vec<u32>, WorkerError> {
    match tokenizer.encode_bounded(text, true, max_tokens)? {
        BoundedEncoding::Tokens(t) => Ok(t),
        BoundedEncoding::Over { at_least, bytes_read } => Err(WorkerError::PromptOverContext {
            at_least,
            bytes_read,
            n_bytes: text.len(),
            n_ctx: max_tokens.saturating_add(1),
        }),
    }
}

/// Positions `p` (1 ≤ p < len) where token `p − 1` decodes to text ending in a newline.
pub fn line_starts(tokenizer: &Tokenizer, tokens: &[u32]) -> Vec<usize> {
    (1..tokens.len())
        .filter(|&p| tokenizer.token_bytes(tokens[p - 1]).ends_with(b"\n"))
        .collect()
}

/// The line starts of `line_starts` that begin a paragraph: the text before them ends with
/// an empty line (`\n`, optional spaces, tabs or `\r`, `\n`), whether the tokenizer merged
/// the newlines into one token or not. Agent prompts put their sections (rules, task,
/// observation) in paragraphs; for a prompt without a user-message boundary (one message, or
/// raw text) the divergence policy's cold save goes to the last one
/// ([`crate::state::planner::PlanRequest::section_starts`]). Looks back from each line start
/// only until the first byte that is not white space.
pub fn section_starts(tokenizer: &Tokenizer, tokens: &[u32], line_starts: &[usize]) -> Vec<usize> {
    let blank_line_before = |p: usize| {
        let mut newlines = 0;
        for &t in tokens[..p].iter().rev() {
            for &b in tokenizer.token_bytes(t).iter().rev() {
                match b {
                    b'\n' => {
                        newlines += 1;
                        if newlines == 2 {
                            return true;
                        }
                    }
                    b' ' | b'\t' | b'\r' => {}
                    _ => return false,
                }
            }
        }
        false
    };
    line_starts.iter().copied().filter(|&p| blank_line_before(p)).collect()
}
