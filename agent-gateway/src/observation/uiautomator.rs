//! uiautomator / Appium page-source XML -> [`Screen`].
//!
//! Accepted input (all seen in real dumps):
//! - `<hierarchy>` holding one or more top-level windows (status bar, nav bar, app, dialogs);
//!   nodes are `<node class="...">` (uiautomator) or elements named after their class
//!   (`<android.widget.Button ...>`, Appium page source) with `class` possibly absent;
//! - pretty-printed or single-line text, CRLF line ends, non-ASCII text;
//! - junk before the XML (tool log lines, a `path:1:` prefix): everything before the first
//!   `<?xml` or `<hierarchy` is dropped;
//! - bytes that are not UTF-8 via [`parse_uiautomator_bytes`] (lossy: bad bytes become U+FFFD).
//!
//! Listing rule: a node is a control when it is visible (bounds of positive area intersecting
//! the screen; not `displayed="false"` / `visible-to-user="false"`) and it is interactive
//! (clickable, long-clickable, checkable, scrollable, or an edit field) or carries text /
//! content-desc.
//!
//! Label merging (what a human sees on a button made of a clickable layout around a text view):
//! a visible, non-interactive node with text or content-desc whose nearest listed interactive
//! ancestor is a *merge target* is not listed itself; its text (else content-desc) is appended
//! to the target's `text`, joined by `" | "`, skipping duplicates, at most
//! [`MAX_MERGED_TEXTS`] parts (further texts are listed as their own controls). A merge target
//! is clickable or long-clickable, neither scrollable nor editable, and covers at most half the
//! screen (so a clickable full-screen container or a list does not swallow its items).
//!
//! Indices are assigned 0.. in document (pre-order) order of the listed nodes.

use roxmltree::{Document, Node};

use super::{pick_foreground, short_class, short_resource_id, Bounds, Control, Screen};
use crate::error::ObservationError;

/// Most child texts merged into one clickable parent's label.
pub const MAX_MERGED_TEXTS: usize = 3;

/// Parse a uiautomator dump given as bytes, decoding lossily (invalid UTF-8 sequences, e.g.
/// CP949 text under a UTF-8 declaration, become U+FFFD). A UTF-8 BOM is ignored.
/// Errors: as [`parse_uiautomator`].
pub fn parse_uiautomator_bytes(bytes: &[u8]) -> Result<Screen, ObservationError> {
    let text = String::from_utf8_lossy(bytes);
    parse_uiautomator(&text)
}

/// Parse a uiautomator (or Appium page-source) XML dump into a [`Screen`].
///
/// Errors: [`ObservationError::Empty`] for blank input or a dump with no listable control;
/// [`ObservationError::NotXml`] when no `<?xml` / `<hierarchy` start is found;
/// [`ObservationError::MalformedXml`] (1-based line/column in `xml`) when the XML is not
/// well-formed.
pub fn parse_uiautomator(xml: &str) -> Result<Screen, ObservationError> {
    let xml = xml.strip_prefix('\u{feff}').unwrap_or(xml);
    if xml.trim().is_empty() {
        return Err(ObservationError::Empty);
    }
    let start = find_xml_start(xml).ok_or_else(|| ObservationError::NotXml {
        found: xml.trim_start().chars().take(60).collect(),
    })?;
    let body = &xml[start..];
    let doc = Document::parse(body).map_err(|e| malformed(&xml[..start], &e))?;
    let root = doc.root_element();

    // Windows: the element children of <hierarchy>, or the root itself for a bare node tree.
    let windows: Vec<Node<'_, '_>> = if root.tag_name().name() == "hierarchy" {
        root.children().filter(|n| n.is_element()).collect()
    } else {
        vec![root]
    };

    let (width, height) = screen_size(root, &windows);
    let mut walker = Walker { width, height, controls: Vec::new() };
    for w in &windows {
        walker.visit(*w, None);
    }
    if walker.controls.is_empty() {
        return Err(ObservationError::Empty);
    }
    let foreground_package = pick_foreground(windows.iter().map(|w| {
        let area = attr(*w, "bounds").and_then(parse_bounds).map(|b| b.area()).unwrap_or(0);
        (attr(*w, "package").unwrap_or(""), area)
    }));
    Ok(Screen { controls: walker.controls, width, height, foreground_package })
}

/// Byte offset of the first `<?xml` or `<hierarchy`, whichever comes first.
fn find_xml_start(text: &str) -> Option<usize> {
    match (text.find("<?xml"), text.find("<hierarchy")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Map a roxmltree error to [`ObservationError::MalformedXml`], with the position counted from
/// the start of the caller's text (the stripped `prefix` included).
fn malformed(prefix: &str, e: &roxmltree::Error) -> ObservationError {
    let pos = e.pos();
    let prefix_lines = prefix.matches('\n').count() as u32;
    let last_line_chars = prefix.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) as u32;
    let column = if pos.row == 1 { pos.col + last_line_chars } else { pos.col };
    ObservationError::MalformedXml { line: pos.row + prefix_lines, column, message: e.to_string() }
}

/// Screen size: `<hierarchy width height>` when both are present and positive, else the
/// largest right / bottom edge among the windows' bounds.
fn screen_size(root: Node<'_, '_>, windows: &[Node<'_, '_>]) -> (u32, u32) {
    let w = attr(root, "width").and_then(|v| v.trim().parse::<u32>().ok()).filter(|v| *v > 0);
    let h = attr(root, "height").and_then(|v| v.trim().parse::<u32>().ok()).filter(|v| *v > 0);
    if let (Some(w), Some(h)) = (w, h) {
        return (w, h);
    }
    let mut max_x = 0i32;
    let mut max_y = 0i32;
    for b in windows.iter().filter_map(|n| attr(*n, "bounds").and_then(parse_bounds)) {
        max_x = max_x.max(b.x2);
        max_y = max_y.max(b.y2);
    }
    (w.unwrap_or(max_x.max(0) as u32), h.unwrap_or(max_y.max(0) as u32))
}

fn attr<'a>(node: Node<'a, '_>, name: &str) -> Option<&'a str> {
    node.attribute(name)
}

fn flag(node: Node<'_, '_>, name: &str) -> bool {
    node.attribute(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

fn flag_false(node: Node<'_, '_>, name: &str) -> bool {
    node.attribute(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
}

/// Parse `"[x1,y1][x2,y2]"` (whitespace tolerated). `None` when malformed.
pub(crate) fn parse_bounds(s: &str) -> Option<Bounds> {
    let nums: Vec<i32> = s
        .split(['[', ']', ','])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<i32>().ok())
        .collect::<Option<Vec<_>>>()?;
    match nums.as_slice() {
        [x1, y1, x2, y2] => Some(Bounds { x1: *x1, y1: *y1, x2: *x2, y2: *y2 }),
        _ => None,
    }
}

/// Where a descendant's plain text may be merged: index into `controls` of the target.
#[derive(Clone, Copy)]
struct MergeTarget {
    slot: usize,
}

struct Walker {
    width: u32,
    height: u32,
    controls: Vec<Control>,
}

impl Walker {
    /// Walks `root`'s subtree in document order (pre-order). Iterative, with an explicit
    /// stack: a hostile dump nested thousands of levels deep must not overflow the thread's
    /// stack (it did, with recursion, at depth 6000).
    fn visit(&mut self, root: Node<'_, '_>, merge: Option<MergeTarget>) {
        let mut stack = vec![(root, merge)];
        while let Some((node, merge)) = stack.pop() {
            let child_merge = self.visit_one(node, merge);
            let children: Vec<_> = node.children().filter(|n| n.is_element()).collect();
            stack.extend(children.into_iter().rev().map(|c| (c, child_merge)));
        }
    }

    /// Lists `node` if it is a visible control; returns where its descendants' plain text
    /// may be merged.
    fn visit_one(&mut self, node: Node<'_, '_>, merge: Option<MergeTarget>) -> Option<MergeTarget> {
        let control = self.control_of(node);
        let visible = control.bounds.intersects_screen(self.width, self.height)
            && !flag_false(node, "displayed")
            && !flag_false(node, "visible-to-user");
        let labelled = !control.text.trim().is_empty() || !control.content_desc.trim().is_empty();
        let interactive = control.is_interactive();

        let mut child_merge = merge;
        if visible && interactive {
            let is_target = (control.clickable || control.long_clickable)
                && !control.scrollable
                && !control.editable
                && control.bounds.area() * 2 <= u64::from(self.width) * u64::from(self.height);
            let slot = self.push(control);
            child_merge = is_target.then_some(MergeTarget { slot });
        } else if visible && labelled {
            let merged = merge.is_some_and(|t| self.merge_into(t.slot, &control));
            if !merged {
                self.push(control);
            }
        }
        child_merge
    }

    fn push(&mut self, mut control: Control) -> usize {
        control.index = self.controls.len() as u32;
        self.controls.push(control);
        self.controls.len() - 1
    }

    /// Append `child`'s text (else content-desc) to the target's text. Returns false when the
    /// target already holds [`MAX_MERGED_TEXTS`] parts (the child is then listed itself).
    fn merge_into(&mut self, slot: usize, child: &Control) -> bool {
        let piece = if child.text.trim().is_empty() { child.content_desc.trim() } else { child.text.trim() };
        let target = &mut self.controls[slot];
        if piece == target.content_desc.trim() || target.text.split(" | ").any(|p| p == piece) {
            return true;
        }
        let parts = if target.text.is_empty() { 0 } else { target.text.split(" | ").count() };
        if parts >= MAX_MERGED_TEXTS {
            return false;
        }
        if !target.text.is_empty() {
            target.text.push_str(" | ");
        }
        target.text.push_str(piece);
        true
    }

    fn control_of(&self, node: Node<'_, '_>) -> Control {
        let tag = node.tag_name().name();
        let full_class = match attr(node, "class") {
            Some(c) if !c.is_empty() => c,
            _ if tag != "node" => tag,
            _ => "",
        };
        let class = short_class(full_class).to_string();
        let editable = flag(node, "editable")
            || class.contains("EditText")
            || class.contains("AutoCompleteTextView");
        Control {
            index: 0,
            text: attr(node, "text").unwrap_or("").to_string(),
            content_desc: attr(node, "content-desc").unwrap_or("").to_string(),
            resource_id: short_resource_id(attr(node, "resource-id").unwrap_or("")).to_string(),
            hint: attr(node, "hint").unwrap_or("").to_string(),
            bounds: attr(node, "bounds").and_then(parse_bounds).unwrap_or_default(),
            clickable: flag(node, "clickable"),
            long_clickable: flag(node, "long-clickable"),
            editable,
            scrollable: flag(node, "scrollable"),
            checkable: flag(node, "checkable"),
            checked: flag(node, "checked"),
            focused: flag(node, "focused"),
            package: attr(node, "package").unwrap_or("").to_string(),
            class,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse() {
        assert_eq!(parse_bounds("[1,2][3,4]"), Some(Bounds { x1: 1, y1: 2, x2: 3, y2: 4 }));
        assert_eq!(parse_bounds("[-5, 2][3,4]"), Some(Bounds { x1: -5, y1: 2, x2: 3, y2: 4 }));
        assert_eq!(parse_bounds("[1,2][3]"), None);
        assert_eq!(parse_bounds("garbage"), None);
    }

    #[test]
    fn start_detection() {
        assert_eq!(find_xml_start("log line\n<?xml ?><hierarchy/>"), Some(9));
        assert_eq!(find_xml_start("  <hierarchy/>"), Some(2));
        assert_eq!(find_xml_start("nothing"), None);
    }
}
