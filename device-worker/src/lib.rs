//! device-worker: owns the model (GGUF), the compute kernels' thread pool, slots with KV
//! cache, and serves `StepService` over gRPC.
//!
//! - [`config`]: options (flags, `--config` files) and the validated settings.
//! - [`engine`]: the actor that owns model and slots, one request's stages; [`engine::admission`]
//!   validates requests.
//! - [`model`]: forward passes over GGUF weights.
//! - [`state`]: slots, KV caches, recurrent state, checkpoints, rollback states, the prompt
//!   cache and the checkpoint planner.
//! - [`speculative`]: drafters, the speculator, verification, the adaptive draft length.
//! - [`sampling`]: token choice (greedy, seeded sampling, grammar mask); [`constraint`]: the
//!   grammar; [`prompt`]: chat messages to tokens.
//! - [`power`]: power votes, the idle controller; [`watchdog`]: the batch watchdog;
//!   [`energy`]: energy sources.
//! - [`service`]: the tonic handlers and the `/metrics` server.
//! - [`telemetry`]: per-request metrics and spans, energy and power series.
//!
//! `ARCHITECTURE.md` at the repository root maps every mechanism to its file.
pub mod bench;
pub mod config;
pub mod constraint;
pub mod energy;
pub mod engine;
pub mod error;
pub mod model;
pub mod power;
pub mod prompt;
pub mod sampling;
pub mod service;
pub mod speculative;
pub mod state;
pub mod telemetry;
pub mod watchdog;
