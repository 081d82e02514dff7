//! AndroidWorld UI-element lists -> [`Screen`].
//!
//! Source shape: `android_world/env/representation_utils.py`, `UIElement` (fields `text`,
//! `content_description`, `class_name`, `bbox`, `bbox_pixels {x_min, x_max, y_min, y_max}`,
//! `hint_text`, `is_checked`, `is_checkable`, `is_clickable`, `is_editable`, `is_enabled`,
//! `is_focused`, `is_focusable`, `is_long_clickable`, `is_scrollable`, `is_selected`,
//! `is_visible`, `package_name`, `resource_name`, `tooltip`, `resource_id`, `metadata`).
//! Accepted spellings: JSON (`null`/`true`) as in episode logs' `state.ui_elements`; the short
//! form `{text, content_desc, class, bbox_pixels: [x1, y1, x2, y2]}` of some logs; and the
//! Python repr `[UIElement(text=None, ..., bbox_pixels=BoundingBox(x_min=0, ...)), ...]`
//! printed by AndroidWorld tools ([`parse_android_world_repr`]).
//!
//! A control keeps its element's position in the list as `index` (AndroidWorld executes
//! `ui_elements[index]`); elements that are invisible (`is_visible: false`), have no positive
//! area, or are neither interactive nor labelled are left out, leaving gaps. The screen size is
//! the largest `x_max` / `y_max` among visible elements (the lists carry no screen size).

use serde_json::{Map, Value};

use super::{pick_foreground, short_class, short_resource_id, Bounds, Control, Screen};
use crate::error::ObservationError;

/// Parse a JSON array of AndroidWorld `UIElement`s (or an object with a `ui_elements` array).
///
/// Errors: [`ObservationError::Empty`] for blank input or no listable element;
/// [`ObservationError::MalformedElements`] for invalid JSON; [`ObservationError::UnexpectedShape`]
/// when the value is not a list of objects.
pub fn parse_android_world(json: &str) -> Result<Screen, ObservationError> {
    if json.trim().is_empty() {
        return Err(ObservationError::Empty);
    }
    let value: Value = serde_json::from_str(json).map_err(|e| ObservationError::MalformedElements {
        line: e.line() as u32,
        column: e.column() as u32,
        message: e.to_string(),
    })?;
    parse_android_world_value(&value)
}

/// Parse an already-decoded UI-element list (see [`parse_android_world`]).
pub fn parse_android_world_value(value: &Value) -> Result<Screen, ObservationError> {
    let elements = match value {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("ui_elements") {
            Some(Value::Array(a)) => a,
            _ => {
                return Err(ObservationError::UnexpectedShape {
                    expected: "an array of UI elements or an object with a \"ui_elements\" array",
                    found: "an object without a \"ui_elements\" array".to_string(),
                })
            }
        },
        other => {
            return Err(ObservationError::UnexpectedShape {
                expected: "an array of UI elements",
                found: crate::json_kind(other).to_string(),
            })
        }
    };
    let mut parsed = Vec::with_capacity(elements.len());
    for (i, e) in elements.iter().enumerate() {
        let obj = e.as_object().ok_or_else(|| ObservationError::UnexpectedShape {
            expected: "an object per UI element",
            found: format!("element {i} is {}", crate::json_kind(e)),
        })?;
        parsed.push((control_of(i as u32, obj), visible_flag(obj)));
    }

    let visible = || parsed.iter().filter(|(c, v)| *v && c.bounds.area() > 0).map(|(c, _)| c);
    let width = visible().map(|c| c.bounds.x2).max().unwrap_or(0).max(0) as u32;
    let height = visible().map(|c| c.bounds.y2).max().unwrap_or(0).max(0) as u32;
    let foreground_package = pick_foreground(visible().map(|c| (c.package.as_str(), c.bounds.area())));
    let controls: Vec<Control> = parsed
        .iter()
        .filter(|(c, v)| {
            *v && c.bounds.intersects_screen(width, height)
                && (c.is_interactive() || !c.text.trim().is_empty() || !c.content_desc.trim().is_empty())
        })
        .map(|(c, _)| c.clone())
        .collect();
    if controls.is_empty() {
        return Err(ObservationError::Empty);
    }
    Ok(Screen { controls, width, height, foreground_package })
}

/// Parse the Python repr of a `UIElement` list, e.g. the first line of AndroidWorld's
/// `ui_log.txt`: `[UIElement(text='Phone', ..., bbox_pixels=BoundingBox(x_min=76, ...)), ...]`.
/// Calls `Name(k=v, ...)` become objects, `None`/`True`/`False` become null/true/false.
///
/// Errors: [`ObservationError::MalformedElements`] (1-based line/column) when the text is not
/// one Python literal; otherwise as [`parse_android_world_value`].
pub fn parse_android_world_repr(text: &str) -> Result<Screen, ObservationError> {
    if text.trim().is_empty() {
        return Err(ObservationError::Empty);
    }
    let value = super::pyrepr::parse(text)?;
    parse_android_world_value(&value)
}

fn string_field<'a>(obj: &'a Map<String, Value>, names: &[&str]) -> &'a str {
    names.iter().find_map(|n| obj.get(*n).and_then(Value::as_str)).unwrap_or("")
}

fn bool_field(obj: &Map<String, Value>, name: &str) -> bool {
    obj.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// `is_visible` defaults to true when absent or null (the short log form has no flags).
fn visible_flag(obj: &Map<String, Value>) -> bool {
    obj.get("is_visible").and_then(Value::as_bool).unwrap_or(true)
}

fn coord(v: Option<&Value>) -> Option<i32> {
    let f = v?.as_f64()?;
    f.is_finite().then(|| f.round().clamp(i32::MIN as f64, i32::MAX as f64) as i32)
}

/// `bbox_pixels` as `{x_min, x_max, y_min, y_max}` or `[x1, y1, x2, y2]`.
fn bounds_of(obj: &Map<String, Value>) -> Bounds {
    let parsed = match obj.get("bbox_pixels") {
        Some(Value::Object(b)) => (|| {
            Some(Bounds {
                x1: coord(b.get("x_min"))?,
                y1: coord(b.get("y_min"))?,
                x2: coord(b.get("x_max"))?,
                y2: coord(b.get("y_max"))?,
            })
        })(),
        Some(Value::Array(a)) if a.len() == 4 => (|| {
            Some(Bounds { x1: coord(a.first())?, y1: coord(a.get(1))?, x2: coord(a.get(2))?, y2: coord(a.get(3))? })
        })(),
        _ => None,
    };
    parsed.unwrap_or_default()
}

fn control_of(index: u32, obj: &Map<String, Value>) -> Control {
    let resource = string_field(obj, &["resource_name", "resource_id"]);
    Control {
        index,
        class: short_class(string_field(obj, &["class_name", "class"])).to_string(),
        text: string_field(obj, &["text"]).to_string(),
        content_desc: string_field(obj, &["content_description", "content_desc"]).to_string(),
        resource_id: short_resource_id(resource).to_string(),
        hint: string_field(obj, &["hint_text"]).to_string(),
        bounds: bounds_of(obj),
        clickable: bool_field(obj, "is_clickable"),
        long_clickable: bool_field(obj, "is_long_clickable"),
        editable: bool_field(obj, "is_editable"),
        scrollable: bool_field(obj, "is_scrollable"),
        checkable: bool_field(obj, "is_checkable"),
        checked: bool_field(obj, "is_checked"),
        focused: bool_field(obj, "is_focused"),
        package: string_field(obj, &["package_name"]).to_string(),
    }
}
