//! AndroidWorld-compatible JSON actions: the [`Action`] type, the JSON Schema used as the
//! decoding constraint ([`action_json_schema`], in `action/schema.rs`), strict parsing of model
//! output ([`parse_action`], in `action/parse.rs`) and the check against the current screen
//! ([`check_on_screen`]).
//!
//! Action types and field names follow android_world `env/json_action.py` (`JSONAction`): the
//! fourteen types of [`ACTION_TYPES`] and the fields `action_type`, `index`, `x`, `y`, `text`,
//! `direction`, `app_name`, `goal_status`, `keycode`, `clear_text`. What each type takes:
//!
//! | `action_type` | fields |
//! |---|---|
//! | `click`, `double_tap`, `long_press` | `index`, or `x` and `y` (pixels) |
//! | `input_text` | `text`; `index`, or `x` and `y`; optional `clear_text` (bool) |
//! | `scroll` | `direction`; optional `index` (the scrollable control; else the whole screen) |
//! | `swipe` | `direction` (the finger's direction across the whole screen) |
//! | `keyboard_enter` | optional `keycode` (`KEYCODE_...`; absent: Enter) |
//! | `open_app` | `app_name` |
//! | `status` | `goal_status` (`complete` / `infeasible`) |
//! | `answer` | `text` |
//! | `navigate_back`, `navigate_home`, `wait`, `unknown` | none |
//!
//! `keycode` on `keyboard_enter` is tandem's place for any key press: D-pad and other keys of TV
//! screens (`KEYCODE_DPAD_DOWN`, `KEYCODE_DPAD_CENTER`, ...). `JSONAction` accepts `keycode` on
//! every type but android_world's actuation reads it for no one of the fourteen, so the one
//! type that presses a key carries it. The schema offers only the index-based target forms
//! (fewer alternatives make constrained decoding cheaper); [`parse_action`] also accepts the
//! coordinate forms that recorded episodes contain.

mod parse;
mod schema;

pub use parse::{action_from_value, extract_action_json, parse_action};
pub use schema::{action_json_schema, action_json_schema_for};

use serde_json::{json, Map, Value};

use crate::error::ActionError;
use crate::observation::Screen;

/// Every `action_type` value, in the order the schema and the rules list them (the fourteen
/// of android_world `json_action._ACTION_TYPES`).
pub const ACTION_TYPES: &[&str] = &[
    "click",
    "double_tap",
    "long_press",
    "input_text",
    "scroll",
    "swipe",
    "navigate_back",
    "navigate_home",
    "open_app",
    "keyboard_enter",
    "wait",
    "status",
    "answer",
    "unknown",
];

/// Values of `direction` for `scroll` and `swipe`.
pub const DIRECTIONS: &[&str] = &["up", "down", "left", "right"];
/// Values of `goal_status` for `status`.
pub const GOAL_STATUSES: &[&str] = &["complete", "infeasible"];
/// Prefix every `keycode` carries (android_world checks it; the rest is the Android
/// `KeyEvent` name, e.g. `KEYCODE_DPAD_DOWN`).
pub const KEYCODE_PREFIX: &str = "KEYCODE_";

/// Direction of a `scroll` (the direction the content moves into view) or a `swipe` (the
/// direction the finger moves), as in android_world's actuation.
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
    pub(crate) fn parse(s: &str) -> Option<Self> {
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

/// What a tap-like action (`click`, `double_tap`, `long_press`, `input_text`) aims at: a
/// control `index` ([`crate::observation::Control::index`]) or a screen pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Index(u32),
    /// Screen pixels, origin top left.
    Point {
        x: u32,
        y: u32,
    },
}

/// One agent action (see the module docs for the fields of each type).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Click {
        target: Target,
    },
    DoubleTap {
        target: Target,
    },
    LongPress {
        target: Target,
    },
    /// Focus the target, type `text` (android_world then presses Enter); `clear_text`: empty
    /// the field first (`None`: not said).
    InputText {
        text: String,
        target: Target,
        clear_text: Option<bool>,
    },
    Scroll {
        direction: Direction,
        index: Option<u32>,
    },
    Swipe {
        direction: Direction,
    },
    NavigateBack,
    NavigateHome,
    OpenApp {
        app_name: String,
    },
    /// Press Enter, or the key `keycode` names (`KEYCODE_...`).
    KeyboardEnter {
        keycode: Option<String>,
    },
    Wait,
    Status {
        goal_status: GoalStatus,
    },
    Answer {
        text: String,
    },
    /// The agent could not tell what to do; nothing is executed.
    Unknown,
}

impl Action {
    /// The AndroidWorld `action_type` string.
    pub fn action_type(&self) -> &'static str {
        match self {
            Action::Click { .. } => "click",
            Action::DoubleTap { .. } => "double_tap",
            Action::LongPress { .. } => "long_press",
            Action::InputText { .. } => "input_text",
            Action::Scroll { .. } => "scroll",
            Action::Swipe { .. } => "swipe",
            Action::NavigateBack => "navigate_back",
            Action::NavigateHome => "navigate_home",
            Action::OpenApp { .. } => "open_app",
            Action::KeyboardEnter { .. } => "keyboard_enter",
            Action::Wait => "wait",
            Action::Status { .. } => "status",
            Action::Answer { .. } => "answer",
            Action::Unknown => "unknown",
        }
    }

    /// The tap target, for `click`, `double_tap`, `long_press` and `input_text`.
    pub fn target(&self) -> Option<Target> {
        match self {
            Action::Click { target }
            | Action::DoubleTap { target }
            | Action::LongPress { target }
            | Action::InputText { target, .. } => Some(*target),
            _ => None,
        }
    }

    /// The control index the action targets, if any (a tap target's index or a scroll's).
    pub fn index(&self) -> Option<u32> {
        match (self, self.target()) {
            (_, Some(Target::Index(i))) => Some(i),
            (Action::Scroll { index, .. }, _) => *index,
            _ => None,
        }
    }

    /// The action as an AndroidWorld JSON object holding only the fields it uses, e.g.
    /// `{"action_type":"click","index":7}` (what `JSONAction(**obj)` accepts). Keys come in
    /// the order the schema lists them (and the rules' examples show): `action_type`, `text`,
    /// the target (`index`, or `x` and `y`), then the type's other fields.
    pub fn to_json(&self) -> Value {
        let mut obj = Map::new();
        let mut put = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        put("action_type", json!(self.action_type()));
        match self {
            Action::InputText { text, .. } | Action::Answer { text } => put("text", json!(text)),
            Action::Scroll { direction, .. } | Action::Swipe { direction } => put("direction", json!(direction.as_str())),
            _ => {}
        }
        match self.target() {
            Some(Target::Index(i)) => put("index", json!(i)),
            Some(Target::Point { x, y }) => {
                put("x", json!(x));
                put("y", json!(y));
            }
            None => {}
        }
        match self {
            Action::InputText { clear_text: Some(c), .. } => put("clear_text", json!(c)),
            Action::Scroll { index: Some(i), .. } => put("index", json!(i)),
            Action::OpenApp { app_name } => put("app_name", json!(app_name)),
            Action::KeyboardEnter { keycode: Some(k) } => put("keycode", json!(k)),
            Action::Status { goal_status } => put("goal_status", json!(goal_status.as_str())),
            _ => {}
        }
        Value::Object(obj)
    }

    /// [`Action::to_json`] as compact text (the form kept in the prompt's history).
    pub fn to_compact_json(&self) -> String {
        self.to_json().to_string()
    }
}

/// Check an action against the screen it was chosen on: its `index` (if any) names a listed
/// control of `screen` (AndroidWorld screens keep source indices, so an index below
/// [`Screen::index_bound`] may still be a gap), and its pixel target (if any) lies on the
/// screen (`x < width`, `y < height`; skipped when the screen size is unknown, 0).
///
/// Errors: [`ActionError::IndexOutOfRange`] beyond the bound, [`ActionError::IndexNotListed`]
/// for a gap, [`ActionError::PointOffScreen`] for a pixel outside the screen.
pub fn check_on_screen(action: &Action, screen: &Screen) -> Result<(), ActionError> {
    if let Some(Target::Point { x, y }) = action.target() {
        let (width, height) = (screen.width, screen.height);
        if width > 0 && height > 0 && (x >= width || y >= height) {
            return Err(ActionError::PointOffScreen {
                x,
                y,
                width,
                height,
            });
        }
    }
    match action.index() {
        None => Ok(()),
        Some(i) if i >= screen.index_bound() => Err(ActionError::IndexOutOfRange {
            index: u64::from(i),
            n_controls: screen.index_bound(),
        }),
        Some(i) if screen.control(i).is_none() => Err(ActionError::IndexNotListed { index: i }),
        Some(_) => Ok(()),
    }
}
