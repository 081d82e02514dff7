//! `tandem-tools`: model-file tools (dry-run planner, draft vocabulary).

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tandem-tools",
    version,
    about = "tandem model-file tools: plan corpus episodes with the worker's checkpoint planner (no model run), add a trimmed draft vocabulary to a GGUF."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan corpus episodes with the worker's checkpoint planner alone (no worker, no model
    /// run, milliseconds): new prompt tokens and passes per step for each policy beside the
    /// KV-cache bound, prompts built and tokenized exactly as gateway and worker do.
    DryRun(DryRunCommand),
    /// Add a trimmed draft vocabulary to a GGUF with MTP layers (for the `mtp-trimmed` drafter).
    ///
    /// Ranks the token ids (control and byte tokens first, then tokens by frequency in the
    /// corpus's recorded agent actions, then by id), keeps the first --top, and writes the
    /// model to --out with two additions: tensor `blk.{L}.nextn.draft_output.weight` (those
    /// rows of the LM head, byte for byte; L = the first MTP layer) and metadata
    /// `{arch}.nextn_draft_token_ids` (their original token ids). The drafter scores only
    /// these rows and maps its choice back to the original id. Everything else is unchanged.
    DraftVocab(model_tools::draft_vocab::DraftVocabArgs),
}

/// `dry-run`'s options: which episodes, and the planner's settings.
#[derive(clap::Args)]
struct DryRunCommand {
    /// Corpus folder: the raw/ folder of the shared corpus (real screen dumps and
    /// episodes). The default is relative to the current directory and fits a run from the
    /// repository root with the corpus checked out beside it; elsewhere pass --corpus or set
    /// TANDEM_CORPUS.
    #[arg(long, env = "TANDEM_CORPUS", default_value = "../shared/corpus/raw")]
    corpus: PathBuf,
    /// Episode id to plan (repeatable; see `agent-gateway replay --list`). Default: every
    /// corpus episode.
    #[arg(long = "episode")]
    episodes: Vec<String>,
    #[command(flatten)]
    args: model_tools::dry_run::DryRunArgs,
}

fn main() -> std::process::ExitCode {
    tandem_options::exit_code(run())
}

/// The command line's work; its error is printed once, causes included, by [`main`].
fn run() -> anyhow::Result<()> {
    // Log lines to stderr (`RUST_LOG`), as both servers write them.
    let _tracing = tandem_telemetry::otel::init("tandem-tools", None)?;
    match Cli::parse().command {
        Command::DryRun(c) => {
            // A usage error exits 2 before any file is read, as clap's own and the worker's.
            tandem_options::exit_on_usage_error(c.args.check_usage());
            model_tools::dry_run::run(&c.corpus, &c.episodes, &c.args)?;
        }
        Command::DraftVocab(args) => {
            let summary = model_tools::draft_vocab::run(&args)?;
            // A reader that went away (`draft-vocab ... | head -0`) ends the command quietly.
            tandem_options::write_stdout(|out| writeln!(out, "{summary}"))?;
        }
    }
    Ok(())
}
