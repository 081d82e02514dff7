//! agent-gateway: turns screen observations into agent prompts, routes episodes to
//! device-workers, streams action tokens and validates the JSON actions.
//!
//! - [`observation`]: uiautomator XML and AndroidWorld UI elements → indexed controls.
//! - [`prompt`]: the agent prompt (rules, task, last actions, controls).
//! - [`action`]: AndroidWorld-compatible JSON actions, their schema and validation.
//! - [`step`], [`episode`], [`worker`]: running a step on a worker.
//! - [`service`]: the gRPC AgentService. [`replay`]: corpus replay client. [`corpus`]: episodes.
pub mod action;
pub mod config;
pub mod corpus;
pub mod episode;
pub mod error;
pub mod health;
pub mod observation;
pub mod prompt;
pub mod prompt_dump;
pub mod replay;
pub mod service;
pub mod step;
pub mod worker;
