//! AndroidWorld-compatible JSON actions: the [`Action`] type, the JSON Schema used as the
//! decoding constraint ([`action_json_schema`]) and strict validation of model output
//! ([`parse_action`]).
//!
//! Action types and field names follow AndroidWorld's `JSONAction`
//! (`android_world/env/json_action.py`): `action_type`, `index`, `x`, `y`, `text`,
//! `direction`, `app_name`, `goal_status`. The schema offers only the index-based forms
//! (fewer alternatives make constrained decoding cheaper); [`parse_action`] also accepts the
//! coordinate forms `click` / `long_press` with `x`, `y` that recorded episodes contain.

use serde_json::{json, Map, Value};

use crate::error::ActionError;
use crate::observation::Screen;

/// Every `action_type` value, in the order the schema and the rules list them.
pub const ACTION_TYPES: &[&str] = &[
    "click",
    "long_press",
    "input_text",
    "scroll",
    "navigate_back",
    "navigate_home",
    "open_app",
    "keyboard_enter",
    "wait",
    "status",
    "answer",
];

/// Values of `direction` for `scroll`.
pub const DIRECTIONS: &[&str] = &["up", "down", "left", "right"];
/// Values of `goal_status` for `status`.
pub const GOAL_STATUSES: &[&str] = &["complete", "infeasible"];

/// Scroll direction (AndroidWorld: the direction the content moves into view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Up,
    Down,
    Left,
    Right,
}

impl Direction {
    /// The JSON spelling (`"up"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
            Direction::Left => "left",
            Direction::Right => "right",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s {
            "up" => Some(Direction::Up),
            "down" => Some(Direction::Down),
            "left" => Some(Direction::Left),
            "right" => Some(Direction::Right),
            _ => None,
        }
    }
}

/// Outcome the agent reports with a `status` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoalStatus {
    Complete,
    Infeasible,
}

impl GoalStatus {
    /// The JSON spelling (`"complete"` / `"infeasible"`).
    pub fn as_str(self) -> &'static str {
        match self {
            GoalStatus::Complete => "complete",
            GoalStatus::Infeasible => "infeasible",
        }
    }
}

/// One agent action. `index` refers to [`crate::observation::Control::index`]; `x`, `y` are
/// screen pixels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Click { index: u32 },
    /// `click` by coordinates (accepted from recorded episodes; not offered by the schema).
    ClickAt { x: u32, y: u32 },
    LongPress { index: u32 },
    /// `long_press` by coordinates (accepted; not offered by the schema).
    LongPressAt { x: u32, y: u32 },
    InputText { text: String, index: u32 },
    Scroll { direction: Direction, index: Option<u32> },
    NavigateBack,
    NavigateHome,
    OpenApp { app_name: String },
    KeyboardEnter,
    Wait,
    Status { goal_status: GoalStatus },
    Answer { text: String },
}

impl Action {
    /// The AndroidWorld `action_type` string.
    pub fn action_type(&self) -> &'static str {
        match self {
            Action::Click { .. } | Action::ClickAt { .. } => "click",
            Action::LongPress { .. } | Action::LongPressAt { .. } => "long_press",
            Action::InputText { .. } => "input_text",
            Action::Scroll { .. } => "scroll",
            Action::NavigateBack => "navigate_back",
            Action::NavigateHome => "navigate_home",
            Action::OpenApp { .. } => "open_app",
            Action::KeyboardEnter => "keyboard_enter",
            Action::Wait => "wait",
            Action::Status { .. } => "status",
            Action::Answer { .. } => "answer",
        }
    }

    /// The control index the action targets, if any.
    pub fn index(&self) -> Option<u32> {
        match self {
            Action::Click { index } | Action::LongPress { index } | Action::InputText { index, .. } => Some(*index),
            Action::Scroll { index, .. } => *index,
            _ => None,
        }
    }

    /// The action as an AndroidWorld JSON object, e.g. `{"action_type":"click","index":7}`.
    pub fn to_json(&self) -> Value {
        let t = self.action_type();
        match self {
            Action::Click { index } | Action::LongPress { index } => json!({"action_type": t, "index": index}),
            Action::ClickAt { x, y } | Action::LongPressAt { x, y } => json!({"action_type": t, "x": x, "y": y}),
            Action::InputText { text, index } => json!({"action_type": t, "text": text, "index": index}),
            Action::Scroll { direction, index: Some(i) } => {
                json!({"action_type": t, "direction": direction.as_str(), "index": i})
            }
            Action::Scroll { direction, index: None } => json!({"action_type": t, "direction": direction.as_str()}),
            Action::OpenApp { app_name } => json!({"action_type": t, "app_name": app_name}),
            Action::Status { goal_status } => json!({"action_type": t, "goal_status": goal_status.as_str()}),
            Action::Answer { text } => json!({"action_type": t, "text": text}),
            Action::NavigateBack | Action::NavigateHome | Action::KeyboardEnter | Action::Wait => {
                json!({"action_type": t})
            }
        }
    }

    /// [`Action::to_json`] as compact text (the form kept in the prompt's history).
    pub fn to_compact_json(&self) -> String {
        self.to_json().to_string()
    }
}

// === schema ===

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

/// The decoding constraint for an action: a JSON Schema (draft 2020-12 subset that llguidance
/// accepts) whose `anyOf` holds one closed object per action type in [`ACTION_TYPES`], with
/// `action_type` as a `const`, index-based targets only, and `additionalProperties: false`.
/// Indices are unbounded here; see [`action_json_schema_for`].
pub fn action_json_schema() -> Value {
    schema_with_index(json!({"type": "integer", "minimum": 0}), true)
}

/// Like [`action_json_schema`], with `index` bounded to `0..n_indices` (pass
/// [`Screen::index_bound`]). With `n_indices == 0` the index-based alternatives (`click`,
/// `long_press`, `input_text`) are left out and `scroll` takes no index.
pub fn action_json_schema_for(n_indices: u32) -> Value {
    let index = json!({"type": "integer", "minimum": 0, "maximum": n_indices.saturating_sub(1)});
    schema_with_index(index, n_indices > 0)
}

fn schema_with_index(index: Value, with_index: bool) -> Value {
    let text = json!({"type": "string"});
    let mut alts = Vec::new();
    if with_index {
        alts.push(alternative("click", &[("index", index.clone())], &["index"]));
        alts.push(alternative("long_press", &[("index", index.clone())], &["index"]));
        alts.push(alternative("input_text", &[("text", text.clone()), ("index", index.clone())], &["text", "index"]));
    }
    let mut scroll_fields = vec![("direction", json!({ "enum": DIRECTIONS }))];
    if with_index {
        scroll_fields.push(("index", index));
    }
    alts.push(alternative("scroll", &scroll_fields, &["direction"]));
    alts.push(alternative("navigate_back", &[], &[]));
    alts.push(alternative("navigate_home", &[], &[]));
    alts.push(alternative("open_app", &[("app_name", json!({"type": "string", "minLength": 1}))], &["app_name"]));
    alts.push(alternative("keyboard_enter", &[], &[]));
    alts.push(alternative("wait", &[], &[]));
    alts.push(alternative("status", &[("goal_status", json!({ "enum": GOAL_STATUSES }))], &["goal_status"]));
    alts.push(alternative("answer", &[("text", text)], &["text"]));
    json!({ "anyOf": alts })
}

// === parsing ===

/// Parse model output as one action, strictly: exactly one JSON object (surrounding whitespace
/// allowed), a known `action_type`, its required fields with the right types, no other non-null
/// fields (null fields count as absent, as AndroidWorld writes them), and any `index` below
/// `n_controls` (pass [`Screen::index_bound`]).
///
/// Errors: [`ActionError::NotJson`], [`ActionError::NotAnObject`],
/// [`ActionError::MissingActionType`], [`ActionError::UnknownActionType`],
/// [`ActionError::MissingField`], [`ActionError::UnexpectedField`],
/// [`ActionError::WrongFieldType`], [`ActionError::InvalidValue`],
/// [`ActionError::IndexOutOfRange`].
pub fn parse_action(output: &str, n_controls: u32) -> Result<Action, ActionError> {
    let value: Value = serde_json::from_str(output).map_err(|e| ActionError::NotJson {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    action_from_value(&value, n_controls)
}

/// [`parse_action`] on an already-decoded JSON value.
pub fn action_from_value(value: &Value, n_controls: u32) -> Result<Action, ActionError> {
    let obj = value.as_object().ok_or(ActionError::NotAnObject { found: kind(value) })?;
    let fields = Fields { obj };
    let action_type = match obj.get("action_type") {
        None | Some(Value::Null) => return Err(ActionError::MissingActionType),
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(ActionError::WrongFieldType {
                field: "action_type",
                expected: "a string",
                found: other.to_string(),
            })
        }
    };
    let t: &'static str = ACTION_TYPES.iter().copied().find(|t| *t == action_type).ok_or_else(|| {
        ActionError::UnknownActionType { action_type: action_type.to_string(), expected: ACTION_TYPES }
    })?;
    let index = |fields: &Fields<'_>| -> Result<Option<u32>, ActionError> {
        match fields.get("index") {
            None => Ok(None),
            Some(v) => {
                let i = v.as_u64().ok_or_else(|| ActionError::WrongFieldType {
                    field: "index",
                    expected: "a non-negative integer",
                    found: v.to_string(),
                })?;
                if i >= u64::from(n_controls) {
                    return Err(ActionError::IndexOutOfRange { index: i, n_controls });
                }
                Ok(Some(i as u32))
            }
        }
    };
    let action = match t {
        "click" | "long_press" => {
            let has_xy = fields.get("x").is_some() || fields.get("y").is_some();
            if has_xy {
                fields.only(t, &["x", "y"])?;
                let (x, y) = (fields.coord(t, "x")?, fields.coord(t, "y")?);
                if t == "click" {
                    Action::ClickAt { x, y }
                } else {
                    Action::LongPressAt { x, y }
                }
            } else {
                fields.only(t, &["index"])?;
                let index = index(&fields)?.ok_or(ActionError::MissingField { action_type: t, field: "index" })?;
                if t == "click" {
                    Action::Click { index }
                } else {
                    Action::LongPress { index }
                }
            }
        }
        "input_text" => {
            fields.only(t, &["text", "index"])?;
            let text = fields.string(t, "text")?.to_string();
            let index = index(&fields)?.ok_or(ActionError::MissingField { action_type: t, field: "index" })?;
            Action::InputText { text, index }
        }
        "scroll" => {
            fields.only(t, &["direction", "index"])?;
            let d = fields.string(t, "direction")?;
            let direction = Direction::parse(d).ok_or_else(|| ActionError::InvalidValue {
                field: "direction",
                expected: DIRECTIONS,
                found: d.to_string(),
            })?;
            Action::Scroll { direction, index: index(&fields)? }
        }
        "open_app" => {
            fields.only(t, &["app_name"])?;
            let app_name = fields.string(t, "app_name")?;
            if app_name.trim().is_empty() {
                return Err(ActionError::WrongFieldType {
                    field: "app_name",
                    expected: "a non-empty string",
                    found: "\"\"".to_string(),
                });
            }
            Action::OpenApp { app_name: app_name.to_string() }
        }
        "status" => {
            fields.only(t, &["goal_status"])?;
            let s = fields.string(t, "goal_status")?;
            let goal_status = match s {
                "complete" => GoalStatus::Complete,
                "infeasible" => GoalStatus::Infeasible,
                _ => {
                    return Err(ActionError::InvalidValue {
                        field: "goal_status",
                        expected: GOAL_STATUSES,
                        found: s.to_string(),
                    })
                }
            };
            Action::Status { goal_status }
        }
        "answer" => {
            fields.only(t, &["text"])?;
            Action::Answer { text: fields.string(t, "text")?.to_string() }
        }
        "navigate_back" | "navigate_home" | "keyboard_enter" | "wait" => {
            fields.only(t, &[])?;
            match t {
                "navigate_back" => Action::NavigateBack,
                "navigate_home" => Action::NavigateHome,
                "keyboard_enter" => Action::KeyboardEnter,
                _ => Action::Wait,
            }
        }
        _ => {
            return Err(ActionError::UnknownActionType { action_type: t.to_string(), expected: ACTION_TYPES });
        }
    };
    Ok(action)
}

/// Check that the action's `index` (if any) names a control listed on `screen`; AndroidWorld
/// screens keep source indices, so an index below [`Screen::index_bound`] may still be a gap.
///
/// Errors: [`ActionError::IndexOutOfRange`] beyond the bound, [`ActionError::IndexNotListed`]
/// for a gap.
pub fn check_index_listed(action: &Action, screen: &Screen) -> Result<(), ActionError> {
    match action.index() {
        None => Ok(()),
        Some(i) if i >= screen.index_bound() => {
            Err(ActionError::IndexOutOfRange { index: u64::from(i), n_controls: screen.index_bound() })
        }
        Some(i) if screen.control(i).is_none() => Err(ActionError::IndexNotListed { index: i }),
        Some(_) => Ok(()),
    }
}

/// Find the action JSON object inside free text such as T3A's `"Reason: ...\nAction: {...}"`:
/// the first balanced `{...}` after the last `Action:` marker, else the first balanced `{...}`
/// in the text. Returns the object's text (not validated).
pub fn extract_action_json(text: &str) -> Option<&str> {
    let from = text.rfind("Action:").map(|p| p + "Action:".len()).unwrap_or(0);
    balanced_object(&text[from..]).or_else(|| balanced_object(text))
}

/// The first `{...}` in `s` whose braces balance, skipping braces inside JSON strings.
fn balanced_object(s: &str) -> Option<&str> {
    let start = s.find('{')?;
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in s[start..].char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&s[start..start + i + 1]);
                }
            }
            _ => {}
        }
    }
    None
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Field access on an action object; null values count as absent.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    /// Reject any non-null field other than `action_type` and `allowed`.
    fn only(&self, action_type: &'static str, allowed: &[&str]) -> Result<(), ActionError> {
        for (k, v) in self.obj {
            if k != "action_type" && !v.is_null() && !allowed.contains(&k.as_str()) {
                return Err(ActionError::UnexpectedField { action_type, field: k.clone() });
            }
        }
        Ok(())
    }

    fn string(&self, action_type: &'static str, field: &'static str) -> Result<&'a str, ActionError> {
        match self.get(field) {
            None => Err(ActionError::MissingField { action_type, field }),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(ActionError::WrongFieldType { field, expected: "a string", found: other.to_string() }),
        }
    }

    /// A non-negative pixel coordinate; fractional values are rounded.
    fn coord(&self, action_type: &'static str, field: &'static str) -> Result<u32, ActionError> {
        let v = self.get(field).ok_or(ActionError::MissingField { action_type, field })?;
        match v.as_f64() {
            Some(f) if f.is_finite() && f >= 0.0 && f <= f64::from(u32::MAX) => Ok(f.round() as u32),
            _ => Err(ActionError::WrongFieldType {
                field,
                expected: "a non-negative pixel coordinate",
                found: v.to_string(),
            }),
        }
    }
}
