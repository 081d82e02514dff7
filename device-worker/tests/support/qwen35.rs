//! The tiny `qwen35` fixtures committed in `tests/fixtures/qwen35/` (made by
//! `tools/fixtures/`, see its README.md): paths, JSON references and loaded models.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device_worker::model::Model;
use device_worker::sampling::argmax;
use device_worker::state::sequence::SequenceState;
use dsp::pool::ThreadPool;
use gguf::reader::GgufFile;

/// `tests/fixtures/qwen35`.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35")
}

/// A committed fixture of `tests/fixtures/qwen35` (a required input).
pub fn fixture(name: &str) -> PathBuf {
    test_support::fixture(
        fixture_dir().join(name),
        "committed in device-worker/tests/fixtures/qwen35 (made by tools/fixtures/, see its README.md)",
    )
}

/// The committed JSON fixture `name`, parsed.
pub fn read_json<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let bytes = std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name} parses: {e}"))
}

/// `reference.json` (the HF float32 reference), as far as `{"cases": [C]}` reads it.
#[derive(serde::Deserialize)]
struct Cases<C> {
    cases: Vec<C>,
}

/// The cases of `reference.json`, each read as a `C` (only the fields a test uses).
pub fn reference_cases<C: serde::de::DeserializeOwned>() -> Vec<C> {
    read_json::<Cases<C>>("reference.json").cases
}

/// The GGUF fixture `name`, loaded (it must be a `qwen35` model), to run on the kernel backend
/// `TANDEM_KERNELS` names (the fastest when unset).
pub fn load(name: &str) -> Model {
    device_worker::config::KernelArgs::install_env().expect("TANDEM_KERNELS");
    let file = Arc::new(GgufFile::open(&fixture(name)).expect("fixture GGUF opens"));
    let m = Model::load(file).unwrap_or_else(|e| panic!("{name} loads: {e}"));
    assert_eq!(m.architecture(), "qwen35");
    m
}

/// The context length of the tests' sequence states.
pub const N_CTX: usize = 512;

/// A loaded fixture and a 2-thread pool to run it on.
pub struct Runner {
    pub model: Model,
    pub pool: ThreadPool,
}

impl Runner {
    /// The fixture `name` ([`load`]) with micro-batches of up to `n_batch` tokens.
    pub fn new(name: &str, n_batch: usize) -> Self {
        Self::with_model(load(name), n_batch)
    }

    /// `model` (of any architecture) with micro-batches of up to `n_batch` tokens, on the
    /// kernel backend `TANDEM_KERNELS` names.
    pub fn with_model(mut model: Model, n_batch: usize) -> Self {
        device_worker::config::KernelArgs::install_env().expect("TANDEM_KERNELS");
        model.set_max_batch(n_batch);
        Self {
            model,
            pool: ThreadPool::new(2).expect("pool"),
        }
    }

    /// A fresh sequence state of [`N_CTX`] tokens.
    pub fn seq(&self) -> SequenceState {
        self.model.new_sequence_state(N_CTX)
    }

    /// Feeds `tokens` in micro-batches of `batch`; returns the last token's logits.
    pub fn prefill(&mut self, seq: &mut SequenceState, tokens: &[u32], batch: usize) -> Vec<f32> {
        let mut out = None;
        let chunks: Vec<&[u32]> = tokens.chunks(batch).collect();
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let l = self
                .model
                .forward(&self.pool, seq, c, last)
                .expect("forward");
            if last {
                out = Some(l.expect("logits requested").to_vec());
            }
        }
        out.expect("non-empty prompt")
    }

    /// One decode step: feeds `id`, returns the logits after it.
    pub fn step(&mut self, seq: &mut SequenceState, id: u32) -> Vec<f32> {
        self.model
            .forward(&self.pool, seq, &[id], true)
            .expect("decode")
            .expect("logits")
            .to_vec()
    }

    /// Greedy continuation of `steps` tokens from `logits` (the last computed ones).
    pub fn greedy(&mut self, seq: &mut SequenceState, logits: Vec<f32>, steps: usize) -> Vec<u32> {
        self.greedy_logits(seq, logits, steps).0
    }

    /// [`Runner::greedy`], with the logits each token was chosen from.
    pub fn greedy_logits(
        &mut self,
        seq: &mut SequenceState,
        mut logits: Vec<f32>,
        steps: usize,
    ) -> (Vec<u32>, Vec<Vec<f32>>) {
        let (mut tokens, mut chosen_from) = (Vec::new(), Vec::new());
        for i in 0..steps {
            let id = argmax(&logits).expect("finite logits");
            tokens.push(id);
            chosen_from.push(logits.clone());
            if i + 1 < steps {
                logits = self.step(seq, id);
            }
        }
        (tokens, chosen_from)
    }

    /// Teacher forcing: from `logits` (the last computed ones), feeds `forced` one token at
    /// a time whatever the logits say, and returns the logits each forced token was
    /// predicted from (`forced.len()` rows of `[n_vocab]`; the last forced token is not fed).
    pub fn teacher_forced(
        &mut self,
        seq: &mut SequenceState,
        mut logits: Vec<f32>,
        forced: &[u32],
    ) -> Vec<Vec<f32>> {
        let mut rows = Vec::with_capacity(forced.len());
        for (i, &id) in forced.iter().enumerate() {
            let next = (i + 1 < forced.len()).then(|| self.step(seq, id));
            rows.push(std::mem::replace(&mut logits, next.unwrap_or_default()));
        }
        rows
    }
}
