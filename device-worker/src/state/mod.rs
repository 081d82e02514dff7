//! Per-slot inference state.
pub mod checkpoint;
pub mod kv;
pub mod mtp;
pub mod recurrent;
pub mod rollback;
pub mod sequence;
pub mod slot;
