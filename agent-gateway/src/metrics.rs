//! Prometheus metrics of the gateway: installing the recorder, recording one step's figures,
//! the in-flight gauge guard, and rendering the text exposition format for `GET /metrics`.
//!
//! Names and buckets live in [`tandem_telemetry::metric_names`] (shared with the worker and the
//! dashboards under `observability/`). The recorder is `metrics-exporter-prometheus`'s, without
//! its own HTTP listener, installed by [`tandem_telemetry::prometheus::install`] (one
//! per process, shared with an in-process worker): [`crate::http`] serves [`render`] on the
//! gateway's axum router.

use std::sync::Once;

use metrics_exporter_prometheus::PrometheusHandle;
use tandem_proto::agent::v1 as apb;
use tandem_telemetry::metric_names as m;

use crate::error::GatewayError;

/// The `Content-Type` of the Prometheus text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = tandem_telemetry::prometheus::CONTENT_TYPE;

static GATEWAY_SERIES: Once = Once::new();

/// Installs the process-wide Prometheus recorder (shared with the worker when both run in one
/// process: [`tandem_telemetry::prometheus::install`], buckets of [`m::HISTOGRAMS`])
/// once, and the gateway's HELP lines and zero-valued series once; later calls return the same
/// handle.
///
/// Errors: [`GatewayError::Config`] when another recorder (not the shared one) is already
/// installed in the process, or a bucket list is empty.
pub fn install() -> Result<PrometheusHandle, GatewayError> {
    let handle = tandem_telemetry::prometheus::install().map_err(|e| GatewayError::Config(e.to_string()))?;
    // Series that may stay at zero for a long time exist from the start, so dashboards and
    // rate() see 0 rather than nothing.
    GATEWAY_SERIES.call_once(|| {
        describe();
        ::metrics::counter!(m::AGENT_WORKER_RETRIES_TOTAL).increment(0);
        for d in crate::screenshot::Decision::ALL {
            ::metrics::counter!(m::AGENT_SCREENSHOTS_TOTAL, m::LABEL_OUTCOME => d.as_str()).increment(0);
        }
        ::metrics::counter!(m::AGENT_IMAGE_TOKENS_TOTAL).increment(0);
        for outcome in ["encoded", "cache_hit"] {
            ::metrics::counter!(m::AGENT_IMAGES_TOTAL, m::LABEL_OUTCOME => outcome).increment(0);
        }
        ::metrics::gauge!(m::AGENT_STEPS_IN_FLIGHT).increment(0.0);
    });
    Ok(handle)
}

/// HELP lines of the gateway's metrics (what each one measures; see [`m`] for labels).
fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(m::AGENT_STEP_DURATION_SECONDS, Unit::Seconds, "Agent step, observation in to validated action.");
    describe_histogram!(m::AGENT_TIME_TO_FIRST_TOKEN_SECONDS, Unit::Seconds, "Step start to the first action token.");
    describe_histogram!(m::AGENT_PREFILL_DURATION_SECONDS, Unit::Seconds, "Worker prefill time per step.");
    describe_histogram!(m::AGENT_DECODE_DURATION_SECONDS, Unit::Seconds, "Worker decode time per step.");
    describe_counter!(m::AGENT_STEPS_TOTAL, "Finished steps by outcome.");
    describe_counter!(m::AGENT_PROMPT_TOKENS_TOTAL, "Prompt tokens per step, new (prefilled) or reused (KV cache).");
    describe_counter!(m::AGENT_KV_BOUND_TOKENS_TOTAL, "Prompt tokens an ideal LCP KV cache would reuse.");
    describe_counter!(m::AGENT_DECODE_TOKENS_TOTAL, "Output tokens.");
    describe_counter!(m::AGENT_WORKER_RETRIES_TOTAL, "Generate calls retried after UNAVAILABLE.");
    describe_counter!(m::AGENT_SCREENSHOTS_TOTAL, "Observations by what became of their screenshot (sent to the model or why not).");
    describe_counter!(m::AGENT_IMAGE_TOKENS_TOTAL, "Image tokens in the steps' prompts.");
    describe_counter!(m::AGENT_IMAGES_TOTAL, "Prompt images past the reused prefix: encoded by the worker or from its image cache.");
    describe_histogram!(m::AGENT_ENCODER_DURATION_SECONDS, Unit::Seconds, "Worker image preprocessing and encoding time per step that encoded an image.");
    describe_gauge!(m::AGENT_STEPS_IN_FLIGHT, "Steps running now.");
    describe_counter!(m::GATEWAY_HTTP_REQUESTS_TOTAL, "HTTP requests answered, by route and status code.");
    describe_gauge!(m::GATEWAY_HTTP_REQUESTS_IN_FLIGHT, "HTTP requests being handled now (a stream until its body ends).");
}

/// The text exposition of every metric recorded so far (runs the exporter's upkeep first so
/// histograms are drained).
pub fn render(handle: &PrometheusHandle) -> String {
    tandem_telemetry::prometheus::render(handle)
}

/// Which API a step came through: the `kind` label of `agent_*` step metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A step of a `RunEpisode` stream.
    Episode,
    /// A unary `Step` call.
    Step,
}

impl StepKind {
    /// The label value: `"episode"` or `"step"`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Episode => "episode",
            StepKind::Step => "step",
        }
    }
}

/// How a step ended: the `outcome` label of [`m::AGENT_STEPS_TOTAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// A valid action.
    Ok,
    /// The model's output did not parse or named an unlisted control.
    InvalidAction,
    /// The worker failed (transport, status, truncated stream) or the controller left.
    WorkerError,
    /// The observation could not be parsed; no worker call was made.
    ObservationError,
}

impl StepOutcome {
    /// The label value (`"ok"`, `"invalid_action"`, `"worker_error"`, `"observation_error"`).
    pub fn as_str(self) -> &'static str {
        match self {
            StepOutcome::Ok => "ok",
            StepOutcome::InvalidAction => "invalid_action",
            StepOutcome::WorkerError => "worker_error",
            StepOutcome::ObservationError => "observation_error",
        }
    }
}

/// Records one finished step: its duration (`stats.step_ms`, ms → s), outcome, and the
/// worker's token and time figures from `result.stats` (prompt tokens new/reused, KV bound,
/// decode tokens, image tokens, images encoded or from the image cache, encoder seconds;
/// prefill and decode seconds of steps the worker finished). `image_sent`: the step's
/// screenshot went to the model (the `has_image` label). A no-op without an installed
/// recorder.
pub fn record_step(kind: StepKind, image_sent: bool, outcome: StepOutcome, result: &apb::StepResult) {
    let s = result.stats.clone().unwrap_or_default();
    let has_image = if image_sent { "true" } else { "false" };
    ::metrics::histogram!(m::AGENT_STEP_DURATION_SECONDS, m::LABEL_KIND => kind.as_str(), m::LABEL_HAS_IMAGE => has_image)
        .record(s.step_ms / 1e3);
    ::metrics::counter!(m::AGENT_STEPS_TOTAL, m::LABEL_KIND => kind.as_str(), m::LABEL_OUTCOME => outcome.as_str()).increment(1);
    ::metrics::counter!(m::AGENT_PROMPT_TOKENS_TOTAL, m::LABEL_KIND => "new").increment(u64::from(s.new_tokens));
    ::metrics::counter!(m::AGENT_PROMPT_TOKENS_TOTAL, m::LABEL_KIND => "reused").increment(u64::from(s.reused_tokens));
    ::metrics::counter!(m::AGENT_KV_BOUND_TOKENS_TOTAL).increment(u64::from(s.kv_bound_tokens));
    ::metrics::counter!(m::AGENT_DECODE_TOKENS_TOTAL).increment(u64::from(s.decode_tokens));
    ::metrics::counter!(m::AGENT_IMAGE_TOKENS_TOTAL).increment(u64::from(s.image_tokens));
    ::metrics::counter!(m::AGENT_IMAGES_TOTAL, m::LABEL_OUTCOME => "encoded").increment(u64::from(s.images_encoded));
    ::metrics::counter!(m::AGENT_IMAGES_TOTAL, m::LABEL_OUTCOME => "cache_hit").increment(u64::from(s.image_cache_hits));
    if s.images_encoded > 0 {
        ::metrics::histogram!(m::AGENT_ENCODER_DURATION_SECONDS).record(s.encoder_ms / 1e3);
    }
    if outcome != StepOutcome::WorkerError && outcome != StepOutcome::ObservationError {
        ::metrics::histogram!(m::AGENT_PREFILL_DURATION_SECONDS).record(s.prefill_ms / 1e3);
        ::metrics::histogram!(m::AGENT_DECODE_DURATION_SECONDS).record(s.decode_ms / 1e3);
    }
}

/// Counts one observation under what became of its screenshot ([`m::AGENT_SCREENSHOTS_TOTAL`]).
pub fn record_screenshot(decision: crate::screenshot::Decision) {
    ::metrics::counter!(m::AGENT_SCREENSHOTS_TOTAL, m::LABEL_OUTCOME => decision.as_str()).increment(1);
}

/// Records the time to the first action token of a step, seconds.
pub fn record_first_token(kind: StepKind, seconds: f64) {
    ::metrics::histogram!(m::AGENT_TIME_TO_FIRST_TOKEN_SECONDS, m::LABEL_KIND => kind.as_str()).record(seconds);
}

/// Counts one Generate retry after UNAVAILABLE.
pub fn record_retry() {
    ::metrics::counter!(m::AGENT_WORKER_RETRIES_TOTAL).increment(1);
}

/// Holds [`m::AGENT_STEPS_IN_FLIGHT`] up by one while alive (decrements on drop, also when the
/// step's future is cancelled).
pub struct InFlight(());

impl InFlight {
    /// Increments the gauge.
    pub fn enter() -> Self {
        ::metrics::gauge!(m::AGENT_STEPS_IN_FLIGHT).increment(1.0);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        ::metrics::gauge!(m::AGENT_STEPS_IN_FLIGHT).decrement(1.0);
    }
}

/// Counts one HTTP request answered on `route` (a served path or `"other"`) with `status`.
pub fn record_http_request(route: &'static str, status: u16) {
    ::metrics::counter!(m::GATEWAY_HTTP_REQUESTS_TOTAL, m::LABEL_ROUTE => route, m::LABEL_STATUS => status.to_string())
        .increment(1);
}

/// Holds [`m::GATEWAY_HTTP_REQUESTS_IN_FLIGHT`]`{route}` up by one while alive (decrements on
/// drop: when the response is sent, or a streamed body ends or is dropped).
pub struct HttpInFlight(&'static str);

impl HttpInFlight {
    /// Increments the gauge of `route`.
    pub fn enter(route: &'static str) -> Self {
        ::metrics::gauge!(m::GATEWAY_HTTP_REQUESTS_IN_FLIGHT, m::LABEL_ROUTE => route).increment(1.0);
        HttpInFlight(route)
    }
}

impl Drop for HttpInFlight {
    fn drop(&mut self) {
        ::metrics::gauge!(m::GATEWAY_HTTP_REQUESTS_IN_FLIGHT, m::LABEL_ROUTE => self.0).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `name{labels}` in a text exposition (labels as rendered, in
    /// order), or `None`.
    pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn recorded_step_figures_render_with_their_names() {
        let h = install().unwrap();
        assert!(install().is_ok(), "a second install returns the same handle");
        let before_new = sample(&render(&h), "agent_prompt_tokens_total{kind=\"new\"}").unwrap_or(0.0);
        let result = apb::StepResult {
            stats: Some(apb::StepStats {
                new_tokens: 37,
                reused_tokens: 400,
                kv_bound_tokens: 420,
                decode_tokens: 12,
                step_ms: 250.0,
                decode_ms: 120.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        record_step(StepKind::Step, false, StepOutcome::Ok, &result);
        {
            let _g = InFlight::enter();
            let text = render(&h);
            assert!(sample(&text, "agent_steps_in_flight").unwrap() >= 1.0);
        }
        let text = render(&h);
        assert_eq!(sample(&text, "agent_prompt_tokens_total{kind=\"new\"}").unwrap() - before_new, 37.0);
        assert!(text.contains("agent_step_duration_seconds_bucket{kind=\"step\",has_image=\"false\",le=\"0.35\"}"), "{text}");
        assert!(sample(&text, "agent_steps_total{kind=\"step\",outcome=\"ok\"}").unwrap() >= 1.0);
        assert!(text.contains("# TYPE agent_step_duration_seconds histogram"));
        assert!(text.contains("# HELP agent_steps_total Finished steps by outcome."), "{text}");
    }
}
