//! Where the tests' real inputs are: the default model and the corpus.

use std::path::PathBuf;

/// The real SmolLM2 model: `$TANDEM_MODEL` or the default cache path. `None` (with a loud
/// message) when absent, so model-backed tests skip on machines without it.
pub fn model_path(test: &str) -> Option<PathBuf> {
    let p = std::env::var_os("TANDEM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from("/root/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "!!!!! SKIPPING {test}: model file {} not found (set TANDEM_MODEL) !!!!!",
            p.display()
        );
        None
    }
}

