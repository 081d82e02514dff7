//! Strict action parsing, the decoding schema, agreement between the two, and the check
//! against the current screen, for all fourteen AndroidWorld action types.

use agent_gateway::action::{
    action_json_schema, action_json_schema_for, check_on_screen, extract_action_json, parse_action,
    Action, Direction, GoalStatus, Target, ACTION_TYPES,
};
use agent_gateway::error::ActionError;
use agent_gateway::observation::parse_android_world;
use serde_json::{json, Value};

/// Matches a schema `pattern` of the one shape the action schema uses, `^PREFIX[A-Z0-9_]+$`
/// (panics on any other, so a new pattern cannot pass unchecked).
fn matches_pattern(pattern: &str, s: &str) -> bool {
    let body = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix("[A-Z0-9_]+$"));
    let prefix = body.unwrap_or_else(|| panic!("validator does not know pattern {pattern}"));
    s.strip_prefix(prefix).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// A validator for the schema subset the action schema uses (anyOf, type
/// object/integer/string/boolean, const, enum, minimum, maximum, minLength, pattern, required,
/// additionalProperties: false).
fn validate(schema: &Value, v: &Value) -> bool {
    if let Some(alts) = schema.get("anyOf").and_then(Value::as_array) {
        return alts.iter().any(|a| validate(a, v));
    }
    if schema.get("const").is_some_and(|c| v != c) {
        return false;
    }
    if schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|e| !e.contains(v))
    {
        return false;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(obj) = v.as_object() else {
                return false;
            };
            let props = schema["properties"].as_object().unwrap();
            for r in schema["required"].as_array().unwrap() {
                if !obj.contains_key(r.as_str().unwrap()) {
                    return false;
                }
            }
            if schema["additionalProperties"] == json!(false)
                && obj.keys().any(|k| !props.contains_key(k))
            {
                return false;
            }
            obj.iter()
                .all(|(k, val)| props.get(k).is_none_or(|p| validate(p, val)))
        }
        Some("integer") => {
            let Some(i) = v.as_i64() else { return false };
            schema
                .get("minimum")
                .and_then(Value::as_i64)
                .is_none_or(|m| i >= m)
                && schema
                    .get("maximum")
                    .and_then(Value::as_i64)
                    .is_none_or(|m| i <= m)
        }
        Some("string") => {
            let Some(s) = v.as_str() else { return false };
            schema
                .get("minLength")
                .and_then(Value::as_u64)
                .is_none_or(|m| s.chars().count() as u64 >= m)
                && schema
                    .get("pattern")
                    .and_then(Value::as_str)
                    .is_none_or(|p| matches_pattern(p, s))
        }
        Some("boolean") => v.is_boolean(),
        Some(other) => panic!("validator does not know type {other}"),
        None => true,
    }
}

/// One or more actions of every type in the index forms the schema offers.
fn all_index_actions() -> Vec<Action> {
    vec![
        Action::Click {
            target: Target::Index(0),
        },
        Action::DoubleTap {
            target: Target::Index(2),
        },
        Action::LongPress {
            target: Target::Index(4),
        },
        Action::InputText {
            text: "milk \"2%\" ✓".into(),
            target: Target::Index(3),
            clear_text: None,
        },
        Action::InputText {
            text: "bread".into(),
            target: Target::Index(1),
            clear_text: Some(true),
        },
        Action::Scroll {
            direction: Direction::Down,
            index: None,
        },
        Action::Scroll {
            direction: Direction::Left,
            index: Some(2),
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
            keycode: Some("KEYCODE_DPAD_DOWN".into()),
        },
        Action::Wait,
        Action::Status {
            goal_status: GoalStatus::Complete,
        },
        Action::Status {
            goal_status: GoalStatus::Infeasible,
        },
        Action::Answer {
            text: "5 pm".into(),
        },
        Action::Unknown,
    ]
}

#[test]
fn the_fourteen_androidworld_types() {
    // android_world env/json_action.py `_ACTION_TYPES`, as a set.
    let mut want = [
        "click",
        "double_tap",
        "scroll",
        "swipe",
        "input_text",
        "navigate_home",
        "navigate_back",
        "keyboard_enter",
        "open_app",
        "status",
        "wait",
        "long_press",
        "answer",
        "unknown",
    ];
    want.sort();
    let mut have = ACTION_TYPES.to_vec();
    have.sort();
    assert_eq!(have, want);
    let mut covered: Vec<&str> = all_index_actions()
        .iter()
        .map(Action::action_type)
        .collect();
    covered.sort();
    covered.dedup();
    assert_eq!(covered, want);
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
        assert!(
            validate(&bounded, &a.to_json()),
            "bounded schema rejects {text}"
        );
    }
}

#[test]
fn schema_lists_exactly_the_action_types() {
    let schema = action_json_schema();
    let alts = schema["anyOf"].as_array().unwrap();
    let types: Vec<&str> = alts
        .iter()
        .map(|a| a["properties"]["action_type"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(types, ACTION_TYPES);
    for a in alts {
        assert_eq!(a["additionalProperties"], json!(false));
        assert!(a["required"]
            .as_array()
            .unwrap()
            .contains(&json!("action_type")));
        // Coordinates are not offered to the model.
        assert!(a["properties"].get("x").is_none() && a["properties"].get("y").is_none());
    }
    // With no listed control the index-based alternatives disappear.
    let none = action_json_schema_for(0);
    let t0: Vec<&str> = none["anyOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["properties"]["action_type"]["const"].as_str().unwrap())
        .collect();
    for t in ["click", "double_tap", "long_press", "input_text"] {
        assert!(!t0.contains(&t), "{t} offered without controls");
    }
    assert!(t0.contains(&"scroll") && t0.contains(&"swipe") && t0.contains(&"unknown"));
}

#[test]
fn schema_and_parser_agree_on_invalid_examples() {
    let schema = action_json_schema_for(5);
    let invalid = [
        json!({"action_type": "click"}),
        json!({"action_type": "click", "index": -1}),
        json!({"action_type": "click", "index": 5}),
        json!({"action_type": "click", "index": "x3"}),
        json!({"action_type": "double_tap"}),
        json!({"action_type": "long_press", "index": 1, "direction": "up"}),
        json!({"action_type": "swipe"}),
        json!({"action_type": "swipe", "direction": "diagonal"}),
        json!({"action_type": "swipe", "direction": "up", "index": 1}),
        json!({"action_type": "keyboard_enter", "keycode": "DPAD_DOWN"}),
        json!({"action_type": "keyboard_enter", "keycode": "KEYCODE_"}),
        json!({"action_type": "keyboard_enter", "keycode": "KEYCODE_dpad"}),
        json!({"action_type": "keyboard_enter", "keycode": 20}),
        json!({"action_type": "input_text", "text": "x", "index": 1, "clear_text": "yes"}),
        json!({"action_type": "click", "index": 1, "clear_text": true}),
        json!({"action_type": "unknown", "text": "why"}),
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
        assert!(
            parse_action(&v.to_string(), 5).is_err(),
            "parser accepts {v}"
        );
    }
}

#[test]
fn clear_errors() {
    assert!(matches!(
        parse_action("", 3),
        Err(ActionError::NotJson { .. })
    ));
    assert!(matches!(
        parse_action("click 3", 3),
        Err(ActionError::NotJson { .. })
    ));
    assert!(matches!(
        parse_action(r#"{"action_type":"wait"} {"action_type":"wait"}"#, 3),
        Err(ActionError::NotJson { .. })
    ));
    assert!(matches!(
        parse_action("Action: {\"action_type\":\"wait\"}", 3),
        Err(ActionError::NotJson { .. })
    ));
    assert_eq!(
        parse_action("[1]", 3),
        Err(ActionError::NotAnObject { found: "an array" })
    );
    assert_eq!(parse_action("{}", 3), Err(ActionError::MissingActionType));
    assert!(matches!(
        parse_action(r#"{"action_type":"tap"}"#, 3),
        Err(ActionError::UnknownActionType { .. })
    ));
    assert_eq!(
        parse_action(r#"{"action_type":"click"}"#, 3),
        Err(ActionError::MissingField {
            action_type: "click",
            field: "index"
        })
    );
    assert_eq!(
        parse_action(r#"{"action_type":"click","index":7}"#, 3),
        Err(ActionError::IndexOutOfRange {
            index: 7,
            n_controls: 3
        })
    );
    assert!(matches!(
        parse_action(r#"{"action_type":"wait","extra":1}"#, 3),
        Err(ActionError::UnexpectedField {
            action_type: "wait",
            ..
        })
    ));
    assert!(matches!(
        parse_action(r#"{"action_type":"scroll","direction":"north"}"#, 3),
        Err(ActionError::InvalidValue {
            field: "direction",
            ..
        })
    ));
    assert!(matches!(
        parse_action(r#"{"action_type":"click","index":1.5}"#, 3),
        Err(ActionError::WrongFieldType { field: "index", .. })
    ));
}

#[test]
fn whitespace_nulls_and_coordinates() {
    assert_eq!(
        parse_action("\n  {\"action_type\": \"wait\"}  \n", 0),
        Ok(Action::Wait)
    );
    // AndroidControl-style records: null fields count as absent, float coordinates are rounded.
    let rec = r#"{"action_type": "click", "app_name": null, "direction": null, "text": null, "x": 313.0, "y": 708.4}"#;
    assert_eq!(
        parse_action(rec, 0),
        Ok(Action::Click {
            target: Target::Point { x: 313, y: 708 }
        })
    );
    let point = |x, y| Target::Point { x, y };
    assert_eq!(
        parse_action(r#"{"action_type":"long_press","x":1,"y":2}"#, 0),
        Ok(Action::LongPress {
            target: point(1, 2)
        })
    );
    assert_eq!(
        parse_action(r#"{"action_type":"double_tap","x":5,"y":6}"#, 0),
        Ok(Action::DoubleTap {
            target: point(5, 6)
        })
    );
    assert_eq!(
        parse_action(
            r#"{"action_type":"input_text","text":"hi","x":5,"y":6,"clear_text":false}"#,
            0
        ),
        Ok(Action::InputText {
            text: "hi".into(),
            target: point(5, 6),
            clear_text: Some(false)
        })
    );
    assert!(matches!(
        parse_action(r#"{"action_type":"click","x":1}"#, 0),
        Err(ActionError::MissingField { field: "y", .. })
    ));
    assert!(parse_action(r#"{"action_type":"click","x":1,"y":2,"index":0}"#, 9).is_err());
    assert!(parse_action(r#"{"action_type":"click","x":-1,"y":2}"#, 9).is_err());
}

#[test]
fn jsonaction_value_forms() {
    // JSONAction int()s a string index and str()s a non-string text.
    assert_eq!(
        parse_action(r#"{"action_type":"click","index":"3"}"#, 5),
        Ok(Action::Click {
            target: Target::Index(3)
        })
    );
    assert_eq!(
        parse_action(r#"{"action_type":"click","index":"7"}"#, 5),
        Err(ActionError::IndexOutOfRange {
            index: 7,
            n_controls: 5
        })
    );
    assert_eq!(
        parse_action(
            r#"{"action_type":"input_text","text":5550100,"index":1}"#,
            5
        ),
        Ok(Action::InputText {
            text: "5550100".into(),
            target: Target::Index(1),
            clear_text: None
        })
    );
    // The schema only produces the canonical forms.
    assert!(!validate(
        &action_json_schema(),
        &json!({"action_type": "click", "index": "3"})
    ));
    assert_eq!(
        Action::Click {
            target: Target::Index(3)
        }
        .to_compact_json(),
        r#"{"action_type":"click","index":3}"#
    );
    assert!(matches!(
        parse_action(r#"{"action_type":"keyboard_enter","keycode":"ENTER"}"#, 0),
        Err(ActionError::WrongFieldType {
            field: "keycode",
            ..
        })
    ));
}

/// Three controls: index 0 a label, 1 an unlisted gap (no text, not interactive), 2 a button;
/// 100x40 pixels.
fn small_screen() -> agent_gateway::observation::Screen {
    parse_android_world(
        r#"[{"text":"a","bbox_pixels":[0,0,100,10]},{"text":"","bbox_pixels":[0,0,10,10]},{"text":"c","is_clickable":true,"is_scrollable":true,"bbox_pixels":[0,10,100,40]}]"#,
    )
    .unwrap()
}

#[test]
fn every_type_validates_against_the_current_screen() {
    let screen = small_screen();
    assert_eq!(
        (screen.index_bound(), screen.width, screen.height),
        (3, 100, 40)
    );
    let bound = screen.index_bound();
    let on = |a: &Action| check_on_screen(a, &screen);
    for a in all_index_actions()
        .iter()
        .filter(|a| a.index().is_none_or(|i| i == 2 || i == 0))
    {
        assert_eq!(on(a), Ok(()), "{}", a.to_compact_json());
    }
    for (t, with_text) in [
        ("click", false),
        ("double_tap", false),
        ("long_press", false),
        ("input_text", true),
    ] {
        let text = if with_text { r#","text":"x""# } else { "" };
        let listed = parse_action(
            &format!(r#"{{"action_type":"{t}","index":2{text}}}"#),
            bound,
        )
        .unwrap();
        assert_eq!(on(&listed), Ok(()), "{t}");
        let gap = parse_action(
            &format!(r#"{{"action_type":"{t}","index":1{text}}}"#),
            bound,
        )
        .unwrap();
        assert_eq!(
            on(&gap),
            Err(ActionError::IndexNotListed { index: 1 }),
            "{t}"
        );
        let inside = parse_action(
            &format!(r#"{{"action_type":"{t}","x":99,"y":39{text}}}"#),
            bound,
        )
        .unwrap();
        assert_eq!(on(&inside), Ok(()), "{t}");
        let off = parse_action(
            &format!(r#"{{"action_type":"{t}","x":50,"y":40{text}}}"#),
            bound,
        )
        .unwrap();
        assert_eq!(
            on(&off),
            Err(ActionError::PointOffScreen {
                x: 50,
                y: 40,
                width: 100,
                height: 40
            }),
            "{t}"
        );
    }
    let scroll_gap = Action::Scroll {
        direction: Direction::Up,
        index: Some(1),
    };
    assert_eq!(
        on(&scroll_gap),
        Err(ActionError::IndexNotListed { index: 1 })
    );
    let beyond = Action::Click {
        target: Target::Index(9),
    };
    assert_eq!(
        on(&beyond),
        Err(ActionError::IndexOutOfRange {
            index: 9,
            n_controls: 3
        })
    );
}

#[test]
fn extract_from_t3a_text() {
    let t = "Reason: tap {the} button\nAction: {\"action_type\": \"input_text\", \"text\": \"a}b\", \"index\": 7}";
    assert_eq!(
        extract_action_json(t),
        Some("{\"action_type\": \"input_text\", \"text\": \"a}b\", \"index\": 7}")
    );
    assert_eq!(extract_action_json("no object"), None);
}

/// The decoding grammar enforces the schema's property order, so action JSON (the history's
/// form) writes its keys in that order too.
#[test]
fn action_json_keys_follow_the_schema_order() {
    let schema = action_json_schema();
    for a in all_index_actions() {
        let alt = schema["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|alt| alt["properties"]["action_type"]["const"] == json!(a.action_type()))
            .unwrap();
        let order: Vec<&String> = alt["properties"].as_object().unwrap().keys().collect();
        let json = a.to_json();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        let positions: Vec<usize> = keys.iter().map(|k| order.iter().position(|o| o == k).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{} keys {keys:?} vs schema {order:?}", a.to_compact_json());
    }
    assert_eq!(
        Action::InputText { text: "milk".into(), target: Target::Index(3), clear_text: Some(true) }.to_compact_json(),
        r#"{"action_type":"input_text","text":"milk","index":3,"clear_text":true}"#
    );
}
