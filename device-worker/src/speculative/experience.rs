//! PastForward's decoding experience memory (PastForward §3.2, "Decoding experience memory"
//! and "Context-compatible retrieval"): earlier outputs, indexed at every position by the
//! token and the final hidden state, propose the continuation of the most similar position.
//!
//! Layout. Every stored output is appended once to one shared token array as
//! `[last prompt token, output[0], …, output[T-1]]` (the last prompt token is the position
//! whose hidden state predicted `output[0]`). Each position `p` that was fed to the model has an
//! *entry*: the token at `p`, its unit-normalised hidden state `h_p` (`[n_embd]` f32, so cosine
//! similarity is a dot product) and the output's end (boundary) `b`. An entry at `p` proposes
//! tokens `p+2 .. min(p+2+max, b)`: the token at `p+1` is the one the target just chose, and a
//! proposal never crosses into the next output.
//!
//! Retrieval. A query is `(a, b, h)`: `a` the last fed token, `b` the token the target chose
//! after it, `h` the hidden state of `a`. The index maps `(a, b)` to the ids of the entries
//! with token `a` followed by `b`, so a lookup costs one dot product per such candidate, never
//! a scan of the memory. The highest cosine wins (the most recent on ties).
//!
//! Bound. [`ExperienceMemory::bytes`] counts the payload (tokens, keys, entry metadata and
//! index ids); when a new output pushes it over `max_bytes`, whole outputs are evicted oldest
//! first (FIFO) and their index ids removed.
//!
//! File format (version 1, little-endian): magic `b"TDXM"`, `u32` version, `u32` n_embd,
//! `u64` n_outputs, then per output `u32` n (array length, ≥ 2), `n × u32` tokens and
//! `(n−1) × n_embd × f32` unit keys, then a `u64` FNV-1a-64 checksum of every byte before it.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{Draft, DraftRequest, Drafter, DrafterKind, SpecError};

/// Number of similarity buckets a draft from the experience memory falls in (see
/// [`similarity_bucket`]).
pub const N_BUCKETS: usize = 4;

/// Upper cosine bounds of buckets `0..N_BUCKETS-1`; the last bucket is `≥ 0.95`.
const BUCKET_UPPER: [f32; N_BUCKETS - 1] = [0.5, 0.8, 0.95];

/// The acceptance bucket of a cosine similarity: 0 for `< 0.5`, 1 for `< 0.8`, 2 for `< 0.95`,
/// 3 for `≥ 0.95` (NaN falls in bucket 0). Acceptance rises with similarity (PastForward §3.2
/// conditions its acceptance estimator on the retrieval similarity `s_d`).
pub fn similarity_bucket(cosine: f32) -> usize {
    BUCKET_UPPER
        .iter()
        .position(|&upper| cosine.is_nan() || cosine < upper)
        .unwrap_or(N_BUCKETS - 1)
}

/// File magic: "TanDem eXperience Memory".
const MAGIC: [u8; 4] = *b"TDXM";
/// File format version written and read.
const VERSION: u32 = 1;

/// Payload bytes per stored token (`u32`).
const TOKEN_BYTES: usize = std::mem::size_of::<u32>();
/// Payload bytes per entry besides its key: the `Entry` record plus its id in the index.
const ENTRY_META_BYTES: usize = std::mem::size_of::<Entry>() + std::mem::size_of::<u64>();
/// Payload bytes per stored output (its `Span` record).
const OUTPUT_BYTES: usize = std::mem::size_of::<Span>();

/// One indexed position.
#[derive(Clone, Debug)]
struct Entry {
    /// Absolute position of the entry's token in the shared array.
    pos: u64,
    /// Absolute end (exclusive) of the output the position belongs to.
    end: u64,
    /// Unit-normalised hidden state `[n_embd]` (all zeros when the state had norm 0).
    key: Box<[f32]>,
}

/// One stored output in the shared array.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// Absolute position of its first token.
    start: u64,
    /// Its token count (`n_entries + 1`).
    len: usize,
    /// Absolute id of its first entry.
    first_entry: u64,
}

/// PastForward's decoding experience memory (`M_dec`, PastForward §3.2), a [`Drafter`].
///
/// Bounded by `max_bytes` of payload (see [`ExperienceMemory::bytes`]); outputs are evicted
/// whole, oldest first. Persist with [`ExperienceMemory::save`] / [`ExperienceMemory::load`].
#[derive(Debug)]
pub struct ExperienceMemory {
    n_embd: usize,
    max_bytes: usize,
    min_similarity: f32,
    /// Shared token array (absolute position `tokens_base + i` is `tokens[i]`).
    tokens: VecDeque<u32>,
    tokens_base: u64,
    /// Entries in id order (absolute id `entries_base + i` is `entries[i]`).
    entries: VecDeque<Entry>,
    entries_base: u64,
    /// Stored outputs, oldest first.
    spans: VecDeque<Span>,
    /// `(token, next token)` → ids of the entries at such positions, oldest first.
    index: HashMap<(u32, u32), VecDeque<u64>>,
    bytes: usize,
}

// === impl ExperienceMemory ===

impl ExperienceMemory {
    /// An empty memory for hidden states of `n_embd` floats, holding at most `max_bytes` of
    /// payload. `min_similarity` starts at 0.0. With `n_embd == 0` nothing is ever stored.
    pub fn new(n_embd: usize, max_bytes: usize) -> Self {
        ExperienceMemory {
            n_embd,
            max_bytes,
            min_similarity: 0.0,
            tokens: VecDeque::new(),
            tokens_base: 0,
            entries: VecDeque::new(),
            entries_base: 0,
            spans: VecDeque::new(),
            index: HashMap::new(),
            bytes: 0,
        }
    }

    /// Proposals whose best cosine similarity is below `min_similarity` (in `[-1, 1]`) are
    /// not made. Default 0.0.
    pub fn with_min_similarity(mut self, min_similarity: f32) -> Self {
        self.min_similarity = min_similarity;
        self
    }

    /// Hidden size the keys have (floats per key).
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// The payload bound in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Payload bytes held: `4·n_tokens + n_entries·(4·n_embd + 40) + n_outputs·24` on 64-bit
    /// targets (tokens, keys, entry records and their index ids, output records; allocator and
    /// hash-map overhead not counted).
    /// Always `≤ max_bytes`.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Outputs held.
    pub fn n_outputs(&self) -> usize {
        self.spans.len()
    }

    /// Tokens in the shared array (each output counts `1 + T`: its last prompt token and its
    /// `T` output tokens).
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Indexed positions (each output counts `T`).
    pub fn n_entries(&self) -> usize {
        self.entries.len()
    }

    /// Store a finished request's output (what [`Drafter::finish`] does, with errors).
    ///
    /// `prompt_hidden` `[n_embd]` is the final hidden state of the last prompt token, `hidden`
    /// `[output.len()-1, n_embd]` those of the output tokens that were fed. Outputs with fewer
    /// than 2 tokens (nothing to propose from them) and an empty prompt's missing first
    /// position are skipped. An output whose payload alone exceeds `max_bytes` is not stored;
    /// otherwise the oldest outputs are evicted until it fits.
    ///
    /// Errors: [`SpecError::ShapeMismatch`] for a wrong slice length,
    /// [`SpecError::NonFiniteHidden`] for NaN/∞ in a state; the memory is unchanged then.
    pub fn insert(
        &mut self,
        prompt: &[u32],
        prompt_hidden: &[f32],
        output: &[u32],
        hidden: &[f32],
    ) -> Result<(), SpecError> {
        let n = self.n_embd;
        let want_hidden = output.len().saturating_sub(1) * n;
        if hidden.len() != want_hidden {
            return Err(SpecError::ShapeMismatch {
                what: "output hidden states [output.len()-1, n_embd]",
                expected: want_hidden,
                actual: hidden.len(),
            });
        }
        if prompt_hidden.len() != n {
            return Err(SpecError::ShapeMismatch {
                what: "last prompt token hidden state [n_embd]",
                expected: n,
                actual: prompt_hidden.len(),
            });
        }
        // Array [last prompt token, output...] with one key per position but the last.
        let (seq, raw_keys): (Vec<u32>, Vec<&[f32]>) = match prompt.last() {
            Some(&last) => (
                std::iter::once(last)
                    .chain(output.iter().copied())
                    .collect(),
                std::iter::once(prompt_hidden)
                    .chain(rows(hidden, n))
                    .collect(),
            ),
            None => (output.to_vec(), rows(hidden, n).collect()),
        };
        if seq.len() < 3 {
            // At most one entry whose continuation after `next` is empty: nothing to propose.
            return Ok(());
        }
        let mut keys = Vec::with_capacity(raw_keys.len());
        for (row, raw) in raw_keys.iter().enumerate() {
            if raw.iter().any(|v| !v.is_finite()) {
                let what = if prompt.is_empty() || row > 0 {
                    "output hidden state"
                } else {
                    "last prompt token hidden state"
                };
                return Err(SpecError::NonFiniteHidden { what, row });
            }
            keys.push(normalized(raw));
        }
        self.push_output(seq, keys);
        Ok(())
    }

    /// Payload bytes of one output of `len` array tokens.
    fn output_bytes(&self, len: usize) -> usize {
        len * TOKEN_BYTES + (len - 1) * (self.n_embd * 4 + ENTRY_META_BYTES) + OUTPUT_BYTES
    }

    /// Append `seq` (`len ≥ 2`) with its `len − 1` unit keys, evicting old outputs to fit.
    fn push_output(&mut self, seq: Vec<u32>, keys: Vec<Box<[f32]>>) {
        if self.n_embd == 0 || seq.len() < 2 || keys.len() != seq.len() - 1 {
            return; // No similarity to rank by, or nothing to index.
        }
        let need = self.output_bytes(seq.len());
        if need > self.max_bytes {
            tracing::debug!(
                need,
                max_bytes = self.max_bytes,
                "experience memory: output larger than the bound, not stored"
            );
            return;
        }
        while self.bytes + need > self.max_bytes {
            self.evict_oldest();
        }
        let start = self.tokens_base + self.tokens.len() as u64;
        let end = start + seq.len() as u64;
        let first_entry = self.entries_base + self.entries.len() as u64;
        for (j, key) in keys.into_iter().enumerate() {
            let id = first_entry + j as u64;
            self.index
                .entry((seq[j], seq[j + 1]))
                .or_default()
                .push_back(id);
            self.entries.push_back(Entry {
                pos: start + j as u64,
                end,
                key,
            });
        }
        self.spans.push_back(Span {
            start,
            len: seq.len(),
            first_entry,
        });
        self.tokens.extend(seq.iter().copied());
        self.bytes += need;
    }

    /// Drop the oldest output, its entries and their index ids.
    fn evict_oldest(&mut self) {
        let Some(span) = self.spans.pop_front() else {
            return;
        };
        debug_assert_eq!(span.start, self.tokens_base);
        debug_assert_eq!(span.first_entry, self.entries_base);
        for j in 0..span.len - 1 {
            let id = span.first_entry + j as u64;
            let key = (
                self.token_at(span.start + j as u64),
                self.token_at(span.start + j as u64 + 1),
            );
            if let Some(ids) = self.index.get_mut(&key) {
                // Ids are pushed in increasing order and the oldest output goes first, so the
                // id is at the front.
                debug_assert_eq!(ids.front(), Some(&id));
                ids.pop_front();
                if ids.is_empty() {
                    self.index.remove(&key);
                }
            }
        }
        self.entries.drain(..span.len - 1);
        self.entries_base += (span.len - 1) as u64;
        self.tokens.drain(..span.len);
        self.tokens_base += span.len as u64;
        self.bytes -= self.output_bytes(span.len);
    }

    /// Token at absolute position `pos` (must be live).
    fn token_at(&self, pos: u64) -> u32 {
        self.tokens[(pos - self.tokens_base) as usize]
    }

    /// Best continuation for the query `(a, b, h)`: up to `max` tokens after `b` from the live
    /// entry with token `a`, next token `b`, a non-empty continuation and the highest cosine to
    /// `h` (newest on ties). Returns the tokens and that cosine.
    fn lookup(&self, a: u32, b: u32, h: &[f32], max: usize) -> Option<(Vec<u32>, f32)> {
        if max == 0 || h.len() != self.n_embd {
            return None;
        }
        let norm = l2(h);
        if !norm.is_finite() || norm <= 0.0 {
            return None;
        }
        let ids = self.index.get(&(a, b))?;
        let mut best: Option<(&Entry, f32)> = None;
        for &id in ids.iter().rev() {
            let entry = &self.entries[(id - self.entries_base) as usize];
            if entry.pos + 2 >= entry.end {
                continue; // `b` ends that output: nothing follows it.
            }
            let cos = dot(&entry.key, h) / norm;
            if best.is_none_or(|(_, c)| cos > c) {
                best = Some((entry, cos));
            }
        }
        let (entry, cos) = best?;
        if cos < self.min_similarity {
            return None;
        }
        let from = entry.pos + 2;
        let to = (from + max as u64).min(entry.end);
        Some(((from..to).map(|p| self.token_at(p)).collect(), cos))
    }

    /// Write the memory to `path` (format in the module docs), through `path.tmp` and a
    /// rename so a crash never leaves a half-written file under `path`.
    ///
    /// Errors: [`SpecError::Io`].
    pub fn save(&self, path: &Path) -> Result<(), SpecError> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let io = |op: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| SpecError::Io {
                op,
                path: p,
                source,
            }
        };
        let file = File::create(&tmp).map_err(io("create", &tmp))?;
        let mut w = HashingWriter {
            inner: BufWriter::new(file),
            hash: FNV_OFFSET,
        };
        self.write_body(&mut w).map_err(io("write", &tmp))?;
        let checksum = w.hash;
        let mut inner = w.inner;
        inner
            .write_all(&checksum.to_le_bytes())
            .map_err(io("write", &tmp))?;
        let file = inner.into_inner().map_err(|e| SpecError::Io {
            op: "flush",
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io("sync", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io("rename to", path))?;
        Ok(())
    }

    fn write_body<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&(self.n_embd as u32).to_le_bytes())?;
        w.write_all(&(self.spans.len() as u64).to_le_bytes())?;
        for span in &self.spans {
            w.write_all(&(span.len as u32).to_le_bytes())?;
            for j in 0..span.len {
                w.write_all(&self.token_at(span.start + j as u64).to_le_bytes())?;
            }
            for j in 0..span.len - 1 {
                let entry = &self.entries[(span.first_entry - self.entries_base) as usize + j];
                for v in entry.key.iter() {
                    w.write_all(&v.to_le_bytes())?;
                }
            }
        }
        Ok(())
    }

    /// Read a memory written by [`ExperienceMemory::save`] for a model with hidden size
    /// `n_embd`, bounded by `max_bytes` (outputs are re-inserted oldest first, so a smaller
    /// bound keeps the newest).
    ///
    /// Errors: [`SpecError::Io`] (cannot read), [`SpecError::BadMagic`],
    /// [`SpecError::UnsupportedVersion`], [`SpecError::EmbdMismatch`],
    /// [`SpecError::Truncated`] (the file ends early), [`SpecError::ChecksumMismatch`] (a byte
    /// changed), [`SpecError::Corrupt`] (complete, checksum right, but a value is impossible).
    /// Never panics on bad input; allocations are bounded by the file size.
    pub fn load(path: &Path, n_embd: usize, max_bytes: usize) -> Result<Self, SpecError> {
        let bytes = std::fs::read(path).map_err(|source| SpecError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
        let corrupt = |reason: String| SpecError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let mut r = Reader {
            buf: &bytes,
            off: 0,
            path,
        };
        let magic = r.array::<4>("magic")?;
        if magic != MAGIC {
            return Err(SpecError::BadMagic {
                path: path.to_path_buf(),
                expected: MAGIC,
                found: magic,
            });
        }
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(SpecError::UnsupportedVersion {
                path: path.to_path_buf(),
                expected: VERSION,
                found: version,
            });
        }
        let file_embd = r.u32("n_embd")? as usize;
        if file_embd != n_embd {
            return Err(SpecError::EmbdMismatch {
                path: path.to_path_buf(),
                expected: n_embd,
                found: file_embd,
            });
        }
        // Does the trailer hold the checksum of everything before it? Decides whether a
        // structural failure means "cut short" or "changed".
        let checksum_ok = bytes.len() >= 8 && {
            let body = bytes.len() - 8;
            let mut trailer = [0u8; 8];
            trailer.copy_from_slice(&bytes[body..]);
            u64::from_le_bytes(trailer) == fnv1a(FNV_OFFSET, &bytes[..body])
        };
        let outputs = match read_outputs(&mut r, n_embd) {
            Ok(outputs) => outputs,
            Err(SpecError::Truncated {
                what,
                offset,
                needed,
                available,
                ..
            }) if checksum_ok => {
                return Err(corrupt(format!(
                    "{what} at offset {offset} claims {needed} bytes, only {available} follow"
                )));
            }
            Err(e) => return Err(e),
        };
        let body = r.off;
        let expected = r.u64("checksum")?;
        if r.off != bytes.len() {
            return Err(if checksum_ok {
                corrupt(format!(
                    "{} bytes after the last output",
                    bytes.len() - r.off
                ))
            } else {
                SpecError::ChecksumMismatch {
                    path: path.to_path_buf(),
                    expected,
                    actual: fnv1a(FNV_OFFSET, &bytes[..body]),
                }
            });
        }
        let actual = fnv1a(FNV_OFFSET, &bytes[..body]);
        if actual != expected {
            return Err(SpecError::ChecksumMismatch {
                path: path.to_path_buf(),
                expected,
                actual,
            });
        }
        let mut mem = ExperienceMemory::new(n_embd, max_bytes);
        for (i, (seq, floats)) in outputs.into_iter().enumerate() {
            if seq.len() < 2 {
                return Err(corrupt(format!(
                    "output {i} has {} tokens (at least 2 are stored)",
                    seq.len()
                )));
            }
            if let Some(bad) = floats.iter().position(|v| !v.is_finite()) {
                return Err(corrupt(format!(
                    "output {i}: key value {bad} is not finite"
                )));
            }
            let keys = rows(&floats, n_embd).map(Box::<[f32]>::from).collect();
            mem.push_output(seq, keys);
        }
        Ok(mem)
    }

    /// Test-only: check the index against the entries and the byte count from scratch.
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut indexed = 0;
        for (&(a, b), ids) in &self.index {
            assert!(!ids.is_empty(), "empty id list left in the index");
            assert!(
                ids.iter().zip(ids.iter().skip(1)).all(|(x, y)| x < y),
                "ids out of order"
            );
            for &id in ids {
                assert!(id >= self.entries_base, "index holds evicted entry {id}");
                let e = &self.entries[(id - self.entries_base) as usize];
                assert_eq!((self.token_at(e.pos), self.token_at(e.pos + 1)), (a, b));
                assert!(e.pos + 1 < e.end);
            }
            indexed += ids.len();
        }
        assert_eq!(indexed, self.entries.len());
        let expect: usize = self.spans.iter().map(|s| self.output_bytes(s.len)).sum();
        assert_eq!(self.bytes, expect);
        assert!(self.bytes <= self.max_bytes);
        assert_eq!(
            self.spans.iter().map(|s| s.len).sum::<usize>(),
            self.tokens.len()
        );
        assert_eq!(
            self.spans.iter().map(|s| s.len - 1).sum::<usize>(),
            self.entries.len()
        );
    }
}

impl Drafter for ExperienceMemory {
    fn kind(&self) -> DrafterKind {
        DrafterKind::Experience
    }

    /// Query `a = output[len-2]` (the prompt's last token when `len == 1`), `b = output[len-1]`,
    /// `h = ctx.hidden`; the bucket is [`similarity_bucket`] of the best cosine. `None` for an
    /// empty output, a wrong-size or zero `hidden`, no candidate, or a best cosine below
    /// `min_similarity`.
    fn propose(&mut self, req: DraftRequest<'_, '_>) -> Option<Draft> {
        let ctx = req.ctx;
        let (&b, before) = ctx.output.split_last()?;
        let a = *before.last().or(ctx.prompt.last())?;
        let (tokens, cos) = self.lookup(a, b, ctx.hidden, req.max)?;
        Some(Draft {
            kind: DrafterKind::Experience,
            tokens,
            bucket: similarity_bucket(cos),
        })
    }

    /// [`ExperienceMemory::insert`]; a bad shape is logged and the output dropped.
    fn finish(&mut self, prompt: &[u32], prompt_hidden: &[f32], output: &[u32], hidden: &[f32]) {
        if let Err(e) = self.insert(prompt, prompt_hidden, output, hidden) {
            tracing::warn!(error = %e, "experience memory: output not stored");
        }
    }

    /// [`ExperienceMemory::save`].
    fn persist(&self, path: &std::path::Path) -> Option<Result<(), SpecError>> {
        Some(self.save(path))
    }
}

// === helpers ===

/// Rows of `[_, n]` (none when `n == 0`).
fn rows(flat: &[f32], n: usize) -> impl Iterator<Item = &[f32]> {
    flat.chunks_exact(n.max(1))
        .take(if n == 0 { 0 } else { usize::MAX })
}

fn dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

fn l2(x: &[f32]) -> f32 {
    dot(x, x).sqrt()
}

/// `x / ‖x‖₂`, or zeros when the norm is 0.
fn normalized(x: &[f32]) -> Box<[f32]> {
    let norm = l2(x);
    if norm > 0.0 && norm.is_finite() {
        x.iter().map(|v| v / norm).collect()
    } else {
        vec![0.0; x.len()].into_boxed_slice()
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 over `data`, continuing from `hash`.
fn fnv1a(mut hash: u64, data: &[u8]) -> u64 {
    for &byte in data {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// A writer that hashes what passes through it.
struct HashingWriter<W> {
    inner: W,
    hash: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash = fnv1a(self.hash, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// One output as read from a file: its array tokens and flat keys `[(len−1)·n_embd]`.
type FileOutput = (Vec<u32>, Vec<f32>);

/// The outputs after the header.
fn read_outputs(r: &mut Reader<'_>, n_embd: usize) -> Result<Vec<FileOutput>, SpecError> {
    let n_outputs = r.u64("n_outputs")?;
    let mut outputs = Vec::new();
    for _ in 0..n_outputs {
        let len = r.u32("output length")? as usize;
        let seq = r
            .take(len.saturating_mul(4), "output tokens")?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n_keys = len.saturating_sub(1).saturating_mul(n_embd);
        let floats = r
            .take(n_keys.saturating_mul(4), "output keys")?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        outputs.push((seq, floats));
    }
    Ok(outputs)
}

/// Bounds-checked little-endian reader over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    off: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SpecError> {
        let available = self.buf.len() - self.off;
        if n > available {
            return Err(SpecError::Truncated {
                path: self.path.to_path_buf(),
                what,
                offset: self.off,
                needed: n,
                available,
            });
        }
        let out = &self.buf[self.off..self.off + n];
        self.off += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], SpecError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, SpecError> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, SpecError> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::test_rng::SplitMix64;
    use crate::speculative::DraftContext;

    /// Cosines are computed in f32; two routes to the same cosine differ by rounding only.
    const COS_TOL: f32 = 1e-5;

    fn random_vec(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.signed()).collect()
    }

    fn ask(
        mem: &mut ExperienceMemory,
        prompt: &[u32],
        output: &[u32],
        hidden: &[f32],
        max: usize,
    ) -> Option<Draft> {
        mem.propose(DraftRequest {
            ctx: &DraftContext {
                prompt,
                output,
                hidden,
            },
            max,
            model: None,
        })
    }

    /// One stored request: prompt, prompt hidden `[n]`, output, output hidden `[T-1, n]`.
    struct Request {
        prompt: Vec<u32>,
        prompt_hidden: Vec<f32>,
        output: Vec<u32>,
        hidden: Vec<f32>,
    }

    impl Request {
        fn random(rng: &mut SplitMix64, n_embd: usize, vocab: u64, len: usize) -> Self {
            let output: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            Request {
                prompt: vec![rng.below(vocab) as u32, rng.below(vocab) as u32],
                prompt_hidden: random_vec(rng, n_embd),
                hidden: random_vec(rng, n_embd * len.saturating_sub(1)),
                output,
            }
        }

        fn store(&self, mem: &mut ExperienceMemory) {
            mem.insert(
                &self.prompt,
                &self.prompt_hidden,
                &self.output,
                &self.hidden,
            )
            .expect("valid shapes");
        }

        /// Hidden state of the token before `output[i]` (the prompt's last for `i == 0`).
        fn hidden_before(&self, i: usize, n: usize) -> &[f32] {
            if i == 0 {
                &self.prompt_hidden
            } else {
                &self.hidden[(i - 1) * n..i * n]
            }
        }
    }

    #[test]
    fn stored_output_replays_its_exact_continuation() {
        let n = 8;
        let mut rng = SplitMix64(11);
        let req = Request {
            prompt: vec![100, 101],
            prompt_hidden: random_vec(&mut rng, n),
            output: (1..=10).collect(),
            hidden: random_vec(&mut rng, 9 * n),
        };
        let mut mem = ExperienceMemory::new(n, 1 << 20);
        req.store(&mut mem);
        assert_eq!(
            (mem.n_outputs(), mem.n_tokens(), mem.n_entries()),
            (1, 11, 10)
        );
        for i in 1..=10 {
            // Output so far: output[..i]; the newest token output[i-1] was just chosen.
            let h = req.hidden_before(i - 1, n);
            let draft = ask(&mut mem, &[7, 101], &req.output[..i], h, 4);
            if i == 10 {
                assert_eq!(draft, None, "the output ended: nothing follows");
                continue;
            }
            let draft = draft.expect("a stored position");
            assert_eq!(
                draft.tokens,
                req.output[i..(i + 4).min(10)].to_vec(),
                "i {i}"
            );
            assert_eq!(draft.kind, DrafterKind::Experience);
            assert_eq!(draft.bucket, N_BUCKETS - 1, "identical state: cosine 1");
        }
        // Another prompt with the same last token and a scaled state: cosine is scale-free.
        let h: Vec<f32> = req.prompt_hidden.iter().map(|v| v * 3.0).collect();
        let draft = ask(&mut mem, &[5, 101], &[1], &h, 2).expect("first position");
        assert_eq!(draft.tokens, vec![2, 3]);
        assert_eq!(ask(&mut mem, &[5, 101], &[1], &h, 0), None, "max 0");
        assert_eq!(
            ask(&mut mem, &[5, 101], &[1], &h[..n - 1], 2),
            None,
            "wrong hidden size"
        );
        assert_eq!(
            ask(&mut mem, &[5, 101], &[1], &vec![0.0; n], 2),
            None,
            "zero state"
        );
        assert_eq!(
            ask(&mut mem, &[5, 102], &[1], &h, 2),
            None,
            "no entry with that token"
        );
    }

    #[test]
    fn best_cosine_wins_and_sets_the_bucket() {
        // Two outputs with the pair (5, 6) but different continuations and states.
        let mut mem = ExperienceMemory::new(2, 1 << 20);
        mem.insert(&[5], &[1.0, 0.0], &[6, 10, 11], &[0.3, 0.3, 0.0, 1.0])
            .expect("ok");
        mem.insert(&[5], &[0.0, 1.0], &[6, 20, 21], &[0.3, 0.3, 1.0, 0.0])
            .expect("ok");
        // Query close to the first output's state.
        let d = ask(&mut mem, &[5], &[6], &[0.9, 0.1], 5).expect("candidates");
        assert_eq!(d.tokens, vec![10, 11]);
        assert_eq!(d.bucket, similarity_bucket(0.9 / (0.82f32).sqrt()));
        assert_eq!(d.bucket, 3);
        // Close to the second.
        let d = ask(&mut mem, &[5], &[6], &[0.2, 1.0], 5).expect("candidates");
        assert_eq!(d.tokens, vec![20, 21]);
        // Between them (cosine ≈ 0.707 to both, the second slightly ahead): bucket 1.
        let d = ask(&mut mem, &[5], &[6], &[0.7, 0.71], 5).expect("candidates");
        assert_eq!((d.tokens, d.bucket), (vec![20, 21], 1));
        // min_similarity: a state orthogonal-ish to both is refused.
        let mut strict = ExperienceMemory::new(2, 1 << 20).with_min_similarity(0.5);
        strict
            .insert(&[5], &[1.0, 0.0], &[6, 10, 11], &[0.3, 0.3, 0.0, 1.0])
            .expect("ok");
        assert!(
            ask(&mut strict, &[5], &[6], &[1.0, 1.0], 5).is_some(),
            "cosine 0.707"
        );
        assert_eq!(
            ask(&mut strict, &[5], &[6], &[-1.0, 0.1], 5),
            None,
            "cosine < 0"
        );
    }

    #[test]
    fn buckets_follow_the_thresholds() {
        let cases = [
            (-1.0, 0),
            (0.49, 0),
            (0.5, 1),
            (0.79, 1),
            (0.8, 2),
            (0.94, 2),
            (0.95, 3),
            (1.0, 3),
        ];
        for (cos, bucket) in cases {
            assert_eq!(similarity_bucket(cos), bucket, "cos {cos}");
        }
        assert_eq!(similarity_bucket(f32::NAN), 0);
    }

    #[test]
    fn proposals_never_cross_an_output_end() {
        let mut mem = ExperienceMemory::new(2, 1 << 20);
        // Array: [9, 1, 2, 3 | 9, 4, 5, 6].
        mem.insert(&[9], &[1.0, 0.0], &[1, 2, 3], &[1.0, 0.0, 0.0, 1.0])
            .expect("ok");
        mem.insert(&[9], &[0.0, 1.0], &[4, 5, 6], &[1.0, 1.0, 1.0, -1.0])
            .expect("ok");
        let d = ask(&mut mem, &[9], &[1], &[1.0, 0.0], 100).expect("position 0");
        assert_eq!(d.tokens, vec![2, 3]);
        // (2, 3) ends the first output: 9, 4, 5, 6 follow in the array but not in that output.
        assert_eq!(ask(&mut mem, &[9], &[1, 2, 3], &[0.0, 1.0], 100), None);
    }

    #[test]
    fn short_and_bad_outputs() {
        let mut mem = ExperienceMemory::new(2, 1 << 20);
        // One output token: nothing could ever be proposed from it; not stored.
        mem.insert(&[1], &[1.0, 0.0], &[2], &[]).expect("ok");
        assert_eq!(mem.n_outputs(), 0);
        mem.insert(&[1], &[1.0, 0.0], &[], &[]).expect("ok");
        assert_eq!(mem.n_outputs(), 0);
        assert!(matches!(
            mem.insert(&[1], &[1.0, 0.0], &[2, 3], &[1.0]),
            Err(SpecError::ShapeMismatch {
                expected: 2,
                actual: 1,
                ..
            })
        ));
        assert!(matches!(
            mem.insert(&[1], &[1.0], &[2, 3], &[1.0, 0.0]),
            Err(SpecError::ShapeMismatch {
                expected: 2,
                actual: 1,
                ..
            })
        ));
        assert!(matches!(
            mem.insert(&[1], &[1.0, 0.0], &[2, 3, 4], &[1.0, 0.0, f32::NAN, 0.0]),
            Err(SpecError::NonFiniteHidden { row: 2, .. })
        ));
        assert_eq!(
            (mem.n_outputs(), mem.bytes()),
            (0, 0),
            "errors leave the memory unchanged"
        );
        // Empty prompt: the output's own positions are indexed.
        mem.insert(&[], &[0.0, 0.0], &[2, 3, 4], &[1.0, 0.0, 0.0, 1.0])
            .expect("ok");
        assert_eq!((mem.n_tokens(), mem.n_entries()), (3, 2));
        let d = ask(&mut mem, &[], &[2, 3], &[1.0, 0.0], 4).expect("stored");
        assert_eq!(d.tokens, vec![4]);
        assert_eq!(
            ask(&mut mem, &[], &[2], &[1.0, 0.0], 4),
            None,
            "no token before output[0]"
        );
        // n_embd 0: no similarity to rank by; nothing stored, no panic.
        let mut zero = ExperienceMemory::new(0, 1 << 20);
        zero.insert(&[1], &[], &[2, 3, 4], &[]).expect("ok");
        assert_eq!(zero.n_outputs(), 0);
        assert_eq!(ask(&mut zero, &[1], &[2], &[], 3), None);
        // finish() drops a bad output instead of panicking.
        mem.finish(&[1], &[1.0], &[2, 3], &[1.0, 0.0]);
        assert_eq!(mem.n_outputs(), 1);
        mem.check_invariants();
    }

    /// Every candidate the definition allows for `(a, b, h)`: `(cosine, continuation)` over the
    /// live requests (a full scan, the reference for the index).
    fn reference(
        live: &[&Request],
        n: usize,
        a: u32,
        b: u32,
        h: &[f32],
        max: usize,
    ) -> Vec<(f32, Vec<u32>)> {
        let mut out = Vec::new();
        for req in live {
            let seq: Vec<u32> = req
                .prompt
                .last()
                .into_iter()
                .chain(&req.output)
                .copied()
                .collect();
            for j in 0..seq.len().saturating_sub(2) {
                if seq[j] == a && seq[j + 1] == b {
                    let key = req.hidden_before(j, n);
                    let cos = dot(key, h) / (l2(key) * l2(h));
                    out.push((cos, seq[j + 2..(j + 2 + max).min(seq.len())].to_vec()));
                }
            }
        }
        out
    }

    #[test]
    fn randomized_eviction_keeps_bound_index_and_answers() {
        let mut rng = SplitMix64(0xe71c7);
        let (mut evictions, mut hits) = (0, 0);
        for case in 0..20 {
            let n = 1 + rng.below(6) as usize;
            let vocab = 2 + rng.below(5);
            let max_bytes = 200 + rng.below(3000) as usize;
            let mut mem = ExperienceMemory::new(n, max_bytes).with_min_similarity(-2.0);
            let mut stored: Vec<Request> = Vec::new();
            for _ in 0..60 {
                let len = rng.below(12) as usize;
                let req = Request::random(&mut rng, n, vocab, len);
                let before = mem.n_outputs();
                let fits =
                    req.output.len() >= 2 && mem.output_bytes(req.output.len() + 1) <= max_bytes;
                req.store(&mut mem);
                mem.check_invariants();
                assert!(mem.bytes() <= max_bytes);
                if fits {
                    stored.push(req);
                    evictions += usize::from(mem.n_outputs() <= before);
                } else {
                    assert_eq!(
                        mem.n_outputs(),
                        before,
                        "unstorable output changed the memory"
                    );
                }
                // The memory holds the newest n_outputs() stored requests.
                let live: Vec<&Request> =
                    stored.iter().skip(stored.len() - mem.n_outputs()).collect();
                let tokens: usize = live.iter().map(|r| r.output.len() + 1).sum();
                assert_eq!(mem.n_tokens(), tokens);
                for _ in 0..10 {
                    let q = Request::random(&mut rng, n, vocab, 3);
                    let (a, b) = match live.last() {
                        Some(r) if rng.below(2) == 0 && r.output.len() >= 2 => {
                            let i = rng.below(r.output.len() as u64 - 1) as usize;
                            (r.output[i], r.output[i + 1])
                        }
                        _ => (q.output[0], q.output[1]),
                    };
                    let max = rng.below(5) as usize;
                    let h = &q.prompt_hidden;
                    let got = ask(&mut mem, &[a], &[b], h, max);
                    let cands = reference(&live, n, a, b, h, max);
                    let best = cands.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
                    match got {
                        None => assert!(
                            max == 0 || cands.is_empty(),
                            "case {case}: missed {cands:?}"
                        ),
                        Some(d) => {
                            hits += 1;
                            assert!(max > 0 && d.tokens.len() <= max && !d.tokens.is_empty());
                            assert!(
                                cands
                                    .iter()
                                    .any(|(c, t)| *t == d.tokens && *c >= best - COS_TOL),
                                "case {case}: {:?} is not a best continuation of {cands:?}",
                                d.tokens
                            );
                        }
                    }
                }
            }
        }
        // The run must exercise what it checks: evictions and answered queries.
        assert!(
            evictions > 100 && hits > 1000,
            "evictions {evictions}, hits {hits}"
        );
    }

    fn filled(seed: u64, n: usize, count: usize) -> (ExperienceMemory, Vec<Request>) {
        let mut rng = SplitMix64(seed);
        let mut mem = ExperienceMemory::new(n, 1 << 20);
        let reqs: Vec<Request> = (0..count)
            .map(|_| {
                let len = 3 + rng.below(6) as usize;
                Request::random(&mut rng, n, 4, len)
            })
            .collect();
        for r in &reqs {
            r.store(&mut mem);
        }
        (mem, reqs)
    }

    /// Answers of `mem` to queries at every stored position.
    fn answers(mem: &mut ExperienceMemory, reqs: &[Request], n: usize) -> Vec<Option<Draft>> {
        let mut out = Vec::new();
        for r in reqs {
            for i in 1..=r.output.len() {
                out.push(ask(
                    mem,
                    &r.prompt,
                    &r.output[..i],
                    r.hidden_before(i - 1, n),
                    3,
                ));
            }
        }
        out
    }

    #[test]
    fn save_load_round_trip() {
        let n = 5;
        let (mut mem, reqs) = filled(3, n, 12);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("xp.bin");
        mem.save(&path).expect("save");
        let mut back = ExperienceMemory::load(&path, n, 1 << 20).expect("load");
        back.check_invariants();
        assert_eq!(
            (
                back.n_outputs(),
                back.n_tokens(),
                back.n_entries(),
                back.bytes()
            ),
            (
                mem.n_outputs(),
                mem.n_tokens(),
                mem.n_entries(),
                mem.bytes()
            )
        );
        let want = answers(&mut mem, &reqs, n);
        assert!(
            want.iter().filter(|d| d.is_some()).count() > reqs.len(),
            "queries hit"
        );
        assert_eq!(answers(&mut back, &reqs, n), want);
        // A smaller bound keeps the newest outputs.
        let small = mem.output_bytes(reqs[11].output.len() + 1)
            + mem.output_bytes(reqs[10].output.len() + 1);
        let newest = ExperienceMemory::load(&path, n, small).expect("load");
        assert_eq!(newest.n_outputs(), 2);
        assert_eq!(
            newest.n_tokens(),
            reqs[10].output.len() + reqs[11].output.len() + 2
        );
        // Saving over an existing file replaces it.
        ExperienceMemory::new(n, 1 << 20)
            .save(&path)
            .expect("save empty");
        assert_eq!(
            ExperienceMemory::load(&path, n, 1 << 20)
                .expect("load")
                .n_outputs(),
            0
        );
    }

    #[test]
    fn bad_files_give_errors() {
        let n = 3;
        let (mem, _) = filled(4, n, 3);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("xp.bin");
        mem.save(&path).expect("save");
        let good = std::fs::read(&path).expect("read");

        assert!(matches!(
            ExperienceMemory::load(&path, n + 1, 1 << 20),
            Err(SpecError::EmbdMismatch {
                expected: 4,
                found: 3,
                ..
            })
        ));
        // Every truncation is an error, never a panic; past the header it says "truncated".
        let cut = dir.path().join("cut.bin");
        for len in 0..good.len() {
            std::fs::write(&cut, &good[..len]).expect("write");
            let err = ExperienceMemory::load(&cut, n, 1 << 20).expect_err("truncated file loaded");
            assert!(
                matches!(err, SpecError::Truncated { .. }),
                "cut at {len}: {err}"
            );
        }
        // Every single flipped bit is an error, never a panic.
        let bad = dir.path().join("bad.bin");
        for pos in 0..good.len() {
            let mut bytes = good.clone();
            bytes[pos] ^= 1 << (pos % 8);
            std::fs::write(&bad, &bytes).expect("write");
            let err = ExperienceMemory::load(&bad, n, 1 << 20).expect_err("corrupt file loaded");
            let expect = match pos {
                0..4 => matches!(err, SpecError::BadMagic { .. }),
                4..8 => matches!(err, SpecError::UnsupportedVersion { found: 0 | 2.., .. }),
                8..12 => matches!(err, SpecError::EmbdMismatch { .. }),
                _ => matches!(
                    err,
                    SpecError::ChecksumMismatch { .. } | SpecError::Truncated { .. }
                ),
            };
            assert!(expect, "flip at {pos}: {err}");
        }
        // Trailing garbage and a missing file.
        let mut long = good.clone();
        long.extend_from_slice(&[0; 3]);
        std::fs::write(&bad, &long).expect("write");
        assert!(ExperienceMemory::load(&bad, n, 1 << 20).is_err());
        assert!(matches!(
            ExperienceMemory::load(&dir.path().join("missing.bin"), n, 1 << 20),
            Err(SpecError::Io { op: "read", .. })
        ));
    }
}
