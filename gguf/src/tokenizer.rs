//! Tokenizer built from the GGUF file's own vocabulary (no `tokenizer.json` needed).
//!
//! Supports `tokenizer.ggml.model == "gpt2"`: byte-level BPE with the vocabulary in
//! `tokenizer.ggml.tokens`, merges in `tokenizer.ggml.merges` (`"a b"` strings, rank = index) and
//! token kinds in `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined,
//! 5 unused, 6 byte). The pre-tokenizer regexes are chosen from `tokenizer.ggml.pre` exactly as
//! llama.cpp does (`src/llama-vocab.cpp`, `llm_tokenizer_bpe` and `llama_vocab::impl::load`):
//! each regex in the list splits every piece further, keeping both the matches and the gaps,
//! which is the `tokenizers` crate's `Split` with `Isolated` behaviour.
//!
//! Special tokens follow llama.cpp's `tokenizer_st_partition`: control tokens are recognised in
//! the text only when `parse_special` is set; user-defined tokens always are.

use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

pub use crate::error::TokenizerError;
use crate::reader::GgufFile;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The GPT-2 regex (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2` entry).
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// llama 3's regex as adapted by llama.cpp (case-insensitive contractions spelt out).
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's regex: like llama 3 but digits one at a time.
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's regex: Qwen2's with combining marks (`\p{M}`) kept with letters.
const RE_QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values we support, for error messages.
const SUPPORTED_PRE: &str = "default, gpt2, gpt-2, smollm, starcoder, refact, codeshell, llama3, \
                             llama-v3, llama-bpe, falcon3, lfm2, qwen2, deepseek-r1-qwen, qwen35";

/// Pre-tokenizer regexes (applied in order) and whether whole-word vocabulary hits skip the
/// merges (`ignore_merges`), for a `tokenizer.ggml.pre` value. `None` if unsupported.
fn pre_tokenizer_rules(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "default" | "" => (
            vec![
                r"[\p{P}\$\+<=>\^~\|]+",
                RE_GPT2,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            false,
        ),
        "gpt2" | "gpt-2" => (vec![RE_GPT2], false),
        "smollm" | "starcoder" | "refact" | "codeshell" => (vec![r"\p{N}", RE_GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "lfm2" => (vec![RE_LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" => (vec![RE_QWEN2], false),
        "qwen35" => (vec![RE_QWEN35], false),
        _ => return None,
    })
}

/// GPT-2's reversible byte ↔ printable-char table (`bytes_to_unicode` in OpenAI's `encoder.py`):
/// printable Latin-1 bytes map to themselves, the other bytes to U+0100 onwards in byte order.
fn byte_level_char_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0x100u32;
        let mut map = HashMap::with_capacity(256);
        for b in 0..=255u8 {
            let c = if printable(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
                next += 1;
                c
            };
            map.insert(c, b);
        }
        map
    })
}

/// Raw bytes of a byte-level token string; `None` if it holds a char outside the table.
fn byte_level_decode(text: &str) -> Option<Vec<u8>> {
    let table = byte_level_char_to_byte();
    text.chars().map(|c| table.get(&c).copied()).collect()
}

// === Tokenizer ===

/// A byte-level BPE tokenizer read from a GGUF file, matching llama.cpp's tokenization.
pub struct Tokenizer {
    /// Recognises control and user-defined tokens in text (`parse_special = true`).
    hf_special: tokenizers::Tokenizer,
    /// Recognises only user-defined tokens (`parse_special = false`).
    hf_plain: tokenizers::Tokenizer,
    texts: Vec<String>,
    bytes: Vec<Vec<u8>>,
    types: Vec<i32>,
    bos: Option<u32>,
    eos: u32,
    eog: Vec<u32>,
    add_bos: bool,
    pre: String,
    /// Texts of control and user-defined tokens (`<|im_end|>`, ...), longest first.
    special_texts: Vec<String>,
    /// No added token holds whitespace, so [`Tokenizer::encode_bounded`] may cut the text
    /// at its chunk boundaries.
    chunkable: bool,
}

/// Bytes of text [`Tokenizer::encode_bounded`] tokenizes at a time (then it cuts at the next
/// boundary, see [`next_cut`]): small enough that a prompt over the context costs one chunk
/// more than the context, large enough that the per-call overhead does not show.
pub const ENCODE_CHUNK_BYTES: usize = 16 << 10;

/// What [`Tokenizer::encode_bounded`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundedEncoding {
    /// Every token of the text: the same ids as [`Tokenizer::encode`].
    Tokens(Vec<u32>),
    /// More than the limit: `at_least` tokens in the first `bytes_read` bytes of the text,
    /// where the encoding stopped (the whole text has at least as many).
    Over { at_least: usize, bytes_read: usize },
}

/// The first position `i ≥ from` where the text may be cut without changing its tokens:
/// before a space that follows a non-whitespace character, or after a newline between two
/// non-whitespace characters; `text.len()` if there is none.
///
/// Why this is safe for every supported pre-tokenizer (`pre_tokenizer_rules`): no
/// alternative of those regexes matches a non-whitespace character followed by a space (the
/// whitespace alternatives need whitespace first; the letter, digit and punctuation runs stop
/// at a space and may only *start* with one), nor a newline followed by a non-whitespace
/// character (`\s*[\r\n]+`, `[\r\n]*` and `(?!\S)` all end at the newline; the
/// `[^\r\n\p{L}\p{N}]?` prefixes exclude it); and with non-whitespace before the newline,
/// the newline is one piece (or ends the punctuation piece before it) whether the text goes
/// on or ends there. So the pieces, and the BPE merges inside each, are the same on both
/// sides of the cut; added tokens are kept whole by refusing to chunk when one holds
/// whitespace (`Tokenizer::chunkable`). None of the regexes looks behind.
fn next_cut(text: &str, from: usize) -> usize {
    if from >= text.len() {
        return text.len();
    }
    let mut from = from.max(1);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let mut before = text[..from].chars().rev();
    let mut prev = before.next();
    let mut prev2 = before.next();
    for (off, c) in text[from..].char_indices() {
        let blank = |x: Option<char>| x.is_none_or(char::is_whitespace);
        let cut = match prev {
            Some(_) if c == ' ' => !blank(prev),
            Some('\n') => !c.is_whitespace() && !blank(prev2),
            _ => false,
        };
        if cut {
            return from + off;
        }
        prev2 = prev;
        prev = Some(c);
    }
    text.len()
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.texts.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    ///
    /// Errors: [`TokenizerError::UnsupportedModel`] unless the model is `"gpt2"`;
    /// [`TokenizerError::UnsupportedPreTokenizer`] for an unknown `tokenizer.ggml.pre`;
    /// missing/mistyped keys ([`TokenizerError::Gguf`]); inconsistent arrays, bad merges or
    /// out-of-range special ids.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let model = file.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_string(),
            });
        }
        let pre = match file.get("tokenizer.ggml.pre") {
            None => {
                tracing::warn!("GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer (quality may degrade)");
                String::new()
            }
            Some(_) => file.get_str("tokenizer.ggml.pre")?.to_string(),
        };
        let (regexes, ignore_merges) =
            pre_tokenizer_rules(&pre).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                pre: pre.clone(),
                supported: SUPPORTED_PRE,
            })?;

        let texts: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = texts.len();
        if n == 0 {
            return Err(TokenizerError::BadVocab(
                "tokenizer.ggml.tokens is empty".into(),
            ));
        }
        let types = match file.get("tokenizer.ggml.token_type") {
            None => vec![token_type::NORMAL; n],
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?,
        };
        if types.len() != n {
            return Err(TokenizerError::BadVocab(format!(
                "tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens has {n}",
                types.len()
            )));
        }
        let merges = file
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(index, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    Ok((a.to_string(), b.to_string()))
                }
                _ => Err(TokenizerError::BadMerge {
                    index,
                    merge: m.to_string(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;

        let check_id = |id: u32| {
            if (id as usize) < n {
                Ok(id)
            } else {
                Err(TokenizerError::BadSpecialId { id, vocab_size: n })
            }
        };
        let bos = file
            .get_u32_opt("tokenizer.ggml.bos_token_id")
            .map(check_id)
            .transpose()?;
        let eos = check_id(file.get_u32("tokenizer.ggml.eos_token_id")?)?;
        let eot = file
            .get_u32_opt("tokenizer.ggml.eot_token_id")
            .map(check_id)
            .transpose()?;
        let eom = file
            .get_u32_opt("tokenizer.ggml.eom_token_id")
            .map(check_id)
            .transpose()?;
        let add_bos = file
            .get_bool_opt("tokenizer.ggml.add_bos_token")
            .unwrap_or(false);

        // Raw bytes of every token: byte-level decoded for text tokens, the literal text for
        // control/user-defined ones (as llama.cpp's `token_to_piece` renders them).
        let mut bytes = Vec::with_capacity(n);
        for (id, (text, &ty)) in texts.iter().zip(&types).enumerate() {
            let b = match ty {
                token_type::CONTROL | token_type::USER_DEFINED => text.as_bytes().to_vec(),
                token_type::UNKNOWN | token_type::UNUSED => {
                    byte_level_decode(text).unwrap_or_else(|| text.as_bytes().to_vec())
                }
                _ => byte_level_decode(text).ok_or_else(|| {
                    TokenizerError::BadVocab(format!(
                        "token {id} {text:?} has a char outside the byte-level alphabet"
                    ))
                })?,
            };
            bytes.push(b);
        }

        // End-of-generation ids, as llama.cpp marks them (`special_eog_ids`).
        const EOG_TEXTS: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|eom_id|>",
            "<EOT>",
            "_<EOT>",
            "<|end_of_text|>",
            "<end_of_utterance>",
        ];
        let mut eog = vec![eos];
        for (id, text) in texts.iter().enumerate() {
            if EOG_TEXTS.contains(&text.as_str()) {
                eog.push(id as u32);
            }
        }
        eog.extend(eot);
        eog.extend(eom);
        eog.sort_unstable();
        eog.dedup();

        let mut vocab = Vocab::default();
        for (id, text) in texts.iter().enumerate() {
            if vocab.contains_key(text) {
                tracing::warn!("duplicate token text {text:?} at id {id}; BPE keeps the first id");
                continue;
            }
            vocab.insert(text.clone(), id as u32);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut pre_toks: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
        for re in regexes {
            let split = Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {re:?}: {e}")))?;
            pre_toks.push(split.into());
        }
        pre_toks.push(ByteLevel::new(false, false, false).into());

        let mut hf = tokenizers::Tokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(Sequence::new(pre_toks)));
        hf.with_decoder(Some(ByteLevelDecoder::default()));
        let added: Vec<AddedToken> = texts
            .iter()
            .zip(&types)
            .filter_map(|(text, &ty)| match ty {
                token_type::CONTROL => Some(AddedToken::from(text.clone(), true)),
                token_type::USER_DEFINED => {
                    Some(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => None,
            })
            .collect();
        // Chunked encoding cuts the text only before a space or after a newline; no added
        // token may span such a cut.
        let chunkable = !added.iter().any(|t| t.content.contains(char::is_whitespace));
        // Adding tokens whose text is already in the vocabulary reuses their ids.
        hf.add_tokens(&added);
        let mut hf_plain = hf.clone();
        hf_plain.set_encode_special_tokens(true);

        let mut special_texts: Vec<String> = texts
            .iter()
            .zip(&types)
            .filter(|(t, &ty)| (ty == 3 || ty == 4) && t.chars().count() >= 2)
            .map(|(t, _)| t.clone())
            .collect();
        special_texts.sort_by_key(|t| std::cmp::Reverse(t.len()));
        Ok(Self {
            hf_special: hf,
            hf_plain,
            texts,
            bytes,
            types,
            bos,
            eos,
            eog,
            add_bos,
            pre,
            special_texts,
            chunkable,
        })
    }

    /// `text` with every occurrence of a control or user-defined token's text (e.g.
    /// `<|im_end|>`) broken by a zero-width space after its first character, so that text
    /// from an untrusted source (a screen, a task) placed inside a chat message cannot close
    /// the turn or open a new one when the rendered prompt is tokenized with special tokens
    /// parsed. Text without such sequences is returned unchanged (borrowed).
    pub fn escape_special<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        if !self.special_texts.iter().any(|s| text.contains(s.as_str())) {
            return std::borrow::Cow::Borrowed(text);
        }
        let mut out = text.to_string();
        for s in &self.special_texts {
            if out.contains(s.as_str()) {
                let first = s.chars().next().map_or(0, char::len_utf8);
                let broken = format!("{}\u{200B}{}", &s[..first], &s[first..]);
                out = out.replace(s.as_str(), &broken);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// Token ids of `text`, with BOS prepended when `tokenizer.ggml.add_bos_token` is true.
    ///
    /// `parse_special`: recognise control tokens such as `<|im_start|>` written in the text
    /// (llama.cpp's `parse_special`); user-defined tokens are always recognised.
    /// Errors: [`TokenizerError::Encode`] if the BPE model fails (not expected for byte-level
    /// vocabularies, which cover every byte).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let hf = if parse_special {
            &self.hf_special
        } else {
            &self.hf_plain
        };
        let enc = hf
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let ids = enc.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 1);
        if self.add_bos {
            out.extend(self.bos);
        }
        out.extend_from_slice(ids);
        Ok(out)
    }

    /// [`Tokenizer::encode`] that stops once the text is known to hold more than
    /// `max_tokens` tokens (BOS included), so an over-long prompt costs about `max_tokens`
    /// tokens' worth of work and memory, not its full length. The text is tokenized in chunks
    /// of about [`ENCODE_CHUNK_BYTES`] cut where the tokens cannot change (see `next_cut`),
    /// so [`BoundedEncoding::Tokens`] holds exactly `encode`'s ids.
    ///
    /// Bound: a text with no space after a non-blank and no newline before one (or a
    /// vocabulary with an added token holding whitespace) is tokenized whole, as `encode`
    /// does; callers bound its length first (bytes / [`Tokenizer::max_token_bytes`]).
    /// Errors: as [`Tokenizer::encode`].
    pub fn encode_bounded(
        &self,
        text: &str,
        parse_special: bool,
        max_tokens: usize,
    ) -> Result<BoundedEncoding, TokenizerError> {
        self.encode_bounded_in(text, parse_special, max_tokens, ENCODE_CHUNK_BYTES)
    }

    /// [`Tokenizer::encode_bounded`] with chunks of about `chunk_bytes` (tests use tiny ones
    /// to cut at every boundary).
    #[doc(hidden)]
    pub fn encode_bounded_in(
        &self,
        text: &str,
        parse_special: bool,
        max_tokens: usize,
        chunk_bytes: usize,
    ) -> Result<BoundedEncoding, TokenizerError> {
        let over = |ids: &[u32], bytes_read: usize| BoundedEncoding::Over {
            at_least: ids.len(),
            bytes_read,
        };
        if !self.chunkable {
            let ids = self.encode(text, parse_special)?;
            return Ok(if ids.len() > max_tokens {
                over(&ids, text.len())
            } else {
                BoundedEncoding::Tokens(ids)
            });
        }
        let hf = if parse_special {
            &self.hf_special
        } else {
            &self.hf_plain
        };
        let mut out = Vec::new();
        if self.add_bos {
            out.extend(self.bos);
        }
        let mut start = 0;
        while start < text.len() {
            let end = next_cut(text, start + chunk_bytes.max(1));
            let enc = hf
                .encode_fast(&text[start..end], false)
                .map_err(|e| TokenizerError::Encode(e.to_string()))?;
            out.extend_from_slice(enc.get_ids());
            start = end;
            if out.len() > max_tokens {
                return Ok(over(&out, end));
            }
        }
        Ok(BoundedEncoding::Tokens(out))
    }

    /// Text of `ids`: the concatenated [`Tokenizer::token_bytes`], invalid UTF-8 replaced by
    /// U+FFFD. Control tokens are rendered as their text; unknown ids render as nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::new();
        for &id in ids {
            buf.extend_from_slice(self.token_bytes_ref(id));
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Raw bytes of token `id` (byte-level decoded; a control token's text). Empty for ids
    /// outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }

    /// Borrowed form of [`Tokenizer::token_bytes`].
    pub fn token_bytes_ref(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The token's string as stored in the GGUF (byte-level form, e.g. `"Ġthe"`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id whose GGUF string is exactly `text` (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.hf_special.token_to_id(text)
    }

    /// `tokenizer.ggml.token_type` of `id` (see [`token_type`]); `None` outside the vocabulary.
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }

    /// Whether `id` is a control token (`<|im_start|>`, `<|endoftext|>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_type(id) == Some(token_type::CONTROL)
    }

    /// `tokenizer.ggml.bos_token_id`, if any.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// End-of-generation ids, sorted: EOS, EOT/EOM and the tokens llama.cpp recognises by text
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, ...).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Number of tokens in the GGUF vocabulary.
    /// The longest token, in bytes of text (special tokens by their text). A text of `n`
    /// bytes encodes to at least `n / max_token_bytes()` tokens (byte-level BPE has no
    /// normaliser that shortens text), which lets a caller refuse an over-long prompt before
    /// tokenizing it.
    pub fn max_token_bytes(&self) -> usize {
        let special = self.special_texts.iter().map(String::len);
        self.bytes.iter().map(Vec::len).chain(special).max().unwrap_or(1).max(1)
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// `tokenizer.ggml.pre` ("" when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }

    /// The underlying `tokenizers` tokenizer (control tokens recognised in text).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.hf_special
    }
}

// === IncrementalDecoder ===

/// Turns a stream of token ids into text, emitting only complete UTF-8 characters.
///
/// A multi-byte character split across tokens is held back until its last byte arrives.
/// Bytes that can never become valid UTF-8 are emitted as U+FFFD at once.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends token `id`'s bytes; returns the newly completed text (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.push_bytes(tok.token_bytes_ref(id))
    }

    /// Appends raw bytes; returns the newly completed text (possibly empty).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `valid_up_to` bytes are valid UTF-8 by construction.
                    out.push_str(&String::from_utf8_lossy(
                        &self.pending[start..start + valid],
                    ));
                    start += valid;
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => break,
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Flushes what is held back (incomplete characters become U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_over_256_bytes() {
        let t = byte_level_char_to_byte();
        assert_eq!(t.len(), 256);
        let mut seen = [false; 256];
        for &b in t.values() {
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }

    #[test]
    fn incremental_decoder_holds_back_split_characters() {
        let mut d = IncrementalDecoder::new();
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(d.push_bytes(b"a"), "a");
        assert_eq!(d.push_bytes(&euro[..1]), "");
        assert_eq!(d.push_bytes(&euro[1..2]), "");
        assert_eq!(d.push_bytes(&[euro[2], b'b']), "€b");
        assert!(d.pending().is_empty());
        // An invalid byte is replaced immediately, not held back.
        assert_eq!(d.push_bytes(&[0xFF, b'c']), "\u{FFFD}c");
        assert_eq!(d.push_bytes(&euro[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn cuts_fall_before_a_space_or_after_a_newline() {
        let t = "ab  cd\n\nef gh\nij";
        let cuts: Vec<usize> = (0..t.len()).map(|i| next_cut(t, i)).collect();
        // Before the space at 2 (after 'b') and at 10 (after 'f'), after the newline at 13
        // (between 'h' and 'i'); not after "\n\n" (whitespace before the newline).
        assert_eq!(cuts, vec![2, 2, 2, 10, 10, 10, 10, 10, 10, 10, 10, 14, 14, 14, 14, 16]);
        assert_eq!(next_cut("é é", 1), 2, "a cut is never inside a character");
        assert_eq!(next_cut("aaaa", 1), 4);
    }

    #[test]
    fn unknown_pre_tokenizer_is_rejected() {
        assert!(pre_tokenizer_rules("no-such-pre").is_none());
        assert!(pre_tokenizer_rules("smollm").is_some());
        assert!(pre_tokenizer_rules("qwen35").is_some());
    }
}
