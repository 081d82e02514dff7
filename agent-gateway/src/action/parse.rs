//! Strict parsing of model output and recorded actions into [`Action`]s (field rules: the table
//! in the parent module's docs; value rules follow android_world `env/json_action.py`).

use serde_json::{Map, Value};

use super::{
    Action, Direction, GoalStatus, Target, ACTION_TYPES, DIRECTIONS, GOAL_STATUSES, KEYCODE_PREFIX,
};
use crate::error::ActionError;

/// Parse model output as one action, strictly: exactly one JSON object (surrounding whitespace
/// allowed), a known `action_type`, its required fields with the right types, no other non-null
/// fields (null fields count as absent, as AndroidWorld writes them), and any `index` below
/// `n_controls` (pass [`crate::observation::Screen::index_bound`]).
///
/// Accepted as `JSONAction` accepts them: `index` as a JSON integer or a string of digits
/// (`"3"`); `text` as a string or a number (kept as its JSON text); pixel coordinates as
/// non-negative numbers (fractions rounded); `keycode` as `KEYCODE_` followed by one or more of
/// `A-Z`, `0-9`, `_`.
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
    let obj = value
        .as_object()
        .ok_or(ActionError::NotAnObject { found: crate::json_kind(value) })?;
    let f = Fields { obj, n_controls };
    let t = f.action_type()?;
    let action = match t {
        "click" => Action::Click {
            target: f.target(t, &[])?,
        },
        "double_tap" => Action::DoubleTap {
            target: f.target(t, &[])?,
        },
        "long_press" => Action::LongPress {
            target: f.target(t, &[])?,
        },
        "input_text" => {
            let target = f.target(t, &["text", "clear_text"])?;
            Action::InputText {
                text: f.text(t)?,
                target,
                clear_text: f.bool("clear_text")?,
            }
        }
        "scroll" => {
            f.only(t, &["direction", "index"])?;
            Action::Scroll {
                direction: f.direction(t)?,
                index: f.index()?,
            }
        }
        "swipe" => {
            f.only(t, &["direction"])?;
            Action::Swipe {
                direction: f.direction(t)?,
            }
        }
        "open_app" => {
            f.only(t, &["app_name"])?;
            Action::OpenApp {
                app_name: f.app_name(t)?,
            }
        }
        "keyboard_enter" => {
            f.only(t, &["keycode"])?;
            Action::KeyboardEnter {
                keycode: f.keycode()?,
            }
        }
        "status" => {
            f.only(t, &["goal_status"])?;
            Action::Status {
                goal_status: f.goal_status(t)?,
            }
        }
        "answer" => {
            f.only(t, &["text"])?;
            Action::Answer { text: f.text(t)? }
        }
        _ => {
            f.only(t, &[])?;
            no_field_action(t)
        }
    };
    Ok(action)
}

/// The action types without fields (`t` is one of them; [`Fields::action_type`] checked it).
fn no_field_action(t: &str) -> Action {
    match t {
        "navigate_back" => Action::NavigateBack,
        "navigate_home" => Action::NavigateHome,
        "wait" => Action::Wait,
        _ => Action::Unknown,
    }
}

/// Find the action JSON object inside free text such as T3A's `"Reason: ...\nAction: {...}"`:
/// the first balanced `{...}` after the last `Action:` marker, else the first balanced `{...}`
/// in the text. Returns the object's text (not validated).
pub fn extract_action_json(text: &str) -> Option<&str> {
    let from = text
        .rfind("Action:")
        .map(|p| p + "Action:".len())
        .unwrap_or(0);
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

/// True for `KEYCODE_` followed by one or more of `A-Z`, `0-9`, `_`.
pub(crate) fn is_keycode(s: &str) -> bool {
    s.strip_prefix(KEYCODE_PREFIX).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// Field access on an action object; null values count as absent.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    /// Exclusive bound for `index`.
    n_controls: u32,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    fn wrong(field: &'static str, expected: &'static str, found: &Value) -> ActionError {
        ActionError::WrongFieldType {
            field,
            expected,
            found: found.to_string(),
        }
    }

    /// The `action_type`, as its entry in [`ACTION_TYPES`].
    fn action_type(&self) -> Result<&'static str, ActionError> {
        let s = match self.get("action_type") {
            None => return Err(ActionError::MissingActionType),
            Some(Value::String(s)) => s.as_str(),
            Some(other) => return Err(Self::wrong("action_type", "a string", other)),
        };
        ACTION_TYPES
            .iter()
            .copied()
            .find(|t| *t == s)
            .ok_or_else(|| ActionError::UnknownActionType {
                action_type: s.to_string(),
                expected: ACTION_TYPES,
            })
    }

    /// Reject any non-null field other than `action_type` and `allowed`.
    fn only(&self, action_type: &'static str, allowed: &[&str]) -> Result<(), ActionError> {
        for (k, v) in self.obj {
            if k != "action_type" && !v.is_null() && !allowed.contains(&k.as_str()) {
                return Err(ActionError::UnexpectedField {
                    action_type,
                    field: k.clone(),
                });
            }
        }
        Ok(())
    }

    /// A tap target: `x` and `y` when either is present, else a required `index`; `extra`
    /// names the type's other fields.
    fn target(&self, t: &'static str, extra: &[&str]) -> Result<Target, ActionError> {
        if self.get("x").is_some() || self.get("y").is_some() {
            self.only(t, &[extra, &["x", "y"]].concat())?;
            return Ok(Target::Point {
                x: self.coord(t, "x")?,
                y: self.coord(t, "y")?,
            });
        }
        self.only(t, &[extra, &["index"]].concat())?;
        let index = self.index()?.ok_or(ActionError::MissingField {
            action_type: t,
            field: "index",
        })?;
        Ok(Target::Index(index))
    }

    /// `index`, if present: a non-negative integer or a string of digits, below `n_controls`.
    fn index(&self) -> Result<Option<u32>, ActionError> {
        let Some(v) = self.get("index") else {
            return Ok(None);
        };
        let expected = "a non-negative integer";
        let i = match v {
            Value::String(s)
                if !s.trim().is_empty() && s.trim().bytes().all(|b| b.is_ascii_digit()) =>
            {
                s.trim()
                    .parse::<u64>()
                    .map_err(|_| Self::wrong("index", expected, v))?
            }
            _ => v
                .as_u64()
                .ok_or_else(|| Self::wrong("index", expected, v))?,
        };
        if i >= u64::from(self.n_controls) {
            return Err(ActionError::IndexOutOfRange {
                index: i,
                n_controls: self.n_controls,
            });
        }
        Ok(Some(i as u32))
    }

    /// A non-negative pixel coordinate; fractional values are rounded.
    fn coord(&self, action_type: &'static str, field: &'static str) -> Result<u32, ActionError> {
        let v = self
            .get(field)
            .ok_or(ActionError::MissingField { action_type, field })?;
        match v.as_f64() {
            Some(f) if f.is_finite() && f >= 0.0 && f <= f64::from(u32::MAX) => {
                Ok(f.round() as u32)
            }
            _ => Err(Self::wrong(field, "a non-negative pixel coordinate", v)),
        }
    }

    fn string(
        &self,
        action_type: &'static str,
        field: &'static str,
    ) -> Result<&'a str, ActionError> {
        match self.get(field) {
            None => Err(ActionError::MissingField { action_type, field }),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(Self::wrong(field, "a string", other)),
        }
    }

    /// `text`: a string, or a number kept as its JSON text (`JSONAction` applies `str()`).
    fn text(&self, action_type: &'static str) -> Result<String, ActionError> {
        match self.get("text") {
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => self.string(action_type, "text").map(str::to_string),
        }
    }

    fn bool(&self, field: &'static str) -> Result<Option<bool>, ActionError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Self::wrong(field, "true or false", other)),
        }
    }

    fn direction(&self, action_type: &'static str) -> Result<Direction, ActionError> {
        let d = self.string(action_type, "direction")?;
        Direction::parse(d).ok_or_else(|| ActionError::InvalidValue {
            field: "direction",
            expected: DIRECTIONS,
            found: d.to_string(),
        })
    }

    fn app_name(&self, action_type: &'static str) -> Result<String, ActionError> {
        let app_name = self.string(action_type, "app_name")?;
        if app_name.trim().is_empty() {
            return Err(Self::wrong(
                "app_name",
                "a non-empty string",
                &Value::String(app_name.into()),
            ));
        }
        Ok(app_name.to_string())
    }

    fn keycode(&self) -> Result<Option<String>, ActionError> {
        match self.get("keycode") {
            None => Ok(None),
            Some(Value::String(k)) if is_keycode(k) => Ok(Some(k.clone())),
            Some(other) => Err(Self::wrong(
                "keycode",
                "a key name like \"KEYCODE_DPAD_DOWN\"",
                other,
            )),
        }
    }

    fn goal_status(&self, action_type: &'static str) -> Result<GoalStatus, ActionError> {
        match self.string(action_type, "goal_status")? {
            "complete" => Ok(GoalStatus::Complete),
            "infeasible" => Ok(GoalStatus::Infeasible),
            s => Err(ActionError::InvalidValue {
                field: "goal_status",
                expected: GOAL_STATUSES,
                found: s.to_string(),
            }),
        }
    }
}
