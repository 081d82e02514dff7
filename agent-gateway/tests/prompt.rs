//! The agent prompt: fixed section order, shared prefixes between consecutive steps, the
//! history window, caps, and that every example in the rules is a valid action.

use std::path::PathBuf;

use agent_gateway::action::{parse_action, ACTION_TYPES};
use agent_gateway::corpus::load_episode;
use agent_gateway::observation::{Control, Screen};
use agent_gateway::prompt::{build_prompt, PromptInput, DEFAULT_MAX_CONTROLS as MAX_CONTROLS, HISTORY_WINDOW, LEFT_OUT_NOTE, RULES};

/// The corpus root (`TANDEM_CORPUS`, else `<repo>/../shared/corpus/raw`): a required input,
/// the test fails when it is missing.
fn corpus() -> PathBuf {
    test_support::corpus_dir()
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// Every `{...}` on the rules' example lines.
fn rule_examples() -> Vec<&'static str> {
    RULES
        .lines()
        .filter(|l| l.starts_with("- "))
        .filter_map(|l| Some(&l[l.find('{')?..=l.rfind('}')?]))
        .collect()
}

#[test]
fn every_rule_example_parses_and_covers_all_action_types() {
    let examples = rule_examples();
    let mut types: Vec<&str> = Vec::new();
    for ex in &examples {
        let a = parse_action(ex, 10).unwrap_or_else(|e| panic!("rules example {ex}: {e}"));
        types.push(a.action_type());
    }
    types.sort();
    types.dedup();
    let mut want = ACTION_TYPES.to_vec();
    want.sort();
    assert_eq!(types, want);
    // One example per action type (fourteen, plus the keycode form): ~550 tokens at ~4 chars per
    // token, between 200 and 650 tokens.
    assert!((800..2600).contains(&RULES.len()), "rules are {} bytes", RULES.len());
}

#[test]
fn consecutive_corpus_steps_share_a_long_prefix() {
    let e = load_episode(&corpus(), "androidworld/ContactsAddContact_base_o4-mini_trial1").unwrap();
    let mut history: Vec<String> = Vec::new();
    let mut prev: Option<(String, String)> = None;
    for st in e.steps.iter().take(5) {
        let screen = st.observation.parse().unwrap();
        let p = build_prompt(&PromptInput {
            task: &e.task,
            foreground_app: screen.foreground_package.as_deref(),
            history: &history,
            screen: &screen,
            max_controls: MAX_CONTROLS,
        });
        assert_eq!(p.system, RULES);
        assert!(p.user.starts_with(&format!("Task: {}\n", e.task)));
        if let Some((sys, user)) = &prev {
            assert_eq!(&p.system, sys);
            // The task line and the history up to the previous step are shared.
            let shared = common_prefix_len(user, &p.user);
            assert!(shared > "Task: ".len() + e.task.len(), "shared {shared} bytes");
        }
        // Section order: task, app, history, controls.
        let pos = |needle: &str| p.user.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
        assert!(pos("Task:") < pos("Foreground app:"));
        assert!(pos("Foreground app:") < pos("Last actions"));
        assert!(pos("Last actions") < pos("Screen controls"));
        prev = Some((p.system, p.user));
        history.push(st.recorded_action.clone().unwrap_or_default());
    }
}

#[test]
fn history_window_keeps_the_last_three() {
    let screen = Screen {
        controls: vec![Control { index: 0, class: "Button".into(), text: "OK".into(), clickable: true, ..Default::default() }],
        width: 100,
        height: 100,
        foreground_package: None,
    };
    let empty = build_prompt(&PromptInput { task: "t", foreground_app: None, history: &[], screen: &screen, max_controls: MAX_CONTROLS });
    assert!(empty.user.contains("Last actions (oldest first): none yet"));
    assert!(empty.user.contains("Foreground app: unknown"));

    let history: Vec<String> = (0..5).map(|i| format!("{{\"action_type\":\"click\",\"index\":{i}}}")).collect();
    let p = build_prompt(&PromptInput { task: "t", foreground_app: Some("com.app"), history: &history, screen: &screen, max_controls: MAX_CONTROLS });
    for (i, h) in history.iter().enumerate() {
        assert_eq!(p.user.contains(h.as_str()), i >= history.len() - HISTORY_WINDOW, "history item {i}");
    }
    assert!(p.user.contains("3. {\"action_type\":\"click\",\"index\":2}"));
    assert!(p.user.contains("[0] Button \"OK\" (clickable)"));
    // Deterministic.
    let again = build_prompt(&PromptInput { task: "t", foreground_app: Some("com.app"), history: &history, screen: &screen, max_controls: MAX_CONTROLS });
    assert_eq!(p, again);
}

#[test]
fn long_texts_and_long_lists_are_capped() {
    let controls: Vec<Control> = (0..75)
        .map(|i| Control { index: i, class: "TextView".into(), text: format!("{i} {}", "long ".repeat(40)), ..Default::default() })
        .collect();
    let screen = Screen { controls, width: 100, height: 100, foreground_package: None };
    let p = build_prompt(&PromptInput { task: "t", foreground_app: None, history: &[], screen: &screen, max_controls: MAX_CONTROLS });
    let lines: Vec<&str> = p.user.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(lines.len(), MAX_CONTROLS);
    assert!(p.user.contains(&format!("... {} more controls {LEFT_OUT_NOTE}", 75 - MAX_CONTROLS)));
    for l in lines {
        assert!(l.chars().count() < 90, "line not capped: {l}");
        assert!(l.contains('…'));
    }
}

#[test]
fn corpus_prompt_sizes_are_reasonable() {
    // Every LlamaTouch step: the user message stays compact (about 60 controls at most).
    let e = load_episode(&corpus(), "llamatouch/trace_7").unwrap();
    for (i, st) in e.steps.iter().enumerate() {
        let screen = st.observation.parse().unwrap();
        let p = build_prompt(&PromptInput { task: &e.task, foreground_app: st.foreground_app.as_deref(), history: &[], screen: &screen, max_controls: MAX_CONTROLS });
        assert!(p.user.len() < 8000, "step {i}: {} bytes", p.user.len());
        assert!(p.user.lines().filter(|l| l.starts_with('[')).count() == screen.controls.len().min(MAX_CONTROLS));
    }
}

/// Every AndroidWorld action type, recorded in an episode as the step runner records it
/// (`EpisodeStore::end_step` with the action's compact JSON), shows in the next prompt's
/// history as one line that parses back to the same action.
#[test]
fn every_action_type_renders_into_the_history() {
    use agent_gateway::action::{Action, Direction, GoalStatus, Target};
    use agent_gateway::episode::EpisodeStore;
    let actions = [
        Action::Click { target: Target::Index(1) },
        Action::DoubleTap { target: Target::Point { x: 10, y: 20 } },
        Action::LongPress { target: Target::Index(0) },
        Action::InputText { text: "say \"hi\"\nthere".into(), target: Target::Index(1), clear_text: Some(true) },
        Action::Scroll { direction: Direction::Down, index: Some(1) },
        Action::Swipe { direction: Direction::Left },
        Action::NavigateBack,
        Action::NavigateHome,
        Action::OpenApp { app_name: "Contacts".into() },
        Action::KeyboardEnter { keycode: Some("KEYCODE_DPAD_RIGHT".into()) },
        Action::Wait,
        Action::Status { goal_status: GoalStatus::Infeasible },
        Action::Answer { text: "5 pm".into() },
        Action::Unknown,
    ];
    let mut types: Vec<&str> = actions.iter().map(Action::action_type).collect();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), ACTION_TYPES.len());
    let screen = Screen {
        controls: vec![Control { index: 1, class: "EditText".into(), editable: true, ..Default::default() }],
        width: 100,
        height: 100,
        foreground_package: None,
    };
    let store = EpisodeStore::new(4);
    for (k, a) in actions.iter().enumerate() {
        let state = store.begin_step("ep", "t");
        assert_eq!(state.history.len(), k);
        store.end_step("ep", Some(a.to_compact_json()));
        let state = store.begin_step("ep", "t");
        let p = build_prompt(&PromptInput { task: "t", foreground_app: None, history: &state.history, screen: &screen, max_controls: MAX_CONTROLS });
        let line = p.user.lines().find(|l| l.starts_with(&format!("{}. ", k + 1))).unwrap_or_else(|| panic!("{}", p.user));
        let shown = line.split_once(". ").unwrap().1;
        assert_eq!(parse_action(shown, u32::MAX).as_ref(), Ok(a), "{line}");
    }
}
