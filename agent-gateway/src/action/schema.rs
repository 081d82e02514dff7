//! The decoding constraint: a JSON Schema with one closed alternative per action type.

use serde_json::{json, Map, Value};

use super::{ACTION_TYPES, DIRECTIONS, GOAL_STATUSES, KEYCODE_PREFIX};

/// Action types whose target is a control index in the schema (left out without controls).
const INDEX_TYPES: &[&str] = &["click", "double_tap", "long_press", "input_text"];

/// The decoding constraint for an action: a JSON Schema (draft 2020-12 subset that llguidance
/// accepts: `anyOf`, `const`, `enum`, `type`, `minimum`, `maximum`, `minLength`, `pattern`,
/// `required`, `additionalProperties: false`) whose `anyOf` holds one closed object per action
/// type of [`ACTION_TYPES`], in that order, with `action_type` as a `const` and index-based
/// targets only. Indices are unbounded here; see [`action_json_schema_for`].
pub fn action_json_schema() -> Value {
    schema_with_index(&json!({"type": "integer", "minimum": 0}), true)
}

/// Like [`action_json_schema`], with `index` bounded to `0..n_indices` (pass
/// [`crate::observation::Screen::index_bound`] of the listed controls). With `n_indices == 0`
/// the index-based alternatives (`click`, `double_tap`, `long_press`, `input_text`) are left
/// out and `scroll` takes no index.
pub fn action_json_schema_for(n_indices: u32) -> Value {
    let index = json!({"type": "integer", "minimum": 0, "maximum": n_indices.saturating_sub(1)});
    schema_with_index(&index, n_indices > 0)
}

fn schema_with_index(index: &Value, with_index: bool) -> Value {
    let alts: Vec<Value> = ACTION_TYPES
        .iter()
        .filter(|t| with_index || !INDEX_TYPES.contains(t))
        .map(|t| {
            let (fields, required) = fields_of(t, index, with_index);
            alternative(t, &fields, required)
        })
        .collect();
    json!({ "anyOf": alts })
}

/// The schema fields of `action_type` (in the order the model writes them) and which of them
/// are required.
fn fields_of(
    action_type: &str,
    index: &Value,
    with_index: bool,
) -> (Vec<(&'static str, Value)>, &'static [&'static str]) {
    let text = json!({"type": "string"});
    let direction = json!({ "enum": DIRECTIONS });
    match action_type {
        "click" | "double_tap" | "long_press" => (vec![("index", index.clone())], &["index"]),
        "input_text" => (
            vec![
                ("text", text),
                ("index", index.clone()),
                ("clear_text", json!({"type": "boolean"})),
            ],
            &["text", "index"],
        ),
        "scroll" if with_index => (
            vec![("direction", direction), ("index", index.clone())],
            &["direction"],
        ),
        "scroll" | "swipe" => (vec![("direction", direction)], &["direction"]),
        "open_app" => (
            vec![("app_name", json!({"type": "string", "minLength": 1}))],
            &["app_name"],
        ),
        "keyboard_enter" => {
            let pattern = format!("^{KEYCODE_PREFIX}[A-Z0-9_]+$");
            (
                vec![("keycode", json!({"type": "string", "pattern": pattern}))],
                &[],
            )
        }
        "status" => (
            vec![("goal_status", json!({ "enum": GOAL_STATUSES }))],
            &["goal_status"],
        ),
        "answer" => (vec![("text", text)], &["text"]),
        _ => (Vec::new(), &[]),
    }
}

fn alternative(action_type: &str, fields: &[(&str, Value)], required: &[&str]) -> Value {
    let mut props = Map::new();
    props.insert("action_type".into(), json!({ "const": action_type }));
    for (name, schema) in fields {
        props.insert((*name).to_string(), schema.clone());
    }
    let mut req = vec![json!("action_type")];
    req.extend(required.iter().map(|r| json!(r)));
    json!({"type": "object", "properties": props, "required": req, "additionalProperties": false})
}
