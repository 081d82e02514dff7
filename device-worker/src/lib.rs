//! device-worker: owns the model (GGUF), the compute kernels' thread pool, slots with KV
//! cache, and serves `StepService` over gRPC.
//!
//! - [`engine`]: the actor that owns model and slots; [`engine::admission`] validates requests.
//! - [`model`]: GGUF loading and forward passes.
//! - [`state`]: slots, KV caches, recurrent state, rollback states.
//! - [`spec`]: speculative-decoding drafters and the adaptive draft length
//!   ([`engine::speculative`] runs the verification rounds).
//! - [`power`]: power votes, the idle controller; [`watchdog`]: the batch watchdog.
//! - [`service`]: the tonic handlers.
//! - [`telemetry`]: Prometheus metrics, energy sampling, OpenTelemetry tracing.
pub mod bench;
pub mod config;
pub mod constraint;
pub mod energy;
pub mod engine;
pub mod error;
pub mod model;
pub mod power;
pub mod prompt;
pub mod service;
pub mod spec;
pub mod state;
pub mod telemetry;
pub mod watchdog;
