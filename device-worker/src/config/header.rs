//! What the commands check from the model files' headers (metadata only, memory-mapped:
//! milliseconds) before anything is loaded or allocated: the architecture and hyperparameters
//! of `--model` (the same functions the loaders use), its hidden size against the
//! `--mmproj` projector's output width, and its trained context.

use gguf::reader::GgufFile;

use crate::model::vision::{VisionConfig, VisionError};
use crate::model::ModelError;
use crate::state::sequence::SequenceShape;

/// A model's configuration read from its GGUF header.
#[derive(Clone, Debug)]
pub struct ModelHeader {
    /// The sequence-state shapes ([`crate::model::sequence_shape`]).
    pub shape: SequenceShape,
    /// Hidden size (`{arch}.embedding_length`): a projector must project to it.
    pub n_embd: usize,
    /// Trained context (`{arch}.context_length`; 4096 when absent, as the loaders assume).
    pub n_ctx_train: usize,
}

impl ModelHeader {
    /// Reads `file`'s architecture and hyperparameters as the loaders do.
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] (with a hint when the file is a
    /// projector, architecture `clip`), a missing or inconsistent hyperparameter.
    pub fn read(file: &GgufFile) -> Result<Self, ModelError> {
        let shape = crate::model::sequence_shape(file).map_err(|e| match e {
            ModelError::UnsupportedArchitecture { arch, supported } if arch == "clip" => ModelError::UnsupportedArchitecture {
                arch,
                supported: format!("{supported}; this file is a vision projector: pass it as --mmproj"),
            },
            e => e,
        })?;
        let arch = file.architecture()?;
        let n_embd = file.get_u32(&format!("{arch}.embedding_length"))? as usize;
        let n_ctx_train = file.get_u32_opt(&format!("{arch}.context_length")).map_or(4096, |v| v as usize);
        Ok(Self { shape, n_embd, n_ctx_train })
    }

    /// The configuration of the projector in `mmproj`, checked to fit this model.
    ///
    /// Errors: [`VisionError`] for a file that is no supported projector, and
    /// [`VisionError::ProjectionMismatch`] when its output width is not [`Self::n_embd`].
    pub fn projector(&self, mmproj: &GgufFile) -> Result<VisionConfig, VisionError> {
        let config = VisionConfig::from_gguf(mmproj)?;
        if config.projection_dim != self.n_embd {
            return Err(VisionError::ProjectionMismatch {
                projection_dim: config.projection_dim,
                text_hidden: self.n_embd,
            });
        }
        Ok(config)
    }
}

/// Whether `--model` (the default path when `model_given` is false: it then gets the hint to
/// fetch it) and `--mmproj` name files this process can read: a missing one is a usage error
/// of the command line (exit code 2), found before anything starts.
///
/// Errors: one line naming the flag and the path.
pub fn check_model_paths(settings: &super::EngineSettings, model_given: bool) -> Result<(), String> {
    let model = &settings.model;
    if !model_given && !model.exists() {
        return Err(format!("model file {} does not exist; run tools/fetch_model.sh or pass --model PATH", model.display()));
    }
    let mut files = vec![("--model", model.as_path())];
    if let Some(v) = &settings.vision {
        files.push(("--mmproj", v.mmproj.as_path()));
    }
    tandem_options::check_readable(&files)
}

/// Reads the headers of `--model` and `--mmproj` (see [`ModelHeader`]) so that a missing,
/// truncated or foreign file, a model of an architecture this build does not run (e.g. a
/// projector given as `--model`) and a projector whose width does not fit the model are
/// reported once, before the port opens, not by a worker that listens and then exits. The
/// engine's load still checks the tensors in the background while health reports
/// NOT_SERVING. `model_given`: `--model` (or `TANDEM_MODEL`) named the file; only the default
/// path gets the hint to fetch it.
///
/// Errors: each names its flag and path.
pub fn check_model_files(settings: &super::EngineSettings, model_given: bool) -> anyhow::Result<()> {
    use anyhow::Context;
    let model = &settings.model;
    if !model_given && !model.exists() {
        anyhow::bail!(
            "model file {} does not exist; run tools/fetch_model.sh or pass --model PATH",
            model.display()
        );
    }
    let what = || format!("--model {}", model.display());
    let file = GgufFile::open(model).with_context(what)?;
    let header = ModelHeader::read(&file).with_context(what)?;
    if let Some(v) = &settings.vision {
        let what = || format!("--mmproj {}", v.mmproj.display());
        let file = GgufFile::open(&v.mmproj).with_context(what)?;
        header.projector(&file).with_context(what)?;
    }
    Ok(())
}
