//! The Qwen3.5 MTP ("nextn") block against the Hugging Face reference of the tiny fixture
//! (`tools/fixtures/make_qwen35_fixture.py::mtp_reference`, field `cases[].mtp` of
//! `tests/fixtures/qwen35/reference.json`): the MTP logits at the last prompt position, with
//! the MTP entries of every prompt position computed from the target's output-normed hidden
//! states, equal HF's within the parity tolerances of `tests/qwen35.rs`; filling the entries
//! batch by batch (the engine's way) gives the same logits as one pass; drafting through
//! [`device_worker::speculative::mtp::draft`] proposes the reference's argmax; a model without the
//! block says so.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use device_worker::sampling::argmax;
use device_worker::speculative::mtp::{fill_with_model as mtp_fill, ModelMtp};
use gguf::reader::GgufFile;
use device_worker::model::{Model, ModelError, MtpHead, MtpPass};
use device_worker::speculative::mtp;
use device_worker::state::mtp::MtpCache;
use dsp::pool::ThreadPool;
use support::qwen35::{fixture, reference_cases, Runner};
use test_support::max_abs_diff;

/// F32 GGUF vs HF float32. The MTP block reads the main model's hidden states, which carry
/// that model's own error (within 1e-3 in logits, `tests/qwen35.rs`: f16 KV cache, f32
/// accumulation), and adds one more attention layer over an f16 KV cache. Measured: 1.2e-3,
/// 8.0e-4, 5.4e-4 for the 5-, 40- and 130-token prompts.
const F32_LOGIT_TOL: f32 = 2e-3;
/// F16 GGUF vs HF float32 (as `tests/qwen35.rs`). Measured: 3.7e-2, 2.1e-2, 6.4e-2.
const F16_LOGIT_TOL: f32 = 1e-1;
/// Same file, entries filled in several passes vs one: the main model's hidden states of
/// different micro-batch splits round differently (chunked vs per-token GDN; 2e-4 in its
/// logits, `tests/qwen35.rs`), and the MTP layer sees all of them. Measured 1.0e-4 – 2.1e-4.
const SPLIT_LOGIT_TOL: f32 = 5e-4;

#[derive(serde::Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    mtp: MtpRef,
}

#[derive(serde::Deserialize)]
struct MtpRef {
    next_token: u32,
    last_logits: Vec<f32>,
    argmax: u32,
}

fn cases() -> Vec<Case> {
    reference_cases()
}

/// [`Runner::new`] with the main model's hidden rows kept (the MTP block reads them).
fn mtp_runner(name: &str, n_batch: usize) -> Runner {
    let mut run = Runner::new(name, n_batch);
    run.model.set_hidden_rows(true);
    run
}

impl Runner {
    /// Prefills `prompt` in micro-batches of `batch`, handing each batch's hidden rows to a
    /// fresh MTP cache and filling its entries after each (the engine's prefill); returns
    /// the cache (entries `0..n−1`, `h_{n−1}` pending) and the main model's last logits.
    fn prefill_mtp(&mut self, prompt: &[u32], batch: usize) -> (MtpCache, Vec<f32>) {
        let mut seq = self.model.new_sequence_state(512);
        let mut cache = self
            .model
            .new_mtp_cache(512)
            .expect("fixture has an MTP block");
        let mut logits = Vec::new();
        let mut fed = Vec::new();
        for chunk in prompt.chunks(batch) {
            let pos0 = seq.len();
            let l = self
                .model
                .forward(&self.pool, &mut seq, chunk, true)
                .expect("forward")
                .expect("logits");
            logits = l.to_vec();
            fed.extend_from_slice(chunk);
            cache.push_hidden(pos0, self.model.hidden_rows());
            mtp_fill(&mut self.model, &self.pool, &mut cache, &fed)
                .expect("MTP fill");
        }
        assert_eq!(cache.n_entries(), prompt.len() - 1);
        assert_eq!(cache.pending().0, prompt.len() - 1);
        (cache, logits)
    }

    /// Up to `max` tokens drafted with `head` after `case`'s prompt and its next token
    /// ([`mtp::draft`]); the draft must propose something.
    fn draft(&mut self, cache: &mut MtpCache, case: &Case, max: usize, head: MtpHead) -> Vec<u32> {
        let mut step = ModelMtp {
            model: &mut self.model,
            pool: &self.pool,
        };
        mtp::draft(&mut step, cache, &case.prompt_ids, case.mtp.next_token, max, head)
            .expect("draft")
            .expect("a proposal")
    }

    /// One MTP pass with `head` over the cache's pending rows, given the target's next token.
    fn mtp_pass(
        &mut self,
        cache: &mut MtpCache,
        next: u32,
        head: MtpHead,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let (pos0, hidden) = cache.pending();
        let hidden = hidden.to_vec();
        let pass = MtpPass {
            pos0,
            hidden: &hidden,
            next: &[next],
            head: Some(head),
        };
        let logits = self.model.mtp_forward(&self.pool, cache, pass)?;
        Ok(logits.map(<[f32]>::to_vec))
    }

    /// MTP logits of the last prompt position given the target's next token.
    fn mtp_logits(&mut self, cache: &mut MtpCache, next: u32) -> Vec<f32> {
        self.mtp_pass(cache, next, MtpHead::Full)
            .expect("MTP pass")
            .expect("logits")
    }
}


/// Gap between the best and second-best logit.
fn margin(l: &[f32]) -> f32 {
    let mut v = l.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

fn parity(name: &str, tol: f32) {
    let cases = cases();
    let mut run = mtp_runner(name, 256);
    assert!(run.model.has_mtp(), "{name} has the nextn block");
    for (i, case) in cases.iter().enumerate() {
        let (mut cache, main_logits) = run.prefill_mtp(&case.prompt_ids, 256);
        // The reference's next token is the main model's greedy choice.
        assert_eq!(argmax(&main_logits), Some(case.mtp.next_token), "case {i}");
        let logits = run.mtp_logits(&mut cache, case.mtp.next_token);
        let d = max_abs_diff(&logits, &case.mtp.last_logits);
        eprintln!(
            "{name} case {i} (n = {}): MTP max |Δlogit| vs HF = {d:.2e}",
            case.prompt_ids.len()
        );
        assert!(d < tol, "case {i}: MTP max |Δlogit| {d} >= {tol}");
        if margin(&case.mtp.last_logits) > 2.0 * tol {
            assert_eq!(argmax(&logits), Some(case.mtp.argmax), "case {i}");
        }
    }
}

#[test]
fn f32_mtp_logits_match_hf_reference() {
    parity("tiny-qwen35-f32.gguf", F32_LOGIT_TOL);
}

#[test]
fn f16_mtp_logits_match_hf_reference() {
    parity("tiny-qwen35-f16.gguf", F16_LOGIT_TOL);
}

#[test]
fn entries_filled_batch_by_batch_equal_one_pass() {
    let cases = cases();
    let case = &cases[2]; // 130 tokens
    let mut run = mtp_runner("tiny-qwen35-f32.gguf", 256);
    let (mut whole, _) = run.prefill_mtp(&case.prompt_ids, 256);
    let a = run.mtp_logits(&mut whole, case.mtp.next_token);
    // Micro-batches of 7 tokens, and an MTP pass of at most 7 rows (the scratch size).
    let mut small = mtp_runner("tiny-qwen35-f32.gguf", 7);
    let (mut split, _) = small.prefill_mtp(&case.prompt_ids, 7);
    let b = small.mtp_logits(&mut split, case.mtp.next_token);
    let d = max_abs_diff(&a, &b);
    eprintln!("batches of 7 vs one pass: max |Δlogit| = {d:.2e}");
    assert!(d < SPLIT_LOGIT_TOL, "max |Δlogit| {d}");
    assert_eq!(split.positions(), whole.positions());
}

#[test]
fn drafting_proposes_the_reference_argmax_and_discards_draft_entries() {
    let cases = cases();
    let mut run = mtp_runner("tiny-qwen35-f32.gguf", 256);
    for (i, case) in cases.iter().enumerate() {
        if margin(&case.mtp.last_logits) <= 2.0 * F32_LOGIT_TOL {
            continue;
        }
        let (mut cache, _) = run.prefill_mtp(&case.prompt_ids, 256);
        let n = case.prompt_ids.len();
        let d = run.draft(&mut cache, case, 3, MtpHead::Full);
        assert_eq!(d.len(), 3, "case {i}");
        assert_eq!(d[0], case.mtp.argmax, "case {i}: first draft");
        // Entry n−1 (target h_{n−1}, verified next token) stays; draft steps' entries go.
        assert_eq!(cache.n_entries(), n, "case {i}");
        assert_eq!(cache.positions().last(), Some(&(n - 1)));
        assert_eq!(cache.pending(), (n, &[][..]));
    }
}

#[test]
fn a_model_without_the_nextn_block_has_no_mtp() {
    let mut run = mtp_runner("tiny-qwen35-nomtp-f32.gguf", 16);
    assert!(!run.model.has_mtp());
    assert!(run.model.new_mtp_cache(16).is_none());
    assert_eq!(run.model.mtp_draft_rows(), None);
    let mut cache = MtpCache::new(2, 32, 16, run.model.n_embd());
    let e = run.model.n_embd();
    let err = run
        .model
        .mtp_forward(
            &run.pool,
            &mut cache,
            MtpPass {
                pos0: 0,
                hidden: &vec![0.0; e],
                next: &[1],
                head: Some(MtpHead::Full),
            },
        )
        .expect_err("no MTP block");
    assert!(err.to_string().contains("no MTP block"), "{err}");
}

#[test]
fn the_fixture_has_no_trimmed_head_and_asking_for_it_names_the_tool() {
    let mut run = mtp_runner("tiny-qwen35-f32.gguf", 16);
    assert_eq!(run.model.mtp_draft_rows(), None);
    let (mut cache, _) = run.prefill_mtp(&[5, 6, 7], 16);
    let err = run
        .mtp_pass(&mut cache, 8, MtpHead::Trimmed)
        .expect_err("no trimmed head");
    assert!(err.to_string().contains("draft-vocab"), "{err}");
}

/// A copy of the f32 fixture with a trimmed draft head over `ids` (rows of the tied LM
/// head, the layout `tandem-tools draft-vocab` writes).
fn trimmed_copy(dir: &Path, ids: &[u32]) -> PathBuf {
    use gguf::reader::MetaValue;
    use gguf::writer::{write_with_additions, Additions, NewTensor};
    let src = GgufFile::open(&fixture("tiny-qwen35-f32.gguf")).expect("fixture opens");
    let lm = src.tensor_opt("token_embd.weight").expect("tied LM head");
    let (n_embd, n_vocab) = (lm.dims[0], lm.dims[1] as usize);
    let row = lm.data.len() / n_vocab;
    let layer = src.get_u32("qwen35.block_count").expect("block_count")
        - src
            .get_u32("qwen35.nextn_predict_layers")
            .expect("nextn layers");
    let out = dir.join("tiny-qwen35-f32-trimmed.gguf");
    let add = Additions {
        kvs: vec![(
            "qwen35.nextn_draft_token_ids".into(),
            MetaValue::Array(ids.iter().map(|&i| MetaValue::U32(i)).collect()),
        )],
        tensors: vec![NewTensor {
            name: format!("blk.{layer}.nextn.draft_output.weight"),
            ty: lm.ty,
            dims: vec![n_embd, ids.len() as u64],
            chunks: ids
                .iter()
                .map(|&i| &lm.data[i as usize * row..(i as usize + 1) * row])
                .collect(),
        }],
        replace: false,
    };
    write_with_additions(&src, &out, &add).expect("trimmed copy written");
    out
}

#[test]
fn trimmed_head_scores_its_rows_like_the_full_head_and_maps_back_to_original_ids() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Every third id, in reverse order (rows are not in id order).
    let ids: Vec<u32> = (0..512u32).rev().step_by(3).collect();
    let path = trimmed_copy(dir.path(), &ids);
    let file = Arc::new(GgufFile::open(&path).expect("trimmed copy opens"));
    let mut model = Model::load(file).expect("trimmed copy loads");
    assert_eq!(model.mtp_draft_rows(), Some(ids.len()));
    let pool = ThreadPool::new(2).expect("pool");
    model.set_max_batch(256);
    model.set_hidden_rows(true);
    let case = &cases()[1];
    let mut run = Runner {
        model,
        pool,
    };
    let (cache, _) = run.prefill_mtp(&case.prompt_ids, 256);
    let full = run.mtp_logits(&mut cache.clone(), case.mtp.next_token);
    let mut c = cache.clone();
    let trimmed = run
        .mtp_pass(&mut c, case.mtp.next_token, MtpHead::Trimmed)
        .expect("trimmed MTP pass")
        .expect("logits");
    assert_eq!(trimmed.len(), ids.len());
    for (r, &id) in ids.iter().enumerate() {
        assert!(
            (trimmed[r] - full[id as usize]).abs() <= 1e-5,
            "row {r} (token {id}): {} vs {}",
            trimmed[r],
            full[id as usize]
        );
    }
    // The drafter's choice: the best of the N rows, as an original id.
    let mut c = cache.clone();
    let d = run.draft(&mut c, case, 1, MtpHead::Trimmed);
    let best = ids
        .iter()
        .copied()
        .max_by(|&a, &b| full[a as usize].total_cmp(&full[b as usize]))
        .expect("rows");
    assert_eq!(d, vec![best]);
    assert_eq!(run.model.mtp_token_id(MtpHead::Trimmed, 0), Some(ids[0]));
    assert_eq!(
        run.model.mtp_token_id(MtpHead::Trimmed, ids.len() as u32),
        None
    );
}

#[test]
fn mtp_drafters_on_models_without_their_parts_fail_at_startup_with_a_clear_error() {
    use device_worker::config::{Drafters, EngineOptions};
    use device_worker::speculative::Speculator;
    let settings = |model: &str, drafters: &str| {
        EngineOptions {
            model: Some(fixture(model)),
            drafters: drafters.parse::<Drafters>().expect("drafters"),
            ..Default::default()
        }
        .settings()
        .expect("valid options")
    };
    let load = |name: &str| {
        Model::load(Arc::new(GgufFile::open(&fixture(name)).expect("opens"))).expect("loads")
    };
    let nomtp = load("tiny-qwen35-nomtp-f32.gguf");
    let err = { let s = settings("tiny-qwen35-nomtp-f32.gguf", "mtp"); Speculator::new(s.speculative.as_ref(), &s.model, &nomtp) }
        .err()
        .expect("mtp without an MTP block is refused");
    assert!(err.to_string().contains("no MTP (nextn) block"), "{err}");
    let full = load("tiny-qwen35-f32.gguf");
    let err = { let s = settings("tiny-qwen35-f32.gguf", "mtp-trimmed"); Speculator::new(s.speculative.as_ref(), &s.model, &full) }
        .err()
        .expect("mtp-trimmed without a draft head is refused");
    assert!(
        err.to_string()
            .contains("tandem-tools draft-vocab --model IN --out OUT"),
        "{err}"
    );
    let ok = { let s = settings("tiny-qwen35-f32.gguf", "mtp,prompt-lookup"); Speculator::new(s.speculative.as_ref(), &s.model, &full) }
        .expect("mtp on a model with the block")
        .expect("speculation on");
    assert!(ok.uses_mtp());
}
