//! The screenshot path's model side (issue 19): the projector file, image preprocessing and
//! the vision tower's forward pass.
//!
//! - [`mmproj`]: the mmproj GGUF (`--mmproj`, projector `qwen3vl_merger`) into a typed
//!   [`VisionConfig`] and shape-checked tensors ([`Projector`]).
//! - [`decode`]: PNG / JPEG bytes → RGB8 within [`DecodeLimits`].
//! - [`resize`]: Pillow-compatible fixed-point bicubic and the two fits (llama.cpp's
//!   `PAD_CEIL`, Hugging Face's stretch).
//! - [`preprocess`]: sizing to multiples of 32 within the token budget, normalisation and
//!   the patch layout the encoder reads.
//! - [`encoder`]: [`Projector::encode`], patches → image embeddings in the text hidden size
//!   (patch embedding, learned positions ([`position`]), pre-LN blocks with 2-D rotary
//!   ([`rope2d`]), the 2×2 merger), with the llama.cpp / Hugging Face differences as
//!   [`EncodeOptions`].
//! - [`error`]: [`VisionError`].
pub mod decode;
pub mod encoder;
pub mod error;
pub mod mmproj;
pub mod position;
pub mod preprocess;
pub mod resize;
pub mod rope2d;

pub use decode::{DecodeLimits, RgbImage};
pub use encoder::{AttnPrecision, EncodeOptions};
pub use error::VisionError;
pub use mmproj::{Projector, VisionConfig};
pub use preprocess::{ImageBudget, PreprocessOptions, Preprocessed};
pub use resize::Fit;
