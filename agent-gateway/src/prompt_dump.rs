//! `agent-gateway prompt`: the chat messages of one corpus step, for fixtures and debugging.

use std::path::PathBuf;

use crate::corpus::load_episode;
use crate::error::GatewayError;
use crate::prompt::{build_prompt, PromptInput};

#[derive(Clone, Debug, clap::Args)]
pub struct PromptArgs {
    /// Episode id (see `replay --list`).
    #[arg(long)]
    pub episode: String,
    /// 0-based step.
    #[arg(long, default_value_t = 0)]
    pub step: usize,
    /// Corpus folder.
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    pub corpus: PathBuf,
}

/// `{"messages": [{"role": "system", ..}, {"role": "user", ..}]}` for the step.
///
/// Errors: unknown episode or step, an observation that does not parse.
pub fn messages_json(args: &PromptArgs) -> Result<String, GatewayError> {
    let ep = load_episode(&args.corpus, &args.episode)?;
    let step = ep.steps.get(args.step).ok_or_else(|| {
        GatewayError::Config(format!("episode {} has {} steps; step {} does not exist", ep.id, ep.steps.len(), args.step))
    })?;
    let screen = step.observation.parse()?;
    let history: Vec<String> = ep.steps[..args.step].iter().filter_map(|s| s.recorded_action.clone()).collect();
    let app = step.foreground_app.clone().or_else(|| screen.foreground_package.clone());
    let p = build_prompt(&PromptInput { task: &ep.task, foreground_app: app.as_deref(), history: &history, screen: &screen });
    Ok(serde_json::json!({"messages": [
        {"role": "system", "content": p.system},
        {"role": "user", "content": p.user},
    ]})
    .to_string())
}
