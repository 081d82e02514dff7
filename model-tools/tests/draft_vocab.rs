//! `draft-vocab` on the tiny Qwen3.5 fixture with an MTP layer: the draft matrix holds the
//! listed LM-head rows byte for byte, control and byte tokens come first, then corpus-output
//! tokens by frequency; the rest of the file is unchanged and still loads; models without
//! nextn layers, with a draft vocabulary already (without --force) or truncated are refused.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_gateway::corpus::load_episodes;
use model_tools::draft_vocab::{run, DraftVocabArgs, DraftVocabError, DraftVocabSummary};
use gguf::reader::GgufFile;
use gguf::tokenizer::{token_type, Tokenizer};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../device-worker/tests/fixtures/qwen35"
);
const TENSOR: &str = "blk.4.nextn.draft_output.weight";
const KEY: &str = "qwen35.nextn_draft_token_ids";

/// A committed fixture of `device-worker/tests/fixtures/qwen35` (a required input).
fn fixture(name: &str) -> PathBuf {
    test_support::fixture(
        Path::new(FIXTURES).join(name),
        "committed in device-worker/tests/fixtures/qwen35 (made by tools/fixtures/, see its README.md)",
    )
}

fn draft(
    model: &Path,
    out: &Path,
    top: usize,
    force: bool,
) -> Result<DraftVocabSummary, DraftVocabError> {
    run(&DraftVocabArgs {
        model: model.to_path_buf(),
        out: out.to_path_buf(),
        top,
        corpus: test_support::corpus_dir(),
        force,
    })
}

/// Corpus output token counts, computed here from the recorded actions.
fn corpus_counts(tok: &Tokenizer) -> HashMap<u32, u64> {
    let episodes = load_episodes(&test_support::corpus_dir()).expect("corpus");
    let mut counts = HashMap::new();
    for a in episodes
        .iter()
        .flat_map(|e| &e.steps)
        .filter_map(|s| s.recorded_action.as_deref())
    {
        let mut ids = tok.encode(a, false).expect("encode");
        if tok.add_bos() && tok.bos().is_some() && ids.first().copied() == tok.bos() {
            ids.remove(0);
        }
        for id in ids {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

fn row(f: &GgufFile, name: &str, id: u32) -> Vec<u8> {
    let t = f.tensor(name).expect("tensor");
    let n = t.data.len() / t.dims[1] as usize;
    t.data[id as usize * n..(id as usize + 1) * n].to_vec()
}

#[test]
fn draft_rows_ids_and_ranking_on_the_fixture() {
    let model = fixture("tiny-qwen35-q8_0.gguf");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("draft.gguf");
    let top = 300;
    let s = draft(&model, &out, top, false).expect("draft-vocab");
    assert_eq!((s.rows, s.n_vocab, s.layer), (top, 512, 4));
    assert_eq!(s.lm_head, "token_embd.weight");
    assert_eq!(s.clamped_from, None);

    let src = GgufFile::open(&model).expect("source");
    let back = GgufFile::open(&out).expect("output");
    let tok = Tokenizer::from_gguf(&src).expect("tokenizer");

    // The ids: N of them, unique, inside the vocabulary.
    let ids = back.get_u32_array(KEY).expect("ids key");
    assert_eq!(ids.len(), top);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), top, "ids repeat");
    assert!(ids.iter().all(|&id| (id as usize) < s.n_vocab));

    // The matrix: those rows of the tied LM head, byte for byte, same type.
    let lm = src.tensor("token_embd.weight").expect("lm head");
    let t = back.tensor(TENSOR).expect("draft tensor");
    assert_eq!((t.ty, t.dims.clone()), (lm.ty, vec![64, top as u64]));
    let row_bytes = t.data.len() / top;
    assert_eq!(s.tensor_bytes, t.data.len() as u64);
    for (r, &id) in ids.iter().enumerate() {
        assert!(
            t.data[r * row_bytes..(r + 1) * row_bytes] == row(&src, "token_embd.weight", id)[..],
            "row {r} (token {id}) differs from the LM head"
        );
    }

    // Everything else unchanged.
    assert_eq!(back.n_tensors(), src.n_tensors() + 1);
    assert_eq!(back.metadata().len(), src.metadata().len() + 1);
    for (k, v) in src.metadata() {
        assert_eq!(back.get(k), Some(v), "metadata {k}");
    }
    for info in src.tensors() {
        let (a, b) = (
            src.tensor(&info.name).unwrap(),
            back.tensor(&info.name).unwrap(),
        );
        assert!(a.data == b.data && a.dims == b.dims, "tensor {}", info.name);
    }

    // Ranking: control tokens, then byte tokens (each by id), then corpus tokens by count.
    let controls: Vec<u32> = (0..512).filter(|&id| tok.is_control(id)).collect();
    let bytes: Vec<u32> = (0..512)
        .filter(|&id| {
            tok.token_type(id) == Some(token_type::NORMAL) && tok.token_bytes_ref(id).len() == 1
        })
        .collect();
    assert!(!controls.is_empty());
    assert_eq!(
        bytes.len(),
        256,
        "a byte-level vocabulary has 256 one-byte tokens"
    );
    let (nc, nb) = (controls.len(), bytes.len());
    assert_eq!(&ids[..nc], &controls[..]);
    assert_eq!(&ids[nc..nc + nb], &bytes[..]);
    assert_eq!(s.n_special, nc + nb);

    let counts = corpus_counts(&tok);
    let count = |id: &u32| counts.get(id).copied().unwrap_or(0);
    let most = counts
        .iter()
        .max_by_key(|(id, c)| (**c, std::cmp::Reverse(**id)))
        .map(|(id, _)| *id)
        .expect("the corpus has output tokens");
    assert!(
        ids.contains(&most),
        "most frequent output token {most} missing"
    );
    let special: HashSet<u32> = controls.iter().chain(&bytes).copied().collect();
    let mut frequent: Vec<u32> = counts
        .keys()
        .copied()
        .filter(|id| !special.contains(id))
        .collect();
    frequent.sort_by_key(|id| (std::cmp::Reverse(count(id)), *id));
    assert!(
        !frequent.is_empty(),
        "the fixture's merges should give multi-byte corpus tokens"
    );
    let k = frequent.len().min(top - nc - nb);
    assert_eq!(&ids[nc + nb..nc + nb + k], &frequent[..k]);
    // The rest (if any room is left) by id.
    let rest = &ids[nc + nb + k..];
    assert!(rest.windows(2).all(|w| w[0] < w[1]));

    let total: u64 = counts.values().sum();
    let covered: u64 = ids.iter().map(count).sum();
    assert_eq!((s.corpus_tokens, s.covered_tokens), (total, covered));
}

#[test]
fn the_output_still_loads_as_a_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("draft.gguf");
    draft(&fixture("tiny-qwen35-q8_0.gguf"), &out, 280, false).expect("draft-vocab");
    let file = Arc::new(GgufFile::open(&out).expect("output"));
    device_worker::model::Model::load(file).expect("the model loads with the draft tensor");
}

#[test]
fn a_model_without_nextn_layers_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("draft.gguf");
    let err =
        draft(&fixture("tiny-qwen35-nomtp-f32.gguf"), &out, 300, false).expect_err("no MTP layers");
    assert!(
        matches!(&err, DraftVocabError::NoNextn { key, found, .. }
            if key == "qwen35.nextn_predict_layers" && found == "absent"),
        "{err:?}"
    );
    assert!(err.to_string().contains("no MTP (nextn) layers"), "{err}");
    assert!(!out.exists());
}

#[test]
fn an_existing_draft_vocabulary_is_replaced_only_with_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = dir.path().join("first.gguf");
    let second = dir.path().join("second.gguf");
    draft(&fixture("tiny-qwen35-q8_0.gguf"), &first, 300, false).expect("first");
    let err = draft(&first, &second, 270, false).expect_err("already has one");
    assert!(
        matches!(&err, DraftVocabError::AlreadyHasDraft { name, .. } if name == TENSOR),
        "{err:?}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    assert!(!second.exists());

    draft(&first, &second, 270, true).expect("--force");
    let (a, b) = (
        GgufFile::open(&first).unwrap(),
        GgufFile::open(&second).unwrap(),
    );
    assert_eq!(b.n_tensors(), a.n_tensors());
    assert_eq!(b.metadata().len(), a.metadata().len());
    assert_eq!(b.tensor(TENSOR).unwrap().dims, vec![64, 270]);
    let (ia, ib) = (a.get_u32_array(KEY).unwrap(), b.get_u32_array(KEY).unwrap());
    assert_eq!(&ia[..270], &ib[..], "same ranking, shorter");
}

#[test]
fn top_above_the_vocabulary_is_clamped_and_zero_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("draft.gguf");
    let model = fixture("tiny-qwen35-q8_0.gguf");
    let s = draft(&model, &out, 10_000, false).expect("clamped");
    assert_eq!((s.rows, s.clamped_from), (512, Some(10_000)));
    assert_eq!(s.coverage_pct(), Some(100.0));
    let mut ids = GgufFile::open(&out).unwrap().get_u32_array(KEY).unwrap();
    ids.sort_unstable();
    assert_eq!(ids, (0..512).collect::<Vec<u32>>());

    let err = draft(&model, &dir.path().join("zero.gguf"), 0, false).expect_err("top 0");
    assert!(matches!(err, DraftVocabError::TopZero), "{err:?}");
}

#[test]
fn a_truncated_model_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("cut.gguf");
    let bytes = std::fs::read(fixture("tiny-qwen35-q8_0.gguf")).expect("fixture");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = dir.path().join("draft.gguf");
    let err = draft(&cut, &out, 300, false).expect_err("truncated");
    assert!(
        matches!(
            &err,
            DraftVocabError::Model {
                source: gguf::reader::GgufError::Truncated { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");
    assert!(!out.exists());
}
