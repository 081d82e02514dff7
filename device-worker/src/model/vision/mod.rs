//! The screenshot path's model side (issue 19): the projector file and image preprocessing.
//!
//! - [`mmproj`]: the mmproj GGUF (`--mmproj`, projector `qwen3vl_merger`) into a typed
//!   [`VisionConfig`] and shape-checked tensors ([`Projector`]).
//! - [`decode`]: PNG / JPEG bytes → RGB8 within [`DecodeLimits`].
//! - [`resize`]: Pillow-compatible fixed-point bicubic and the two fits (llama.cpp's
//!   `PAD_CEIL`, Hugging Face's stretch).
//! - [`preprocess`]: sizing to multiples of 32 within the token budget, normalisation and
//!   the patch layout the encoder reads.
//! - [`error`]: [`VisionError`].
pub mod decode;
pub mod error;
pub mod mmproj;
pub mod preprocess;
pub mod resize;

pub use decode::{DecodeLimits, RgbImage};
pub use error::VisionError;
pub use mmproj::{Projector, VisionConfig};
pub use preprocess::{ImageBudget, PreprocessOptions, Preprocessed};
pub use resize::Fit;
