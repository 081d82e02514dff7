//! `tandem-tools draft-vocab`: adds a trimmed draft vocabulary to a GGUF model, the input of
//! the `mtp-trimmed` drafter (issue 5; DESIGN.md "Within-request: speculative decoding";
//! Tandem §3.3, §4.3).
//!
//! The MTP drafter scores every vocabulary row on each draft; a trimmed head scores only the
//! top N rows (default 32,768), which the agent's short JSON actions almost never leave. The
//! tool ranks the token ids, keeps the first N and writes, with
//! [`gguf::writer`]:
//!
//! - tensor `blk.{L}.nextn.draft_output.weight` ([`draft_tensor_name`]), L = the first MTP
//!   layer = `{arch}.block_count − {arch}.nextn_predict_layers`: the selected rows of the LM
//!   head (`output.weight`, else the tied `token_embd.weight`) in rank order, copied byte for
//!   byte (a quantized row is whole blocks, so the subset is exact), same ggml type, GGUF dims
//!   `[n_embd, N]`;
//! - metadata `{arch}.nextn_draft_token_ids` ([`draft_ids_key`]): UINT32 array of length N,
//!   the original token id of each row, same order. The drafter maps its choice back with it.
//!
//! Everything else in the file is unchanged. Ranking ([`rank_tokens`]): control tokens, then
//! byte tokens ([`is_byte_token`]), each by id; then tokens by their count in the corpus of
//! agent outputs ([`corpus_output_counts`]: every recorded action of every corpus episode as
//! the compact JSON the agent emits, tokenized with the model's own tokenizer), most frequent
//! first, ties by id; then the remaining tokens by id.
//!
//! `--top` above the vocabulary size is clamped to it with a warning (every row is kept, in
//! rank order); `--top 0` is an error.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_gateway::corpus::{load_episodes, Episode};
use agent_gateway::error::CorpusError;
use gguf::reader::{GgufError, GgufFile, MetaValue};
use gguf::tokenizer::{token_type, Tokenizer, TokenizerError};
use gguf::writer::{write_with_additions, Additions, GgufWriteError, NewTensor};

/// Default number of draft rows (Tandem's trimmed head).
pub const DEFAULT_TOP: usize = 32_768;

/// Name of the draft output matrix for first MTP layer `layer`.
pub fn draft_tensor_name(layer: u32) -> String {
    format!("blk.{layer}.nextn.draft_output.weight")
}

/// Metadata key of the draft rows' original token ids for architecture `arch`.
pub fn draft_ids_key(arch: &str) -> String {
    format!("{arch}.nextn_draft_token_ids")
}

/// Options of `tandem-tools draft-vocab`.
#[derive(Clone, Debug, clap::Args)]
pub struct DraftVocabArgs {
    /// GGUF model with MTP (nextn) layers, e.g. a Qwen3.5 GGUF.
    #[arg(long)]
    pub model: PathBuf,
    /// Output GGUF: the model plus the draft vocabulary (written to OUT.tmp, then renamed).
    #[arg(long)]
    pub out: PathBuf,
    /// Rows of the draft output matrix (N). Above the vocabulary size it is clamped, with a
    /// warning.
    #[arg(long, default_value_t = DEFAULT_TOP)]
    pub top: usize,
    /// Corpus folder whose episodes' recorded actions rank the tokens.
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    pub corpus: PathBuf,
    /// Replace a draft vocabulary the model already has.
    #[arg(long)]
    pub force: bool,
}

/// Errors of `draft-vocab`.
#[derive(Debug, thiserror::Error)]
pub enum DraftVocabError {
    #[error("model {path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
    #[error("model {path}: tokenizer: {source}")]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: TokenizerError,
    },
    #[error("corpus: {0}")]
    Corpus(#[from] CorpusError),
    /// The model has no MTP block to draft with.
    #[error("model {path} has no MTP (nextn) layers: {key} is {found}, expected at least 1")]
    NoNextn {
        path: PathBuf,
        key: String,
        found: String,
    },
    /// `nextn_predict_layers` leaves no main layer before the MTP block.
    #[error(
        "model {path}: {arch}.nextn_predict_layers = {nextn} must be below {arch}.block_count = {blocks}"
    )]
    BadLayerCount {
        path: PathBuf,
        arch: String,
        blocks: u32,
        nextn: u32,
    },
    /// The model already has a draft vocabulary and `--force` is not set.
    #[error("model {path} already has {what} {name:?}; pass --force to replace it")]
    AlreadyHasDraft {
        path: PathBuf,
        what: &'static str,
        name: String,
    },
    /// The LM head is not a matrix.
    #[error("model {path}: LM head {tensor:?} has GGUF dims {dims:?}; expected [n_embd, n_vocab]")]
    LmHeadNotMatrix {
        path: PathBuf,
        tensor: String,
        dims: Vec<u64>,
    },
    /// The tokenizer has more tokens than the LM head has rows.
    #[error("model {path}: the tokenizer has {vocab} tokens but LM head {tensor:?} has only {rows} rows")]
    VocabExceedsLmHead {
        path: PathBuf,
        tensor: String,
        rows: usize,
        vocab: usize,
    },
    /// A draft id names no LM-head row.
    #[error("draft token id {id} is outside the LM head's {n_vocab} rows")]
    IdOutOfRange { id: u32, n_vocab: usize },
    #[error("--top must be at least 1")]
    TopZero,
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: Box<GgufWriteError>,
    },
}

// === the model's draft head ===

/// Where the draft vocabulary goes in a model, from its metadata and tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftHead {
    /// `general.architecture`.
    pub arch: String,
    /// First MTP layer, `block_count − nextn_predict_layers`.
    pub layer: u32,
    /// The LM head tensor the rows come from (`output.weight` or `token_embd.weight`).
    pub lm_head: String,
    /// Rows of the LM head (the model's vocabulary size).
    pub n_vocab: usize,
    /// Row length in elements (GGUF `dims[0]`).
    pub n_embd: u64,
}

/// Finds the first MTP layer and the LM head of `file` (opened from `path`, for messages).
///
/// Errors: [`DraftVocabError::NoNextn`] when `{arch}.nextn_predict_layers` is absent or 0,
/// [`DraftVocabError::BadLayerCount`], [`DraftVocabError::LmHeadNotMatrix`], and missing or
/// mistyped keys and tensors ([`DraftVocabError::Model`]).
pub fn draft_head(file: &GgufFile, path: &Path) -> Result<DraftHead, DraftVocabError> {
    let model = |source| DraftVocabError::Model {
        path: path.to_path_buf(),
        source,
    };
    let arch = file.architecture().map_err(model)?.to_string();
    let nextn_key = format!("{arch}.nextn_predict_layers");
    let nextn = match file.get(&nextn_key) {
        None => None,
        Some(_) => Some(file.get_u32(&nextn_key).map_err(model)?),
    };
    let nextn = match nextn {
        Some(n) if n > 0 => n,
        _ => {
            let found = nextn.map_or("absent".to_string(), |n| n.to_string());
            return Err(DraftVocabError::NoNextn {
                path: path.to_path_buf(),
                key: nextn_key,
                found,
            });
        }
    };
    let blocks = file
        .get_u32(&format!("{arch}.block_count"))
        .map_err(model)?;
    if nextn >= blocks {
        return Err(DraftVocabError::BadLayerCount {
            path: path.to_path_buf(),
            arch,
            blocks,
            nextn,
        });
    }
    let lm_head = if file.tensor_opt("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let t = file.tensor(lm_head).map_err(model)?;
    let [n_embd, n_vocab] = t.dims[..] else {
        return Err(DraftVocabError::LmHeadNotMatrix {
            path: path.to_path_buf(),
            tensor: lm_head.to_string(),
            dims: t.dims.clone(),
        });
    };
    Ok(DraftHead {
        arch,
        layer: blocks - nextn,
        lm_head: lm_head.to_string(),
        n_vocab: n_vocab as usize,
        n_embd,
    })
}

// === ranking ===

/// Token counts over the corpus of agent outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputCounts {
    /// `counts[id]`: occurrences of token `id`; length = the vocabulary size given.
    pub counts: Vec<u64>,
    /// Sum of `counts` (output tokens in the corpus).
    pub total: u64,
    /// Recorded actions tokenized.
    pub n_actions: usize,
}

/// Counts the tokens of every recorded action of every episode, rendered as the agent emits
/// it (the compact AndroidWorld JSON of [`agent_gateway::action::Action::to_compact_json`], stored in
/// [`agent_gateway::corpus::EpisodeStepData::recorded_action`]), tokenized with `tok` without special
/// tokens and without the BOS that `tok` may prepend. Ids ≥ `n_vocab` are not counted.
///
/// Errors: [`TokenizerError::Encode`] if the tokenizer fails.
pub fn corpus_output_counts(
    episodes: &[Episode],
    tok: &Tokenizer,
    n_vocab: usize,
) -> Result<OutputCounts, TokenizerError> {
    let mut counts = vec![0u64; n_vocab];
    let mut n_actions = 0;
    for action in episodes
        .iter()
        .flat_map(|e| &e.steps)
        .filter_map(|s| s.recorded_action.as_deref())
    {
        let ids = tok.encode(action, false)?;
        let body = match (tok.add_bos(), tok.bos(), ids.first()) {
            (true, Some(bos), Some(&first)) if first == bos => &ids[1..],
            _ => &ids[..],
        };
        for &id in body {
            if let Some(c) = counts.get_mut(id as usize) {
                *c += 1;
            }
        }
        n_actions += 1;
    }
    let total = counts.iter().sum();
    Ok(OutputCounts {
        counts,
        total,
        n_actions,
    })
}

/// Whether `id` is a byte token: `tokenizer.ggml.token_type` BYTE, a byte-fallback token
/// `<0xNN>`, or — in a byte-level BPE vocabulary, which has neither — a normal token of
/// exactly one byte (the 256 base tokens every text can be spelt with).
pub fn is_byte_token(tok: &Tokenizer, id: u32) -> bool {
    let byte_fallback = |t: &str| {
        t.len() == 6
            && t.starts_with("<0x")
            && t.ends_with('>')
            && t[3..5].chars().all(|c| c.is_ascii_hexdigit())
    };
    match tok.token_type(id) {
        Some(token_type::BYTE) => true,
        Some(token_type::NORMAL) => {
            tok.token_text(id).is_some_and(byte_fallback) || tok.token_bytes_ref(id).len() == 1
        }
        _ => false,
    }
}

/// Every id in `0..n_vocab` in draft-vocabulary order: control tokens, then byte tokens
/// ([`is_byte_token`]), each by id; then tokens with `counts[id] > 0`, most frequent first,
/// ties by id; then the rest by id (including rows past the tokenizer's vocabulary).
/// `counts` shorter than `n_vocab` counts the missing ids as 0.
pub fn rank_tokens(tok: &Tokenizer, n_vocab: usize, counts: &[u64]) -> Vec<u32> {
    let ids = 0..n_vocab as u32;
    let count = |id: u32| counts.get(id as usize).copied().unwrap_or(0);
    let mut ranked: Vec<u32> = ids.clone().filter(|&id| tok.is_control(id)).collect();
    ranked.extend(
        ids.clone()
            .filter(|&id| !tok.is_control(id) && is_byte_token(tok, id)),
    );
    let mut taken: HashSet<u32> = ranked.iter().copied().collect();
    let mut frequent: Vec<u32> = ids
        .clone()
        .filter(|&id| count(id) > 0 && !taken.contains(&id))
        .collect();
    frequent.sort_by_key(|&id| (std::cmp::Reverse(count(id)), id));
    taken.extend(frequent.iter().copied());
    ranked.extend(frequent);
    ranked.extend(ids.filter(|id| !taken.contains(id)));
    ranked
}

// === writing ===

/// Writes `file` (opened from `path`) to `out` with the draft rows `ids` of `head`'s LM head
/// and their ids added (see the module docs). `force` replaces an existing draft tensor/key.
///
/// Errors: [`DraftVocabError::AlreadyHasDraft`] without `force`; ids outside the LM head
/// ([`DraftVocabError::IdOutOfRange`]); the writer's errors ([`DraftVocabError::Write`]),
/// e.g. an empty `ids` (an empty array has no element type).
pub fn write_draft_vocab(
    file: &GgufFile,
    path: &Path,
    head: &DraftHead,
    ids: &[u32],
    out: &Path,
    force: bool,
) -> Result<gguf::writer::WriteSummary, DraftVocabError> {
    if !force {
        check_no_draft(file, path, head)?;
    }
    let lm = file
        .tensor(&head.lm_head)
        .map_err(|source| DraftVocabError::Model {
            path: path.to_path_buf(),
            source,
        })?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= head.n_vocab) {
        return Err(DraftVocabError::IdOutOfRange {
            id,
            n_vocab: head.n_vocab,
        });
    }
    // Rows are whole blocks (checked when the file was opened), so this divides exactly.
    let row_bytes = lm.data.len() / head.n_vocab.max(1);
    let chunks: Vec<&[u8]> = ids
        .iter()
        .map(|&id| &lm.data[id as usize * row_bytes..(id as usize + 1) * row_bytes])
        .collect();
    let add = Additions {
        kvs: vec![(
            draft_ids_key(&head.arch),
            MetaValue::Array(ids.iter().map(|&id| MetaValue::U32(id)).collect()),
        )],
        tensors: vec![NewTensor {
            name: draft_tensor_name(head.layer),
            ty: lm.ty,
            dims: vec![head.n_embd, ids.len() as u64],
            chunks,
        }],
        replace: force,
    };
    write_with_additions(file, out, &add).map_err(|source| DraftVocabError::Write {
        path: out.to_path_buf(),
        source: Box::new(source),
    })
}

/// Errors with [`DraftVocabError::AlreadyHasDraft`] if `file` has the draft tensor or key.
fn check_no_draft(file: &GgufFile, path: &Path, head: &DraftHead) -> Result<(), DraftVocabError> {
    let tensor = draft_tensor_name(head.layer);
    if file.tensor_opt(&tensor).is_some() {
        return Err(DraftVocabError::AlreadyHasDraft {
            path: path.to_path_buf(),
            what: "tensor",
            name: tensor,
        });
    }
    let key = draft_ids_key(&head.arch);
    if file.get(&key).is_some() {
        return Err(DraftVocabError::AlreadyHasDraft {
            path: path.to_path_buf(),
            what: "metadata key",
            name: key,
        });
    }
    Ok(())
}

// === the command ===

/// What `draft-vocab` did.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftVocabSummary {
    pub out: PathBuf,
    /// Draft rows written (N after clamping).
    pub rows: usize,
    /// `--top` as given, when it was clamped to the vocabulary size.
    pub clamped_from: Option<usize>,
    pub n_vocab: usize,
    /// The first MTP layer and the LM head the rows came from.
    pub layer: u32,
    pub lm_head: String,
    /// Bytes of the draft matrix, and output size − input size (matrix, ids, padding).
    pub tensor_bytes: u64,
    pub bytes_added: i64,
    /// Leading rows that are control or byte tokens.
    pub n_special: usize,
    /// Corpus output tokens, and how many of them the draft vocabulary holds.
    pub corpus_tokens: u64,
    pub covered_tokens: u64,
    pub n_actions: usize,
    pub elapsed: Duration,
}

impl DraftVocabSummary {
    /// Share of the corpus output tokens in the draft vocabulary, in percent; `None` for an
    /// empty corpus.
    pub fn coverage_pct(&self) -> Option<f64> {
        (self.corpus_tokens > 0)
            .then(|| 100.0 * self.covered_tokens as f64 / self.corpus_tokens as f64)
    }
}

impl fmt::Display for DraftVocabSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let coverage = self
            .coverage_pct()
            .map_or("n/a".to_string(), |p| format!("{p:.2}%"));
        write!(
            f,
            "draft-vocab: wrote {} rows of {} ({} control/byte first) from {} as blk.{}.nextn.draft_output.weight to {}: \
             +{:.2} MiB (matrix {:.2} MiB); covers {coverage} of {} corpus output tokens ({}/{} tokens, {} actions); {:.1} s",
            self.rows,
            self.n_vocab,
            self.n_special,
            self.lm_head,
            self.layer,
            self.out.display(),
            self.bytes_added as f64 / (1 << 20) as f64,
            self.tensor_bytes as f64 / (1 << 20) as f64,
            self.corpus_tokens,
            self.covered_tokens,
            self.corpus_tokens,
            self.n_actions,
            self.elapsed.as_secs_f64(),
        )?;
        if let Some(top) = self.clamped_from {
            write!(f, " (--top {top} clamped to the vocabulary)")?;
        }
        Ok(())
    }
}

/// Runs `draft-vocab`: opens the model, checks it has MTP layers (and no draft vocabulary
/// unless `--force`), ranks the tokens by the corpus outputs, writes `--out`.
///
/// Errors: see [`DraftVocabError`]; nothing is written on error.
pub fn run(args: &DraftVocabArgs) -> Result<DraftVocabSummary, DraftVocabError> {
    let start = Instant::now();
    if args.top == 0 {
        return Err(DraftVocabError::TopZero);
    }
    let path = args.model.as_path();
    let file = GgufFile::open(path).map_err(|source| DraftVocabError::Model {
        path: path.to_path_buf(),
        source,
    })?;
    let head = draft_head(&file, path)?;
    if !args.force {
        check_no_draft(&file, path, &head)?; // before the slow part (tokenizer, corpus)
    }
    let tok = Tokenizer::from_gguf(&file).map_err(|source| DraftVocabError::Tokenizer {
        path: path.to_path_buf(),
        source,
    })?;
    if tok.vocab_size() > head.n_vocab {
        return Err(DraftVocabError::VocabExceedsLmHead {
            path: path.to_path_buf(),
            tensor: head.lm_head.clone(),
            rows: head.n_vocab,
            vocab: tok.vocab_size(),
        });
    }
    let rows = args.top.min(head.n_vocab);
    let clamped_from = (rows < args.top).then_some(args.top);
    if let Some(top) = clamped_from {
        tracing::warn!(
            top,
            n_vocab = head.n_vocab,
            "--top exceeds the vocabulary; keeping every row"
        );
    }

    let episodes = load_episodes(&args.corpus)?;
    let counts = corpus_output_counts(&episodes, &tok, head.n_vocab).map_err(|source| {
        DraftVocabError::Tokenizer {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let mut ranked = rank_tokens(&tok, head.n_vocab, &counts.counts);
    ranked.truncate(rows);
    tracing::info!(
        rows,
        n_vocab = head.n_vocab,
        actions = counts.n_actions,
        corpus_tokens = counts.total,
        out = %args.out.display(),
        "ranked the draft vocabulary; writing"
    );
    let n_special = ranked
        .iter()
        .take_while(|&&id| tok.is_control(id) || is_byte_token(&tok, id))
        .count();
    let covered_tokens = ranked.iter().map(|&id| counts.counts[id as usize]).sum();

    let written = write_draft_vocab(&file, path, &head, &ranked, &args.out, args.force)?;
    let row_bytes = file
        .tensor(&head.lm_head)
        .map(|t| t.data.len() / head.n_vocab)
        .unwrap_or(0);
    Ok(DraftVocabSummary {
        out: args.out.clone(),
        rows,
        clamped_from,
        n_vocab: head.n_vocab,
        layer: head.layer,
        lm_head: head.lm_head,
        tensor_bytes: (rows * row_bytes) as u64,
        bytes_added: written.file_bytes as i64 - file.file_bytes() as i64,
        n_special,
        corpus_tokens: counts.total,
        covered_tokens,
        n_actions: counts.n_actions,
        elapsed: start.elapsed(),
    })
}
