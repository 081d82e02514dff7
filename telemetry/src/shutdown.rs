//! Graceful shutdown for both servers: the first SIGINT (Ctrl-C) or SIGTERM (`kill`, systemd,
//! containers) stops accepting work and lets in-flight streams finish; a second signal, or
//! [`DRAIN_LIMIT`] without the drain completing, exits the process at once (status 130) so a
//! stuck client can never keep a server alive.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// Longest graceful drain after the first signal.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(30);

type Hook = Box<dyn Fn() + Send + Sync>;

/// Run, in order, just before a forced exit ([`before_forced_exit`]).
static FORCED_EXIT_HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Registers `hook` to run just before the forced exit (second signal or [`DRAIN_LIMIT`]),
/// which skips every destructor: the worker restores the host's power settings here.
pub fn before_forced_exit(hook: impl Fn() + Send + Sync + 'static) {
    FORCED_EXIT_HOOKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Box::new(hook));
}

fn run_forced_exit_hooks() {
    // try_lock: a hook registered concurrently must not block the exit.
    if let Ok(hooks) = FORCED_EXIT_HOOKS.try_lock() {
        for h in hooks.iter() {
            h();
        }
    }
}

/// A future resolving on the first SIGINT or SIGTERM. The handlers are installed before this
/// returns (a signal during start-up is not lost); after the first signal a watcher forces
/// the exit on a second one or after [`DRAIN_LIMIT`]. Call inside a tokio runtime.
///
/// Errors: the OS refused to install a handler.
pub fn signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            tracing::info!(
                signal = name,
                drain_limit_s = DRAIN_LIMIT.as_secs(),
                "shutting down: finishing in-flight requests (a second signal exits now)"
            );
            tokio::spawn(async move {
                let why = tokio::select! {
                    _ = int.recv() => "second signal",
                    _ = term.recv() => "second signal",
                    _ = tokio::time::sleep(DRAIN_LIMIT) => "drain limit reached",
                };
                tracing::warn!(reason = why, "exiting without waiting for in-flight requests");
                run_forced_exit_hooks();
                std::process::exit(130);
            });
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        })
    }
}
