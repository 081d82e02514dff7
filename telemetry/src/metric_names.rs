//! Prometheus metric names and histogram buckets shared by the gateway and the worker: the one
//! definition both binaries, the Grafana dashboards (`observability/dashboards/`) and the
//! recording rules (`observability/prometheus/rules.yml`) use.
//!
//! Names follow the Prometheus conventions (<https://prometheus.io/docs/practices/naming/>):
//! `<app>_<what>_<unit>`, base units (seconds, joules, watts), counters end in `_total`.
//! `agent_*` are recorded by agent-gateway per step, `gateway_http_*` by its HTTP endpoint per
//! request, `worker_*` by device-worker per request.

// === agent-gateway ===

/// Histogram, seconds: one agent step, observation received to validated action (or
/// error). Labels: [`LABEL_KIND`] (`"episode"`: a `RunEpisode` stream, `"step"`: unary
/// `Step`), [`LABEL_HAS_IMAGE`] (`"true"`/`"false"`: the step's screenshot was sent to the
/// model, `serve --screenshots`; an observation's screenshot that was not sent is `"false"`).
pub const AGENT_STEP_DURATION_SECONDS: &str = "agent_step_duration_seconds";
/// Histogram, seconds: step start to the first action token forwarded to the controller.
/// Labels: [`LABEL_KIND`].
pub const AGENT_TIME_TO_FIRST_TOKEN_SECONDS: &str = "agent_time_to_first_token_seconds";
/// Counter: finished steps. Labels: [`LABEL_KIND`], [`LABEL_OUTCOME`] (`"ok"`,
/// `"invalid_action"`, `"worker_error"`, `"observation_error"`).
pub const AGENT_STEPS_TOTAL: &str = "agent_steps_total";
/// Gauge: steps running now (RAII guard in the gateway).
pub const AGENT_STEPS_IN_FLIGHT: &str = "agent_steps_in_flight";
/// Counter, tokens: prompt tokens of each step as the worker reported them. Label
/// [`LABEL_KIND`]: `"new"` (prefilled) or `"reused"` (taken from the slot's KV cache).
pub const AGENT_PROMPT_TOKENS_TOTAL: &str = "agent_prompt_tokens_total";
/// Counter, tokens: the KV-cache bound of each step (prompt tokens an ideal LCP cache
/// reuses, `FinalStats.kv_bound_tokens`).
pub const AGENT_KV_BOUND_TOKENS_TOTAL: &str = "agent_kv_bound_tokens_total";
/// Counter, tokens: output (decode) tokens of each step.
pub const AGENT_DECODE_TOKENS_TOTAL: &str = "agent_decode_tokens_total";
/// Histogram, seconds: worker prefill time of each step (`FinalStats.prefill_ms`).
pub const AGENT_PREFILL_DURATION_SECONDS: &str = "agent_prefill_duration_seconds";
/// Histogram, seconds: worker decode time of each step (`FinalStats.decode_ms`); the rate of
/// its `_sum` over the rate of [`AGENT_DECODE_TOKENS_TOTAL`] is seconds per output token.
pub const AGENT_DECODE_DURATION_SECONDS: &str = "agent_decode_duration_seconds";
/// Counter: observations by what became of their screenshot (`serve --screenshots`). Label
/// [`LABEL_OUTCOME`]: `"sent"` (attached to the prompt), `"none"` (the observation had none),
/// `"off"` (`never`), `"dense"` (`auto`, the tree lists enough controls), `"no_vision"`
/// (`auto`, the worker has no vision projector or did not say), `"refused"` (`always`, the
/// worker has no vision projector: the step failed).
pub const AGENT_SCREENSHOTS_TOTAL: &str = "agent_screenshots_total";
/// Counter, tokens: image tokens in the steps' prompts (`PrefillStats.image_tokens`).
pub const AGENT_IMAGE_TOKENS_TOTAL: &str = "agent_image_tokens_total";
/// Counter: images of the steps' prompts past the reused prefix. Label [`LABEL_OUTCOME`]:
/// `"encoded"` (the worker's projector ran) or `"cache_hit"` (embeddings from its image
/// cache).
pub const AGENT_IMAGES_TOTAL: &str = "agent_images_total";
/// Histogram, seconds: the worker's image preprocessing and encoding time of each step that
/// encoded an image (`PrefillStats.encoder_ms`; steps whose images all came from the image
/// cache record none).
pub const AGENT_ENCODER_DURATION_SECONDS: &str = "agent_encoder_duration_seconds";
/// Counter: Generate calls retried after the worker answered UNAVAILABLE.
pub const AGENT_WORKER_RETRIES_TOTAL: &str = "agent_worker_retries_total";
/// Counter: requests the gateway's HTTP endpoint answered. Labels: [`LABEL_ROUTE`] (a served
/// path such as `"/v1/chat/completions"`, or `"other"`), [`LABEL_STATUS`] (the status code,
/// `"200"`, `"413"`, ...; a streamed answer counts its head's status).
pub const GATEWAY_HTTP_REQUESTS_TOTAL: &str = "gateway_http_requests_total";
/// Gauge: HTTP requests being handled now, a streamed answer until its body ends (RAII
/// guard in the gateway). Label: [`LABEL_ROUTE`].
pub const GATEWAY_HTTP_REQUESTS_IN_FLIGHT: &str = "gateway_http_requests_in_flight";

// === device-worker ===

/// Histogram, seconds: one Generate request, dequeue to last token (`server_ms`).
pub const WORKER_REQUEST_DURATION_SECONDS: &str = "worker_request_duration_seconds";
/// Histogram, seconds: time a request waited in the queue before its first batch.
pub const WORKER_QUEUE_WAIT_SECONDS: &str = "worker_queue_wait_seconds";
/// Histogram, seconds: dequeue to the first output token (prefill included).
pub const WORKER_TIME_TO_FIRST_TOKEN_SECONDS: &str = "worker_time_to_first_token_seconds";
/// Gauge: requests admitted and not finished.
pub const WORKER_REQUESTS_IN_FLIGHT: &str = "worker_requests_in_flight";
/// Counter: requests by how they ended. Label [`LABEL_OUTCOME`]: `"ok"`, `"error"` (the engine
/// failed it), `"cancelled"` (the client left), or `"refused"` (never admitted: bad input, a
/// full queue, loading, or no valid bearer token), which also carries [`LABEL_REASON`] (a gRPC
/// code in snake case: `invalid_argument`, `resource_exhausted`, `unavailable`, `internal`,
/// `unauthenticated`).
pub const WORKER_REQUESTS_TOTAL: &str = "worker_requests_total";
/// Counter, tokens: prompt tokens. Label [`LABEL_KIND`]: `"new"` or `"reused"`.
pub const WORKER_PREFILL_TOKENS_TOTAL: &str = "worker_prefill_tokens_total";
/// Counter, tokens: the LCP bound of the KV cache per request.
pub const WORKER_KV_BOUND_TOKENS_TOTAL: &str = "worker_kv_bound_tokens_total";
/// Counter, tokens: image tokens in prompts (issue 19).
pub const WORKER_IMAGE_TOKENS_TOTAL: &str = "worker_image_tokens_total";
/// Counter: prompt images past the reused prefix. Label [`LABEL_OUTCOME`]: `"encoded"` (the
/// projector ran) or `"cache_hit"` (embeddings from the image cache).
pub const WORKER_IMAGES_TOTAL: &str = "worker_images_total";
/// Histogram, seconds: patching and encoding the images a request encoded (one sample per
/// request that encoded at least one image; image-cache hits record nothing).
pub const WORKER_ENCODER_DURATION_SECONDS: &str = "worker_encoder_duration_seconds";
/// Counter, tokens: output tokens.
pub const WORKER_DECODE_TOKENS_TOTAL: &str = "worker_decode_tokens_total";
/// Histogram, seconds: prefill time per request.
pub const WORKER_PREFILL_DURATION_SECONDS: &str = "worker_prefill_duration_seconds";
/// Histogram, seconds: decode time per request.
pub const WORKER_DECODE_DURATION_SECONDS: &str = "worker_decode_duration_seconds";
/// Counter, tokens: speculative drafts. Labels [`LABEL_DRAFTER`] (`"prompt-lookup"`,
/// `"experience"`), [`LABEL_OUTCOME`] (`"proposed"`, `"accepted"`).
pub const WORKER_DRAFT_TOKENS_TOTAL: &str = "worker_draft_tokens_total";
/// Counter: target-model passes of the decode phase (plain steps and verification
/// passes); passes per output token = this / `worker_decode_tokens_total`.
pub const WORKER_DECODE_PASSES_TOTAL: &str = "worker_decode_passes_total";
/// Counter: recurrent-state checkpoint events. Label [`LABEL_EVENT`] (`"save"`,
/// `"restore"`, `"evict"`).
pub const WORKER_CHECKPOINT_EVENTS_TOTAL: &str = "worker_checkpoint_events_total";
/// Gauge, bytes: saved recurrent-state checkpoints (slot and prompt cache) held after the
/// latest request (`FinalStats.checkpoint_bytes_held`).
pub const WORKER_CHECKPOINT_BYTES_HELD: &str = "worker_checkpoint_bytes_held";
/// Counter: live sessions (episodes) that lost their slot to a new session because every slot
/// was bound (the least recently used one is taken; its content moves to the prompt cache).
pub const WORKER_SLOT_EVICTIONS_TOTAL: &str = "worker_slot_evictions_total";
/// Gauge, 0/1 per state: 1 for the current power state. Label [`LABEL_STATE`]
/// (`"active"`, `"released"`, `"unloaded"`, `"loading"`).
pub const WORKER_POWER_STATE: &str = "worker_power_state";
/// Histogram, seconds: wake-up latency a request paid after the power votes were released.
pub const WORKER_WAKEUP_DURATION_SECONDS: &str = "worker_wakeup_duration_seconds";
/// Counter: model reloads after an idle unload.
pub const WORKER_COLD_STARTS_TOTAL: &str = "worker_cold_starts_total";
/// Counter: power-vote releases (each active → released transition,
/// `PowerFigures.release_cycles`).
pub const WORKER_RELEASE_CYCLES_TOTAL: &str = "worker_release_cycles_total";
/// Counter: engines the watchdog restarted after a hung batch.
pub const WORKER_WATCHDOG_RESTARTS_TOTAL: &str = "worker_watchdog_restarts_total";
/// Counter, joules: energy the power source measured since the worker started (present only
/// when [`WORKER_ENERGY_AVAILABLE`] is 1). Label [`LABEL_SOURCE`].
pub const WORKER_ENERGY_JOULES_TOTAL: &str = "worker_energy_joules_total";
/// Histogram, joules: energy of one request above the idle power over its duration.
pub const WORKER_STEP_ENERGY_JOULES: &str = "worker_step_energy_joules";
/// Gauge, watts: power measured while no request ran.
pub const WORKER_IDLE_POWER_WATTS: &str = "worker_idle_power_watts";
/// Gauge, 0/1: whether an energy source exists. Label [`LABEL_SOURCE`] (`"rapl"`,
/// `"fuel_gauge"`, or `"unavailable"` with value 0). Never an invented number.
pub const WORKER_ENERGY_AVAILABLE: &str = "worker_energy_available";

// === labels ===

/// Label: the step's API (`agent_*`) or the token kind (`*_tokens_total`).
pub const LABEL_KIND: &str = "kind";
/// Label: `"true"`/`"false"` (an image was sent to the model).
pub const LABEL_HAS_IMAGE: &str = "has_image";
/// Label: how something ended.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: why a request was refused, its gRPC code in snake case (`"invalid_argument"`,
/// `"resource_exhausted"`, `"unavailable"`, `"internal"`: four values).
pub const LABEL_REASON: &str = "reason";
/// Label: the drafter of speculative tokens.
pub const LABEL_DRAFTER: &str = "drafter";
/// Label: a checkpoint event.
pub const LABEL_EVENT: &str = "event";
/// Label: a power state.
pub const LABEL_STATE: &str = "state";
/// Label: an energy source.
pub const LABEL_SOURCE: &str = "source";
/// Label: an HTTP route (the served path, or `"other"`).
pub const LABEL_ROUTE: &str = "route";
/// Label: an HTTP status code.
pub const LABEL_STATUS: &str = "status";

// === buckets ===

/// Upper bounds, seconds, for step and request latencies: 10 ms to 60 s, about ×1.5–2 apart
/// (a decode token is ~10–70 ms, a text step 0.3–2 s, a cold start up to a minute).
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
    20.0, 30.0, 45.0, 60.0,
];
/// Upper bounds, joules, for the energy of one step (a phone text step is ~5–20 J).
pub const ENERGY_BUCKETS_JOULES: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0,
];

/// Every histogram name with its bucket bounds, for installing a recorder.
pub const HISTOGRAMS: &[(&str, &[f64])] = &[
    (AGENT_STEP_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (AGENT_TIME_TO_FIRST_TOKEN_SECONDS, LATENCY_BUCKETS_SECONDS),
    (AGENT_PREFILL_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (AGENT_DECODE_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (AGENT_ENCODER_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_REQUEST_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_QUEUE_WAIT_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_TIME_TO_FIRST_TOKEN_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_PREFILL_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_DECODE_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_WAKEUP_DURATION_SECONDS, LATENCY_BUCKETS_SECONDS),
    (WORKER_STEP_ENERGY_JOULES, ENERGY_BUCKETS_JOULES),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_increase_and_span_10ms_to_60s() {
        for (name, b) in HISTOGRAMS {
            assert!(
                b.windows(2).all(|w| w[0] < w[1]),
                "{name}: bounds must increase"
            );
        }
        assert_eq!(LATENCY_BUCKETS_SECONDS.first(), Some(&0.01));
        assert_eq!(LATENCY_BUCKETS_SECONDS.last(), Some(&60.0));
    }

    #[test]
    fn histogram_names_end_in_a_unit_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in HISTOGRAMS {
            assert!(
                name.ends_with("_seconds") || name.ends_with("_joules"),
                "{name}"
            );
            assert!(seen.insert(*name), "{name} listed twice");
        }
    }
}
