//! Control selection by importance on real corpus screens: a capped prompt keeps the focused
//! control and the navigation bars, indices stay those of the full list, and the prompt says
//! how many controls were left out.

use std::path::PathBuf;

use agent_gateway::corpus::load_episodes;
use agent_gateway::observation::{importance, parse_uiautomator_bytes, select_controls, Screen};
use agent_gateway::prompt::{build_prompt, PromptInput, LEFT_OUT_NOTE};

fn corpus() -> PathBuf {
    test_support::corpus_dir()
}

fn dump(rel: &str) -> Screen {
    let path = corpus().join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_uiautomator_bytes(&bytes).unwrap()
}

fn labels(screen: &Screen, indices: &[u32]) -> Vec<String> {
    indices
        .iter()
        .map(|&i| {
            screen
                .control(i)
                .map(|c| c.label().to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// `uiautomator_xml/ecovacs/ui_dump_v1.xml` (DAONEW/ecovacs-automation at 565b666c, see
/// SOURCES.md): 51 controls; the system navigation bar comes first in the XML (0-2), then the
/// status bar icons, the focused WebView (15) and the app's top bar (16 "Back", 18 "Video
/// Manager", 19 "Settings"). With a cap of 10, document order keeps the system bar and status
/// icons and cuts the focused control and the top bar; selection by importance keeps both.
#[test]
fn capped_dump_keeps_focus_and_navigation_bars_with_their_indices() {
    let full = dump("uiautomator_xml/ecovacs/ui_dump_v1.xml");
    assert_eq!(full.controls.len(), 51);
    let focused: Vec<u32> = full
        .controls
        .iter()
        .filter(|c| c.focused)
        .map(|c| c.index)
        .collect();
    assert_eq!(focused, [15]);
    let system_bar = [0, 1, 2];
    let top_bar = [16, 18, 19];
    assert_eq!(labels(&full, &system_bar), ["Letzte", "Zurück", "Home"]);
    assert_eq!(
        labels(&full, &top_bar),
        ["Back", "Video Manager", "Settings"]
    );
    // What the document-order cut used to list: none of the focus or the top bar.
    let first_ten: Vec<u32> = full.controls.iter().take(10).map(|c| c.index).collect();
    assert!(!first_ten.contains(&15) && top_bar.iter().all(|i| !first_ten.contains(i)));

    let sel = select_controls(&full, 10);
    assert_eq!((sel.shown.controls.len(), sel.left_out), (10, 41));
    let shown: Vec<u32> = sel.shown.controls.iter().map(|c| c.index).collect();
    for i in focused.iter().chain(&system_bar).chain(&top_bar) {
        assert!(shown.contains(i), "control {i} not listed: {shown:?}");
    }
    // The rest of the cap goes to clickable controls with text (the room buttons), not to the
    // status bar's icons.
    // (Their text starts with a private-use icon glyph.)
    let rooms: Vec<String> = labels(&full, &shown[7..])
        .iter()
        .map(|l| l.chars().skip(2).collect())
        .collect();
    assert_eq!(rooms, ["Bathroom", "Bathroom1", "Cloakroom"]);
    for c in &sel.shown.controls {
        assert_eq!(
            full.control(c.index),
            Some(c),
            "index {} names another control",
            c.index
        );
    }

    let screen = &full;
    let p = build_prompt(&PromptInput {
        task: "clean the kitchen",
        foreground_app: None,
        history: &[],
        screen,
        max_controls: 10,
    });
    let lines: Vec<&str> = p.user.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(lines.len(), 10);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[15] WebView") && l.ends_with("(focused)")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[19] Button \"Settings\"")),
        "{lines:?}"
    );
    assert!(p.user.contains("Screen controls (51):"));
    assert!(
        p.user
            .contains(&format!("\n... 41 more controls {LEFT_OUT_NOTE}\n")),
        "{}",
        p.user
    );
}

/// On every corpus screen and several caps: the listed controls are the most important ones
/// (no left-out control outranks a listed one; ties go to the lower index), they keep their
/// full-list indices in index order, and the count left out adds up.
#[test]
fn selection_order_holds_on_every_corpus_screen() {
    let mut screens: Vec<Screen> = Vec::new();
    for e in load_episodes(&corpus()).unwrap() {
        screens.extend(e.steps.iter().map(|s| s.observation.parse().unwrap()));
    }
    for rel in [
        "uiautomator_xml/ecovacs/ui_dump_v1.xml",
        "uiautomator_xml/samsung_tablet/messaging_conversations.xml",
    ] {
        screens.push(dump(rel));
    }
    let mut capped = 0;
    for screen in &screens {
        for cap in [1, 5, 12, 30, 60] {
            let sel = select_controls(screen, cap);
            let n = screen.controls.len();
            assert_eq!(sel.shown.controls.len(), n.min(cap));
            assert_eq!(sel.left_out, n - n.min(cap));
            assert!(sel
                .shown
                .controls
                .windows(2)
                .all(|w| w[0].index < w[1].index));
            let rank = |c: &agent_gateway::observation::Control| {
                (importance(c, screen.width, screen.height), c.index)
            };
            let worst_shown = sel.shown.controls.iter().map(rank).max();
            for c in &screen.controls {
                match sel.shown.control(c.index) {
                    Some(s) => assert_eq!(s, c),
                    None => assert!(
                        worst_shown.is_some_and(|w| w < rank(c)),
                        "left out {c:?} outranks a listed control"
                    ),
                }
            }
            capped += usize::from(sel.left_out > 0);
        }
    }
    assert!(capped > 50, "only {capped} capped selections");
}

#[test]
fn navigation_by_name_and_by_position() {
    use agent_gateway::observation::{is_navigation, Bounds, Control};
    let at = |y1, y2| Bounds {
        x1: 0,
        y1,
        x2: 200,
        y2,
    };
    let c = |class: &str, id: &str, bounds: Bounds, clickable: bool| Control {
        class: class.into(),
        resource_id: id.into(),
        bounds,
        clickable,
        ..Default::default()
    };
    let (w, h) = (1080, 2400);
    assert!(is_navigation(
        &c("TabLayout$TabView", "", at(1000, 1100), false),
        w,
        h
    ));
    assert!(is_navigation(
        &c("FrameLayout", "bottom_navigation", at(1000, 1100), false),
        w,
        h
    ));
    assert!(is_navigation(
        &c("ImageButton", "action_bar_up", at(1000, 1100), false),
        w,
        h
    ));
    // Named for navigation but filling the screen: a container, not a bar.
    let host = Control {
        bounds: Bounds {
            x1: 0,
            y1: 0,
            x2: 1080,
            y2: 2400,
        },
        ..c("FrameLayout", "nav_host_fragment", at(0, 0), false)
    };
    assert!(!is_navigation(&host, w, h));
    // "tab" inside another word is no tab.
    assert!(!is_navigation(
        &c("TextView", "stable_price", at(1000, 1100), true),
        w,
        h
    ));
    // Position: a small tappable control at the top or bottom edge, not one mid-screen or
    // a label there.
    assert!(is_navigation(&c("View", "", at(40, 140), true), w, h));
    assert!(is_navigation(&c("View", "", at(2250, 2400), true), w, h));
    assert!(!is_navigation(&c("View", "", at(1000, 1100), true), w, h));
    assert!(!is_navigation(&c("TextView", "", at(40, 140), false), w, h));
    assert!(
        !is_navigation(&c("View", "", at(40, 140), true), 0, 0),
        "no geometry without a screen size"
    );
}
