//! Loading real episodes from the corpus; every step's observation parses.

use std::path::{Path, PathBuf};

use agent_gateway::action::{parse_action, Action, Direction, Target};
use agent_gateway::corpus::{load_episode, load_episodes, scan_corpus, ObservationSource, NO_TASK_RECORDED};
use agent_gateway::error::CorpusError;

/// The corpus root (`TANDEM_CORPUS`, else `<repo>/../shared/corpus/raw`): a required input,
/// the test fails when it is missing.
fn corpus() -> PathBuf {
    test_support::corpus_dir()
}

#[test]
fn loads_at_least_three_episodes_and_every_step_parses() {
    let episodes = load_episodes(&corpus()).unwrap();
    assert!(episodes.len() >= 3, "only {} episodes", episodes.len());
    let ids: Vec<&str> = episodes.iter().map(|e| e.id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "episodes sorted by id");
    for want in ["llamatouch/trace_7", "llamatouch/trace_18", "androidworld/demo", "androidworld/ContactsAddContact_base_o4-mini_trial1"] {
        assert!(ids.contains(&want), "{want} missing from {ids:?}");
    }
    for e in &episodes {
        assert!(!e.task.trim().is_empty(), "{}: empty task", e.id);
        assert!(!e.steps.is_empty(), "{}: no steps", e.id);
        assert!(corpus().join(&e.source).exists(), "{}: source {} missing", e.id, e.source);
        for (i, st) in e.steps.iter().enumerate() {
            let screen = st.observation.parse().unwrap_or_else(|err| panic!("{} step {i}: {err}", e.id));
            assert!(!screen.controls.is_empty());
            if let Some(a) = &st.recorded_action {
                // Recorded actions are valid actions; their indices name listed controls.
                let action = parse_action(a, u32::MAX).unwrap_or_else(|err| panic!("{} step {i}: {a}: {err}", e.id));
                if let Some(idx) = action.index() {
                    assert!(screen.control(idx).is_some(), "{} step {i}: index {idx} not listed", e.id);
                }
                if let Some(Target::Point { x, y }) = action.target() {
                    assert!(x <= screen.width.max(1080) && y <= screen.height.max(2400), "{} step {i}: {a}", e.id);
                }
            }
        }
    }
}

#[test]
fn llamatouch_trace_shape() {
    let e = load_episode(&corpus(), "llamatouch/trace_7").unwrap();
    assert_eq!(e.task, "delete location history");
    assert_eq!(e.steps.len(), 12);
    assert!(matches!(e.steps[0].observation, ObservationSource::Xml(_)));
    assert_eq!(e.steps[0].foreground_app.as_deref(), Some("com.google.android.apps.photos"));
    assert_eq!(e.steps[1].foreground_app, None, "bare window name (wallpaper)");
    assert_eq!(e.steps[2].foreground_app, None, "`null` activity");
    assert_eq!(e.steps[0].recorded_action.as_deref(), Some(r#"{"action_type":"navigate_home"}"#));
    assert!(e.steps[11].recorded_action.is_none(), "the last screen has no action");
    // Step 1 (launcher): the recorded tap, rescaled from 400x720 to the dump's 1080x1792,
    // lands on a listed control.
    let a = parse_action(e.steps[1].recorded_action.as_deref().unwrap(), 0).unwrap();
    let Action::Click { target: Target::Point { x, y } } = a else { panic!("expected a coordinate click, got {a:?}") };
    let screen = e.steps[1].observation.parse().unwrap();
    assert!(screen.hit_test(i64::from(x), i64::from(y)).is_some(), "tap ({x},{y}) hits nothing");
}

/// The corpus's recorded swipe: LlamaTouch `test_asset/1.action`
/// (`SWIPE|[0.5, 0.8139]|[0.5, 0.1863]|1080|2400`, LlamaTouch/Evaluator
/// `evaluator/test_asset/1.action` at fc2b4081, see SOURCES.md): the finger moves up the
/// screen, AndroidWorld's `swipe up`. It stays in the next step's history.
#[test]
fn recorded_swipe_stays_in_the_history() {
    let e = load_episode(&corpus(), "llamatouch/test_asset").unwrap();
    assert_eq!(e.source, "llamatouch_evaluator/test_asset");
    assert_eq!(e.task, NO_TASK_RECORDED);
    assert_eq!(
        e.steps.len(),
        2,
        "1.xml and 2.xml; 3.action and 4.action have no screen"
    );
    let swipe = e.steps[0]
        .recorded_action
        .as_deref()
        .expect("step 0 records the swipe");
    assert_eq!(swipe, r#"{"action_type":"swipe","direction":"up"}"#);
    assert_eq!(
        parse_action(swipe, 0),
        Ok(Action::Swipe {
            direction: Direction::Up
        })
    );
    // Step 1's recorded tap (`CLICK|[0.5, 0.1225]`) lands on the 2.xml screen.
    let click = parse_action(e.steps[1].recorded_action.as_deref().unwrap(), 0).unwrap();
    let screen = e.steps[1].observation.parse().unwrap();
    assert_eq!(
        agent_gateway::action::check_on_screen(&click, &screen),
        Ok(())
    );
    let prompt = e.step_prompt(1).unwrap();
    assert!(
        prompt.user.contains(&format!("\n1. {swipe}\n")),
        "history lacks the swipe:\n{}",
        prompt.user
    );
}

#[test]
fn androidworld_logs_and_skips() {
    let load = scan_corpus(&corpus()).unwrap();
    let truncated = load.skipped.iter().find(|s| s.source.contains("TRUNCATED_INVALID")).expect("truncated log skipped");
    assert!(truncated.reason.contains("not valid JSON"), "{}", truncated.reason);
    assert!(load.skipped.iter().any(|s| s.source == "androidcontrol_smolagents_sample"));

    let c = load_episode(&corpus(), "androidworld/ContactsAddContact_base_o4-mini_trial1").unwrap();
    assert_eq!(c.steps.len(), 9);
    assert!(c.task.starts_with("Create a new contact"));
    assert_eq!(c.steps[0].recorded_action.as_deref(), Some(r#"{"action_type":"click","index":3}"#));
    assert!(matches!(c.steps[0].observation, ObservationSource::UiElementsJson(_)));

    // The log whose only step is an LLM-API error: the agent framework wrote a fallback
    // `status infeasible` after the error text, and that is the recorded action.
    let m = load_episode(&corpus(), "androidworld/MarkorCreateFolder_base_o3-mini_trial1").unwrap();
    assert_eq!(m.steps.len(), 1);
    assert_eq!(m.steps[0].recorded_action.as_deref(), Some(r#"{"action_type":"status","goal_status":"infeasible"}"#));
}

#[test]
fn unknown_ids_and_missing_roots_are_errors() {
    match load_episode(&corpus(), "nope") {
        Err(CorpusError::UnknownEpisode { known, .. }) => assert!(known.len() >= 3),
        other => panic!("expected UnknownEpisode, got {other:?}"),
    }
    match load_episodes(Path::new("/nonexistent/corpus")) {
        Err(CorpusError::MissingRoot { root, why }) => {
            assert_eq!(root, Path::new("/nonexistent/corpus"));
            assert_eq!(why, "not found");
        }
        other => panic!("expected MissingRoot, got {other:?}"),
    }
    let empty = std::env::temp_dir().join(format!("empty-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(matches!(load_episodes(&empty), Err(CorpusError::NoEpisodes { .. })));
    // A file is not a folder; a parent of raw/ points at it.
    let file = empty.join("corpus.txt");
    std::fs::write(&file, b"x").unwrap();
    match load_episodes(&file) {
        Err(e @ CorpusError::MissingRoot { why: "is a file, not a folder", .. }) => {
            assert!(e.to_string().contains("is a file, not a folder"), "{e}")
        }
        other => panic!("expected MissingRoot (a file), got {other:?}"),
    }
    std::fs::create_dir_all(empty.join("raw")).unwrap();
    match load_episodes(&empty) {
        Err(e @ CorpusError::NoEpisodes { .. }) => assert!(e.to_string().contains("raw/ subfolder"), "{e}"),
        other => panic!("expected NoEpisodes with a raw/ hint, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&empty);
}
