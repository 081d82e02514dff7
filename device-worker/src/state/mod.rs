//! Per-slot inference state.
pub mod kv;
pub mod slot;
