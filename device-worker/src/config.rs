//! Worker configuration: one struct for flags (clap) and environment.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Where `tools/fetch_model.sh` puts the default model.
pub fn default_model_path() -> PathBuf {
    let cache = std::env::var_os("TANDEM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tandem")))
        .unwrap_or_else(|| PathBuf::from(".cache/tandem"));
    cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Parses a count that must be at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Engine settings.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineConfig {
    /// GGUF model file (architecture `llama`). Default: the SmolLM2-135M-Instruct Q4_1 file
    /// fetched by `tools/fetch_model.sh` into $TANDEM_CACHE (or ~/.cache/tandem).
    #[arg(long, env = "TANDEM_MODEL")]
    pub model: Option<PathBuf>,
    /// Compute threads (the engine thread included). Default: all cores.
    #[arg(long, short = 't', value_parser = at_least_one)]
    pub threads: Option<usize>,
    /// Context length per slot, in tokens (prompt + output).
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    pub ctx_size: usize,
    /// Slots (sequences with their own KV cache). Episodes are pinned to slots.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub slots: usize,
    /// Micro-batch size for prefill, in tokens.
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub micro_batch: usize,
    /// Requests that may wait for the engine; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    pub max_queue: usize,
    /// Output budget when a request says 0.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: u32,
}

impl EngineConfig {
    pub fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }

    pub fn n_threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
            .max(1)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: None,
            threads: None,
            ctx_size: 4096,
            slots: 2,
            micro_batch: 512,
            max_queue: 32,
            default_max_tokens: 256,
        }
    }
}

/// The `serve` command's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeConfig {
    /// Address for StepService (gRPC). Use 127.0.0.1 on a phone reached by `adb forward`.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub engine: EngineConfig,
}
