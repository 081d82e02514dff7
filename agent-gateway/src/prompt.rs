//! The agent prompt: a constant system message (the rules) and one user message with fixed
//! sections in this order: task and foreground app, the last [`HISTORY_WINDOW`] actions, the
//! indexed on-screen controls. The order follows DESIGN.md "Request path of one step": the
//! parts that change least come first, so consecutive prompts of an episode share a long
//! prefix and diverge inside the history or the controls (Tandem §2.4).
//!
//! Controls: a screen with more controls than [`PromptInput::max_controls`] (the gateway's
//! `--max-controls`, default [`DEFAULT_MAX_CONTROLS`]) lists the most important ones, chosen
//! in this order: the focused control, navigation bars and tabs, editable fields, clickable
//! controls with text, other interactive controls, plain labels (ties: document order; see
//! [`crate::observation::select_controls`]). Listed controls appear in index order with the
//! indices of the full list, and a last line says how many were left out:
//! `... 7 more controls left out (kept first: ...)`.
//!
//! Output is deterministic: the same input always gives byte-identical text.

pub use crate::observation::DEFAULT_MAX_CONTROLS;
use crate::observation::{select_controls, Control, Screen};

/// How many previous actions the prompt shows (oldest first).
pub const HISTORY_WINDOW: usize = 3;
/// Most characters shown of one text (label, content-desc, hint, task is not capped).
pub const MAX_TEXT_CHARS: usize = 60;

/// The rules: what the agent is, the action format with one example per action type, and the
/// answer format. Constant across requests (the shared prefix of every prompt). The action
/// types are android_world's fourteen (`env/json_action.py`).
pub const RULES: &str = "\
You are an agent that operates an Android phone or TV to complete the user's task, one action per step.
Each step you get the task, the foreground app, your last actions and the list of on-screen controls. \
Each control line is: [index] class \"text\" desc=\"content description\" id=resource-id (states).
Choose the single next action and answer with one JSON object only, no other text. Action formats:
- Tap a control: {\"action_type\":\"click\",\"index\":7}
- Double-tap a control: {\"action_type\":\"double_tap\",\"index\":7}
- Long-press a control: {\"action_type\":\"long_press\",\"index\":7}
- Type into an editable control (add \"clear_text\":true to empty it first): {\"action_type\":\"input_text\",\"text\":\"milk\",\"index\":3}
- Scroll the screen or a scrollable control (direction: up, down, left or right): {\"action_type\":\"scroll\",\"direction\":\"down\"}
- Swipe across the screen (the finger's direction): {\"action_type\":\"swipe\",\"direction\":\"left\"}
- Go back: {\"action_type\":\"navigate_back\"}
- Go to the home screen: {\"action_type\":\"navigate_home\"}
- Open an app by name: {\"action_type\":\"open_app\",\"app_name\":\"Contacts\"}
- Press Enter on the keyboard: {\"action_type\":\"keyboard_enter\"}
- Press another key, e.g. a TV remote's D-pad: {\"action_type\":\"keyboard_enter\",\"keycode\":\"KEYCODE_DPAD_DOWN\"}
- Wait for the screen to update: {\"action_type\":\"wait\"}
- Finish: {\"action_type\":\"status\",\"goal_status\":\"complete\"} (or \"infeasible\" if the task cannot be done)
- Answer a question from the task: {\"action_type\":\"answer\",\"text\":\"It is 5 pm.\"}
- No idea what to do: {\"action_type\":\"unknown\"}
Use only indices from the current list. Prefer open_app to launching apps by hand. \
To type, use input_text on the field directly; it focuses the field first. \
When the task is done, answer with the complete status.";

/// What one step's prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct PromptInput<'a> {
    /// The user's task, verbatim.
    pub task: &'a str,
    /// Foreground app (package or name); `None` prints "unknown".
    pub foreground_app: Option<&'a str>,
    /// Previous actions as compact JSON, oldest first; only the last [`HISTORY_WINDOW`] are shown.
    pub history: &'a [String],
    /// The current screen (all its controls; the prompt lists at most `max_controls`).
    pub screen: &'a Screen,
    /// Most controls listed (see the module docs for which); [`DEFAULT_MAX_CONTROLS`] unless
    /// the gateway's `--max-controls` says otherwise.
    pub max_controls: usize,
}

/// The prompt as two chat messages; the worker renders them with the model's chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPrompt {
    /// The rules ([`RULES`]).
    pub system: String,
    /// Task, foreground app, last actions and controls.
    pub user: String,
}

/// Build the prompt for one step (see the module docs for the section order).
pub fn build_prompt(input: &PromptInput<'_>) -> AgentPrompt {
    let mut user = String::with_capacity(256 + input.screen.controls.len().min(input.max_controls) * 48);
    user.push_str("Task: ");
    user.push_str(&one_line_raw(input.task));
    user.push_str("\nForeground app: ");
    user.push_str(input.foreground_app.filter(|a| !a.trim().is_empty()).unwrap_or("unknown"));

    let shown = &input.history[input.history.len().saturating_sub(HISTORY_WINDOW)..];
    let first_step = input.history.len() - shown.len() + 1;
    user.push_str("\nLast actions (oldest first):");
    if shown.is_empty() {
        user.push_str(" none yet");
    }
    for (i, a) in shown.iter().enumerate() {
        user.push_str(&format!("\n{}. {}", first_step + i, one_line_raw(a)));
    }

    let selection = select_controls(input.screen, input.max_controls);
    user.push_str(&format!("\nScreen controls ({}):", input.screen.controls.len()));
    for c in &selection.shown.controls {
        user.push('\n');
        user.push_str(&control_line(c));
    }
    if selection.left_out > 0 {
        user.push_str(&format!("\n... {} more controls {LEFT_OUT_NOTE}", selection.left_out));
    }
    user.push_str("\nNext action (one JSON object):");
    AgentPrompt { system: RULES.to_string(), user }
}

/// What the last control line says after the number of controls left out.
pub const LEFT_OUT_NOTE: &str =
    "left out (kept first: focused control, navigation bars and tabs, editable fields, clickable controls with text)";

/// One control as a compact line, e.g. `[7] Button "Search" (clickable)`.
pub fn control_line(c: &Control) -> String {
    let mut line = format!("[{}] {}", c.index, if c.class.is_empty() { "View" } else { &c.class });
    let text = one_line(&c.text, MAX_TEXT_CHARS);
    let desc = one_line(&c.content_desc, MAX_TEXT_CHARS);
    if !text.is_empty() {
        line.push_str(&format!(" \"{text}\""));
    }
    if !desc.is_empty() && desc != text {
        line.push_str(&format!(" desc=\"{desc}\""));
    }
    let hint = one_line(&c.hint, MAX_TEXT_CHARS);
    if !hint.is_empty() && hint != text {
        line.push_str(&format!(" hint=\"{hint}\""));
    }
    if text.is_empty() && desc.is_empty() && !c.resource_id.is_empty() {
        line.push_str(&format!(" id={}", one_line(&c.resource_id, MAX_TEXT_CHARS)));
    }
    let mut states: Vec<&str> = Vec::new();
    if c.clickable {
        states.push("clickable");
    }
    if c.long_clickable {
        states.push("long-clickable");
    }
    if c.editable {
        states.push("editable");
    }
    if c.scrollable {
        states.push("scrollable");
    }
    if c.checkable {
        states.push(if c.checked { "checked" } else { "unchecked" });
    }
    if c.focused {
        states.push("focused");
    }
    if !states.is_empty() {
        line.push_str(&format!(" ({})", states.join(", ")));
    }
    line
}

/// Collapse whitespace runs (newlines included) to one space, drop control and bidi-mark
/// characters, escape `"` (labels are shown in quotes), and cap at `max_chars` characters (an ellipsis marks a cut).
fn one_line(s: &str, max_chars: usize) -> String {
    one_line_with(s, max_chars, true)
}

/// [`one_line`] without escaping `"` (for JSON history entries, shown verbatim).
fn one_line_raw(s: &str) -> String {
    one_line_with(s, usize::MAX, false)
}

fn one_line_with(s: &str, max_chars: usize, escape_quotes: bool) -> String {
    let mut out = String::new();
    let mut n = 0usize;
    let mut pending_space = false;
    for ch in s.chars() {
        if ch.is_whitespace() {
            pending_space = n > 0;
            continue;
        }
        if ch.is_control() || matches!(ch, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
            continue;
        }
        if pending_space {
            if n + 1 >= max_chars {
                out.push('…');
                return out;
            }
            out.push(' ');
            n += 1;
            pending_space = false;
        }
        if n >= max_chars {
            out.push('…');
            return out;
        }
        if escape_quotes && ch == '"' {
            out.push('\\');
        }
        out.push(ch);
        n += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_collapses_and_caps() {
        assert_eq!(one_line("  a \n\n b\t", 60), "a b");
        assert_eq!(one_line("say \"hi\"", 60), "say \\\"hi\\\"");
        assert_eq!(one_line("\u{200e}Note", 60), "Note");
        let long = "x".repeat(100);
        let capped = one_line(&long, 60);
        assert_eq!(capped.chars().count(), 61);
        assert!(capped.ends_with('…'));
        assert_eq!(one_line(&"y".repeat(60), 60), "y".repeat(60));
    }

    #[test]
    fn control_line_shape() {
        let c = Control {
            index: 7,
            class: "Button".into(),
            text: "Search".into(),
            clickable: true,
            ..Default::default()
        };
        assert_eq!(control_line(&c), "[7] Button \"Search\" (clickable)");
        let d = Control {
            index: 2,
            class: "ImageButton".into(),
            content_desc: "Navigate up".into(),
            resource_id: "up".into(),
            checkable: true,
            checked: true,
            ..Default::default()
        };
        assert_eq!(control_line(&d), "[2] ImageButton desc=\"Navigate up\" (checked)");
    }
}
