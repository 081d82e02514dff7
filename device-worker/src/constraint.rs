//! JSON-schema constrained decoding with `llguidance` over our GGUF tokenizer.
//!
//! [`ConstraintFactory`] (one per model) builds llguidance's token trie from the tokenizer's raw
//! token bytes and compiles schemas into [`Constraint`]s (one per request). The decoding loop:
//!
//! ```text
//! loop {
//!     let mask = constraint.allowed_tokens()?;   // ids the grammar allows next
//!     mask.apply(&mut logits);                   // disallowed logits := -inf
//!     let id = argmax(logits);
//!     if tokenizer.is_eog(id) { break }          // grammar accepted, model ended the turn
//!     constraint.commit(id)?;
//!     if constraint.is_finished() { break }      // grammar complete: only EOS allowed
//! }
//! ```
//!
//! Control tokens (`<|im_start|>`, ...) enter the trie as llguidance special tokens (a 0xFF
//! byte before their text), so they never match grammar text. The end-of-generation ids of the
//! tokenizer are llguidance's EOS set: whichever of them the model picks, the grammar accepts.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use gguf::tokenizer::{token_type, Tokenizer};

// === errors ===

/// Errors building or driving a grammar constraint (`constraint`).
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    #[error("building the token trie / parser factory failed: {0}")]
    Setup(String),
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    #[error("token {token} is not allowed by the grammar here: {reason}")]
    TokenRejected { token: u32, reason: String },
    #[error("grammar parser error: {0}")]
    Parser(String),
}

// === token environment ===

/// llguidance's view of our tokenizer: the trie of token bytes plus a text tokenizer.
struct GgufTokEnv {
    trie: TokTrie,
    /// Tokenizes plain text (control tokens are not parsed from text).
    text: tokenizers::Tokenizer,
}

impl TokenizerEnv for GgufTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |s| match self.text.encode_fast(s, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                // Byte-level BPE covers every byte; fall back to the trie's greedy split anyway.
                Err(_) => self.trie.greedy_tokenize(s.as_bytes()),
            })
    }
}

fn build_tok_env(tok: &Tokenizer) -> Result<TokEnv, ConstraintError> {
    let n = tok.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| match tok.token_type(id) {
            Some(token_type::CONTROL | token_type::UNKNOWN | token_type::UNUSED) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
                w
            }
            _ => tok.token_bytes(id),
        })
        .collect();
    let eos = tok.eos();
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_bos = tok.bos();
    info.tok_end_of_turn = tok.token_id("<|im_end|>").filter(|&id| id != eos);
    // EOS first, then the other end-of-generation ids.
    let mut eos_set = vec![eos];
    eos_set.extend(tok.eog_ids().iter().copied().filter(|&id| id != eos));
    if eos_set.iter().any(|&id| id as usize >= n) {
        return Err(ConstraintError::Setup(format!(
            "end-of-generation ids {eos_set:?} outside the vocabulary of {n}"
        )));
    }
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_set);
    let mut text = tok.hf().clone();
    text.set_encode_special_tokens(true);
    Ok(Arc::new(GgufTokEnv { trie, text }))
}

// === ConstraintFactory ===

/// The whitespace a JSON-schema constraint allows between two JSON tokens (one run, never
/// empty; none at all is also allowed): one space, or one or two newlines then up to 20
/// spaces or tabs. llama.cpp's `SPACE_RULE` (common/json-schema-to-grammar.cpp), in
/// llguidance's `whitespace_pattern` regex syntax.
pub const JSON_WHITESPACE: &str = r"\x20|\n{1,2}[\x20\t]{0,20}";

/// Adds [`JSON_WHITESPACE`] to a schema's `x-guidance` options unless they already choose the
/// whitespace (`whitespace_pattern`, or `whitespace_flexible`: llguidance's compact/any
/// switch). A block that is not an object is left for llguidance to refuse.
fn bound_whitespace(options: &mut serde_json::Value) {
    if let Some(o) = options.as_object_mut() {
        if !o.contains_key("whitespace_pattern") && !o.contains_key("whitespace_flexible") {
            o.insert("whitespace_pattern".into(), JSON_WHITESPACE.into());
        }
    }
}

/// Compiles grammars for one model's tokenizer. Build once per model; cheap to share (`Arc`
/// inside) across requests.
pub struct ConstraintFactory {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
    eos: Arc<[u32]>,
}

impl std::fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintFactory")
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl ConstraintFactory {
    /// Builds the token trie and llguidance's parser factory for `tok`.
    ///
    /// Errors: [`ConstraintError::Setup`] if the trie or the factory cannot be built.
    pub fn new(tok: &Tokenizer) -> Result<Self, ConstraintError> {
        let env = build_tok_env(tok)?;
        let eos: Arc<[u32]> = env.tok_trie().eos_tokens().into();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Setup(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            vocab_size: tok.vocab_size(),
            eos,
        })
    }

    /// A constraint that accepts exactly the JSON documents matching `schema_json`.
    ///
    /// Whitespace between JSON tokens is bounded as llama.cpp's `json-schema-to-grammar`
    /// bounds it (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`, common/json-schema-to-grammar.cpp
    /// `SPACE_RULE`): compact and pretty-printed JSON pass, but a model cannot fill its token
    /// budget with blank lines inside the document (llguidance's default allows any run of
    /// whitespace). A schema's own `x-guidance` options are kept; the bound is added to them
    /// unless they already say how whitespace goes (`whitespace_pattern` or
    /// `whitespace_flexible`).
    ///
    /// Errors: [`ConstraintError::InvalidSchema`] with serde's or llguidance's message when the
    /// text is not JSON or not a schema llguidance can compile.
    pub fn json_schema(&self, schema_json: &str) -> Result<Constraint, ConstraintError> {
        let mut schema: serde_json::Value = serde_json::from_str(schema_json)
            .map_err(|e| ConstraintError::InvalidSchema(format!("not JSON: {e}")))?;
        if let Some(obj) = schema.as_object_mut() {
            bound_whitespace(obj.entry("x-guidance").or_insert_with(|| serde_json::json!({})));
        }
        self.grammar(TopLevelGrammar::from_json_schema(schema))
            .map_err(|e| match e {
                ConstraintError::Parser(m) => ConstraintError::InvalidSchema(m),
                e => e,
            })
    }

    /// A constraint from a Lark grammar (llguidance's dialect).
    ///
    /// Errors: [`ConstraintError::Parser`] with llguidance's message.
    pub fn lark(&self, grammar: &str) -> Result<Constraint, ConstraintError> {
        self.grammar(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    fn grammar(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Parser(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        let mask = compute_mask(&mut matcher)?;
        Ok(Constraint {
            matcher,
            mask: Some(TokenMask { vob: mask }),
            vocab_size: self.vocab_size,
            eos: self.eos.clone(),
        })
    }

    /// Vocabulary size the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

fn compute_mask(m: &mut Matcher) -> Result<SimpleVob, ConstraintError> {
    m.compute_mask_or_eos()
        .map_err(|e| ConstraintError::Parser(e.to_string()))
}

// === TokenMask ===

/// The set of token ids allowed next (a bitset over the vocabulary).
#[derive(Clone, Debug)]
pub struct TokenMask {
    vob: SimpleVob,
}

impl TokenMask {
    /// Whether `id` is allowed; ids outside the vocabulary never are.
    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.vob.len() && self.vob.is_allowed(id)
    }

    /// Number of allowed ids.
    pub fn count(&self) -> usize {
        self.vob.num_set()
    }

    /// Allowed ids in increasing order.
    pub fn allowed_ids(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.count());
        self.vob.iter_set_entries(|i| v.push(i as u32));
        v
    }

    /// Sets `logits[id] = -inf` for every disallowed id. `logits: [n_vocab]`; entries past the
    /// tokenizer's vocabulary (padding rows of the output matrix) are disallowed too.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

// === Constraint ===

/// The grammar state of one generation. Not shared between requests.
pub struct Constraint {
    matcher: Matcher,
    /// Mask for the next token, computed on first need after each commit (`None`: not yet;
    /// greedy decoding often never needs it, see [`Constraint::is_allowed`]).
    mask: Option<TokenMask>,
    vocab_size: usize,
    /// llguidance's EOS set (the tokenizer's end-of-generation ids).
    eos: Arc<[u32]>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("allowed", &self.mask.as_ref().map(TokenMask::count))
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// The mask of the ids allowed next (computed now if the last commit left it stale).
    ///
    /// Errors: [`ConstraintError::Parser`] if llguidance is in an error state or fails.
    pub fn allowed_tokens(&mut self) -> Result<&TokenMask, ConstraintError> {
        if let Some(e) = self.matcher.get_error() {
            return Err(ConstraintError::Parser(e));
        }
        let mask = match self.mask.take() {
            Some(m) => m,
            None => TokenMask {
                vob: compute_mask(&mut self.matcher)?,
            },
        };
        Ok(self.mask.insert(mask))
    }

    /// Whether `id` may come next. Without a current mask, an ordinary id (not end-of-
    /// generation, inside the vocabulary) is checked by the parser directly (llguidance
    /// `validate_tokens`: one token's bytes through the lexer and parser, instead of a mask
    /// over the whole vocabulary); other ids compute the mask. Greedy decoding uses this to
    /// skip the mask whenever the unconstrained argmax is allowed (the masked argmax is then
    /// the same token; the approach of lazy grammar masking in vLLM / XGrammar).
    pub fn is_allowed(&mut self, id: u32) -> bool {
        if let Some(m) = &self.mask {
            return m.is_allowed(id);
        }
        if (id as usize) < self.vocab_size && !self.eos.contains(&id) {
            return self.matcher.validate_tokens(&[id]).is_ok_and(|n| n == 1);
        }
        self.allowed_tokens().is_ok_and(|m| m.is_allowed(id))
    }

    /// Advances the grammar by `id`; the next mask is computed when first needed.
    ///
    /// Errors: [`ConstraintError::TokenRejected`] if `id` is not allowed here (the state is left
    /// unchanged); [`ConstraintError::Parser`] if llguidance fails.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstraintError> {
        if !self.is_allowed(id) {
            let reason = if (id as usize) >= self.vocab_size {
                format!("outside the vocabulary of {}", self.vocab_size)
            } else {
                let n = self.allowed_tokens().map_or(0, TokenMask::count);
                format!("{n} tokens are allowed at this point")
            };
            return Err(ConstraintError::TokenRejected { token: id, reason });
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| ConstraintError::Parser(e.to_string()))?;
        self.mask = None;
        Ok(())
    }

    /// Whether the grammar is complete: the parser stopped, or only EOS ids are allowed next.
    /// (llguidance stops the parser itself when only EOS can follow, so a stale mask is not
    /// computed for this.)
    pub fn is_finished(&self) -> bool {
        if self.matcher.is_stopped() {
            return true;
        }
        let Some(mask) = &self.mask else {
            return false;
        };
        let mut only_eos = true;
        mask.vob.iter_set_entries(|i| {
            if !self.eos.contains(&(i as u32)) {
                only_eos = false;
            }
        });
        only_eos && mask.count() > 0
    }

    /// Whether the grammar would accept EOS now (the text so far is a complete document).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Tokens the grammar forces next (fast-forward), without committing them. Empty when
    /// nothing is forced or on error.
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }
}
