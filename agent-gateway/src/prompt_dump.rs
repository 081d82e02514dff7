//! `agent-gateway prompt`: the chat messages of one corpus step, for fixtures and debugging.

use std::path::PathBuf;

use crate::corpus::load_episode;
use crate::error::GatewayError;

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
    let p = load_episode(&args.corpus, &args.episode)?.step_prompt(args.step)?;
    Ok(serde_json::json!({"messages": [
        {"role": "system", "content": p.system},
        {"role": "user", "content": p.user},
    ]})
    .to_string())
}
