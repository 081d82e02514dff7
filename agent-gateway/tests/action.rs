//! Strict action parsing, the decoding schema, and agreement between the two.

use agent_gateway::action::{
    action_json_schema, action_json_schema_for, check_index_listed, extract_action_json, parse_action, Action,
    Direction, GoalStatus, ACTION_TYPES,
};
use agent_gateway::error::ActionError;
use agent_gateway::observation::parse_android_world;
use serde_json::{json, Value};

/// A validator for the schema subset the action schema uses (anyOf, type object/integer/string,
/// const, enum, minimum, maximum, minLength, required, additionalProperties: false).
fn validate(schema: &Value, v: &Value) -> bool {
    if let Some(alts) = schema.get("anyOf").and_then(Value::as_array) {
        return alts.iter().any(|a| validate(a, v));
    }
    if let Some(c) = schema.get("const") {
        if v != c {
            return false;
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return false;
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(obj) = v.as_object() else { return false };
            let props = schema["properties"].as_object().unwrap();
            for r in schema["required"].as_array().unwrap() {
                if !obj.contains_key(r.as_str().unwrap()) {
                    return false;
                }
            }
            if schema["additionalProperties"] == json!(false) && obj.keys().any(|k| !props.contains_key(k)) {
                return false;
            }
            obj.iter().all(|(k, val)| props.get(k).is_none_or(|p| validate(p, val)))
        }
        Some("integer") => {
            let Some(i) = v.as_i64() else { return false };
            schema.get("minimum").and_then(Value::as_i64).is_none_or(|m| i >= m)
                && schema.get("maximum").and_then(Value::as_i64).is_none_or(|m| i <= m)
        }
        Some("string") => {
            let Some(s) = v.as_str() else { return false };
            schema.get("minLength").and_then(Value::as_u64).is_none_or(|m| s.chars().count() as u64 >= m)
        }
        Some(other) => panic!("validator does not know type {other}"),
        None => true,
    }
}

fn all_index_actions() -> Vec<Action> {
    vec![
        Action::Click { index: 0 },
        Action::LongPress { index: 4 },
        Action::InputText { text: "milk \"2%\" ✓".into(), index: 3 },
        Action::Scroll { direction: Direction::Down, index: None },
        Action::Scroll { direction: Direction::Left, index: Some(2) },
        Action::NavigateBack,
        Action::NavigateHome,
        Action::OpenApp { app_name: "Contacts".into() },
        Action::KeyboardEnter,
        Action::Wait,
        Action::Status { goal_status: GoalStatus::Complete },
        Action::Status { goal_status: GoalStatus::Infeasible },
        Action::Answer { text: "5 pm".into() },
    ]
}

#[test]
fn round_trip_and_schema_accepts_every_index_action() {
    let schema = action_json_schema();
    let bounded = action_json_schema_for(5);
    for a in all_index_actions() {
        let text = a.to_compact_json();
        assert_eq!(parse_action(&text, 5), Ok(a.clone()), "{text}");
        assert_eq!(a.to_json()["action_type"], json!(a.action_type()));
        assert!(validate(&schema, &a.to_json()), "schema rejects {text}");
        assert!(validate(&bounded, &a.to_json()), "bounded schema rejects {text}");
    }
}

#[test]
fn schema_lists_exactly_the_action_types() {
    let schema = action_json_schema();
    let alts = schema["anyOf"].as_array().unwrap();
    let types: Vec<&str> = alts.iter().map(|a| a["properties"]["action_type"]["const"].as_str().unwrap()).collect();
    assert_eq!(types, ACTION_TYPES);
    for a in alts {
        assert_eq!(a["additionalProperties"], json!(false));
        assert!(a["required"].as_array().unwrap().contains(&json!("action_type")));
        // Coordinates are not offered to the model.
        assert!(a["properties"].get("x").is_none() && a["properties"].get("y").is_none());
    }
    // With no listed control the index-based alternatives disappear.
    let none = action_json_schema_for(0);
    let t0: Vec<&str> =
        none["anyOf"].as_array().unwrap().iter().map(|a| a["properties"]["action_type"]["const"].as_str().unwrap()).collect();
    assert!(!t0.contains(&"click") && !t0.contains(&"input_text") && t0.contains(&"scroll"));
}

#[test]
fn schema_and_parser_agree_on_invalid_examples() {
    let schema = action_json_schema_for(5);
    let invalid = [
        json!({"action_type": "click"}),
        json!({"action_type": "click", "index": -1}),
        json!({"action_type": "click", "index": 5}),
        json!({"action_type": "click", "index": "3"}),
        json!({"action_type": "click", "index": 1, "text": "x"}),
        json!({"action_type": "tap", "index": 1}),
        json!({"index": 1}),
        json!({"action_type": "scroll", "direction": "sideways"}),
        json!({"action_type": "status", "goal_status": "done"}),
        json!({"action_type": "open_app", "app_name": ""}),
        json!({"action_type": "input_text", "text": "x"}),
        json!({"action_type": "navigate_back", "index": 0}),
        json!({"action_type": "answer"}),
    ];
    for v in &invalid {
        assert!(!validate(&schema, v), "schema accepts {v}");
        assert!(parse_action(&v.to_string(), 5).is_err(), "parser accepts {v}");
    }
}

#[test]
fn clear_errors() {
    assert!(matches!(parse_action("", 3), Err(ActionError::NotJson { .. })));
    assert!(matches!(parse_action("click 3", 3), Err(ActionError::NotJson { .. })));
    assert!(matches!(
        parse_action(r#"{"action_type":"wait"} {"action_type":"wait"}"#, 3),
        Err(ActionError::NotJson { .. })
    ));
    assert!(matches!(parse_action("Action: {\"action_type\":\"wait\"}", 3), Err(ActionError::NotJson { .. })));
    assert_eq!(parse_action("[1]", 3), Err(ActionError::NotAnObject { found: "an array" }));
    assert_eq!(parse_action("{}", 3), Err(ActionError::MissingActionType));
    assert!(matches!(parse_action(r#"{"action_type":"tap"}"#, 3), Err(ActionError::UnknownActionType { .. })));
    assert_eq!(
        parse_action(r#"{"action_type":"click"}"#, 3),
        Err(ActionError::MissingField { action_type: "click", field: "index" })
    );
    assert_eq!(
        parse_action(r#"{"action_type":"click","index":7}"#, 3),
        Err(ActionError::IndexOutOfRange { index: 7, n_controls: 3 })
    );
    assert!(matches!(
        parse_action(r#"{"action_type":"wait","extra":1}"#, 3),
        Err(ActionError::UnexpectedField { action_type: "wait", .. })
    ));
    assert!(matches!(
        parse_action(r#"{"action_type":"scroll","direction":"north"}"#, 3),
        Err(ActionError::InvalidValue { field: "direction", .. })
    ));
    assert!(matches!(
        parse_action(r#"{"action_type":"click","index":1.5}"#, 3),
        Err(ActionError::WrongFieldType { field: "index", .. })
    ));
}

#[test]
fn whitespace_nulls_and_coordinates() {
    assert_eq!(parse_action("\n  {\"action_type\": \"wait\"}  \n", 0), Ok(Action::Wait));
    // AndroidControl-style records: null fields count as absent, float coordinates are rounded.
    let rec = r#"{"action_type": "click", "app_name": null, "direction": null, "text": null, "x": 313.0, "y": 708.4}"#;
    assert_eq!(parse_action(rec, 0), Ok(Action::ClickAt { x: 313, y: 708 }));
    assert_eq!(parse_action(r#"{"action_type":"long_press","x":1,"y":2}"#, 0), Ok(Action::LongPressAt { x: 1, y: 2 }));
    assert!(matches!(
        parse_action(r#"{"action_type":"click","x":1}"#, 0),
        Err(ActionError::MissingField { field: "y", .. })
    ));
    assert!(parse_action(r#"{"action_type":"click","x":1,"y":2,"index":0}"#, 9).is_err());
    assert!(parse_action(r#"{"action_type":"click","x":-1,"y":2}"#, 9).is_err());
}

#[test]
fn index_must_name_a_listed_control() {
    let screen = parse_android_world(
        r#"[{"text":"a","bbox_pixels":[0,0,10,10]},{"text":"","bbox_pixels":[0,0,10,10]},{"text":"c","is_clickable":true,"bbox_pixels":[0,0,10,10]}]"#,
    )
    .unwrap();
    assert_eq!(screen.index_bound(), 3);
    let ok = parse_action(r#"{"action_type":"click","index":2}"#, screen.index_bound()).unwrap();
    assert_eq!(check_index_listed(&ok, &screen), Ok(()));
    let gap = parse_action(r#"{"action_type":"click","index":1}"#, screen.index_bound()).unwrap();
    assert_eq!(check_index_listed(&gap, &screen), Err(ActionError::IndexNotListed { index: 1 }));
    assert_eq!(check_index_listed(&Action::Wait, &screen), Ok(()));
}

#[test]
fn extract_from_t3a_text() {
    let t = "Reason: tap {the} button\nAction: {\"action_type\": \"input_text\", \"text\": \"a}b\", \"index\": 7}";
    assert_eq!(extract_action_json(t), Some("{\"action_type\": \"input_text\", \"text\": \"a}b\", \"index\": 7}"));
    assert_eq!(extract_action_json("no object"), None);
}
