//! The gateway's action schema through the worker's real llguidance grammar, over the default
//! model's tokenizer: one JSON action of every AndroidWorld action type (fourteen, in the
//! forms the schema offers) is accepted token by token as the tokenizer splits it and ends a
//! complete document, so schema-constrained decoding can produce each type; values outside
//! the schema (bad keycode, out-of-range index, a field the type does not take) are refused.

use agent_gateway::action::{
    action_json_schema_for, Action, Direction, GoalStatus, Target, ACTION_TYPES,
};
use device_worker::constraint::{Constraint, ConstraintFactory};
use gguf::reader::GgufFile;
use gguf::tokenizer::Tokenizer;

/// Controls on the screen the schema is built for (indices `0..N_INDICES`).
const N_INDICES: u32 = 12;

fn setup() -> (Tokenizer, ConstraintFactory) {
    let g = GgufFile::open(&test_support::model_path()).expect("model opens");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let f = ConstraintFactory::new(&tok).expect("constraint factory");
    (tok, f)
}

fn constraint(f: &ConstraintFactory, n_indices: u32) -> Constraint {
    f.json_schema(&action_json_schema_for(n_indices).to_string())
        .expect("the action schema compiles")
}

/// Feeds `text`'s tokens; `Ok(())` when every token is allowed and the document is complete
/// (EOS allowed), else the first refused token's position and text.
fn feed(c: &mut Constraint, tok: &Tokenizer, text: &str) -> Result<(), String> {
    let ids = tok.encode(text, false).expect("encode");
    for (k, &id) in ids.iter().enumerate() {
        if !c.is_allowed(id) {
            return Err(format!(
                "token {k} ({:?}) of {text} refused",
                tok.decode(&[id])
            ));
        }
        c.commit(id).expect("an allowed token commits");
    }
    if !(c.is_accepting() && c.is_allowed(tok.eos())) {
        return Err(format!("{text} is not a complete document"));
    }
    Ok(())
}

fn every_type() -> Vec<Action> {
    let i = Target::Index;
    vec![
        Action::Click { target: i(0) },
        Action::DoubleTap { target: i(7) },
        Action::LongPress { target: i(11) },
        Action::InputText {
            text: "milk \"2%\" ✓".into(),
            target: i(3),
            clear_text: None,
        },
        Action::InputText {
            text: "+15550100002".into(),
            target: i(10),
            clear_text: Some(true),
        },
        Action::Scroll {
            direction: Direction::Down,
            index: None,
        },
        Action::Scroll {
            direction: Direction::Right,
            index: Some(5),
        },
        Action::Swipe {
            direction: Direction::Up,
        },
        Action::NavigateBack,
        Action::NavigateHome,
        Action::OpenApp {
            app_name: "Contacts".into(),
        },
        Action::KeyboardEnter { keycode: None },
        Action::KeyboardEnter {
            keycode: Some("KEYCODE_DPAD_CENTER".into()),
        },
        Action::Wait,
        Action::Status {
            goal_status: GoalStatus::Complete,
        },
        Action::Status {
            goal_status: GoalStatus::Infeasible,
        },
        Action::Answer {
            text: "It is 5 pm.".into(),
        },
        Action::Unknown,
    ]
}

#[test]
fn the_grammar_produces_every_action_type() {
    let (tok, f) = setup();
    let actions = every_type();
    let mut types: Vec<&str> = actions.iter().map(Action::action_type).collect();
    types.sort();
    types.dedup();
    let mut want = ACTION_TYPES.to_vec();
    want.sort();
    assert_eq!(types, want, "one action of each of the fourteen types");
    for a in &actions {
        let text = a.to_compact_json();
        feed(&mut constraint(&f, N_INDICES), &tok, &text).unwrap_or_else(|e| panic!("{e}"));
    }
    // Without listed controls the types that need no index remain producible.
    for a in actions.iter().filter(|a| a.index().is_none()) {
        feed(&mut constraint(&f, 0), &tok, &a.to_compact_json())
            .unwrap_or_else(|e| panic!("no controls: {e}"));
    }
}

/// The rules show the model one example per type; each is a document the grammar accepts as
/// written (key order included).
#[test]
fn every_rules_example_passes_the_grammar() {
    let (tok, f) = setup();
    let examples: Vec<&str> = agent_gateway::prompt::RULES
        .lines()
        .filter(|l| l.starts_with("- "))
        .filter_map(|l| Some(&l[l.find('{')?..=l.rfind('}')?]))
        .collect();
    assert!(examples.len() >= ACTION_TYPES.len());
    for ex in examples {
        feed(&mut constraint(&f, N_INDICES), &tok, ex)
            .unwrap_or_else(|e| panic!("rules example: {e}"));
    }
}

#[test]
fn the_grammar_refuses_what_the_parser_refuses() {
    let (tok, f) = setup();
    let refused = [
        r#"{"action_type":"keyboard_enter","keycode":"DPAD_DOWN"}"#,
        r#"{"action_type":"keyboard_enter","keycode":"KEYCODE_dpad"}"#,
        r#"{"action_type":"click","index":12}"#,
        r#"{"action_type":"double_tap","index":1,"direction":"up"}"#,
        r#"{"action_type":"swipe","direction":"up","index":1}"#,
        r#"{"action_type":"swipe","direction":"north"}"#,
        r#"{"action_type":"input_text","text":"x","index":1,"clear_text":"yes"}"#,
        r#"{"action_type":"unknown","text":"why"}"#,
        r#"{"action_type":"tap","index":1}"#,
    ];
    for text in refused {
        assert!(
            feed(&mut constraint(&f, N_INDICES), &tok, text).is_err(),
            "grammar accepts {text}"
        );
        assert!(
            agent_gateway::action::parse_action(text, N_INDICES).is_err(),
            "parser accepts {text}"
        );
    }
    let no_controls = r#"{"action_type":"double_tap","index":0}"#;
    assert!(
        feed(&mut constraint(&f, 0), &tok, no_controls).is_err(),
        "index actions offered without controls"
    );
}
