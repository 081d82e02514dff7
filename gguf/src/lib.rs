//! The model file: what the worker and the model tools read from (and write to) a GGUF file.
//!
//! - [`reader`]: the memory-mapped, bounds-checked GGUF reader ([`GgufFile`]): header,
//!   metadata ([`MetaValue`]), tensor table and tensor views.
//! - [`writer`]: rewrites a GGUF with additional tensors and metadata, everything else byte
//!   for byte (the trimmed draft vocabulary).
//! - [`tokenizer`]: the tokenizer built from a GGUF vocabulary (`tokenizer.ggml.*`), with
//!   llama.cpp's pre-tokenizers, and the incremental UTF-8 decoder of streamed tokens.
//! - [`chat_template`]: the Jinja chat template of `tokenizer.chat_template` (minijinja).
//!
//! Tensor types are the kernels' [`dsp::GgmlType`]: a file with a type no kernel implements
//! is rejected when it is opened, naming the tensor and the type. Nothing here knows a model
//! architecture or a wire format.
// The one `unsafe` is the memory map of the model file (reader::map_readonly).
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod chat_template;
pub mod error;
pub mod reader;
pub mod tokenizer;
pub mod writer;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use error::{GgufError, TemplateError, TokenizerError};
pub use reader::{GgufFile, MetaValue, TensorInfo, TensorView};
pub use tokenizer::{BoundedEncoding, IncrementalDecoder, Tokenizer};
