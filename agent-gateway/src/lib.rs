//! agent-gateway: turns screen observations into agent prompts, routes episodes to
//! device-workers, streams action tokens and validates the JSON actions.
//!
//! - [`observation`]: uiautomator XML and AndroidWorld UI elements → indexed controls.
//! - [`prompt`]: the agent prompt (rules, task, last actions, controls).
//! - [`action`]: AndroidWorld-compatible JSON actions, their schema and validation.
//! - [`step`], [`episode`], [`worker`]: running a step on a worker; [`screenshot`]: whether
//!   and where a step's screenshot goes into its prompt.
//! - [`metrics`]: Prometheus metrics (`GET /metrics`); [`telemetry`]: spans and trace context.
//! - [`service`]: the gRPC AgentService. [`http`]: the OpenAI-compatible HTTP endpoint. [`replay`]: corpus replay client. [`load`]: the bounded load generator. [`corpus`]: episodes.
pub mod action;
pub mod config;
pub mod corpus;
pub mod episode;
pub mod error;
pub mod health;
pub mod http;
pub mod load;
pub mod metrics;
pub mod observation;
pub mod prompt;
pub mod prompt_dump;
pub mod replay;
pub mod screenshot;
pub mod service;
pub mod step;
pub mod telemetry;
pub mod worker;

/// The kind of a JSON value as error messages name it: "null", "a boolean", "a number",
/// "a string", "an array" or "an object".
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
