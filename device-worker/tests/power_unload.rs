//! After `unload_after_idle` the model, slots and pool are dropped; the next request reloads
//! them (a cold start reported in FinalStats and Status) and gives the same output.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use device_worker::engine::EngineHandle;
use device_worker::power::{BootClock, PowerState, RecordingBackend, Votes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_worker_unloads_and_the_next_request_is_a_cold_start() {
    let model = model_path();
    let mut cfg = config(model);
    cfg.idle_release_ms = 50;
    cfg.unload_after_idle_s = 1;
    let rec = RecordingBackend::new(Arc::new(BootClock));
    let engine = EngineHandle::spawn_with_backend(cfg.settings().expect("valid options"), Box::new(rec.clone())).unwrap();
    let handle = engine.clone();
    let mut w = start_worker_with(engine).await;
    let req = || chat("u", "You are a phone agent.", "Open the calendar.", 8);

    let first = generate(&mut w.client, req()).await.expect("first request");
    assert!(!first.done.as_ref().unwrap().cold_start);
    let t0 = Instant::now();
    // The idle controller's state turns Unloaded just before the engine thread drops the
    // model and republishes its status: wait for both.
    while handle.idle().state() != PowerState::Unloaded || !handle.status().slots.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never unloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Released first, then unloaded no earlier than the unload time.
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "unloaded too early: {:?}",
        t0.elapsed()
    );
    let p = handle.status().power.unwrap();
    assert_eq!(
        (p.state.as_str(), p.unloads, p.cold_starts),
        ("unloaded", 1, 0)
    );
    assert_eq!(rec.current(), Some(Votes::RELEASED));

    let second = generate(&mut w.client, req()).await.expect("cold request");
    let d = second.done.clone().unwrap();
    assert!(d.cold_start);
    assert_eq!(d.reused_tokens, 0, "slots are new after a reload");
    let ids = |c: &Collected| c.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&second), ids(&first));
    let p = handle.status().power.unwrap();
    assert_eq!(p.cold_starts, 1);
    assert_eq!(handle.status().slots.len(), 2);
}
