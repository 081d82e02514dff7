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
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = step_index)]
    pub step: usize,
    /// Corpus folder.
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    pub corpus: PathBuf,
}

/// `--step`: a 0-based step number (`-1` reaches this parser, not clap's "unexpected
/// argument"). Errors: a message naming the value.
fn step_index(s: &str) -> Result<usize, String> {
    s.trim().parse().map_err(|_| format!("expected a 0-based step number (0 is the first step; `replay --list` shows each episode's step count), found {s:?}"))
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
