//! Which controls a capped prompt lists: the most important ones, not the first in document
//! order.
//!
//! When a screen has more controls than the cap (`--max-controls`, default
//! [`DEFAULT_MAX_CONTROLS`]), controls are kept by [`Importance`], most important first:
//! 1. the focused control (`focused` / AndroidWorld `is_focused`): where a D-pad or keyboard
//!    acts;
//! 2. navigation bars and tabs ([`is_navigation`]);
//! 3. editable fields;
//! 4. clickable (or long-clickable, checkable) controls with text or a content description;
//! 5. other interactive controls (scrollable containers, unlabelled buttons);
//! 6. plain labels.
//!
//! Ties keep document order (lower index first). The kept controls are listed in index order
//! and keep their indices from the full list, so the index the model writes names the same
//! element for the controller; [`Selection::left_out`] counts the rest.

use super::{Control, Screen};

/// The default cap on listed controls (the gateway's `--max-controls`).
pub const DEFAULT_MAX_CONTROLS: usize = 60;

/// How much a control matters to the agent, most important first (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Importance {
    Focused,
    Navigation,
    Editable,
    LabelledClickable,
    OtherInteractive,
    Text,
}

/// Words of a resource id (split at `_`, `-`, `.` and case changes ignored) that name a
/// navigation bar or tab.
const NAV_ID_WORDS: &[&str] = &[
    "tab",
    "tabs",
    "nav",
    "navigation",
    "navbar",
    "toolbar",
    "actionbar",
    "appbar",
    "tabbar",
    "bottombar",
    "topbar",
];
/// Class-name parts of navigation widgets (`TabLayout$TabView`, `BottomNavigationItemView`,
/// `Toolbar`, `NavigationRailItemView`, ...).
const NAV_CLASS_PARTS: &[&str] = &[
    "Tab",
    "Toolbar",
    "ActionBar",
    "BottomNavigation",
    "NavigationBar",
    "NavigationRail",
];

/// True when `c` belongs to a navigation bar or a tab strip: its class or resource id names
/// one (see [`NAV_CLASS_PARTS`], [`NAV_ID_WORDS`]; `action_bar` counts as `actionbar`) and it
/// covers at most half the screen, or it
/// is an interactive control (clickable, long-clickable or checkable) at most 1/8 of the screen
/// high lying within the top or the bottom 15% of a `width` x `height` screen (top
/// navigation rows of TV and phone apps, bottom tab bars, the system navigation bar). The
/// geometric rule is skipped when the screen size is unknown (0).
pub fn is_navigation(c: &Control, width: u32, height: u32) -> bool {
    let id = c.resource_id.to_ascii_lowercase();
    let joined = id.replace(['_', '-', '.'], "");
    let named = NAV_CLASS_PARTS.iter().any(|p| c.class.contains(p))
        || id.split(['_', '-', '.']).any(|w| NAV_ID_WORDS.contains(&w))
        || NAV_ID_WORDS
            .iter()
            .filter(|w| w.len() > 4)
            .any(|w| joined.contains(w));
    let screen_area = u64::from(width) * u64::from(height);
    if named {
        // A container named for navigation (`nav_host_fragment`) that fills the screen is none.
        return screen_area == 0 || c.bounds.area() * 2 <= screen_area;
    }
    let tappable = c.clickable || c.long_clickable || c.checkable;
    if !tappable || width == 0 || height == 0 {
        return false;
    }
    let h = i64::from(height);
    let small = i64::from(c.bounds.height()) * 8 <= h;
    let top = i64::from(c.bounds.y2) * 20 <= h * 3;
    let bottom = i64::from(c.bounds.y1) * 20 >= h * 17;
    small && (top || bottom)
}

/// The [`Importance`] of `c` on a `width` x `height` screen.
pub fn importance(c: &Control, width: u32, height: u32) -> Importance {
    let labelled = !c.text.trim().is_empty() || !c.content_desc.trim().is_empty();
    if c.focused {
        Importance::Focused
    } else if is_navigation(c, width, height) {
        Importance::Navigation
    } else if c.editable {
        Importance::Editable
    } else if labelled && (c.clickable || c.long_clickable || c.checkable) {
        Importance::LabelledClickable
    } else if c.is_interactive() {
        Importance::OtherInteractive
    } else {
        Importance::Text
    }
}

/// The controls a prompt lists and how many it leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The listed controls in index order, with their indices from the full list; the size and
    /// foreground package are the full screen's.
    pub shown: Screen,
    /// Controls of the full screen not listed.
    pub left_out: usize,
}

/// Keep at most `max_controls` controls of `screen`, the most important first (see the module
/// docs). A screen within the cap is returned whole; `max_controls == 0` lists nothing.
pub fn select_controls(screen: &Screen, max_controls: usize) -> Selection {
    let controls = &screen.controls;
    if controls.len() <= max_controls {
        return Selection {
            shown: screen.clone(),
            left_out: 0,
        };
    }
    let mut order: Vec<usize> = (0..controls.len()).collect();
    order.sort_by_key(|&i| (importance(&controls[i], screen.width, screen.height), i));
    order.truncate(max_controls);
    order.sort_unstable();
    let shown = Screen {
        controls: order.iter().map(|&i| controls[i].clone()).collect(),
        width: screen.width,
        height: screen.height,
        foreground_package: screen.foreground_package.clone(),
    };
    Selection {
        left_out: controls.len() - shown.controls.len(),
        shown,
    }
}
