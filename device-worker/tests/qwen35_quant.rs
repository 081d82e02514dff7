//! The `qwen35` forward pass on quantised fixtures against llama.cpp on the same files:
//! greedy tokens equal to `llama-server`'s for Q8_0 (tiny, hidden 64), Q8_0 and Q4_K_M
//! (wide, hidden 256: every row a multiple of 256, so Q4_K and Q6_K tensors exist), and a
//! fixture converted without the MTP block loads and reproduces the HF reference.
//! Fixtures and llama.cpp's tokens: `tools/fixtures/record_llama_cpp_quant.py`
//! (`tests/fixtures/qwen35/quant_reference.json`).

mod support;

use std::collections::BTreeMap;

use support::qwen35::{read_json, reference_cases, Runner};

/// Where llama.cpp's own top two log-probs are closer than this, rounding differences may
/// legitimately pick the runner-up (same rule as `tests/parity.rs`).
const NEAR_TIE_LOGPROB: f64 = 0.05;
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

/// Greedy decoding of `steps` tokens after prefilling `prompt` in batches of [`N_BATCH`].
fn greedy(run: &mut Runner, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut seq = run.seq();
    let logits = run.prefill(&mut seq, prompt, N_BATCH);
    run.greedy(&mut seq, logits, steps)
}

/// Our greedy tokens must equal llama.cpp's; a difference is allowed only at a step where
/// llama.cpp's top two were within [`NEAR_TIE_LOGPROB`] and we chose its runner-up (after
/// which the sequences may diverge). Returns how many cases matched token for token.
fn assert_equal_llama_cpp(gguf: &str) -> usize {
    let r = quant_reference();
    let m = quant_model(&r, gguf);
    let mut run = Runner::new(gguf, N_BATCH);
    let mut exact = 0;
    for (i, case) in m.cases.iter().enumerate() {
        let ours = greedy(&mut run, &case.prompt_ids, case.tokens.len());
        match ours.iter().zip(&case.tokens).position(|(a, b)| a != b) {
            None => exact += 1,
            Some(k) => {
                let top2 = case.top2[k].as_ref().unwrap_or_else(|| {
                    panic!("{gguf} case {i}: token {k} differs (ours {ours:?}, llama.cpp {:?}) where llama.cpp gave no log-probs", case.tokens)
                });
                let gap = top2[0].1 - top2[1].1;
                assert!(
                    gap < NEAR_TIE_LOGPROB && top2[1].0 == ours[k],
                    "{gguf} case {i}: token {k} differs (ours {ours:?}, llama.cpp {:?}; its top two {top2:?}, gap {gap:.3})",
                    case.tokens
                );
                eprintln!("{gguf} case {i}: equal for {k} tokens, then a near-tie (gap {gap:.3}) went the other way");
            }
        }
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
    assert_eq!(run.model.architecture(), "qwen35", "expected the qwen35 architecture");
    assert!(!run.model.has_mtp(), "no MTP block in this file");
    // The main model's weights are those of tiny-qwen35-f32.gguf (the MTP block is drawn
    // after them), so the HF greedy tokens of reference.json apply.
    let hf_cases: Vec<HfCase> = reference_cases();
    for (i, case) in hf_cases.iter().enumerate() {
        let ours = greedy(&mut run, &case.prompt_ids, case.greedy_tokens.len());
        assert_eq!(ours, case.greedy_tokens, "case {i}: greedy tokens vs HF");
    }
    assert_eq!(
        assert_equal_llama_cpp("tiny-qwen35-nomtp-f32.gguf"),
        hf_cases.len()
    );
}
