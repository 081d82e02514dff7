//! With the real Linux backend and the model loaded, a released worker uses (almost) no CPU:
//! the process's CPU time grows by less than 5 ms over a 5 s idle window. Alone in its test
//! binary (one #[test]) so no other test's threads are counted; the engine runs in-process.

mod common;

use std::time::Duration;

use common::*;
use device_worker::config::PowerBackendKind;
use device_worker::engine::EngineHandle;

/// CPU time of every live thread of this process, from `/proc/self/task/*/schedstat`
/// (field 1: time on CPU, ns).
fn process_cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(target_os = "linux")]
#[test]
fn released_worker_uses_under_20ms_cpu_in_5s() {
    let model = model_path();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut cfg = config(model);
    cfg.idle_release_ms = 200;
    cfg.power_backend = PowerBackendKind::Linux;
    let engine = EngineHandle::spawn(cfg.settings().expect("valid options")).unwrap();
    let idle = engine.idle();
    let status = engine.clone();
    rt.block_on(async move {
        let mut w = start_worker_with(engine).await;
        let out = generate(
            &mut w.client,
            chat("e", "You are a phone agent.", "Open the camera.", 8),
        )
        .await
        .expect("request");
        assert!(out.done.is_some());
        wait_released(&idle, Duration::from_millis(10)).await;
        // Let the gRPC connection and the last events settle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = process_cpu_ns();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let used_ms = (process_cpu_ns() - before) as f64 / 1e6;
        let s = status.status();
        assert!(
            s.model.is_some() && s.slots.len() == 2,
            "model still loaded"
        );
        assert_eq!(s.power.unwrap().state, "released");
        eprintln!("CPU time over 5 s released: {used_ms:.3} ms");
        // The whole test process counts (gRPC client, tokio timers): 5 ms measured 5.9-7.3 ms
        // on a loaded 2-core CI machine; 20 ms in 5 s (0.4 % of a core) still proves no
        // compute thread is spinning (an awake pool burns ~5000 ms).
        assert!(
            used_ms < 20.0,
            "released worker used {used_ms:.3} ms of CPU in 5 s"
        );
        drop(w);
    });
}
