//! Screenshots in agent steps (issue 19): whether an observation's screenshot is sent to the
//! model (`serve --screenshots never|auto|always`, `--screenshot-sparse-below N`), the cheap
//! signature check the gateway does itself, and the image part's place in the prompt.
//!
//! An attached screenshot goes into the step's user message as two parts after its text:
//! [`SCREENSHOT_LABEL`], then the image. The system message and the user text come first and
//! stay byte-identical to a text-only step, so consecutive steps share their text prefix and
//! the worker resumes from the text checkpoint before the image (its divergence rule, Tandem
//! §4.5); only the image and what follows it are new.
//!
//! The worker decodes the image (its admission, `device-worker/src/engine/images.rs`: PNG or
//! JPEG within its decoding limits); its refusal of the image is reported as the observation's fault
//! (`observation.screenshot_png: ...`, see [`observation_error`]).

use tandem_proto::step::v1 as spb;

use crate::error::GatewayError;
use crate::prompt::AgentPrompt;
use crate::worker::Router;

/// Text part before an attached screenshot (after the user message's text).
pub const SCREENSHOT_LABEL: &str = "\nScreenshot of the screen:";

/// Where the screenshot stands in the worker request the gateway builds: the user message
/// (`messages[1]`), part 1 (after [`SCREENSHOT_LABEL`]). The worker names it so in its
/// INVALID_ARGUMENT messages.
pub const WORKER_IMAGE_PATH: &str = "messages[1].parts[1]";

/// Where the screenshot stands in the controller's request, as errors name it.
pub const OBSERVATION_PATH: &str = "observation.screenshot_png";

/// Default of `--screenshot-sparse-below`: a screen listing fewer controls than this is
/// "sparse" for `--screenshots auto`. Measured on the corpus's 17 LlamaTouch screens
/// (`trace_18`, `trace_7`; `agent-gateway prompt`): they list 4 to 44 controls, the sparsest
/// being confirmation dialogs (4–5 controls, their whole text) and the launcher (9), all fully
/// described by their tree, so none of them gets a screenshot at 4. A tree with fewer holds
/// next to nothing of the screen (a game, a map, a canvas or a video with a button or two),
/// where only the pixels say what is there.
pub const DEFAULT_SPARSE_BELOW: usize = 4;

/// `serve --screenshots`: when an observation's screenshot is sent to the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScreenshotMode {
    /// Never: steps are text-only, screenshots are ignored (the behaviour before issue 19).
    Never,
    /// When the episode's worker has a vision projector (`--mmproj`) and the screen lists
    /// fewer controls than `--screenshot-sparse-below`.
    #[default]
    Auto,
    /// Whenever the observation carries one; a worker without a vision projector makes such
    /// a step fail (FAILED_PRECONDITION on `Step`, a StepResult error on `RunEpisode`).
    Always,
}

impl ScreenshotMode {
    /// The flag value (`"never"`, `"auto"`, `"always"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ScreenshotMode::Never => "never",
            ScreenshotMode::Auto => "auto",
            ScreenshotMode::Always => "always",
        }
    }
}

/// The screenshot policy of a running gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScreenshotPolicy {
    pub mode: ScreenshotMode,
    /// `--screenshot-sparse-below`: `auto` attaches below this many listed controls.
    pub sparse_below: usize,
}

impl Default for ScreenshotPolicy {
    fn default() -> Self {
        Self {
            mode: ScreenshotMode::default(),
            sparse_below: DEFAULT_SPARSE_BELOW,
        }
    }
}

/// What the gateway knows about the routed worker's image support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerVision {
    /// Its Status reports a vision projector.
    Yes,
    /// Its Status reports a loaded model without one.
    No,
    /// No answer yet (unreachable, loading).
    Unknown,
}

/// Whether a step's screenshot goes to the model, and if not, why (the `outcome` label of
/// `agent_screenshots_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Attached to the prompt.
    Sent,
    /// The observation carried none.
    NoScreenshot,
    /// `--screenshots never`.
    Off,
    /// `auto`: the tree lists enough controls.
    Dense,
    /// `auto`: the worker has no vision projector (or did not say).
    NoVision,
    /// `always`, but the worker has no vision projector: the step fails.
    Refused,
}

impl Decision {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Sent => "sent",
            Decision::NoScreenshot => "none",
            Decision::Off => "off",
            Decision::Dense => "dense",
            Decision::NoVision => "no_vision",
            Decision::Refused => "refused",
        }
    }

    /// Every value, for zero-valued series.
    pub const ALL: [Decision; 6] = [
        Decision::Sent,
        Decision::NoScreenshot,
        Decision::Off,
        Decision::Dense,
        Decision::NoVision,
        Decision::Refused,
    ];
}

impl ScreenshotPolicy {
    /// The decision for a step whose observation has a screenshot or not (`has_screenshot`),
    /// whose prompt lists `listed_controls` controls, routed to a worker with `vision`.
    /// `always` with an unknown worker attaches (the worker refuses the image if it cannot
    /// take it).
    pub fn decide(&self, has_screenshot: bool, listed_controls: usize, vision: WorkerVision) -> Decision {
        if !has_screenshot {
            return Decision::NoScreenshot;
        }
        match (self.mode, vision) {
            (ScreenshotMode::Never, _) => Decision::Off,
            (ScreenshotMode::Always, WorkerVision::No) => Decision::Refused,
            (ScreenshotMode::Always, _) => Decision::Sent,
            (ScreenshotMode::Auto, WorkerVision::Yes) if listed_controls < self.sparse_below => Decision::Sent,
            (ScreenshotMode::Auto, WorkerVision::Yes) => Decision::Dense,
            (ScreenshotMode::Auto, _) => Decision::NoVision,
        }
    }

    /// Whether a step may need the worker's image support (so the gateway asks for it).
    pub fn may_attach(&self, has_screenshot: bool) -> bool {
        has_screenshot && self.mode != ScreenshotMode::Never
    }
}

/// `serve`'s start-up check: under `always`, the first worker of `router` that answers without
/// a vision projector (its Status) stops the start; workers that do not answer yet (loading,
/// not started) are checked per step instead. Other modes check nothing.
///
/// Errors: [`GatewayError::Config`] naming the worker and the way out (`--mmproj`, or another
/// `--screenshots`).
pub async fn check_workers(router: &Router, policy: &ScreenshotPolicy) -> Result<(), GatewayError> {
    if policy.mode != ScreenshotMode::Always {
        return Ok(());
    }
    for w in router.workers() {
        if w.vision().await == WorkerVision::No {
            return Err(GatewayError::Config(format!(
                "--screenshots always: worker {} has no vision projector (start it with --mmproj, or use --screenshots auto or never)",
                w.addr
            )));
        }
    }
    Ok(())
}

/// The encoded image's format from its first bytes: `"PNG"` or `"JPEG"`.
///
/// Errors: a message for bytes that are neither (empty, text, another format), naming the
/// first bytes seen.
pub fn sniff(bytes: &[u8]) -> Result<&'static str, String> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    const JPEG: &[u8] = b"\xff\xd8\xff";
    if bytes.starts_with(PNG) {
        Ok("PNG")
    } else if bytes.starts_with(JPEG) {
        Ok("JPEG")
    } else if bytes.is_empty() {
        Err("empty".into())
    } else {
        let head: String = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        Err(format!(
            "not a PNG or JPEG image ({} bytes starting {head}; expected the PNG signature 89 50 4e 47 0d 0a 1a 0a or the JPEG one ff d8 ff)",
            bytes.len()
        ))
    }
}

/// The user message's parts for an attached screenshot: [`SCREENSHOT_LABEL`], then the image.
pub fn image_parts(png: Vec<u8>) -> Vec<spb::ContentPart> {
    vec![
        spb::ContentPart { part: Some(spb::content_part::Part::Text(SCREENSHOT_LABEL.into())) },
        spb::ContentPart { part: Some(spb::content_part::Part::Image(png)) },
    ]
}

/// The chat messages of one step as the gateway sends them to the worker: the rules as the
/// system message, then the user message (task, history, controls) with the screenshot's
/// [`image_parts`] after its text when `screenshot` is given. What `tandem-tools dry-run`
/// plans, too.
pub fn step_messages(prompt: AgentPrompt, screenshot: Option<Vec<u8>>) -> Vec<spb::ChatMessage> {
    vec![
        spb::ChatMessage { role: "system".into(), content: prompt.system, parts: vec![] },
        spb::ChatMessage { role: "user".into(), content: prompt.user, parts: screenshot.map(image_parts).unwrap_or_default() },
    ]
}

/// A worker's INVALID_ARGUMENT message about the attached image (it names
/// [`WORKER_IMAGE_PATH`]) as the controller's error: `observation.screenshot_png: <why>`.
/// `None` for any other message.
pub fn observation_error(worker_message: &str) -> Option<String> {
    let at = worker_message.find(WORKER_IMAGE_PATH)?;
    let why = worker_message[at + WORKER_IMAGE_PATH.len()..].trim_start_matches([':', ' ']);
    Some(format!("{OBSERVATION_PATH}: {why}"))
}

/// The INVALID_ARGUMENT message for a screenshot-only step (no control listed) whose
/// screenshot does not go to the model (`decision` is neither [`Decision::Sent`] nor
/// [`Decision::Refused`]): why it was not sent and what to do, for the worker at `worker`.
pub fn unsent_screenshot_only(decision: Decision, worker: &str, policy: &ScreenshotPolicy) -> String {
    let tree = "send an accessibility tree with at least one visible control";
    let why = match decision {
        Decision::Off => format!(
            "the gateway runs with --screenshots never: {tree}, or run the gateway with \
             --screenshots auto or always in front of a worker started with --mmproj"
        ),
        Decision::NoVision => format!(
            "worker {worker} has no vision projector (or has not said so yet): start it with --mmproj, or {tree}"
        ),
        Decision::Dense => format!(
            "--screenshots auto attaches screenshots only below --screenshot-sparse-below {} listed controls: \
             raise it, or {tree}",
            policy.sparse_below
        ),
        Decision::NoScreenshot | Decision::Sent | Decision::Refused => tree.to_string(),
    };
    format!("observation holds no visible control and its screenshot is not sent to the model: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_follow_the_mode_the_tree_and_the_worker() {
        let p = |mode| ScreenshotPolicy { mode, sparse_below: 10 };
        assert_eq!(ScreenshotPolicy::default(), ScreenshotPolicy { mode: Auto, sparse_below: DEFAULT_SPARSE_BELOW });
        use ScreenshotMode::*;
        use WorkerVision::*;
        assert_eq!(p(Auto).decide(false, 3, Yes), Decision::NoScreenshot);
        assert_eq!(p(Never).decide(true, 3, Yes), Decision::Off);
        assert_eq!(p(Auto).decide(true, 9, Yes), Decision::Sent);
        assert_eq!(p(Auto).decide(true, 10, Yes), Decision::Dense);
        assert_eq!(p(Auto).decide(true, 3, No), Decision::NoVision);
        assert_eq!(p(Auto).decide(true, 3, Unknown), Decision::NoVision);
        assert_eq!(p(Always).decide(true, 60, Yes), Decision::Sent);
        assert_eq!(p(Always).decide(true, 60, Unknown), Decision::Sent);
        assert_eq!(p(Always).decide(true, 60, No), Decision::Refused);
        assert!(!p(Never).may_attach(true) && !p(Always).may_attach(false) && p(Auto).may_attach(true));
    }

    #[test]
    fn an_unsent_screenshot_only_step_says_what_to_do() {
        let p = ScreenshotPolicy::default();
        let never = unsent_screenshot_only(Decision::Off, "http://w:1", &p);
        assert!(never.starts_with("observation holds no visible control"), "{never}");
        assert!(never.contains("--screenshots never") && never.contains("--screenshots auto or always"), "{never}");
        assert!(never.contains("--mmproj") && never.contains("accessibility tree"), "{never}");
        let no_vision = unsent_screenshot_only(Decision::NoVision, "http://w:1", &p);
        assert!(no_vision.contains("worker http://w:1 has no vision projector") && no_vision.contains("--mmproj"), "{no_vision}");
        let dense = unsent_screenshot_only(Decision::Dense, "http://w:1", &ScreenshotPolicy { mode: ScreenshotMode::Auto, sparse_below: 0 });
        assert!(dense.contains("--screenshot-sparse-below 0"), "{dense}");
    }

    #[test]
    fn only_png_and_jpeg_signatures_pass_the_sniff() {
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), Ok("PNG"));
        assert_eq!(sniff(b"\xff\xd8\xff\xe0\0\x10JFIF"), Ok("JPEG"));
        assert_eq!(sniff(b""), Err("empty".into()));
        let e = sniff(b"GIF89a..").unwrap_err();
        assert!(e.contains("47 49 46 38") && e.contains("8 bytes"), "{e}");
    }

    #[test]
    fn worker_image_errors_name_the_observation() {
        let m = "messages[1].parts[1]: not a PNG or JPEG image: truncated";
        assert_eq!(
            observation_error(m).as_deref(),
            Some("observation.screenshot_png: not a PNG or JPEG image: truncated")
        );
        assert_eq!(observation_error("messages[0].role = \"x\": expected"), None);
    }
}
