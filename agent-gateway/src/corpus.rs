//! Real multi-step episodes from the corpus (`shared/corpus/raw`, see its `SOURCES.md`),
//! loaded for replay through the gateway.
//!
//! Sources read:
//! - LlamaTouch traces, `llamatouch_evaluator/trace_*/`: `N.xml` uiautomator dumps (step N),
//!   `N.png` the step's screenshot when present (1080×2400 in `trace_18` and `trace_7`; sent
//!   by `replay --screenshots auto|always`, see [`EpisodeStepData::screenshot`]),
//!   `N.activity` (foreground `package/activity`; `null` or a bare window name give `None`), `instruction.txt` (an id line,
//!   then the task), `eventStructs.txt` (one action per line, `[Home]` or
//!   `[Click] Screen Resolution (w, h), Click Position (x, y)` in a down-scaled resolution).
//!   Line N is the action taken on screen N; the last screen has none. Click positions are
//!   rescaled to the episode's XML pixel space (the largest dump size in the trace) and recorded
//!   as `{"action_type":"click","x":..,"y":..}`.
//! - LlamaTouch action records, `llamatouch_evaluator/<dir>/` holding `1.action`: `N.xml` and
//!   `N.action` from N = 1, one line `KIND|arg|arg|width|height` with normalized `[x, y]`
//!   positions (`SWIPE|[x1, y1]|[x2, y2]|..`, `CLICK|[x, y]|NULL|..`, `TYPE|'text'|NULL|..`,
//!   `STATUS_TASK_COMPLETE|..`). A step is a screen with its `.xml`; actions past the last
//!   screen are dropped. `SWIPE` becomes `swipe` in the finger's main direction, `CLICK` a
//!   pixel click in the dump's pixel space, `STATUS_TASK_COMPLETE` `status complete`; `TYPE`
//!   names no target and is not recorded. The folder records no task: the episode's task is
//!   [`NO_TASK_RECORDED`]. (`test_asset` is the corpus's only recorded swipe.)
//! - AndroidWorld episode logs, `androidworld_episodes_t3a/*.json`: `goal`, and either
//!   `step_records[i].state.ui_elements` with `step_records[i].action` (T3A text
//!   `"Reason: ...\nAction: {...}"`), or `observations[i].ui_elements` with `actions[i]`
//!   (JSON objects). A file that is not valid JSON (the `TRUNCATED_INVALID_*` one) is skipped
//!   with its reason (logged at debug level for a file named as invalid on purpose,
//!   [`DELIBERATELY_INVALID`]; any other at warn level); a step whose action text holds no valid action is kept with
//!   `recorded_action: None` (the Markor log's LLM-API error text ends in a fallback
//!   `Action: {"action_type": "status", "goal_status": "infeasible"}`, which is recorded).
//!
//! Not episodes (skipped with a reason): the AndroidControl sample (screenshots elided, no UI
//! tree) and the AndroidWorld autodev run (screenshots only).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::action::{action_from_value, extract_action_json, parse_action, Action, Direction, GoalStatus, Target};
use crate::error::{CorpusError, GatewayError, ObservationError};
use crate::prompt::{build_prompt, AgentPrompt, PromptInput};
use crate::observation::{parse_android_world, parse_uiautomator, parse_uiautomator_bytes, Screen, DEFAULT_MAX_CONTROLS};

/// The corpus root used when none is given: `<repo>/../shared/corpus/raw`, located from this
/// crate's manifest directory at build time.
pub fn default_corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/raw")
}

/// The observation of one step, as the controller would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservationSource {
    /// uiautomator XML (decoded lossily from the file's bytes).
    Xml(String),
    /// AndroidWorld `UIElement` list as a JSON array.
    UiElementsJson(String),
}

impl ObservationSource {
    /// Parse with the matching observation parser. Errors: as that parser.
    pub fn parse(&self) -> Result<Screen, ObservationError> {
        match self {
            ObservationSource::Xml(x) => parse_uiautomator(x),
            ObservationSource::UiElementsJson(j) => parse_android_world(j),
        }
    }
}

/// One recorded step: the screen, the foreground app and the action the recorded agent took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeStepData {
    pub observation: ObservationSource,
    /// Foreground package when the source records it (LlamaTouch `N.activity`), else `None`.
    pub foreground_app: Option<String>,
    /// The recorded action as compact AndroidWorld JSON, when the log holds a valid one.
    pub recorded_action: Option<String>,
    /// The step's screenshot file (PNG), when the source has one (LlamaTouch traces' `N.png`);
    /// read when sent ([`EpisodeStepData::to_observation_with_screenshot`]).
    pub screenshot: Option<PathBuf>,
}

impl EpisodeStepData {
    /// The step's screen as a gateway `Observation` (what a controller would send).
    pub fn to_observation(&self) -> tandem_proto::agent::v1::Observation {
        use tandem_proto::agent::v1 as apb;
        apb::Observation {
            screen: Some(match &self.observation {
                ObservationSource::Xml(x) => apb::observation::Screen::UiautomatorXml(x.clone()),
                ObservationSource::UiElementsJson(j) => apb::observation::Screen::UiElementsJson(j.clone()),
            }),
            screenshot_png: vec![],
            foreground_app: self.foreground_app.clone().unwrap_or_default(),
        }
    }

    /// [`EpisodeStepData::to_observation`] with the step's screenshot bytes in
    /// `screenshot_png` (none when the step has no screenshot file).
    ///
    /// Errors: [`CorpusError::Io`] when the screenshot file cannot be read.
    pub fn to_observation_with_screenshot(&self) -> Result<tandem_proto::agent::v1::Observation, CorpusError> {
        let mut obs = self.to_observation();
        if let Some(p) = &self.screenshot {
            obs.screenshot_png = read_bytes(p)?;
        }
        Ok(obs)
    }
}

/// One episode: a task and its steps in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// Stable id, `"<source kind>/<name>"`, e.g. `"llamatouch/trace_7"`, `"androidworld/demo"`.
    pub id: String,
    /// Path relative to the corpus root, for provenance.
    pub source: String,
    pub task: String,
    pub steps: Vec<EpisodeStepData>,
}

impl Episode {
    /// The agent prompt of step `i` as the gateway builds it, with the episode's recorded
    /// actions of steps `0..i` as the history (what `agent-gateway prompt` prints and the dry
    /// run plans), listing at most [`DEFAULT_MAX_CONTROLS`] controls.
    ///
    /// Errors: [`GatewayError::Config`] for a step past the end; the observation's parse error.
    pub fn step_prompt(&self, i: usize) -> Result<AgentPrompt, GatewayError> {
        let step = self.steps.get(i).ok_or_else(|| {
            GatewayError::Config(format!("episode {} has {} steps; step {i} does not exist", self.id, self.steps.len()))
        })?;
        let screen = step.observation.parse()?;
        let history: Vec<String> = self.steps[..i].iter().filter_map(|s| s.recorded_action.clone()).collect();
        let app = step.foreground_app.clone().or_else(|| screen.foreground_package.clone());
        Ok(build_prompt(&PromptInput {
            task: &self.task,
            foreground_app: app.as_deref(),
            history: &history,
            screen: &screen,
            max_controls: DEFAULT_MAX_CONTROLS,
        }))
    }
}

/// A corpus entry that is not loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEpisode {
    /// Path relative to the corpus root.
    pub source: String,
    pub reason: String,
}

/// Result of scanning the corpus.
#[derive(Debug, Clone, Default)]
pub struct CorpusLoad {
    /// Usable episodes, sorted by id.
    pub episodes: Vec<Episode>,
    /// Entries that were skipped, with reasons (sorted by source).
    pub skipped: Vec<SkippedEpisode>,
}

/// Every usable episode under `corpus_root`, sorted by id; skipped entries are logged at warn
/// level (use [`scan_corpus`] to get them).
///
/// Errors: [`CorpusError::Io`] when the root cannot be read, [`CorpusError::NoEpisodes`] when
/// nothing usable is found.
pub fn load_episodes(corpus_root: &Path) -> Result<Vec<Episode>, CorpusError> {
    let load = scan_corpus(corpus_root)?;
    for s in &load.skipped {
        log_skipped(s);
    }
    Ok(load.episodes)
}

/// Logs a skipped entry: a folder known to hold no episodes ([`NOT_EPISODES`]) or a file
/// invalid on purpose ([`DELIBERATELY_INVALID`]) at debug level (they are no problem, and a
/// warning on every run of every command would only teach users to ignore warnings), any
/// other once per process at warn level (every load of the corpus would repeat it).
fn log_skipped(s: &SkippedEpisode) {
    static WARNED: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let name = s.source.rsplit('/').next().unwrap_or(&s.source);
    if NOT_EPISODES.iter().any(|(dir, _)| *dir == s.source) || name.starts_with(DELIBERATELY_INVALID) {
        tracing::debug!(source = %s.source, reason = %s.reason, "corpus entry skipped");
        return;
    }
    let key = (s.source.clone(), s.reason.clone());
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.contains(&key) {
        tracing::warn!(source = %s.source, reason = %s.reason, "corpus entry skipped");
        warned.push(key);
    }
}

/// The name prefix of corpus files invalid on purpose: the corpus's SOURCES.md lists
/// `TRUNCATED_INVALID_*.json`, a log cut off mid-file, kept to exercise the loader.
pub const DELIBERATELY_INVALID: &str = "TRUNCATED_INVALID_";

/// Corpus folders that hold no episodes, and why (skipped, logged at debug level only).
const NOT_EPISODES: [(&str, &str); 2] = [
    ("androidcontrol_smolagents_sample", "AndroidControl sample: screenshots elided, no UI tree to observe"),
    ("androidworld_autodev_run", "AndroidWorld autodev run: screenshots and notes only, no UI tree per step"),
];

/// The episode with this id. Errors: as [`load_episodes`], plus
/// [`CorpusError::UnknownEpisode`] listing the known ids.
pub fn load_episode(corpus_root: &Path, id: &str) -> Result<Episode, CorpusError> {
    let episodes = scan_corpus(corpus_root)?.episodes;
    let known: Vec<String> = episodes.iter().map(|e| e.id.clone()).collect();
    episodes.into_iter().find(|e| e.id == id).ok_or_else(|| CorpusError::UnknownEpisode {
        id: id.to_string(),
        root: corpus_root.to_path_buf(),
        known,
    })
}

/// Scan the corpus: usable episodes and skipped entries with reasons.
/// Errors: [`CorpusError::MissingRoot`] when the root is not a folder (with the --corpus /
/// TANDEM_CORPUS hint), [`CorpusError::Io`] for an unreadable root, [`CorpusError::NoEpisodes`].
pub fn scan_corpus(corpus_root: &Path) -> Result<CorpusLoad, CorpusError> {
    if !corpus_root.is_dir() {
        let why = if corpus_root.exists() { "is a file, not a folder" } else { "not found" };
        return Err(CorpusError::MissingRoot { root: corpus_root.to_path_buf(), why });
    }
    std::fs::read_dir(corpus_root).map_err(|source| CorpusError::Io { path: corpus_root.to_path_buf(), source })?;
    let mut load = CorpusLoad::default();
    let mut record = |result: Result<Episode, CorpusError>, source: String| match result {
        Ok(e) => load.episodes.push(e),
        Err(e) => load.skipped.push(SkippedEpisode { source, reason: e.to_string() }),
    };

    for dir in sorted_entries(&corpus_root.join("llamatouch_evaluator"))? {
        let name = file_name(&dir);
        if dir.is_dir() && name.starts_with("trace_") {
            record(load_llamatouch(corpus_root, &dir), rel(corpus_root, &dir));
        } else if dir.join("1.action").is_file() {
            record(load_llamatouch_records(corpus_root, &dir), rel(corpus_root, &dir));
        }
    }
    for file in sorted_entries(&corpus_root.join("androidworld_episodes_t3a"))? {
        if file.extension().is_some_and(|e| e == "json") {
            record(load_androidworld_log(corpus_root, &file), rel(corpus_root, &file));
        }
    }
    for (dir, why) in NOT_EPISODES {
        if corpus_root.join(dir).exists() {
            load.skipped.push(SkippedEpisode { source: dir.to_string(), reason: why.to_string() });
        }
    }

    load.episodes.sort_by(|a, b| a.id.cmp(&b.id));
    load.skipped.sort_by(|a, b| a.source.cmp(&b.source));
    if load.episodes.is_empty() {
        let hint = if corpus_root.join("raw").is_dir() {
            format!(" (its raw/ subfolder may hold them: --corpus {})", corpus_root.join("raw").display())
        } else {
            String::new()
        };
        return Err(CorpusError::NoEpisodes { root: corpus_root.to_path_buf(), hint });
    }
    Ok(load)
}

// === helpers ===

/// Entries of `dir` sorted by path; a missing directory yields none.
fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, CorpusError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let rd = std::fs::read_dir(dir).map_err(|source| CorpusError::Io { path: dir.to_path_buf(), source })?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| CorpusError::Io { path: dir.to_path_buf(), source })?;
        out.push(entry.path());
    }
    out.sort();
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).to_string_lossy().replace('\\', "/")
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, CorpusError> {
    std::fs::read(path).map_err(|source| CorpusError::Io { path: path.to_path_buf(), source })
}

fn read_text(path: &Path) -> Result<String, CorpusError> {
    Ok(String::from_utf8_lossy(&read_bytes(path)?).into_owned())
}

// === LlamaTouch ===

fn load_llamatouch(root: &Path, dir: &Path) -> Result<Episode, CorpusError> {
    let instruction_path = dir.join("instruction.txt");
    let task = llamatouch_task(&read_text(&instruction_path)?).ok_or_else(|| CorpusError::Invalid {
        path: instruction_path.clone(),
        what: "no task text".to_string(),
    })?;

    let mut xmls = Vec::new();
    while dir.join(format!("{}.xml", xmls.len())).exists() {
        xmls.push(read_bytes(&dir.join(format!("{}.xml", xmls.len())))?);
    }
    if xmls.is_empty() {
        return Err(CorpusError::Invalid { path: dir.to_path_buf(), what: "no 0.xml step dump".to_string() });
    }
    let events_path = dir.join("eventStructs.txt");
    let events: Vec<String> = if events_path.exists() {
        read_text(&events_path)?.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
    } else {
        Vec::new()
    };

    // The episode's pixel space: the largest dump size (dialog-only dumps report smaller sizes).
    let (mut width, mut height) = (0u32, 0u32);
    for x in &xmls {
        if let Ok(s) = parse_uiautomator_bytes(x) {
            width = width.max(s.width);
            height = height.max(s.height);
        }
    }

    let mut steps = Vec::with_capacity(xmls.len());
    for (i, bytes) in xmls.into_iter().enumerate() {
        let activity_path = dir.join(format!("{i}.activity"));
        let foreground_app = if activity_path.exists() { activity_package(&read_text(&activity_path)?) } else { None };
        let recorded_action = events
            .get(i)
            .and_then(|e| llamatouch_action(e, width, height))
            .map(|a| a.to_compact_json());
        let png = dir.join(format!("{i}.png"));
        steps.push(EpisodeStepData {
            observation: ObservationSource::Xml(String::from_utf8_lossy(&bytes).into_owned()),
            foreground_app,
            recorded_action,
            screenshot: png.is_file().then_some(png),
        });
    }
    Ok(Episode { id: format!("llamatouch/{}", file_name(dir)), source: rel(root, dir), task, steps })
}

/// `instruction.txt`: an optional numeric id line, then the task.
fn llamatouch_task(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let body: &[&str] = match lines.split_first() {
        Some((first, rest)) if !rest.is_empty() && first.chars().all(|c| c.is_ascii_digit()) => rest,
        _ => &lines,
    };
    let task = body.join(" ");
    (!task.is_empty()).then_some(task)
}

/// `N.activity`: `package/activity` gives the package; `null`, empty, or a bare window name
/// without `/` (e.g. `com.android.systemui.ImageWallpaper` on the launcher) gives `None`, so
/// the caller falls back to the screen's foreground package.
fn activity_package(text: &str) -> Option<String> {
    let (package, _) = text.trim().split_once('/')?;
    (!package.is_empty()).then(|| package.to_string())
}

/// Convert one `eventStructs.txt` line; click positions are rescaled from the stated
/// resolution to `width` x `height` pixels. `None` for unknown or malformed lines.
pub(crate) fn llamatouch_action(line: &str, width: u32, height: u32) -> Option<Action> {
    let line = line.trim();
    if line.starts_with("[Home]") {
        return Some(Action::NavigateHome);
    }
    if line.starts_with("[Back]") {
        return Some(Action::NavigateBack);
    }
    if !line.starts_with("[Click]") {
        return None;
    }
    let nums: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse::<f64>().ok())
        .collect();
    let [rw, rh, x, y] = nums.as_slice() else { return None };
    if *rw <= 0.0 || *rh <= 0.0 || width == 0 || height == 0 {
        return None;
    }
    Some(Action::Click {
        target: Target::Point { x: (x * f64::from(width) / rw).round() as u32, y: (y * f64::from(height) / rh).round() as u32 },
    })
}

/// The task of an episode whose source records none (LlamaTouch action-record folders).
pub const NO_TASK_RECORDED: &str = "(no task recorded)";

/// A LlamaTouch action-record folder (`N.xml` + `N.action`, see the module docs).
fn load_llamatouch_records(root: &Path, dir: &Path) -> Result<Episode, CorpusError> {
    let mut steps = Vec::new();
    for n in 1.. {
        let xml_path = dir.join(format!("{n}.xml"));
        if !xml_path.is_file() {
            break;
        }
        let xml = read_bytes(&xml_path)?;
        let screen = parse_uiautomator_bytes(&xml).map_err(|e| CorpusError::Invalid {
            path: xml_path.clone(),
            what: e.to_string(),
        })?;
        let action_path = dir.join(format!("{n}.action"));
        let recorded_action = if action_path.is_file() {
            llamatouch_record(&read_text(&action_path)?, screen.width, screen.height)
                .map(|a| a.to_compact_json())
        } else {
            None
        };
        steps.push(EpisodeStepData {
            observation: ObservationSource::Xml(String::from_utf8_lossy(&xml).into_owned()),
            foreground_app: None,
            recorded_action,
            screenshot: None,
        });
    }
    if steps.is_empty() {
        return Err(CorpusError::Invalid {
            path: dir.to_path_buf(),
            what: "no 1.xml step dump".to_string(),
        });
    }
    let id = format!("llamatouch/{}", file_name(dir));
    Ok(Episode {
        id,
        source: rel(root, dir),
        task: NO_TASK_RECORDED.to_string(),
        steps,
    })
}

/// One LlamaTouch `N.action` line (`KIND|arg|arg|width|height`, positions normalized to 0..1)
/// as an action in a `width` x `height` pixel space; `None` for `TYPE` (no target), unknown
/// kinds and malformed lines.
pub(crate) fn llamatouch_record(line: &str, width: u32, height: u32) -> Option<Action> {
    let fields: Vec<&str> = line.trim().split('|').map(str::trim).collect();
    let point = |s: &str| -> Option<(f64, f64)> {
        let nums: Vec<f64> = s
            .trim_matches(['[', ']'])
            .split(',')
            .map(|p| p.trim().parse::<f64>().ok())
            .collect::<Option<_>>()?;
        match nums.as_slice() {
            [x, y] if x.is_finite() && y.is_finite() => Some((*x, *y)),
            _ => None,
        }
    };
    match *fields.first()? {
        "SWIPE" => {
            let ((x1, y1), (x2, y2)) = (point(fields.get(1)?)?, point(fields.get(2)?)?);
            let (dx, dy) = (x2 - x1, y2 - y1);
            let direction = match (dx.abs() >= dy.abs(), dx >= 0.0, dy >= 0.0) {
                (true, true, _) => Direction::Right,
                (true, false, _) => Direction::Left,
                (false, _, true) => Direction::Down,
                (false, _, false) => Direction::Up,
            };
            (dx != 0.0 || dy != 0.0).then_some(Action::Swipe { direction })
        }
        "CLICK" => {
            let (x, y) = point(fields.get(1)?)?;
            let inside = (0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y);
            let px = |v: f64, size: u32| {
                ((v * f64::from(size)).round() as u32).min(size.saturating_sub(1))
            };
            (inside && width > 0 && height > 0).then(|| Action::Click {
                target: Target::Point {
                    x: px(x, width),
                    y: px(y, height),
                },
            })
        }
        "STATUS_TASK_COMPLETE" => Some(Action::Status {
            goal_status: GoalStatus::Complete,
        }),
        _ => None,
    }
}

// === AndroidWorld logs ===

fn load_androidworld_log(root: &Path, path: &Path) -> Result<Episode, CorpusError> {
    let text = read_text(path)?;
    let v: Value = serde_json::from_str(&text).map_err(|source| CorpusError::Json { path: path.to_path_buf(), source })?;
    let invalid = |what: &str| CorpusError::Invalid { path: path.to_path_buf(), what: what.to_string() };
    let task = v.get("goal").and_then(Value::as_str).filter(|g| !g.trim().is_empty()).ok_or_else(|| invalid("no \"goal\" string"))?;

    let mut steps = Vec::new();
    if let Some(records) = v.get("step_records").and_then(Value::as_array) {
        for (i, r) in records.iter().enumerate() {
            let elements = r
                .pointer("/state/ui_elements")
                .filter(|e| e.is_array())
                .ok_or_else(|| invalid(&format!("step_records[{i}].state.ui_elements is not an array")))?;
            let recorded_action = r.get("action").and_then(recorded_from_value);
            steps.push(EpisodeStepData {
                observation: ObservationSource::UiElementsJson(elements.to_string()),
                foreground_app: None,
                recorded_action,
                screenshot: None,
            });
        }
    } else if let Some(observations) = v.get("observations").and_then(Value::as_array) {
        let actions = v.get("actions").and_then(Value::as_array);
        for (i, o) in observations.iter().enumerate() {
            let elements = o
                .get("ui_elements")
                .filter(|e| e.is_array())
                .ok_or_else(|| invalid(&format!("observations[{i}].ui_elements is not an array")))?;
            let recorded_action = actions.and_then(|a| a.get(i)).and_then(recorded_from_value);
            steps.push(EpisodeStepData {
                observation: ObservationSource::UiElementsJson(elements.to_string()),
                foreground_app: None,
                recorded_action,
                screenshot: None,
            });
        }
    } else {
        return Err(invalid("neither \"step_records\" nor \"observations\" is an array"));
    }
    if steps.is_empty() {
        return Err(invalid("no steps"));
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(Episode { id: format!("androidworld/{stem}"), source: rel(root, path), task: task.to_string(), steps })
}

/// A recorded action as compact JSON: a JSON object, or T3A text holding one after
/// `Action:`; `None` when it is not a valid action (e.g. an API error string).
fn recorded_from_value(v: &Value) -> Option<String> {
    let action = match v {
        Value::Object(_) => action_from_value(v, u32::MAX).ok()?,
        Value::String(s) => parse_action(extract_action_json(s)?, u32::MAX).ok()?,
        _ => return None,
    };
    Some(action.to_compact_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_corpus_folder_says_how_to_point_at_one() {
        let root = Path::new("no/such/corpus/raw");
        for e in [load_episodes(root).unwrap_err(), load_episode(root, "x").unwrap_err()] {
            assert!(matches!(e, CorpusError::MissingRoot { .. }), "{e:?}");
            let m = e.to_string();
            assert!(m.contains("no/such/corpus/raw") && m.contains("--corpus") && m.contains("TANDEM_CORPUS"), "{m}");
        }
    }

    #[test]
    fn llamatouch_lines() {
        assert_eq!(llamatouch_action("[Home]", 1080, 1792), Some(Action::NavigateHome));
        assert_eq!(
            llamatouch_action("[Click] Screen Resolution (400, 720), Click Position (200, 360)", 1080, 1792),
            Some(Action::Click { target: Target::Point { x: 540, y: 896 } })
        );
        assert_eq!(llamatouch_action("[Click] Screen Resolution (400, 720)", 1080, 1792), None);
        assert_eq!(llamatouch_action("[Swipe] something", 1080, 1792), None);
    }

    #[test]
    fn llamatouch_records() {
        let swipe = "SWIPE|[0.5, 0.8138888888888889]|[0.5, 0.18625]|1080|2400";
        assert_eq!(
            llamatouch_record(swipe, 1080, 1792),
            Some(Action::Swipe {
                direction: Direction::Up
            })
        );
        assert_eq!(
            llamatouch_record("SWIPE|[0.9, 0.5]|[0.1, 0.52]|1080|2400", 1080, 1792),
            Some(Action::Swipe {
                direction: Direction::Left
            })
        );
        assert_eq!(
            llamatouch_record("CLICK|[0.5, 0.1225]|NULL|1080|2400", 1080, 1792),
            Some(Action::Click {
                target: Target::Point { x: 540, y: 220 }
            })
        );
        assert_eq!(
            llamatouch_record("TYPE|'expedia'|NULL|1080|2400", 1080, 1792),
            None
        );
        assert_eq!(
            llamatouch_record("STATUS_TASK_COMPLETE|NULL|NULL|1080|2400", 1, 1),
            Some(Action::Status {
                goal_status: GoalStatus::Complete
            })
        );
        for bad in [
            "",
            "SWIPE|[0.5]|[0.5, 0.1]",
            "SWIPE|[0.5, 0.5]|[0.5, 0.5]",
            "CLICK|[1.5, 0.1]|NULL",
            "CLICK|[NaN, 0.1]|NULL",
        ] {
            assert_eq!(llamatouch_record(bad, 1080, 1792), None, "{bad}");
        }
    }

    #[test]
    fn instruction_and_activity() {
        assert_eq!(llamatouch_task("18\nPractice French.").as_deref(), Some("Practice French."));
        assert_eq!(llamatouch_task("Open the app").as_deref(), Some("Open the app"));
        assert_eq!(llamatouch_task("123\n"), Some("123".to_string()));
        assert_eq!(llamatouch_task("  \n"), None);
        assert_eq!(activity_package("com.a/com.a.Main\n").as_deref(), Some("com.a"));
        assert_eq!(activity_package("null"), None);
        assert_eq!(activity_package("com.android.systemui.ImageWallpaper"), None);
    }

    #[test]
    fn recorded_actions() {
        let t3a = Value::String("Reason: open it {x}\nAction: {\"action_type\": \"click\", \"index\": 3}".into());
        assert_eq!(recorded_from_value(&t3a).as_deref(), Some(r#"{"action_type":"click","index":3}"#));
        let err = Value::String("Reason: Error code: 400 - {'error': {'message': 'x'}}".into());
        assert_eq!(recorded_from_value(&err), None);
        let obj = serde_json::json!({"action_type": "open_app", "app_name": "Contacts"});
        assert_eq!(recorded_from_value(&obj).as_deref(), Some(r#"{"action_type":"open_app","app_name":"Contacts"}"#));
    }
}
