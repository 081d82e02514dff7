//! Errors of the screenshot path: the projector file and the image bytes.

use gguf::GgufError;

use crate::model::ModelError;

/// Errors loading the mmproj file (`mmproj`) or turning image bytes into encoder input
/// (`decode`, `preprocess`). Every variant caused by a request's image (the decode ones and
/// [`VisionError::NoProjector`]) is the client's fault: the engine maps them to
/// INVALID_ARGUMENT ([`VisionError::is_invalid_input`]).
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The projector's metadata (a key missing or of the wrong type).
    #[error("mmproj: {0}")]
    Gguf(#[from] GgufError),
    /// The `--mmproj` file cannot be opened or is no readable GGUF (named, so a bad projector
    /// is never taken for a bad `--model`).
    #[error("--mmproj {}: {error}", .path.display())]
    Open {
        path: std::path::PathBuf,
        error: GgufError,
    },
    /// A missing tensor or one of the wrong shape ([`ModelError::MissingTensor`],
    /// [`ModelError::TensorShape`]), or one that cannot be dequantized.
    #[error("mmproj: {0}")]
    Tensor(#[from] ModelError),
    #[error(
        "mmproj file is not a projector: general.architecture is {found:?}, expected \"clip\""
    )]
    NotProjector { found: String },
    #[error("mmproj projector type {found:?} is not supported (supported: {supported})")]
    UnknownProjector { found: String, supported: String },
    #[error("mmproj has no vision encoder (clip.has_vision_encoder is false)")]
    NoVisionEncoder,
    #[error("mmproj projects to {projection_dim} dims but the text model's hidden size is {text_hidden}")]
    ProjectionMismatch {
        projection_dim: usize,
        text_hidden: usize,
    },
    #[error("mmproj hyperparameter {key} = {value} is not supported: {why}")]
    Hyperparameter {
        key: &'static str,
        value: String,
        why: &'static str,
    },
    /// An image was sent but the worker has no projector (`--mmproj`).
    #[error("this model has no vision projector (start the worker with --mmproj): images are not accepted")]
    NoProjector,
    #[error("image is empty (0 bytes)")]
    EmptyImage,
    #[error("{} is not supported (PNG and JPEG are)", match .format { Some(f) => format!("image format {f}"), None => "an image whose format is not recognised".to_string() })]
    UnsupportedFormat { format: Option<String> },
    #[error("image is {width}x{height}; the limit is {max_side} pixels per side and {max_pixels} pixels")]
    ImageTooLarge {
        width: u32,
        height: u32,
        max_side: u32,
        max_pixels: u64,
    },
    #[error("image is {width}x{height}; each side must be at least {min_side} pixels")]
    ImageTooSmall {
        width: u32,
        height: u32,
        min_side: u32,
    },
    #[error("image is {width}x{height}; the aspect ratio must be at most {max_ratio}")]
    AspectRatio {
        width: u32,
        height: u32,
        max_ratio: u32,
    },
    /// The images of one request so far exceed [`super::DecodeLimits::max_request_pixels`]
    /// (checked from each header before decoding).
    #[error("the request's images reach {total} pixels with this one ({width}x{height}); the limit is {limit} pixels per request (--image-request-mpx)")]
    RequestPixels {
        width: u32,
        height: u32,
        total: u64,
        limit: u64,
    },
    #[error("image cannot be decoded: {0}")]
    Decode(String),
    #[error("image budget: {0}")]
    Budget(String),
    /// The encoder was given input of another shape than its projector needs (a
    /// [`super::Preprocessed`] made for another projector, or a bug).
    #[error("vision encoder: {what} has {actual} values, expected {expected}")]
    EncoderShape {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// A kernel of the encoder refused its arguments (a bug: shapes are checked before).
    #[error("vision encoder: {op}")]
    Encoder {
        op: String,
        #[source]
        source: ModelError,
    },
}

impl VisionError {
    /// [`VisionError::Encoder`] for a kernel error of `op`.
    pub(crate) fn kernel(op: &str, source: dsp::DspError) -> Self {
        Self::Encoder {
            op: op.to_string(),
            source: ModelError::Kernel {
                name: op.to_string(),
                source,
            },
        }
    }

    /// Whether the error is the request's fault (a bad or unwanted image), not the server's.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::NoProjector
                | Self::EmptyImage
                | Self::UnsupportedFormat { .. }
                | Self::ImageTooLarge { .. }
                | Self::ImageTooSmall { .. }
                | Self::AspectRatio { .. }
                | Self::RequestPixels { .. }
                | Self::Decode(_)
        )
    }
}
