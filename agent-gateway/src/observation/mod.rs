//! Observations: turn one screen (a uiautomator XML dump or an AndroidWorld UI-element list)
//! into a [`Screen`], an indexed list of the on-screen [`Control`]s the agent may act on.
//!
//! The control's `index` is the number the model writes in an action (`{"action_type":
//! "click", "index": 7}`), as in AndroidWorld's `JSONAction`.
//! - uiautomator dumps: indices are 0.. in document (pre-order) order, without gaps.
//! - AndroidWorld lists: a control keeps the position of its element in the source list
//!   (AndroidWorld executes `ui_elements[index]`), so the listed indices may have gaps where
//!   elements were dropped; use [`Screen::index_bound`] as the exclusive upper bound.
//!
//! Listing rule shared by both parsers: a node becomes a control only if it is visible (positive
//! area intersecting the screen, not flagged invisible) and it is interactive (clickable,
//! long-clickable, editable, scrollable or checkable) or carries text / content-desc.
//!
//! A prompt lists at most a cap of them, chosen by importance ([`select_controls`], module
//! `select`): focused control, navigation bars and tabs, editable fields, clickable controls
//! with text, then the rest; listed controls keep their indices.

mod androidworld;
mod pyrepr;
mod select;
mod uiautomator;

pub use androidworld::{parse_android_world, parse_android_world_repr, parse_android_world_value};
pub use select::{importance, is_navigation, select_controls, Importance, Selection, DEFAULT_MAX_CONTROLS};
pub use uiautomator::{parse_uiautomator, parse_uiautomator_bytes};

use crate::error::ObservationError;

/// A rectangle in screen pixels: left `x1`, top `y1` (inclusive), right `x2`, bottom `y2`
/// (exclusive), as in uiautomator's `bounds="[x1,y1][x2,y2]"` and AndroidWorld's
/// `BoundingBox(x_min, x_max, y_min, y_max)`. Coordinates may be negative or beyond the screen
/// in raw dumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Bounds {
    pub x1: i32,
    pub y1: i32,
    pub x2: i32,
    pub y2: i32,
}

impl Bounds {
    /// Width in pixels (0 when `x2 <= x1`).
    pub fn width(&self) -> u32 {
        (i64::from(self.x2) - i64::from(self.x1)).max(0) as u32
    }
    /// Height in pixels (0 when `y2 <= y1`).
    pub fn height(&self) -> u32 {
        (i64::from(self.y2) - i64::from(self.y1)).max(0) as u32
    }
    /// Area in square pixels.
    pub fn area(&self) -> u64 {
        u64::from(self.width()) * u64::from(self.height())
    }
    /// True when the rectangle has positive area and overlaps `[0, width) x [0, height)`.
    pub fn intersects_screen(&self, width: u32, height: u32) -> bool {
        self.area() > 0
            && i64::from(self.x2) > 0
            && i64::from(self.y2) > 0
            && i64::from(self.x1) < i64::from(width)
            && i64::from(self.y1) < i64::from(height)
    }
    /// True when the pixel `(x, y)` lies inside the rectangle.
    pub fn contains(&self, x: i64, y: i64) -> bool {
        x >= i64::from(self.x1) && x < i64::from(self.x2) && y >= i64::from(self.y1) && y < i64::from(self.y2)
    }
    /// Centre pixel `(x, y)`.
    pub fn center(&self) -> (i32, i32) {
        (
            ((i64::from(self.x1) + i64::from(self.x2)) / 2) as i32,
            ((i64::from(self.y1) + i64::from(self.y2)) / 2) as i32,
        )
    }
}

/// One on-screen control the agent may refer to by `index`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Control {
    /// The number the model uses in actions (see the module docs for gaps).
    pub index: u32,
    /// Short class name, e.g. `"Button"` for `android.widget.Button`.
    pub class: String,
    /// Visible text. For a clickable node that wraps plain text children, the children's texts
    /// are appended here, joined by `" | "` (see `uiautomator` docs).
    pub text: String,
    /// Accessibility content description.
    pub content_desc: String,
    /// Short resource id after `":id/"` (e.g. `"search_button"`), empty when absent.
    pub resource_id: String,
    /// Hint text of an editable field (`hint` attr / AndroidWorld `hint_text`), empty when absent.
    pub hint: String,
    /// On-screen rectangle in pixels.
    pub bounds: Bounds,
    pub clickable: bool,
    pub long_clickable: bool,
    /// Accepts text input (AndroidWorld `is_editable`; for uiautomator, inferred from an
    /// `EditText`/`AutoCompleteTextView` class).
    pub editable: bool,
    pub scrollable: bool,
    pub checkable: bool,
    pub checked: bool,
    pub focused: bool,
    /// Android package owning the node.
    pub package: String,
}

impl Control {
    /// The label a human reads: text, else content-desc, else empty.
    pub fn label(&self) -> &str {
        if !self.text.is_empty() {
            &self.text
        } else {
            &self.content_desc
        }
    }
    /// True when the control accepts an action (click, long press, typing, scrolling, toggling).
    pub fn is_interactive(&self) -> bool {
        self.clickable || self.long_clickable || self.editable || self.scrollable || self.checkable
    }
}

/// One parsed screen: its listed controls in index order and its size in pixels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Screen {
    /// Controls in increasing `index` order.
    pub controls: Vec<Control>,
    /// Screen width in pixels (hierarchy `width` attr, else the largest right edge of the
    /// top-level windows / elements).
    pub width: u32,
    /// Screen height in pixels (same sources as `width`).
    pub height: u32,
    /// Package of the main (largest, non-SystemUI when possible) window, if known.
    pub foreground_package: Option<String>,
}

impl Screen {
    /// Exclusive upper bound of the listed indices (`max index + 1`, 0 when empty). This is the
    /// `n_controls` to pass to [`crate::action::parse_action`].
    pub fn index_bound(&self) -> u32 {
        self.controls.iter().map(|c| c.index.saturating_add(1)).max().unwrap_or(0)
    }
    /// The control carrying `index`, if listed.
    pub fn control(&self, index: u32) -> Option<&Control> {
        self.controls.binary_search_by_key(&index, |c| c.index).ok().map(|i| &self.controls[i])
    }
    /// The smallest-area interactive control containing pixel `(x, y)`, else the smallest
    /// control of any kind containing it. Used to map coordinate actions (recorded taps) to
    /// an index.
    pub fn hit_test(&self, x: i64, y: i64) -> Option<&Control> {
        let containing = || self.controls.iter().filter(move |c| c.bounds.contains(x, y));
        containing()
            .filter(|c| c.is_interactive())
            .min_by_key(|c| c.bounds.area())
            .or_else(|| containing().min_by_key(|c| c.bounds.area()))
    }
}

/// The kind of text an observation arrives as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObservationKind {
    /// `uiautomator dump` / Appium page-source XML.
    UiautomatorXml,
    /// AndroidWorld `UIElement` list as a JSON array.
    AndroidWorldJson,
    /// AndroidWorld `UIElement` list as Python repr (`[UIElement(text=..., ...), ...]`).
    AndroidWorldRepr,
}

/// Parse `text` as an observation of the given kind. Errors as the per-kind parsers.
pub fn parse_observation(kind: ObservationKind, text: &str) -> Result<Screen, ObservationError> {
    match kind {
        ObservationKind::UiautomatorXml => parse_uiautomator(text),
        ObservationKind::AndroidWorldJson => parse_android_world(text),
        ObservationKind::AndroidWorldRepr => parse_android_world_repr(text),
    }
}

/// Short class name: the part after the last `.` (`android.widget.Button` -> `Button`).
pub(crate) fn short_class(class: &str) -> &str {
    class.rsplit('.').next().unwrap_or(class)
}

/// Short resource id: the part after `":id/"` (`com.app:id/search` -> `search`).
pub(crate) fn short_resource_id(id: &str) -> &str {
    match id.rfind(":id/") {
        Some(pos) => &id[pos + 4..],
        None => id,
    }
}

/// Pick the foreground package among `(package, area)` windows: the largest one that is not
/// `com.android.systemui`, else the largest one.
pub(crate) fn pick_foreground<'a>(windows: impl Iterator<Item = (&'a str, u64)> + Clone) -> Option<String> {
    let best = |skip_systemui: bool| {
        windows
            .clone()
            .filter(|(p, _)| !(p.is_empty() || (skip_systemui && *p == "com.android.systemui")))
            .max_by_key(|(_, a)| *a)
            .map(|(p, _)| p.to_string())
    };
    best(true).or_else(|| best(false))
}
