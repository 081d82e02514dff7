//! A small parkable thread pool for the kernels: a scoped parallel-for where the calling thread
//! takes part, workers that spin briefly between runs (low decode latency) unless parked, and
//! panics carried back to the caller. No external crates.
//!
//! Protocol: `run` publishes a job (the closure, the task count, a new generation number) under
//! the state lock; workers claim task indices from an atomic counter. A worker registers itself
//! as *inside* the job under the same lock, and the caller, after claiming its last task,
//! withdraws the job under the lock and waits until no worker is inside. So the borrowed
//! closure is never touched after `run` returns, and late workers find no job and go back to
//! waiting.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::DspError;

/// How long an active (unparked) thread spins waiting for the next job or for workers to
/// finish before it blocks.
pub const SPIN: Duration = Duration::from_micros(50);

type Task = dyn Fn(usize) + Sync;

/// The job being run: a borrowed closure whose lifetime the protocol (module docs) enforces.
#[derive(Clone, Copy)]
struct JobRef {
    f: *const Task,
    n_tasks: usize,
}

// SAFETY: the closure is `Sync`, so calling it from other threads through a shared pointer is
// allowed; the pointer is only dereferenced while `run` keeps the borrow alive.
unsafe impl Send for JobRef {}

struct State {
    generation: u64,
    job: Option<JobRef>,
    shutdown: bool,
    /// Workers blocked on `work_cv`.
    sleepers: usize,
    /// The caller is blocked on `done_cv`.
    done_waiter: bool,
}

struct Shared {
    state: Mutex<State>,
    work_cv: Condvar,
    done_cv: Condvar,
    /// Mirror of `State::generation` for lock-free spinning.
    generation: AtomicU64,
    parked: AtomicBool,
    next_task: AtomicUsize,
    /// Workers currently executing the job.
    inside: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set (after `panic` is filled) when a task of the current job panicked, so a run
    /// without a panic skips the `panic` lock.
    panicked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock (tasks run outside it), but be robust anyway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims and runs tasks of `job` until none are left; catches panics.
    fn execute(&self, job: JobRef) {
        IN_POOL_TASK.with(|flag| {
            let outer = flag.replace(true);
            loop {
                let i = self.next_task.fetch_add(1, Ordering::Relaxed);
                if i >= job.n_tasks {
                    break;
                }
                // SAFETY: `job.f` is alive: the caller of `run` waits for every worker that
                // entered the job (and for its own tasks) before returning.
                let f = unsafe { &*job.f };
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                    let mut slot = self.panic.lock().unwrap_or_else(PoisonError::into_inner);
                    slot.get_or_insert(p);
                    self.panicked.store(true, Ordering::Release);
                }
            }
            flag.set(outer);
        });
    }
}

thread_local! {
    /// Set while this thread executes a pool task; nested `run` calls then run inline.
    static IN_POOL_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of worker threads plus the calling thread.
///
/// `run` may be called from several threads (calls are serialised) and from inside a task
/// (the nested call runs its tasks inline on the current thread).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .field("parked", &self.is_parked())
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the caller of `run` plus `n_threads - 1` workers
    /// (`0` is treated as `1`: everything runs on the caller).
    ///
    /// # Errors
    /// `ThreadSpawn` if the OS refuses a thread.
    pub fn new(n_threads: usize) -> Result<Self, DspError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                shutdown: false,
                sleepers: 0,
                done_waiter: false,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            generation: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            next_task: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            panic: Mutex::new(None),
            panicked: AtomicBool::new(false),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            run_lock: Mutex::new(()),
        };
        for index in 1..n_threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("dsp-worker-{index}"))
                .spawn(move || worker_loop(&shared))
                .map_err(|source| DspError::ThreadSpawn { index, source })?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads that execute tasks, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Stop spinning between runs: idle workers block (no busy-waiting, no periodic wake-ups)
    /// until the next `run`, which still works and wakes them. For idle power.
    pub fn park(&self) {
        self.shared.parked.store(true, Ordering::Release);
    }

    /// Allow workers to spin for up to [`SPIN`] between runs again.
    pub fn unpark(&self) {
        self.shared.parked.store(false, Ordering::Release);
    }

    pub fn is_parked(&self) -> bool {
        self.shared.parked.load(Ordering::Acquire)
    }

    /// Calls `f(i)` for every `i in 0..n_tasks`, each exactly once, spread over the pool's
    /// threads including the caller; returns when all calls have returned.
    ///
    /// # Panics
    /// If any task panics, the remaining tasks still run and the first panic is resumed on
    /// the caller once the run is complete (no deadlock, the pool stays usable).
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 || IN_POOL_TASK.with(Cell::get) {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let sh = &*self.shared;
        // SAFETY: only the lifetime is erased; the protocol in the module docs guarantees no
        // thread dereferences the pointer after this function returns.
        let f_static: &'static Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Task>(f) };
        let job = JobRef {
            f: f_static,
            n_tasks,
        };
        {
            let mut st = sh.lock();
            sh.next_task.store(0, Ordering::Relaxed);
            st.job = Some(job);
            st.generation += 1;
            sh.generation.store(st.generation, Ordering::Release);
            if st.sleepers > 0 {
                sh.work_cv.notify_all();
            }
        }
        sh.execute(job);
        sh.lock().job = None;
        // Wait for the workers still inside: spin briefly, then block.
        let start = Instant::now();
        while sh.inside.load(Ordering::Acquire) > 0
            && !sh.parked.load(Ordering::Relaxed)
            && start.elapsed() < SPIN
        {
            std::hint::spin_loop();
        }
        // The job was withdrawn under the lock above, so `inside` can only fall from here on:
        // once it reads 0 (acquire, pairing with the workers' release decrement) every
        // worker is done with the closure, and the lock is needed only to block.
        if sh.inside.load(Ordering::Acquire) > 0 {
            let mut st = sh.lock();
            while sh.inside.load(Ordering::Acquire) > 0 {
                st.done_waiter = true;
                st = sh.done_cv.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            st.done_waiter = false;
        }
        if sh.panicked.load(Ordering::Acquire) {
            let panic = sh
                .panic
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            sh.panicked.store(false, Ordering::Relaxed);
            if let Some(p) = panic {
                resume_unwind(p);
            }
        }
    }
}

fn worker_loop(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        if !sh.parked.load(Ordering::Acquire) {
            let start = Instant::now();
            let mut spins = 0u32;
            while sh.generation.load(Ordering::Acquire) == seen {
                std::hint::spin_loop();
                spins += 1;
                if spins.is_multiple_of(64)
                    && (start.elapsed() >= SPIN || sh.parked.load(Ordering::Relaxed))
                {
                    break;
                }
            }
        }
        let job = {
            let mut st = sh.lock();
            while st.generation == seen && !st.shutdown {
                st.sleepers += 1;
                st = sh.work_cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                st.sleepers -= 1;
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            if st.job.is_some() {
                sh.inside.fetch_add(1, Ordering::AcqRel);
            }
            st.job
        };
        if let Some(job) = job {
            sh.execute(job);
            if sh.inside.fetch_sub(1, Ordering::AcqRel) == 1 {
                let st = sh.lock();
                if st.done_waiter {
                    sh.done_cv.notify_one();
                }
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.work_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            // A worker never panics (tasks are caught), so join errors carry nothing to report.
            let _ = w.join();
        }
    }
}
