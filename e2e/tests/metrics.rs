//! `GET /metrics` after a real replay: the gateway's counters, and the worker's on its own
//! `/metrics`, agree with the replay's per-step JSONL (steps, prompt tokens new/reused, KV
//! bound, decode tokens, decode passes, draft tokens per drafter).

mod common;

use agent_gateway::replay;
use common::{http_get, model_path, replay_config, sample, start, start_http, start_worker_metrics};

/// How much `series` grew from the `before` to the `after` scrape of `who`'s `/metrics`. A
/// series missing after is a failure; before, a counter not yet touched is not rendered and
/// counts 0.
fn increase(who: &str, before: &str, after: &str, series: &str) -> f64 {
    let now = sample(after, series)
        .unwrap_or_else(|| panic!("{who} /metrics has no series {series}:\n{after}"));
    now - sample(before, series).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_the_replay_jsonl() {
    let model = model_path();
    let mut servers = start(model).await;
    let http = start_http(&mut servers).await;
    let worker_http = start_worker_metrics(&mut servers).await;
    let (status, before) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    let (status, worker_before) = http_get(&worker_http, "/metrics").await;
    assert_eq!(status, 200);
    // Whether a drafter proposes depends on timing (the policy drafts when verification pays
    // off), so every drafter's series is there at 0 before any request.
    for drafter in ["prompt-lookup", "experience", "mtp", "mtp-trimmed"] {
        for outcome in ["proposed", "accepted"] {
            let series =
                format!("worker_draft_tokens_total{{drafter=\"{drafter}\",outcome=\"{outcome}\"}}");
            assert!(
                sample(&worker_before, &series).is_some(),
                "{series} is zero-initialised:\n{worker_before}"
            );
        }
    }
    let out = tempfile::tempdir().unwrap();
    let cfg = replay_config(&servers.gateway, 3, out.path().join("replay.jsonl"));
    replay::run(&cfg).await.expect("replay");
    // Read the figures back from the JSONL file, as a dashboard user would compare them.
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&cfg.out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    let sum = |field: &str| rows.iter().map(|r| r[field].as_u64().unwrap()).sum::<u64>() as f64;
    let ok_steps = rows
        .iter()
        .filter(|r| r["error"].as_str() == Some(""))
        .count() as f64;

    let (status, text) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    // The counters are process-wide: compare increases over the replay.
    // A series missing after the replay is a failure; before it, a counter not yet touched
    // is not rendered and counts 0.
    let delta = |series: &str| increase("gateway", &before, &text, series);
    assert_eq!(
        delta("agent_steps_total{kind=\"episode\",outcome=\"ok\"}"),
        ok_steps,
        "{text}"
    );
    assert_eq!(
        delta("agent_step_duration_seconds_count{kind=\"episode\",has_image=\"false\"}"),
        3.0,
        "{text}"
    );
    assert_eq!(
        delta("agent_prompt_tokens_total{kind=\"new\"}"),
        sum("new_tokens")
    );
    assert_eq!(
        delta("agent_prompt_tokens_total{kind=\"reused\"}"),
        sum("reused_tokens")
    );
    assert!(sum("reused_tokens") > 0.0, "later steps reuse the prefix");
    assert_eq!(delta("agent_kv_bound_tokens_total"), sum("kv_bound_tokens"));
    assert_eq!(delta("agent_decode_tokens_total"), sum("decode_tokens"));
    assert_eq!(
        sample(&text, "agent_steps_in_flight"),
        Some(0.0),
        "the in-flight gauge returns to 0"
    );
    // Every step streamed at least one token, so each has a time to first token.
    assert_eq!(
        delta("agent_time_to_first_token_seconds_count{kind=\"episode\"}"),
        3.0
    );
    // Step time in the histogram's sum agrees with the JSONL's step_ms (same figure, s vs ms).
    let step_s: f64 = rows
        .iter()
        .map(|r| r["step_ms"].as_f64().unwrap())
        .sum::<f64>()
        / 1e3;
    let hist_s = delta("agent_step_duration_seconds_sum{kind=\"episode\",has_image=\"false\"}");
    assert!(
        (hist_s - step_s).abs() < 1e-6,
        "histogram sum {hist_s} s vs JSONL {step_s} s"
    );
    assert!(text.contains("# TYPE agent_step_duration_seconds histogram"));

    // The worker's own /metrics (same process registry, served like --metrics-listen).
    let (status, wtext) = http_get(&worker_http, "/metrics").await;
    assert_eq!(status, 200);
    let wdelta = |series: &str| increase("worker", &worker_before, &wtext, series);
    // Requests the worker finished carry its server time (a worker error leaves it 0).
    let worker_ok = rows
        .iter()
        .filter(|r| r["server_ms"].as_f64().is_some_and(|t| t > 0.0))
        .count() as f64;
    assert_eq!(
        wdelta("worker_requests_total{outcome=\"ok\"}"),
        worker_ok,
        "{wtext}"
    );
    assert_eq!(
        wdelta("worker_prefill_tokens_total{kind=\"new\"}"),
        sum("new_tokens"),
        "{wtext}"
    );
    assert_eq!(
        wdelta("worker_prefill_tokens_total{kind=\"reused\"}"),
        sum("reused_tokens")
    );
    assert_eq!(
        wdelta("worker_kv_bound_tokens_total"),
        sum("kv_bound_tokens")
    );
    assert_eq!(wdelta("worker_decode_tokens_total"), sum("decode_tokens"));
    assert_eq!(wdelta("worker_request_duration_seconds_count"), worker_ok);
    assert_eq!(
        wdelta("worker_decode_passes_total"),
        sum("decode_passes"),
        "{wtext}"
    );
    // Drafts per drafter and outcome (speculative decoding is on by default).
    let mut drafted = 0.0;
    for drafter in ["prompt-lookup", "experience"] {
        for outcome in ["proposed", "accepted"] {
            let jsonl: f64 = rows
                .iter()
                .flat_map(|r| r["drafts"].as_array().unwrap().iter())
                .filter(|d| d["drafter"] == drafter)
                .map(|d| d[outcome].as_f64().unwrap())
                .sum();
            let series =
                format!("worker_draft_tokens_total{{drafter=\"{drafter}\",outcome=\"{outcome}\"}}");
            assert_eq!(wdelta(&series), jsonl, "{series}\n{wtext}");
            if outcome == "proposed" {
                drafted += jsonl;
            }
        }
    }
    assert!(
        drafted > 0.0,
        "no drafts in 3 steps: the draft counters were not exercised"
    );
    assert_eq!(
        wdelta("worker_time_to_first_token_seconds_count"),
        3.0,
        "every step streamed a token"
    );
    assert_eq!(
        sample(&wtext, "worker_requests_in_flight"),
        Some(0.0),
        "the in-flight gauge returns to 0"
    );
    let prefill_s: f64 = rows
        .iter()
        .map(|r| r["prefill_ms"].as_f64().unwrap())
        .sum::<f64>()
        / 1e3;
    assert!(
        (wdelta("worker_prefill_duration_seconds_sum") - prefill_s).abs() < 1e-6,
        "prefill seconds agree with the JSONL"
    );
    // One power state is current, and this host has no energy source: 0, never a number.
    let states = ["active", "released", "unloaded", "loading"]
        .map(|s| sample(&wtext, &format!("worker_power_state{{state=\"{s}\"}}")).unwrap());
    assert_eq!(states.iter().sum::<f64>(), 1.0, "{wtext}");
    assert!(sample(&wtext, "worker_cold_starts_total").is_some());
    if sample(&wtext, "worker_energy_available{source=\"unavailable\"}").is_some() {
        assert_eq!(
            sample(&wtext, "worker_energy_available{source=\"unavailable\"}"),
            Some(0.0)
        );
        assert!(
            !wtext.contains("worker_step_energy_joules_count"),
            "no energy figure without a source"
        );
    }
    assert!(wtext.contains("# TYPE worker_request_duration_seconds histogram"));
}
