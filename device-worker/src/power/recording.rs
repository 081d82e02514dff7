//! A backend that only records: every vote change, with the time it happened, for tests.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::clock::Clock;
use super::{PowerBackend, Votes};

/// One change of the voted set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoteChange {
    /// When it was applied, on the backend's clock.
    pub at: Duration,
    /// The votes from then on.
    pub votes: Votes,
}

/// Records each call of [`PowerBackend::apply`] that changes the votes. Clones share the
/// log, so a test keeps one clone and hands the other to the worker.
#[derive(Clone)]
pub struct RecordingBackend {
    log: Arc<Mutex<Vec<VoteChange>>>,
    clock: Arc<dyn Clock>,
}

impl RecordingBackend {
    /// An empty log timed by `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            log: Arc::default(),
            clock,
        }
    }

    /// Every change so far, oldest first.
    pub fn changes(&self) -> Vec<VoteChange> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The votes in force (the last change), `None` before the first.
    pub fn current(&self) -> Option<Votes> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .map(|c| c.votes)
    }
}

impl PowerBackend for RecordingBackend {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn apply(&mut self, votes: &Votes) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.last().map(|c| c.votes) != Some(*votes) {
            log.push(VoteChange {
                at: self.clock.now(),
                votes: *votes,
            });
        }
    }
}
