//! 400 release / re-apply cycles between requests over real gRPC (recording backend, 2 ms
//! idle release): every request after a release re-applied the votes before its first
//! batch, and all outputs are bit-identical to the first (votes held) one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use device_worker::config::PowerBackendKind;
use device_worker::engine::EngineHandle;
use device_worker::power::{BootClock, RecordingBackend, Votes};

const CYCLES: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_release_cycles_give_identical_outputs() {
    let model = model_path();
    let mut cfg = config(model);
    cfg.idle_release_ms = 2;
    cfg.power_backend = PowerBackendKind::Recording;
    let rec = RecordingBackend::new(Arc::new(BootClock));
    let engine = EngineHandle::spawn_with_backend(cfg.settings().expect("valid options"), Box::new(rec.clone())).unwrap();
    let idle = engine.idle();
    let mut w = start_worker_with(engine).await;

    let req = |i: usize| {
        // Alternate two sessions so the prefill does real work on both slots.
        chat(
            &format!("s{}", i % 2),
            "You are a phone agent.",
            "Open the clock app and set an alarm for 7.",
            6,
        )
    };
    let reference = generate(&mut w.client, req(0))
        .await
        .expect("first request");
    let ref_ids: Vec<u32> = reference.tokens.iter().map(|t| t.id).collect();
    assert!(!ref_ids.is_empty());
    for i in 1..=CYCLES {
        wait_released(&idle, Duration::from_millis(1)).await;
        assert_eq!(rec.current(), Some(Votes::RELEASED));
        let out = generate(&mut w.client, req(i)).await.expect("request");
        let ids: Vec<u32> = out.tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, ref_ids, "cycle {i}: output differs");
        let done = out.done.expect("final stats");
        assert!(
            done.wake_ms > 0.0,
            "cycle {i}: votes were not re-applied before the first batch"
        );
        assert!(!done.cold_start);
    }
    wait_released(&idle, Duration::from_millis(1)).await;
    let p = w
        .client
        .status(tandem_proto::step::v1::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .power
        .unwrap();
    assert_eq!(p.backend, "recording");
    assert_eq!(p.state, "released");
    let wl = p.wake_latency.unwrap();
    // Every cycle woke the votes, and the first request too if it found them released.
    let first_woke = reference.done.as_ref().is_some_and(|d| d.wake_ms > 0.0);
    let wakes = CYCLES as u64 + u64::from(first_woke);
    assert_eq!(wl.count, wakes);
    assert_eq!(wl.counts.iter().sum::<u64>(), wakes);
    assert_eq!(
        p.release_cycles,
        wakes + 1,
        "one release per wake, plus the last"
    );
    let changes = rec.changes();
    assert!(changes.len() >= 2 * CYCLES + 2);
    for (i, c) in changes.iter().enumerate() {
        let want = if i % 2 == 0 {
            Votes::ACTIVE
        } else {
            Votes::RELEASED
        };
        assert_eq!(c.votes, want, "change {i}");
        if i > 0 {
            assert!(c.at >= changes[i - 1].at);
        }
    }
}
