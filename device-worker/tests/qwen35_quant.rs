//! The `qwen35` forward pass on quantised fixtures against llama.cpp on the same files:
//! every output step of `llama-server`'s greedy run compared, teacher-forced, with its
//! top-2 log-probabilities, for Q8_0 (tiny, hidden 64), Q8_0 and Q4_K_M
//! (wide, hidden 256: every row a multiple of 256, so Q4_K and Q6_K tensors exist), and a
//! fixture converted without the MTP block loads and reproduces the HF reference.
//! Fixtures and llama.cpp's tokens: `tools/fixtures/record_llama_cpp_quant.py`
//! (`tests/fixtures/qwen35/quant_reference.json`).

mod support;

use std::collections::BTreeMap;

use support::parity::{self, PeerStep};
use support::qwen35::{read_json, reference_cases, Runner};

const N_BATCH: usize = 256;

#[derive(serde::Deserialize)]
struct QuantReference {
    models: Vec<QuantModel>,
}

#[derive(serde::Deserialize)]
struct QuantModel {
    gguf: String,
    ftype: String,
    /// ggml type name -> number of tensors of that type (from gguf-py).
    tensor_types: BTreeMap<String, usize>,
    cases: Vec<QuantCase>,
}

#[derive(serde::Deserialize)]
struct QuantCase {
    prompt_ids: Vec<u32>,
    /// llama.cpp's greedy continuation.
    tokens: Vec<u32>,
    /// Per step, llama.cpp's top two `(id, logprob)`, or null where the server gave none.
    top2: Vec<Option<Vec<(u32, f64)>>>,
}

/// A case of the HF float32 reference of the tiny model (`reference.json`, only the fields
/// used here).
#[derive(serde::Deserialize)]
struct HfCase {
    prompt_ids: Vec<u32>,
    greedy_tokens: Vec<u32>,
}

fn quant_reference() -> QuantReference {
    read_json("quant_reference.json")
}

fn quant_model<'a>(r: &'a QuantReference, gguf: &str) -> &'a QuantModel {
    r.models
        .iter()
        .find(|m| m.gguf == gguf)
        .unwrap_or_else(|| panic!("{gguf} missing from quant_reference.json"))
}

/// Largest |our log-prob − llama.cpp's| of its top two tokens accepted on the float32
/// fixture: the same weights and the same sums up to summation order and llama.cpp's f16 KV
/// cache (measured max 7.4e-4).
const LOGPROB_TOL_F32: f64 = 2e-3;

/// The same on the quantised fixtures (measured max 0.115, at a log-prob of −6): llama.cpp
/// quantises activations and rounds K/V to f16 where our kernels keep more in f32, and these
/// random-initialised models have sharp, large logits. A wrong kernel moves log-probs by
/// whole units.
const LOGPROB_TOL_QUANT: f64 = 0.15;

/// llama.cpp's top-2 per step of `case`, where its position is certain.
/// `record_llama_cpp_quant.py` matched the server's `completion_probabilities` to steps by
/// token id, and the server leaves out the entries of tokens that end inside a UTF-8
/// character: after the first left-out step, an entry whose token occurs again later in the
/// output may belong to that later step (seen on `tiny-qwen35-nomtp-f32.gguf` case 0, whose
/// steps 3 and 4 hold the values of steps 4 and 5). Such entries are not compared; the
/// tokens always are.
fn certain_top2(case: &QuantCase) -> Vec<Option<&[(u32, f64)]>> {
    let first_gap = case
        .top2
        .iter()
        .position(Option::is_none)
        .unwrap_or(case.top2.len());
    (0..case.tokens.len())
        .map(|s| {
            let repeats_later = case.tokens[s + 1..].contains(&case.tokens[s]);
            let certain = s < first_gap || !repeats_later;
            case.top2
                .get(s)
                .and_then(|t| t.as_deref())
                .filter(|_| certain)
        })
        .collect()
}

/// Every output step of llama.cpp's greedy run of each case, teacher-forced
/// ([`parity::check_steps`]). Returns how many cases matched token for token (no near-tie
/// went the other way).
fn assert_equal_llama_cpp(gguf: &str) -> usize {
    let r = quant_reference();
    let m = quant_model(&r, gguf);
    let mut run = Runner::new(gguf, N_BATCH);
    let mut exact = 0;
    for (i, case) in m.cases.iter().enumerate() {
        let mut seq = run.seq();
        let logits = run.prefill(&mut seq, &case.prompt_ids, N_BATCH);
        let ours = run.teacher_forced(&mut seq, logits, &case.tokens);
        let peer: Vec<PeerStep> = case
            .tokens
            .iter()
            .zip(certain_top2(case))
            .map(|(&token, top2)| PeerStep { token, top2 })
            .collect();
        let tol = if m.ftype == "F32" {
            LOGPROB_TOL_F32
        } else {
            LOGPROB_TOL_QUANT
        };
        let rep = parity::check_steps(&format!("{gguf} case {i}"), &ours, &peer, tol);
        eprintln!("{gguf} case {i}: {rep:?}");
        exact += (rep.near_ties == 0) as usize;
    }
    eprintln!(
        "{gguf} ({}): {exact} of {} cases equal llama.cpp token for token",
        m.ftype,
        m.cases.len()
    );
    exact
}

#[test]
fn q8_0_tiny_greedy_tokens_equal_llama_cpp() {
    let r = quant_reference();
    let m = quant_model(&r, "tiny-qwen35-q8_0.gguf");
    assert!(
        m.tensor_types.get("Q8_0").copied().unwrap_or(0) > 0,
        "{:?}",
        m.tensor_types
    );
    assert!(assert_equal_llama_cpp("tiny-qwen35-q8_0.gguf") >= 2);
}

#[test]
fn q8_0_wide_greedy_tokens_equal_llama_cpp() {
    assert!(assert_equal_llama_cpp("wide-qwen35-q8_0.gguf") >= 2);
}

#[test]
fn q4_k_m_wide_greedy_tokens_equal_llama_cpp() {
    let r = quant_reference();
    let m = quant_model(&r, "wide-qwen35-q4_k_m.gguf");
    // The fixture must really exercise the K-quant kernels.
    for ty in ["Q4_K", "Q6_K"] {
        assert!(
            m.tensor_types.get(ty).copied().unwrap_or(0) > 0,
            "no {ty} tensor: {:?}",
            m.tensor_types
        );
    }
    assert!(assert_equal_llama_cpp("wide-qwen35-q4_k_m.gguf") >= 2);
}

#[test]
fn fixture_without_mtp_loads_and_matches_hf_and_llama_cpp() {
    let mut run = Runner::new("tiny-qwen35-nomtp-f32.gguf", N_BATCH);
    assert_eq!(
        run.model.architecture(),
        "qwen35",
        "expected the qwen35 architecture"
    );
    assert!(!run.model.has_mtp(), "no MTP block in this file");
    // The main model's weights are those of tiny-qwen35-f32.gguf (the MTP block is drawn
    // after them), so the HF greedy tokens of reference.json apply.
    let hf_cases: Vec<HfCase> = reference_cases();
    for (i, case) in hf_cases.iter().enumerate() {
        let mut seq = run.seq();
        let logits = run.prefill(&mut seq, &case.prompt_ids, N_BATCH);
        let ours = run.greedy(&mut seq, logits, case.greedy_tokens.len());
        assert_eq!(ours, case.greedy_tokens, "case {i}: greedy tokens vs HF");
    }
    assert_eq!(
        assert_equal_llama_cpp("tiny-qwen35-nomtp-f32.gguf"),
        hf_cases.len()
    );
}
