//! JSON-schema constraints over the SmolLM2 vocabulary: driving the grammar to completion,
//! rejecting disallowed tokens, and reporting invalid schemas.


use device_worker::constraint::{Constraint, ConstraintFactory};
use device_worker::error::ConstraintError;
use gguf::reader::GgufFile;
use gguf::tokenizer::Tokenizer;
use test_support::model_path;

const CLICK_SCHEMA: &str = r#"{"type":"object","properties":{"action_type":{"const":"click"},"index":{"type":"integer"}},"required":["action_type","index"],"additionalProperties":false}"#;

/// Steps before a drive is declared non-terminating.
const MAX_STEPS: usize = 200;

/// The default model's tokenizer and a constraint factory over it (the model is a required
/// input).
fn setup() -> (Tokenizer, ConstraintFactory) {
    let g = GgufFile::open(&model_path()).expect("model opens");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let f = ConstraintFactory::new(&tok).expect("factory");
    (tok, f)
}

/// Runs the lead's decoding loop with `choose` picking among the allowed ids; returns the
/// committed ids (without the final EOG, if one was chosen).
fn drive(c: &mut Constraint, tok: &Tokenizer, mut choose: impl FnMut(&[u32]) -> u32) -> Vec<u32> {
    let mut out = Vec::new();
    for _ in 0..MAX_STEPS {
        let allowed = c.allowed_tokens().expect("mask").allowed_ids();
        assert!(
            !allowed.is_empty(),
            "grammar allows nothing after {:?}",
            tok.decode(&out)
        );
        let id = choose(&allowed);
        if tok.is_eog(id) {
            return out;
        }
        c.commit(id).expect("allowed token commits");
        out.push(id);
        if c.is_finished() {
            return out;
        }
    }
    panic!(
        "no completion after {MAX_STEPS} steps: {:?}",
        tok.decode(&out)
    );
}

fn check_click(text: &str) {
    let v: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 2, "{text}");
    assert_eq!(obj["action_type"], "click", "{text}");
    // JSON Schema's "integer" is a number with no fractional part; `-0` qualifies (serde_json
    // reads it as the float -0.0).
    assert!(
        obj["index"].as_f64().is_some_and(|f| f.fract() == 0.0),
        "{text}"
    );
    assert!(
        !text.contains('.') && !text.to_ascii_lowercase().contains("e+"),
        "{text}"
    );
}

#[test]
fn lowest_id_drive_terminates_with_valid_json() {
    let (tok, f) = setup();
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
    // Prefer the lowest allowed id that is not an end-of-generation token, so the drive only
    // stops when the grammar itself is complete.
    let ids = drive(&mut c, &tok, |allowed| {
        allowed
            .iter()
            .copied()
            .find(|&i| !tok.is_eog(i))
            .unwrap_or(allowed[0])
    });
    let text = tok.decode(&ids);
    check_click(&text);
    assert!(c.is_finished() || c.is_accepting(), "{text}");
    // At the end only end-of-generation ids remain.
    let mask = c.allowed_tokens().expect("mask");
    let rest = mask.allowed_ids();
    assert!(
        !rest.is_empty() && rest.iter().all(|&i| tok.is_eog(i)),
        "{rest:?}"
    );
}

#[test]
fn highest_id_drive_also_yields_valid_json() {
    let (tok, f) = setup();
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
    let mut steps = 0;
    let ids = drive(&mut c, &tok, |allowed| {
        steps += 1;
        // Long integers are allowed; after 40 steps take the lowest id to close the object.
        let pick = if steps < 40 {
            allowed.iter().rev().copied().find(|&i| !tok.is_eog(i))
        } else {
            None
        };
        pick.or_else(|| allowed.iter().copied().find(|&i| !tok.is_eog(i)))
            .unwrap_or(allowed[0])
    });
    check_click(&tok.decode(&ids));
}

#[test]
fn model_style_tokenization_is_accepted_and_wrong_tokens_are_rejected() {
    let (tok, f) = setup();
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");

    // Before anything: an object must start; a word or '[' cannot.
    let hello = tok.token_id("Hello").expect("Hello");
    let bracket = tok.token_id("[").expect("[");
    assert!(!c.is_allowed(hello) && !c.is_allowed(bracket));
    assert!(
        !c.is_allowed(1),
        "control token <|im_start|> never matches grammar text"
    );
    assert!(!c.is_allowed(tok.eos()), "empty output is not a document");
    let before = c.allowed_tokens().expect("mask").count();
    match c.commit(hello) {
        Err(ConstraintError::TokenRejected { token, .. }) => assert_eq!(token, hello),
        other => panic!("expected TokenRejected, got {other:?}"),
    }
    assert!(matches!(
        c.commit(10_000_000),
        Err(ConstraintError::TokenRejected { .. })
    ));
    assert_eq!(
        c.allowed_tokens().expect("mask").count(),
        before,
        "a rejected commit leaves the state alone"
    );

    // The compact text a model would write, token by token as the tokenizer splits it.
    let text = r#"{"action_type":"click","index":3}"#;
    let ids = tok.encode(text, false).expect("enc");
    for (k, &id) in ids.iter().enumerate() {
        assert!(
            c.is_allowed(id),
            "token {k} ({:?}) of {text} rejected",
            tok.decode(&[id])
        );
        c.commit(id).expect("commit");
    }
    assert!(c.is_accepting(), "complete object accepts EOS");
    assert!(c.is_allowed(tok.eos()));
    assert!(
        !c.is_allowed(tok.token_id(",").expect(",")),
        "nothing may follow the closing brace"
    );

    // A value outside the const is refused at the first differing token.
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
    let bad = tok
        .encode(r#"{"action_type":"scroll""#, false)
        .expect("enc");
    let mut rejected = false;
    for &id in &bad {
        if !c.is_allowed(id) {
            rejected = true;
            assert!(matches!(
                c.commit(id),
                Err(ConstraintError::TokenRejected { .. })
            ));
            break;
        }
        c.commit(id).expect("prefix commits");
    }
    assert!(rejected, "\"scroll\" must not satisfy const \"click\"");
}

#[test]
fn invalid_schemas_are_reported() {
    let (_tok, f) = setup();
    match f.json_schema(r#"{"type": 12}"#) {
        Err(ConstraintError::InvalidSchema(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected InvalidSchema, got {other:?}"),
    }
    assert!(matches!(
        f.json_schema("{not json"),
        Err(ConstraintError::InvalidSchema(_))
    ));
}

#[test]
fn masks_cover_the_vocabulary_and_apply_to_logits() {
    let (tok, f) = setup();
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
    let mask = c.allowed_tokens().expect("mask");
    let mut logits = vec![0.0f32; tok.vocab_size() + 16];
    mask.apply(&mut logits);
    let finite: Vec<u32> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, _)| i as u32)
        .collect();
    assert_eq!(finite, mask.allowed_ids());
    assert!(finite.iter().all(|&i| (i as usize) < tok.vocab_size()));
    assert_eq!(mask.count(), finite.len());
}

/// Greedy decoding without computing the mask when the unconstrained argmax is allowed
/// (`Constraint::is_allowed` asks the parser about that one token) picks exactly what the
/// masked argmax picks: two constraints in lockstep over seeded random logits, one lazy, one
/// computing the mask at every step. Half of the steps boost a random allowed token so both
/// paths (argmax allowed / not allowed) are taken many times.
#[test]
fn lazy_greedy_choice_equals_the_masked_argmax() {
    let (tok, f) = setup();
    let schema = r#"{"type":"object","properties":{"action_type":{"enum":["click","input_text","scroll"]},"index":{"type":"integer","minimum":0,"maximum":40},"text":{"type":"string","maxLength":12}},"required":["action_type","index"],"additionalProperties":false}"#;
    let n = tok.vocab_size() + 16;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut lazy_hits, mut fallbacks, mut documents) = (0, 0, 0);
    for _doc in 0..12 {
        let mut lazy = f.json_schema(schema).expect("schema");
        let mut full = f.json_schema(schema).expect("schema");
        for _step in 0..MAX_STEPS {
            let mask = full.allowed_tokens().expect("mask").clone();
            let allowed = mask.allowed_ids();
            let mut logits: Vec<f32> = (0..n).map(|_| (rnd() % 10_000) as f32 / 1000.0).collect();
            if rnd() % 2 == 0 {
                let pick = allowed[(rnd() as usize) % allowed.len()];
                logits[pick as usize] += 20.0;
            }
            let mut masked = logits.clone();
            mask.apply(&mut masked);
            let want = device_worker::sampling::argmax(&masked).expect("something allowed");
            let raw = device_worker::sampling::argmax(&logits).unwrap();
            let got = if lazy.is_allowed(raw) {
                lazy_hits += 1;
                raw
            } else {
                fallbacks += 1;
                lazy.allowed_tokens().expect("mask").apply(&mut logits);
                device_worker::sampling::argmax(&logits).unwrap()
            };
            assert_eq!(got, want, "lazy and masked greedy choices differ");
            if tok.is_eog(got) {
                documents += 1;
                break;
            }
            lazy.commit(got).expect("lazy commit");
            full.commit(got).expect("full commit");
            assert_eq!(lazy.is_finished(), full.is_finished());
            if full.is_finished() {
                documents += 1;
                break;
            }
        }
    }
    eprintln!("{lazy_hits} lazy choices, {fallbacks} mask fallbacks, {documents} documents");
    assert!(lazy_hits > 50 && fallbacks > 50, "both paths exercised");
}

/// Whitespace between JSON tokens is bounded as llama.cpp's json-schema-to-grammar bounds it
/// (`ConstraintFactory::json_schema`): compact and pretty-printed documents pass; a third
/// newline, a 21-space indent or two spaces do not; and a drive that takes the longest
/// whitespace token whenever one is allowed still ends in a valid document (with
/// llguidance's default, any run of whitespace, it never did).
#[test]
fn whitespace_between_json_tokens_is_bounded() {
    let (tok, f) = setup();
    let accepts = |text: &str| -> bool {
        let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
        for id in tok.encode(text, false).expect("enc") {
            if c.commit(id).is_err() {
                return false;
            }
        }
        c.is_accepting()
    };
    assert!(accepts(r#"{"action_type":"click","index":3}"#));
    assert!(accepts(r#"{"action_type": "click", "index": 3}"#));
    assert!(accepts("{\n  \"action_type\": \"click\",\n  \"index\": 3\n}"));
    assert!(accepts("{\n\n\t\"action_type\": \"click\", \"index\": 3}"));
    assert!(!accepts("{\n\n\n\"action_type\": \"click\", \"index\": 3}"), "three newlines");
    let indent = format!("{{\n{}\"action_type\": \"click\", \"index\": 3}}", " ".repeat(21));
    assert!(!accepts(&indent), "a 21-space indent");
    assert!(!accepts("{\"action_type\":  \"click\", \"index\": 3}"), "two spaces");

    let ws_len: Vec<usize> = (0..tok.vocab_size() as u32)
        .map(|i| {
            let t = tok.decode(&[i]);
            if !t.is_empty() && t.chars().all(char::is_whitespace) { t.len() } else { 0 }
        })
        .collect();
    let mut c = f.json_schema(CLICK_SCHEMA).expect("schema compiles");
    let ids = drive(&mut c, &tok, |allowed| {
        let longest_ws = allowed.iter().copied().filter(|&i| ws_len[i as usize] > 0).max_by_key(|&i| ws_len[i as usize]);
        longest_ws
            .or_else(|| allowed.iter().copied().find(|&i| !tok.is_eog(i)))
            .unwrap_or(allowed[0])
    });
    let text = tok.decode(&ids);
    check_click(&text);
    assert!(text.chars().filter(|c| c.is_whitespace()).count() > 10, "the drive took whitespace: {text:?}");
}

/// A schema's own `x-guidance` block keeps the whitespace bound unless it chooses the
/// whitespace itself: an unrelated option (`lenient`) still refuses three newlines, while
/// `whitespace_flexible: true` (llguidance's "any whitespace") accepts them.
#[test]
fn x_guidance_options_keep_the_whitespace_bound_unless_they_choose_whitespace() {
    let (tok, f) = setup();
    let with_options = |options: serde_json::Value| -> String {
        let mut schema: serde_json::Value = serde_json::from_str(CLICK_SCHEMA).expect("schema JSON");
        schema["x-guidance"] = options;
        schema.to_string()
    };
    let accepts = |schema: &str, text: &str| -> bool {
        let mut c = f.json_schema(schema).expect("schema compiles");
        tok.encode(text, false).expect("enc").into_iter().all(|id| c.commit(id).is_ok()) && c.is_accepting()
    };
    let three_newlines = "{\n\n\n\"action_type\": \"click\", \"index\": 3}";
    let lenient = with_options(serde_json::json!({ "lenient": true }));
    assert!(accepts(&lenient, r#"{"action_type": "click", "index": 3}"#));
    assert!(!accepts(&lenient, three_newlines), "an unrelated option dropped the bound");
    let flexible = with_options(serde_json::json!({ "whitespace_flexible": true }));
    assert!(accepts(&flexible, three_newlines), "the schema's own whitespace choice is kept");
}
