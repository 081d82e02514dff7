//! Chat prompt rendering with the GGUF's own Jinja template (`tokenizer.chat_template`).
//!
//! Rendering follows Hugging Face `transformers`' `apply_chat_template`: a Jinja environment with
//! `trim_blocks` and `lstrip_blocks`, the variables `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token` (plus any extras the caller passes, e.g. `tools`,
//! `enable_thinking`) and a `raise_exception(msg)` function. Python string methods used by real
//! templates (`.strip()`, `.startswith()`, `.split()`, ...) come from `minijinja-contrib`'s
//! pycompat layer. A file without a template falls back to ChatML.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

pub use crate::error::TemplateError;
use crate::reader::GgufFile;

/// ChatML, used when the GGUF has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat";

/// One chat turn as the template sees it (`message['role']`, `message['content']`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"` or `"tool"`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the model's BOS/EOS strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    is_fallback: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("is_fallback", &self.is_fallback)
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Reads `tokenizer.chat_template` and the BOS/EOS token strings from `file`.
    ///
    /// A missing template falls back to [`CHATML_TEMPLATE`] with a logged warning.
    /// Errors: [`TemplateError::Compile`] if the template does not parse;
    /// [`TemplateError::Gguf`] if a key has the wrong type.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TemplateError> {
        let tokens = file
            .get_str_array_opt("tokenizer.ggml.tokens")
            .unwrap_or_default();
        let token_str = |key: &str| -> String {
            file.get_u32_opt(key)
                .and_then(|id| tokens.get(id as usize))
                .map(|s| s.to_string())
                .unwrap_or_default()
        };
        let bos = token_str("tokenizer.ggml.bos_token_id");
        let eos = token_str("tokenizer.ggml.eos_token_id");
        match file.get("tokenizer.chat_template") {
            Some(_) => Self::new(file.get_str("tokenizer.chat_template")?, &bos, &eos),
            None => {
                tracing::warn!("GGUF has no tokenizer.chat_template; falling back to ChatML");
                let mut t = Self::new(CHATML_TEMPLATE, &bos, &eos)?;
                t.is_fallback = true;
                Ok(t)
            }
        }
    }

    /// Compiles `source` with the given BOS/EOS strings.
    ///
    /// Errors: [`TemplateError::Compile`] with minijinja's message (line and cause).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(TemplateError::Compile)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            is_fallback: false,
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the opening of an
    /// assistant turn. Errors: [`TemplateError::Render`] (including `raise_exception` calls,
    /// whose message it carries).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(messages, add_generation_prompt, Value::UNDEFINED)
    }

    /// Like [`ChatTemplate::render`] with extra template variables from a map-like `extra`
    /// (e.g. `minijinja::context! { tools => ..., enable_thinking => false }`); pass
    /// `Value::UNDEFINED` for none. Extra keys override the standard ones.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: Value,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(TemplateError::Render)?;
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let ctx = if extra.is_undefined() {
            base
        } else {
            minijinja::context! { ..extra, ..base }
        };
        tmpl.render(ctx).map_err(TemplateError::Render)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is the ChatML fallback (the file had no template).
    pub fn is_fallback(&self) -> bool {
        self.is_fallback
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_turns_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").expect("compiles");
        let msgs = [ChatMessage::new("user", "Hi")];
        assert_eq!(
            t.render(&msgs, true).expect("renders"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs, false).expect("renders"),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn raise_exception_surfaces_as_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no tools allowed') }}", "", "")
            .expect("compiles");
        let err = t.render(&[], false).expect_err("must fail");
        assert!(matches!(err, TemplateError::Render(_)));
        assert!(
            err.to_string().contains("no tools allowed")
                || format!("{err:?}").contains("no tools allowed")
        );
    }

    #[test]
    fn syntax_errors_fail_at_compile_time() {
        assert!(matches!(
            ChatTemplate::new("{% for x in %}", "", ""),
            Err(TemplateError::Compile(_))
        ));
    }
}
