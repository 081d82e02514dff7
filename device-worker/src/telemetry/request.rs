//! [`RequestObserver`]: follows one Generate request through the events the engine streams
//! (`Prefill`, `Token`s, `Done` or `Failed`) and records its metrics and spans. It lives in
//! the Generate handler's stream ([`crate::service`]), so every request the worker admitted is
//! seen, whether it finishes, fails, or is cancelled by its client.
//!
//! Spans (children of the caller's span when the request carried a W3C `traceparent`, see
//! [`super::otel::extract`]): `request` → `prefill` (submission to the prefill event: queue
//! wait, wake-up or cold start included) → `decode` (to the final event). Checkpoint saves,
//! restores and evictions are events on the `request` span.

use std::time::Instant;

use tandem_telemetry::metric_names as m;
use tandem_proto::step::v1 as pb;

/// How a request ended: the `outcome` label of [`m::WORKER_REQUESTS_TOTAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Final stats sent.
    Ok,
    /// The engine failed the request.
    Error,
    /// The client went away (or the stream was dropped) first.
    Cancelled,
}

impl Outcome {
    /// Every outcome, for zero-initialising the series.
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Error, Outcome::Cancelled];

    /// The label value: `"ok"`, `"error"`, `"cancelled"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Observes one admitted request; holds [`m::WORKER_REQUESTS_IN_FLIGHT`] up by one until
/// dropped, and counts it as cancelled when dropped before a final or failed event.
pub struct RequestObserver {
    submitted: Instant,
    /// `PrefillStats.queue_ms`, once the prefill event came.
    queue_ms: Option<f64>,
    first_token_seen: bool,
    outcome: Option<Outcome>,
    request: tracing::Span,
    /// The open `prefill` or `decode` span.
    phase: Option<tracing::Span>,
}

impl RequestObserver {
    /// Starts observing at submission, under the `request` span `span` (which it keeps open
    /// until dropped); opens its `prefill` child.
    pub fn new(span: tracing::Span) -> Self {
        ::metrics::gauge!(m::WORKER_REQUESTS_IN_FLIGHT).increment(1.0);
        let phase = Some(tracing::info_span!(parent: &span, "prefill"));
        Self {
            submitted: Instant::now(),
            queue_ms: None,
            first_token_seen: false,
            outcome: None,
            request: span,
            phase,
        }
    }

    /// The request's span.
    pub fn span(&self) -> &tracing::Span {
        &self.request
    }

    /// Prefill finished: records the queue wait, closes `prefill`, opens `decode`.
    pub fn on_prefill(&mut self, p: &pb::PrefillStats) {
        self.queue_ms = Some(p.queue_ms);
        ::metrics::histogram!(m::WORKER_QUEUE_WAIT_SECONDS).record(p.queue_ms / 1e3);
        if p.image_tokens > 0 {
            ::metrics::counter!(m::WORKER_IMAGE_TOKENS_TOTAL).increment(u64::from(p.image_tokens));
            ::metrics::counter!(m::WORKER_IMAGES_TOTAL, m::LABEL_OUTCOME => "encoded").increment(u64::from(p.images_encoded));
            ::metrics::counter!(m::WORKER_IMAGES_TOTAL, m::LABEL_OUTCOME => "cache_hit").increment(u64::from(p.image_cache_hits));
        }
        // One sample per request that encoded (a request served from the image cache or the
        // reused prefix encodes nothing and records nothing).
        if p.images_encoded > 0 {
            ::metrics::histogram!(m::WORKER_ENCODER_DURATION_SECONDS).record(p.encoder_ms / 1e3);
        }
        if let Some(s) = &self.phase {
            s.record("prompt_tokens", p.prompt_tokens);
        }
        tracing::debug!(parent: &self.request, queue_ms = p.queue_ms, prefill_ms = p.prefill_ms, new = p.new_tokens, reused = p.reused_tokens, "prefill done");
        // Close `prefill` before `decode` opens (an assignment would create the new span first).
        self.phase = None;
        self.phase = Some(tracing::info_span!(parent: &self.request, "decode"));
    }

    /// An output token was sent: the first one records the time to first token, measured from
    /// dequeue (submission + queue wait) to now.
    pub fn on_token(&mut self) {
        if self.first_token_seen {
            return;
        }
        self.first_token_seen = true;
        if let Some(q) = self.queue_ms {
            let s = (self.submitted.elapsed().as_secs_f64() - q / 1e3).max(0.0);
            ::metrics::histogram!(m::WORKER_TIME_TO_FIRST_TOKEN_SECONDS).record(s);
        }
    }

    /// The final event: records the request's figures ([`record_final`]) and closes `decode`.
    pub fn on_done(&mut self, d: &pb::FinalStats) {
        self.phase = None;
        record_final(d);
        if d.checkpoints_restored > 0 {
            tracing::info!(parent: &self.request, restored = d.checkpoints_restored, "checkpoint restore");
        }
        if d.checkpoints_saved > 0 || d.checkpoints_evicted > 0 {
            tracing::info!(parent: &self.request, saved = d.checkpoints_saved, evicted = d.checkpoints_evicted, bytes_held = d.checkpoint_bytes_held, "checkpoints");
        }
        self.outcome = Some(Outcome::Ok);
    }

    /// The engine failed the request.
    pub fn on_failed(&mut self, error: &dyn std::fmt::Display) {
        self.phase = None;
        tracing::warn!(parent: &self.request, error = %error, "request failed");
        self.outcome = Some(Outcome::Error);
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        self.phase = None;
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => outcome.as_str())
            .increment(1);
        ::metrics::gauge!(m::WORKER_REQUESTS_IN_FLIGHT).decrement(1.0);
    }
}

/// The longest error text a refusal's log line carries, in characters.
pub const REFUSAL_LOG_CHARS: usize = 300;

/// A request refused before it was admitted (bad input, a full queue, a loading model):
/// counts it in [`m::WORKER_REQUESTS_TOTAL`] with outcome `"refused"` and `reason` (a gRPC
/// code in snake case, one of four), and logs one WARN line with the reason and the error's
/// first [`REFUSAL_LOG_CHARS`] characters.
pub fn record_refusal(reason: &'static str, error: &dyn std::fmt::Display) {
    count_refusal(reason);
    let text = error.to_string();
    let shown = match text.char_indices().nth(REFUSAL_LOG_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text,
    };
    tracing::warn!(reason, error = %shown.escape_debug(), "request refused");
}

/// The reason label of a call refused by the bearer-token layer (see [`record_unauthenticated`]).
pub const UNAUTHENTICATED_REASON: &str = "unauthenticated";

/// A call the bearer-token layer refused (no token, a malformed header or a wrong token):
/// counts it in [`m::WORKER_REQUESTS_TOTAL`] with outcome `"refused"` and reason
/// [`UNAUTHENTICATED_REASON`]. The layer itself logs the WARN line.
pub fn record_unauthenticated() {
    count_refusal(UNAUTHENTICATED_REASON);
}

/// One refused request in [`m::WORKER_REQUESTS_TOTAL`] (outcome `"refused"`, `reason`).
fn count_refusal(reason: &'static str) {
    ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => "refused", m::LABEL_REASON => reason).increment(1);
}

/// Records a finished request's figures from its [`pb::FinalStats`]: duration (`server_ms`),
/// prefill and decode seconds, prompt tokens new/reused, KV bound, output tokens, wake-up
/// latency (when it paid one, `wake_ms > 0`), checkpoint events and bytes held, decode
/// passes and drafts proposed / accepted per drafter. ms → s.
pub fn record_final(d: &pb::FinalStats) {
    ::metrics::histogram!(m::WORKER_REQUEST_DURATION_SECONDS).record(d.server_ms / 1e3);
    ::metrics::histogram!(m::WORKER_PREFILL_DURATION_SECONDS).record(d.prefill_ms / 1e3);
    ::metrics::histogram!(m::WORKER_DECODE_DURATION_SECONDS).record(d.decode_ms / 1e3);
    ::metrics::counter!(m::WORKER_PREFILL_TOKENS_TOTAL, m::LABEL_KIND => "new")
        .increment(u64::from(d.new_tokens));
    ::metrics::counter!(m::WORKER_PREFILL_TOKENS_TOTAL, m::LABEL_KIND => "reused")
        .increment(u64::from(d.reused_tokens));
    ::metrics::counter!(m::WORKER_KV_BOUND_TOKENS_TOTAL).increment(u64::from(d.kv_bound_tokens));
    ::metrics::counter!(m::WORKER_DECODE_TOKENS_TOTAL).increment(u64::from(d.decode_tokens));
    ::metrics::counter!(m::WORKER_DECODE_PASSES_TOTAL).increment(u64::from(d.decode_passes));
    for ds in &d.drafts {
        for (outcome, n) in [("proposed", ds.proposed), ("accepted", ds.accepted)] {
            ::metrics::counter!(m::WORKER_DRAFT_TOKENS_TOTAL, m::LABEL_DRAFTER => ds.drafter.clone(), m::LABEL_OUTCOME => outcome)
                .increment(u64::from(n));
        }
    }
    if d.wake_ms > 0.0 {
        ::metrics::histogram!(m::WORKER_WAKEUP_DURATION_SECONDS).record(d.wake_ms / 1e3);
    }
    for (event, n) in [
        ("save", d.checkpoints_saved),
        ("restore", d.checkpoints_restored),
        ("evict", d.checkpoints_evicted),
    ] {
        ::metrics::counter!(m::WORKER_CHECKPOINT_EVENTS_TOTAL, m::LABEL_EVENT => event)
            .increment(u64::from(n));
    }
    ::metrics::gauge!(m::WORKER_CHECKPOINT_BYTES_HELD).set(d.checkpoint_bytes_held as f64);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

    /// Runs `f` with a fresh local recorder (the shared buckets) and returns its rendering.
    pub(crate) fn with_recorder(f: impl FnOnce()) -> String {
        let mut b = PrometheusBuilder::new();
        for (name, buckets) in m::HISTOGRAMS {
            b = b
                .set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)
                .unwrap();
        }
        let recorder = b.build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, f);
        handle.run_upkeep();
        handle.render()
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| {
            l.strip_prefix(series)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
    }

    /// Every `(series, value)` of `want` is a sample of `text` with that value.
    fn assert_samples(text: &str, want: &[(&str, f64)]) {
        for &(series, value) in want {
            assert_eq!(sample(text, series), Some(value), "{series}\n{text}");
        }
    }

    #[test]
    fn a_finished_request_records_its_final_stats() {
        let done = pb::FinalStats {
            new_tokens: 30,
            reused_tokens: 500,
            kv_bound_tokens: 510,
            decode_tokens: 12,
            server_ms: 700.0,
            prefill_ms: 400.0,
            decode_ms: 300.0,
            wake_ms: 3.0,
            checkpoints_saved: 2,
            checkpoints_restored: 1,
            checkpoints_evicted: 1,
            checkpoint_bytes_held: 4096,
            decode_passes: 7,
            drafts: vec![pb::DraftStats {
                drafter: "prompt-lookup".into(),
                proposed: 9,
                accepted: 5,
                rounds: 3,
            }],
            ..Default::default()
        };
        let text = with_recorder(|| {
            let mut obs = RequestObserver::new(tracing::Span::none());
            obs.on_prefill(&pb::PrefillStats {
                queue_ms: 20.0,
                ..Default::default()
            });
            obs.on_token();
            obs.on_token();
            obs.on_done(&done);
            drop(obs);
        });
        assert_samples(&text, &[
            ("worker_prefill_tokens_total{kind=\"new\"}", 30.0),
            ("worker_prefill_tokens_total{kind=\"reused\"}", 500.0),
            ("worker_kv_bound_tokens_total", 510.0),
            ("worker_decode_tokens_total", 12.0),
            ("worker_request_duration_seconds_sum", 0.7),
            ("worker_request_duration_seconds_bucket{le=\"0.75\"}", 1.0),
            ("worker_request_duration_seconds_bucket{le=\"0.5\"}", 0.0),
            ("worker_queue_wait_seconds_sum", 0.02),
            ("worker_time_to_first_token_seconds_count", 1.0),
            ("worker_wakeup_duration_seconds_sum", 0.003),
            ("worker_checkpoint_events_total{event=\"save\"}", 2.0),
            ("worker_checkpoint_events_total{event=\"restore\"}", 1.0),
            ("worker_checkpoint_bytes_held", 4096.0),
            ("worker_decode_passes_total", 7.0),
            ("worker_draft_tokens_total{drafter=\"prompt-lookup\",outcome=\"proposed\"}", 9.0),
            ("worker_draft_tokens_total{drafter=\"prompt-lookup\",outcome=\"accepted\"}", 5.0),
            ("worker_requests_total{outcome=\"ok\"}", 1.0),
            ("worker_requests_in_flight", 0.0),
        ]);
    }

    #[test]
    fn a_prompt_with_images_records_image_tokens_encodings_and_cache_hits() {
        let text = with_recorder(|| {
            let mut obs = RequestObserver::new(tracing::Span::none());
            obs.on_prefill(&pb::PrefillStats {
                image_tokens: 460,
                images_encoded: 1,
                image_cache_hits: 1,
                encoder_ms: 250.0,
                ..Default::default()
            });
            obs.on_prefill(&pb::PrefillStats { image_tokens: 230, image_cache_hits: 1, ..Default::default() });
        });
        assert_samples(&text, &[
            ("worker_image_tokens_total", 690.0),
            ("worker_images_total{outcome=\"encoded\"}", 1.0),
            ("worker_images_total{outcome=\"cache_hit\"}", 2.0),
            ("worker_encoder_duration_seconds_sum", 0.25),
            // The cache-hit-only request records no encoder time.
            ("worker_encoder_duration_seconds_count", 1.0),
        ]);
    }

    #[test]
    fn a_refusal_is_counted_with_its_reason() {
        let text = with_recorder(|| {
            record_refusal("invalid_argument", &"top_p: expected a number in [0, 1]");
            record_refusal("invalid_argument", &"x".repeat(100_000));
            record_refusal("resource_exhausted", &"the request queue is full");
        });
        assert_samples(&text, &[
            ("worker_requests_total{outcome=\"refused\",reason=\"invalid_argument\"}", 2.0),
            ("worker_requests_total{outcome=\"refused\",reason=\"resource_exhausted\"}", 1.0),
        ]);
    }

    #[test]
    fn dropped_before_the_end_counts_as_cancelled_and_failed_as_error() {
        let text = with_recorder(|| {
            drop(RequestObserver::new(tracing::Span::none()));
            let mut failed = RequestObserver::new(tracing::Span::none());
            failed.on_failed(&"boom");
            let _cancelled = RequestObserver::new(tracing::Span::none());
            drop(failed);
        });
        assert_eq!(
            sample(&text, "worker_requests_total{outcome=\"cancelled\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "worker_requests_total{outcome=\"error\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(sample(&text, "worker_requests_in_flight"), Some(0.0));
        assert!(
            !text.contains("worker_request_duration_seconds"),
            "no final stats, no duration"
        );
    }
}
