//! `tandem-tools dry-run`: the corpus through the checkpoint planner alone — no worker, no
//! model run, milliseconds. Every step's prompt is built exactly as the gateway
//! builds it (history: the episode's recorded actions), rendered and tokenized with the
//! model's own chat template and tokenizer (the worker's admission path), then planned under
//! each policy with the worker's planner (`device_worker::state::planner`), one slot serving the
//! episodes in order (a host prompt cache keeps earlier episodes), with the state sizes
//! (hybrid or not, checkpoint bytes, KV bytes per token) the worker would have for the model
//! (`--state-shapes`, default `--model`; [`device_worker::model::sequence_shape`]). Prints new prompt tokens
//! per step beside the KV-cache bound (LCP-only reuse) and the forward passes per step.
//!
//! Two prompt formats: `system-user` (the rules as a system message, as the gateway sends)
//! and `single-user` (everything in one user message, the source paper's agent).
//!
//! Screenshots (`--screenshots auto|always --mmproj MMPROJ.gguf`): the steps that have one
//! (LlamaTouch traces' `N.png`) carry it after the user message's text as the gateway sends it
//! ([`agent_gateway::screenshot::step_messages`]; `auto` with the gateway's sparse-tree rule),
//! and the prompt goes through the worker's own admission of images
//! ([`device_worker::engine::images::chat_tokens_with_parts`]: decode, llama.cpp's
//! smart-resize within `--image-min-tokens`/`--image-max-tokens`, one token per merged 2×2
//! patch block, image ids from the content hash), so image tokens are counted exactly as the
//! engine counts them and the planner sees the image span as the engine's planner does.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use agent_gateway::corpus::{load_episode, load_episodes, Episode};
use agent_gateway::observation::select_controls;
use agent_gateway::screenshot::{step_messages, Decision, ScreenshotMode, ScreenshotPolicy, WorkerVision};
use device_worker::config::defaults as d;
use device_worker::config::{at_least_one, ConfigError, PlannerSettings};
use device_worker::engine::images::{chat_tokens_with_parts, mark_image_tokens, ImageAdmission};
use device_worker::model::vision::preprocess::{DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS};
use device_worker::model::vision::{PreprocessOptions, VisionConfig};
use device_worker::state::planner::{plan, CacheState, PlanConfig, PlanRequest, Policy};
use device_worker::state::sequence::SequenceShape;
use gguf::{ChatTemplate, GgufFile, Tokenizer};
use tandem_proto::step::v1 as spb;

use crate::error::ToolsError;

/// The planner configurations compared, in table order.
pub const CONFIGS: [(&str, Policy, bool); 5] = [
    ("stock", Policy::Stock, false),
    ("stock+cons", Policy::Stock, true),
    ("marconi", Policy::Marconi, false),
    ("divergence", Policy::Divergence, false),
    ("div+cons", Policy::Divergence, true),
];

/// Prompt layouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptFormat {
    /// Rules as a system message, then one user message (what the gateway sends).
    SystemUser,
    /// Rules and everything else in one user message.
    SingleUser,
    /// Both, one after the other.
    #[default]
    Both,
}

/// Options of the dry run.
#[derive(Clone, Debug, clap::Args)]
pub struct DryRunArgs {
    /// GGUF whose tokenizer and chat template tokenize the prompts (default: $TANDEM_MODEL,
    /// else the fetched SmolLM2). Only metadata is read.
    #[arg(long, env = "TANDEM_MODEL")]
    pub model: Option<PathBuf>,
    /// GGUF whose hyperparameters give the planned state sizes: recurrent layers or not, bytes
    /// per checkpoint, KV bytes per token (default: --model). Only metadata is read, so a
    /// metadata-only file of a model's shapes will do (e.g. the committed
    /// `device-worker/tests/fixtures/qwen35/qwen35-0.8b-shapes.gguf`, to plan the Qwen3.5-0.8B
    /// hybrid with another model's tokenizer).
    #[arg(long, value_name = "GGUF")]
    pub state_shapes: Option<PathBuf>,
    /// Prompt format(s) to plan.
    #[arg(long, value_enum, default_value = "both")]
    pub format: PromptFormat,
    /// Micro-batch limit of the planned worker (the worker's --micro-batch).
    #[arg(long, default_value_t = d::MICRO_BATCH, value_parser = at_least_one)]
    pub micro_batch: usize,
    /// Checkpoints per slot (the worker's --checkpoints).
    #[arg(long, default_value_t = d::CHECKPOINTS, value_parser = at_least_one)]
    pub checkpoints: usize,
    /// Divergence policy's minimum L − R for a save (the worker's --checkpoint-min-gap).
    #[arg(long, default_value_t = d::CHECKPOINT_MIN_GAP)]
    pub checkpoint_min_gap: usize,
    /// Also print a line per step.
    #[arg(long)]
    pub per_step: bool,
    /// Send every step's prompt this many more times (an agent that waited, or whose action
    /// changed nothing, repeats its prompt), each a step of its own in the figures.
    #[arg(long, default_value_t = 0)]
    pub repeats: usize,
    /// Plan without the end-of-prompt state (a worker without rollback states: drafters
    /// `none`), for comparison.
    #[arg(long)]
    pub no_end_state: bool,
    /// Which steps carry their corpus screenshot (LlamaTouch traces' `N.png`), as the
    /// gateway's `serve --screenshots` would send them to a worker with a projector: `never`
    /// (the default: text-only plans, image tokens 0), `auto` (steps listing fewer than
    /// --screenshot-sparse-below controls), `always` (every step that has one). With `auto` or
    /// `always` (needs --mmproj) each sent screenshot counts as the worker's image tokens
    /// (decoded and sized within --image-min-tokens/--image-max-tokens by the worker's own
    /// code, one token per merged 2×2 patch block), included in the prompt tokens and shown
    /// in the `image` column and the per-format mean.
    #[arg(long, value_enum, default_value_t = ScreenshotMode::Never, hide_possible_values = true, value_name = "never|auto|always")]
    pub screenshots: ScreenshotMode,
    /// The gateway's `--screenshot-sparse-below` (for `--screenshots auto`).
    #[arg(long, default_value_t = agent_gateway::screenshot::DEFAULT_SPARSE_BELOW)]
    pub screenshot_sparse_below: usize,
    /// The worker's vision projector GGUF (`device-worker serve --mmproj`): its patch and
    /// merge sizes give the image-token counts. Only metadata is read.
    #[arg(long, value_name = "GGUF")]
    pub mmproj: Option<PathBuf>,
    /// The worker's `--image-min-tokens`.
    #[arg(long, default_value_t = DEFAULT_MIN_TOKENS)]
    pub image_min_tokens: usize,
    /// The worker's `--image-max-tokens`.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS)]
    pub image_max_tokens: usize,
    /// The worker's `--ctx-size` (tokens per slot; the worker caps it at the model's trained
    /// context, `{arch}.context_length` of --state-shapes). Planned prompts that leave no
    /// room for one output token in it are counted and warned about: a worker refuses them.
    #[arg(long, default_value_t = d::CTX_SIZE, value_parser = device_worker::config::ctx_size)]
    pub ctx_size: usize,
}

impl DryRunArgs {
    /// The checks of option combinations that clap cannot make, reported as usage errors
    /// (exit code 2) before any file is read: `--screenshots auto|always` without `--mmproj`,
    /// and the image-token budget, off its defaults only with `--mmproj`
    /// ([`device_worker::config::check_image_budget_usage`], as `serve` and `bench`).
    ///
    /// Errors: [`ConfigError`] naming the option.
    pub fn check_usage(&self) -> Result<(), ConfigError> {
        if self.screenshots != ScreenshotMode::Never && self.mmproj.is_none() {
            return Err(ConfigError {
                option: "screenshots",
                value: self.screenshots.as_str().to_string(),
                reason: "needs --mmproj (the worker's projector: its patch and merge sizes give the image tokens)",
            });
        }
        device_worker::config::check_image_budget_usage(self.mmproj.is_some(), self.image_min_tokens, self.image_max_tokens)
    }
}

impl Default for DryRunArgs {
    fn default() -> Self {
        Self {
            model: None,
            state_shapes: None,
            format: PromptFormat::Both,
            micro_batch: d::MICRO_BATCH,
            checkpoints: d::CHECKPOINTS,
            checkpoint_min_gap: d::CHECKPOINT_MIN_GAP,
            per_step: false,
            repeats: 0,
            no_end_state: false,
            screenshots: ScreenshotMode::Never,
            screenshot_sparse_below: agent_gateway::screenshot::DEFAULT_SPARSE_BELOW,
            mmproj: None,
            image_min_tokens: DEFAULT_MIN_TOKENS,
            image_max_tokens: DEFAULT_MAX_TOKENS,
            ctx_size: d::CTX_SIZE,
        }
    }
}

/// One step's planned figures per configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepPlan {
    pub episode: String,
    pub step: usize,
    pub prompt_tokens: usize,
    /// Image tokens of the prompt (0 without a screenshot), counted in `prompt_tokens`.
    pub image_tokens: usize,
    /// New tokens a KV cache would process (`n − min(L, n − 1)`).
    pub kv_bound_new: usize,
    /// `(config name, new tokens, passes, checkpoints saved)` in [`CONFIGS`] order.
    pub configs: Vec<(String, usize, usize, usize)>,
}

/// Summary of one format's run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FormatSummary {
    pub format: String,
    pub steps: usize,
    pub mean_prompt_tokens: f64,
    /// Mean image tokens per step (0 without screenshots).
    pub mean_image_tokens: f64,
    pub mean_kv_bound_new: f64,
    /// `(config, mean new tokens, mean passes, ratio to the KV bound, checkpoints saved)`.
    pub configs: Vec<(String, f64, f64, f64, usize)>,
    /// Steps whose prompt a worker with the planned context would refuse (prompt tokens ≥
    /// the context: no room for an output token), and the longest prompt planned.
    pub steps_over_context: usize,
    pub max_prompt_tokens: usize,
}

/// What a dry run plans with: the tokenizer and template of `--model`, the state sizes of
/// `--state-shapes`, the worker's image admission (with `--screenshots`), the episodes.
struct Setup {
    path: PathBuf,
    shapes_path: PathBuf,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    shape: SequenceShape,
    /// The planned worker's context per slot: `--ctx-size` capped by the trained context.
    n_ctx: usize,
    /// The trained context of `--state-shapes` (`{arch}.context_length`; 4096 when absent,
    /// as the worker's loaders assume).
    n_ctx_train: usize,
    vision: Option<ImageAdmission>,
    episodes: Vec<Episode>,
}

impl Setup {
    /// Errors: as [`run`].
    fn load(corpus: &std::path::Path, episode_ids: &[String], args: &DryRunArgs) -> Result<Self, ToolsError> {
        args.check_usage()?;
        let path = args.model.clone().unwrap_or_else(device_worker::config::default_model_path);
        let model_err = |path: &std::path::Path, what: &str, e: &dyn std::fmt::Display| ToolsError::Model {
            path: path.to_path_buf(),
            reason: format!("{what}: {e}"),
        };
        let file = Arc::new(GgufFile::open(&path).map_err(|e| model_err(&path, "cannot read", &e))?);
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| model_err(&path, "tokenizer", &e))?;
        let template = ChatTemplate::from_gguf(&file).map_err(|e| model_err(&path, "chat template", &e))?;
        let shapes_path = args.state_shapes.clone().unwrap_or_else(|| path.clone());
        // A file of its own is named as --state-shapes; without one the shapes are --model's.
        let shapes_err = |what: &str, e: &dyn std::fmt::Display| match &args.state_shapes {
            Some(p) => ToolsError::StateShapes { path: p.clone(), reason: format!("{what}: {e}") },
            None => model_err(&path, what, e),
        };
        let shapes_file = if shapes_path == path {
            Arc::clone(&file)
        } else {
            Arc::new(GgufFile::open(&shapes_path).map_err(|e| shapes_err("cannot read", &e))?)
        };
        let shape = device_worker::model::sequence_shape(&shapes_file).map_err(|e| shapes_err("hyperparameters", &e))?;
        let arch = shapes_file.architecture().map_err(|e| shapes_err("architecture", &e))?;
        let n_ctx_train = shapes_file.get_u32_opt(&format!("{arch}.context_length")).map_or(4096, |v| v as usize);
        let n_ctx = args.ctx_size.min(n_ctx_train);
        let vision = match args.mmproj.as_deref().filter(|_| args.screenshots != ScreenshotMode::Never) {
            None => None,
            Some(mmproj) => {
                let mmproj_err = |reason: String| ToolsError::Mmproj { path: mmproj.to_path_buf(), reason };
                let f = GgufFile::open(mmproj).map_err(|e| mmproj_err(format!("cannot read: {e}")))?;
                let config = VisionConfig::from_gguf(&f).map_err(|e| mmproj_err(e.to_string()))?;
                let budget = device_worker::config::image_budget(args.image_min_tokens, args.image_max_tokens)?;
                let options = PreprocessOptions { budget, ..PreprocessOptions::default() };
                let admission = ImageAdmission::new(&tokenizer, config, options).map_err(|e| {
                    // The admission's error is the worker's load failure, "--mmproj: ..."; nothing is loaded here.
                    let why = match e {
                        device_worker::error::WorkerError::LoadFailed(m) => m.trim_start_matches("--mmproj: ").to_string(),
                        e => e.to_string(),
                    };
                    mmproj_err(format!("does not fit the model {}: {why}", path.display()))
                })?;
                Some(admission)
            }
        };
        let episodes: Vec<Episode> = if episode_ids.is_empty() {
            load_episodes(corpus)?
        } else {
            episode_ids.iter().map(|id| load_episode(corpus, id)).collect::<Result<_, _>>()?
        };
        Ok(Self { path, shapes_path, tokenizer, template, shape, n_ctx, n_ctx_train, vision, episodes })
    }

    fn plan(&self, format: PromptFormat, args: &DryRunArgs) -> Result<Vec<StepPlan>, ToolsError> {
        plan_format(&self.episodes, format, &self.tokenizer, &self.template, self.vision.as_ref(), &self.shape, args)
    }
}

/// Runs the dry run over the episodes with the given ids (empty: every corpus episode) and
/// prints the tables.
///
/// Errors: corpus or model-metadata problems (a missing file, an unsupported architecture,
/// `--screenshots` without a readable `--mmproj`), a prompt that cannot be rendered/tokenized
/// (or a corpus screenshot the worker's admission refuses).
pub fn run(
    corpus: &std::path::Path,
    episode_ids: &[String],
    args: &DryRunArgs,
) -> Result<Vec<FormatSummary>, ToolsError> {
    let t0 = std::time::Instant::now();
    let setup = Setup::load(corpus, episode_ids, args)?;
    let formats: &[PromptFormat] = match args.format {
        PromptFormat::Both => &[PromptFormat::SystemUser, PromptFormat::SingleUser],
        PromptFormat::SystemUser => &[PromptFormat::SystemUser],
        PromptFormat::SingleUser => &[PromptFormat::SingleUser],
    };
    tandem_options::write_stdout(|out| print_setup(out, &setup, args))?;
    let mut out = Vec::new();
    for &format in formats {
        let steps = setup.plan(format, args)?;
        let summary = summarize(format, &steps, setup.n_ctx);
        tandem_options::write_stdout(|out| print_summary(out, &summary, &steps, args.per_step))?;
        warn_over_context(&summary, &setup, args);
        out.push(summary);
    }
    tandem_options::write_stdout(|out| writeln!(out, "dry run took {:.0} ms", t0.elapsed().as_secs_f64() * 1e3))?;
    Ok(out)
}

/// The first line of [`run`]'s output: what is planned, with which files and settings.
fn print_setup(out: &mut impl Write, setup: &Setup, args: &DryRunArgs) -> std::io::Result<()> {
    let shape = &setup.shape;
    writeln!(
        out,
        "dry run: {} episodes, tokenizer and template of {}, planned as {} with the state \
         sizes of {} ({} bytes per checkpoint, {} KV bytes per token; micro-batch {}, {} \
         checkpoints per slot, divergence min gap {}, one slot, {} MiB prompt cache; end-of-prompt \
         state {}, every prompt sent {} time(s); screenshots {}; context {} tokens)",
        setup.episodes.len(),
        setup.path.display(),
        if shape.hybrid() { "a hybrid model" } else { "an attention-only model" },
        setup.shapes_path.display(),
        shape.checkpoint_bytes(),
        shape.kv_bytes_per_token(),
        args.micro_batch,
        args.checkpoints,
        args.checkpoint_min_gap,
        PlannerSettings::default().prompt_cache_bytes >> 20,
        if args.no_end_state { "off" } else { "on" },
        args.repeats + 1,
        args.screenshots.as_str(),
        setup.n_ctx
    )
}

/// The per-step plans of [`run`] for one format (`args.format`; `both` plans `system-user`,
/// the gateway's), without printing.
///
/// Errors: as [`run`].
pub fn plan_steps(corpus: &std::path::Path, episode_ids: &[String], args: &DryRunArgs) -> Result<Vec<StepPlan>, ToolsError> {
    let format = match args.format {
        PromptFormat::Both => PromptFormat::SystemUser,
        f => f,
    };
    Setup::load(corpus, episode_ids, args)?.plan(format, args)
}

/// The chat messages of step `i` of `ep` in `format`, with its screenshot when `policy`
/// attaches it (the gateway's decision for a worker with vision).
fn step_chat(ep: &Episode, i: usize, format: PromptFormat, policy: ScreenshotPolicy) -> Result<Vec<spb::ChatMessage>, ToolsError> {
    let step = &ep.steps[i];
    let p = ep.step_prompt(i)?;
    let listed = select_controls(&step.observation.parse().map_err(agent_gateway::error::GatewayError::from)?, agent_gateway::observation::DEFAULT_MAX_CONTROLS)
        .shown
        .controls
        .len();
    let shot = match (&step.screenshot, policy.decide(step.screenshot.is_some(), listed, WorkerVision::Yes)) {
        (Some(path), Decision::Sent) => Some(std::fs::read(path).map_err(|source| {
            agent_gateway::error::CorpusError::Io { path: path.clone(), source }
        })?),
        _ => None,
    };
    let mut messages = step_messages(p, shot);
    if format == PromptFormat::SingleUser {
        let user = messages.pop().expect("system and user");
        let system = messages.pop().expect("system and user");
        messages = vec![spb::ChatMessage {
            role: "user".into(),
            content: format!("{}\n\n{}", system.content, user.content),
            parts: user.parts,
        }];
    }
    Ok(messages)
}

fn plan_format(
    episodes: &[Episode],
    format: PromptFormat,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    vision: Option<&ImageAdmission>,
    shape: &SequenceShape,
    args: &DryRunArgs,
) -> Result<Vec<StepPlan>, ToolsError> {
    let policy = ScreenshotPolicy { mode: args.screenshots, sparse_below: args.screenshot_sparse_below };
    let cfgs: Vec<PlanConfig> = CONFIGS
        .iter()
        .map(|&(_, policy, consolidate)| {
            PlannerSettings {
                policy,
                consolidate,
                n_checkpoints: args.checkpoints.max(1),
                min_gap: args.checkpoint_min_gap,
                end_state: !args.no_end_state,
                ..PlannerSettings::default()
            }
            .plan_config(args.micro_batch.max(1), shape)
        })
        .collect();
    let mut states: Vec<CacheState> = vec![CacheState::default(); cfgs.len()];
    let mut steps = Vec::new();
    for ep in episodes {
        for (i, step) in ep.steps.iter().enumerate() {
            let messages = step_chat(ep, i, format, policy)?;
            // The worker's admission: images decoded and sized by its own code, then the
            // image tokens' content-hash ids.
            let (mut ct, images) = chat_tokens_with_parts(tokenizer, template, vision, messages, usize::MAX)
                .map_err(|e| ToolsError::Prompt { episode: ep.id.clone(), step: i, reason: e.to_string() })?;
            mark_image_tokens(&mut ct.tokens, &images);
            let image_tokens: usize = images.iter().map(|im| im.image.n_tokens).sum();
            let output: Vec<u32> = step
                .recorded_action
                .as_deref()
                .map(|a| tokenizer.encode(a, false).unwrap_or_default())
                .unwrap_or_default();
            let req = PlanRequest {
                prompt: &ct.tokens,
                last_user_start: ct.last_user_start,
                image_start: images.first().map(|im| im.start),
                image_end: images.last().map(|im| im.start + im.image.n_tokens),
                line_starts: &ct.line_starts,
                section_starts: &ct.section_starts,
            };
            let mut processed = ct.tokens.clone();
            processed.extend_from_slice(&output[..output.len().saturating_sub(1)]);
            for _ in 0..=args.repeats {
                let mut row = StepPlan {
                    episode: ep.id.clone(),
                    step: i,
                    prompt_tokens: ct.tokens.len(),
                    image_tokens,
                    kv_bound_new: 0,
                    configs: Vec::new(),
                };
                for ((cfg, st), (name, _, _)) in cfgs.iter().zip(states.iter_mut()).zip(CONFIGS) {
                    let pl = plan(st, &req, cfg);
                    row.kv_bound_new = pl.n_prompt - pl.kv_bound;
                    // Checkpoints saved: the policy's and the end-of-prompt state.
                    let saved = pl.saved.len() + usize::from(pl.end_state.is_some());
                    row.configs.push((name.to_string(), pl.new_tokens(), pl.passes(), saved));
                    st.apply(cfg, &pl, &processed);
                }
                steps.push(row);
            }
        }
    }
    Ok(steps)
}

/// Warns on stderr when planned prompts would not fit the planned worker's context, saying
/// how many and what to change.
fn warn_over_context(s: &FormatSummary, setup: &Setup, args: &DryRunArgs) {
    if s.steps_over_context == 0 {
        return;
    }
    let capped = if setup.n_ctx < args.ctx_size {
        format!(", capped by the trained context of {} tokens of {}", setup.n_ctx_train, setup.shapes_path.display())
    } else {
        String::new()
    };
    eprintln!(
        "warning: {} format: {} of {} steps plan prompts a worker would refuse as over its context \
         (longest {} tokens; context {} tokens: --ctx-size {}{capped}, one token kept for the \
         output); raise the worker's and the dry run's --ctx-size{}, or shorten the prompts",
        s.format,
        s.steps_over_context,
        s.steps,
        s.max_prompt_tokens,
        setup.n_ctx,
        args.ctx_size,
        if s.mean_image_tokens > 0.0 { ", lower --image-max-tokens" } else { "" }
    );
}

fn summarize(format: PromptFormat, steps: &[StepPlan], n_ctx: usize) -> FormatSummary {
    let n = steps.len().max(1) as f64;
    let kv = steps.iter().map(|s| s.kv_bound_new as f64).sum::<f64>() / n;
    let configs = CONFIGS
        .iter()
        .enumerate()
        .map(|(ci, (name, _, _))| {
            let new = steps.iter().map(|s| s.configs[ci].1 as f64).sum::<f64>() / n;
            let passes = steps.iter().map(|s| s.configs[ci].2 as f64).sum::<f64>() / n;
            let saved = steps.iter().map(|s| s.configs[ci].3).sum::<usize>();
            (name.to_string(), new, passes, if kv > 0.0 { new / kv } else { 0.0 }, saved)
        })
        .collect();
    FormatSummary {
        format: format!("{format:?}"),
        steps: steps.len(),
        mean_prompt_tokens: steps.iter().map(|s| s.prompt_tokens as f64).sum::<f64>() / n,
        mean_image_tokens: steps.iter().map(|s| s.image_tokens as f64).sum::<f64>() / n,
        mean_kv_bound_new: kv,
        configs,
        steps_over_context: steps.iter().filter(|s| s.prompt_tokens >= n_ctx).count(),
        max_prompt_tokens: steps.iter().map(|s| s.prompt_tokens).max().unwrap_or(0),
    }
}

fn print_summary(out: &mut impl Write, s: &FormatSummary, steps: &[StepPlan], per_step: bool) -> std::io::Result<()> {
    writeln!(
        out,
        "\n== {} format: {} steps, {:.0} prompt tokens per step ({:.0} of them image tokens), KV bound {:.1} new tokens per step ==",
        s.format, s.steps, s.mean_prompt_tokens, s.mean_image_tokens, s.mean_kv_bound_new
    )?;
    if per_step {
        write!(out, "{:<44} {:>4} {:>6} {:>6} {:>6}", "episode", "step", "prompt", "image", "kv")?;
        for (name, _, _) in CONFIGS {
            write!(out, " {name:>11}")?;
        }
        writeln!(out)?;
        for st in steps {
            write!(
                out,
                "{:<44} {:>4} {:>6} {:>6} {:>6}",
                st.episode, st.step, st.prompt_tokens, st.image_tokens, st.kv_bound_new
            )?;
            for c in &st.configs {
                write!(out, " {:>6}/{:<4}", c.1, c.2)?;
            }
            writeln!(out)?;
        }
        writeln!(out, "(per config: new tokens / passes)")?;
    }
    writeln!(out, "| config | new tokens/step | × KV bound | passes/step | checkpoints saved |")?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    writeln!(out, "| KV bound | {:.1} | 1.00 | | |", s.mean_kv_bound_new)?;
    for (name, new, passes, ratio, saved) in &s.configs {
        writeln!(out, "| {name} | {new:.1} | {ratio:.3} | {passes:.2} | {saved} |")?;
    }
    Ok(())
}
