//! Test support shared by the workspace's test suites (a dev-dependency only): the real inputs
//! and what a test does without them ([`inputs`]), NaN-aware numeric comparisons
//! ([`compare`]), a writer of synthetic GGUF files ([`gguf_builder`]), image bytes for the
//! screenshot path ([`images`]) and checks of the programs' command lines ([`cli`]).
#![forbid(unsafe_code)]

pub mod cli;
pub mod compare;
pub mod gguf_builder;
pub mod images;
pub mod inputs;

pub use compare::{assert_close, max_abs_diff, max_rel_diff};
pub use gguf_builder::{projector_metadata, write_temp_bytes, GgufBuilder, RawTensor, Val};
pub use inputs::{
    corpus_dir, fixture, kernel_backend, model_path, optional_model_path, require_inputs, untested,
};
