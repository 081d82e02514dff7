//! The thread pool: every task runs exactly once, nested and concurrent runs, panics reach the
//! caller without deadlock, parking.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dsp::ThreadPool;

fn counts(n: usize) -> Vec<AtomicUsize> {
    (0..n).map(|_| AtomicUsize::new(0)).collect()
}

#[test]
fn run_covers_every_task_exactly_once() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::new(threads).expect("pool");
        assert_eq!(pool.n_threads(), threads);
        for n in [0usize, 1, 2, 3, 7, 64, 1000] {
            for _ in 0..20 {
                let c = counts(n);
                pool.run(n, &|i| {
                    c[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    c.iter().all(|x| x.load(Ordering::Relaxed) == 1),
                    "threads {threads} n {n}"
                );
            }
        }
    }
}

#[test]
fn workers_really_take_part() {
    let pool = ThreadPool::new(3).expect("pool");
    let ids = std::sync::Mutex::new(std::collections::HashSet::new());
    for _ in 0..50 {
        pool.run(64, &|_| {
            std::thread::sleep(Duration::from_micros(200));
            ids.lock()
                .expect("lock")
                .insert(std::thread::current().id());
        });
    }
    assert!(ids.lock().expect("lock").len() > 1);
}

#[test]
fn nested_run_completes_inline() {
    let pool = ThreadPool::new(2).expect("pool");
    let c = counts(8 * 8);
    pool.run(8, &|i| {
        pool.run(8, &|j| {
            c[i * 8 + j].fetch_add(1, Ordering::Relaxed);
        });
    });
    assert!(c.iter().all(|x| x.load(Ordering::Relaxed) == 1));
}

#[test]
fn concurrent_runs_from_several_threads_are_serialised_correctly() {
    let pool = Arc::new(ThreadPool::new(2).expect("pool"));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                for n in 1..60 {
                    let c = counts(n);
                    pool.run(n, &|i| {
                        c[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(c.iter().all(|x| x.load(Ordering::Relaxed) == 1));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("runner thread");
    }
}

#[test]
fn a_panicking_task_propagates_and_the_pool_survives() {
    let pool = ThreadPool::new(2).expect("pool");
    let done = AtomicUsize::new(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(16, &|i| {
            if i == 5 {
                panic!("task 5 fails");
            }
            done.fetch_add(1, Ordering::Relaxed);
        });
    }));
    let payload = r.expect_err("panic must reach the caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"task 5 fails"));
    assert_eq!(
        done.load(Ordering::Relaxed),
        15,
        "the other tasks still ran"
    );
    let c = counts(10);
    pool.run(10, &|i| {
        c[i].fetch_add(1, Ordering::Relaxed);
    });
    assert!(c.iter().all(|x| x.load(Ordering::Relaxed) == 1));
}

#[test]
fn park_and_unpark_keep_run_working() {
    let pool = ThreadPool::new(3).expect("pool");
    pool.park();
    assert!(pool.is_parked());
    // Give workers time to fall asleep, then run: run must wake them.
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..10 {
        let c = counts(33);
        pool.run(33, &|i| {
            c[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(c.iter().all(|x| x.load(Ordering::Relaxed) == 1));
        std::thread::sleep(Duration::from_millis(1));
    }
    pool.unpark();
    assert!(!pool.is_parked());
    let c = counts(33);
    pool.run(33, &|i| {
        c[i].fetch_add(1, Ordering::Relaxed);
    });
    assert!(c.iter().all(|x| x.load(Ordering::Relaxed) == 1));
}
