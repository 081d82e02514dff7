//! Parked pool workers use no CPU. In its own test binary: other tests' pools in the same
//! process would be counted (their threads carry the same name).

use std::time::Duration;

use dsp::pool::ThreadPool;

/// Parked workers block instead of spinning: the process's CPU time stays flat while idle.
#[cfg(target_os = "linux")]
#[test]
fn parked_workers_do_not_burn_cpu() {
    fn thread_cpu_ticks(name_prefix: &str) -> u64 {
        let mut total = 0;
        for entry in std::fs::read_dir("/proc/self/task")
            .expect("proc")
            .flatten()
        {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if !comm.starts_with(name_prefix) {
                continue;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // Fields after the ")" : state is field 3; utime, stime are fields 14 and 15.
            let rest = stat.rsplit(')').next().unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            total += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            total += f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        total
    }
    let pool = ThreadPool::new(3).expect("pool");
    pool.run(8, &|_| {});
    pool.park();
    std::thread::sleep(Duration::from_millis(20));
    let before = thread_cpu_ticks("dsp-worker");
    std::thread::sleep(Duration::from_millis(300));
    let after = thread_cpu_ticks("dsp-worker");
    // Clock ticks are 10 ms; spinning workers would accumulate ~60 ticks in 300 ms.
    assert!(
        after - before <= 2,
        "parked workers used {} ticks",
        after - before
    );
}
