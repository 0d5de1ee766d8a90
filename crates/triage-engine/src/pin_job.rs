//! `PinJob`: a prefix pin in progress, shared by whoever asked for it and the thread that steps
//! its engine: tokens prefilled so far, a cancel flag, and the outcome once it has one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::llm_engine::PrefixSource;

/// A prefix kept resident in a model's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedPrefix {
    /// Tokens pinned (whole blocks only; the tail of the prefix is prefilled with each question).
    pub num_tokens: usize,
    pub source: PrefixSource,
}

/// Why a pin ended without pinning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinFailure {
    /// [`PinJob::cancel`] stopped it (a newer pin replaced it, or nobody needs it any more).
    Cancelled,
    /// The prefill failed or the prefix does not fit in the cache (why).
    Failed(String),
}

impl std::fmt::Display for PinFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cancelled => f.write_str("the pin was cancelled"),
            Self::Failed(why) => f.write_str(why),
        }
    }
}

/// How a pin ended.
pub type PinOutcome = std::result::Result<PinnedPrefix, PinFailure>;

/// A pin in progress. The engine that runs it sets the progress and the outcome; the caller
/// reads them, waits for the outcome, or cancels (the engine stops the prefill at its next
/// step).
#[derive(Debug)]
pub struct PinJob {
    /// Tokens to pin: the prefix's whole blocks once the engine has the job.
    total: AtomicUsize,
    /// Tokens whose KV is in the cache so far.
    done: AtomicUsize,
    cancelled: AtomicBool,
    outcome: Mutex<Option<PinOutcome>>,
    ended: Condvar,
}

impl PinJob {
    /// A job for a prefix of `total_tokens` tokens, not started.
    pub fn new(total_tokens: usize) -> Arc<Self> {
        Arc::new(Self {
            total: AtomicUsize::new(total_tokens),
            done: AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
            outcome: Mutex::new(None),
            ended: Condvar::new(),
        })
    }

    /// Tokens prefilled (or found cached) so far, and the tokens to pin.
    pub fn progress(&self) -> (usize, usize) {
        let total = self.total.load(Ordering::Relaxed);
        (self.done.load(Ordering::Relaxed).min(total), total)
    }

    pub(crate) fn set_total(&self, total: usize) {
        self.total.store(total, Ordering::Relaxed);
    }

    pub(crate) fn set_done(&self, done: usize) {
        self.done.store(done, Ordering::Relaxed);
    }

    /// Ask the engine to stop the pin: it ends [`PinFailure::Cancelled`] at the engine's next
    /// step, unless it has ended already.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<PinOutcome>> {
        // Only whole values are assigned under this lock, so a poisoned one is still valid.
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The outcome, once the pin has ended.
    pub fn outcome(&self) -> Option<PinOutcome> {
        self.slot().clone()
    }

    /// End the job (the first outcome stands) and wake its waiters.
    pub fn end(&self, outcome: PinOutcome) {
        let mut slot = self.slot();
        if slot.is_none() {
            if let Ok(pinned) = &outcome {
                self.done.store(pinned.num_tokens, Ordering::Relaxed);
            }
            *slot = Some(outcome);
        }
        self.ended.notify_all();
    }

    /// Wait up to `timeout` for the outcome.
    pub fn wait(&self, timeout: Duration) -> Option<PinOutcome> {
        let slot = self.slot();
        let (slot, _) = self
            .ended
            .wait_timeout_while(slot, timeout, |o| o.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        slot.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outcome_stands_and_wakes_a_waiter() {
        let job = PinJob::new(64);
        assert_eq!(job.wait(Duration::from_millis(1)), None);
        let waiter = {
            let job = job.clone();
            std::thread::spawn(move || job.wait(Duration::from_secs(60)))
        };
        let pinned = PinnedPrefix {
            num_tokens: 48,
            source: PrefixSource::Cache,
        };
        job.end(Ok(pinned));
        job.end(Err(PinFailure::Cancelled));
        assert_eq!(waiter.join().unwrap(), Some(Ok(pinned)));
        assert_eq!(job.progress(), (48, 64));
    }
}
