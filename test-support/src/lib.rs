//! Test support shared by the workspace's test suites (a dev-dependency only): where the real
//! inputs are ([`inputs`]) and a writer of synthetic GGUF files ([`gguf_builder`]).
#![forbid(unsafe_code)]

pub mod gguf_builder;
pub mod inputs;

pub use gguf_builder::{write_temp_bytes, GgufBuilder, RawTensor, Val};
pub use inputs::model_path;
