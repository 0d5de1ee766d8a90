//! Pins an `LlmEngine` runs for a [`PinJob`]: begun by a caller that does not step the engine
//! itself (a corpus registry re-pinning in the background), advanced by every step, ended when
//! their prefill finishes, and held by their tokens until released.

use std::path::Path;
use std::sync::Arc;

use triage_core::PrefixHandle;

use super::prefixes::{PendingPin, PinStart};
use super::{LlmEngine, RequestId};
use crate::generate::FinishReason;
use crate::pin_job::{PinFailure, PinJob, PinnedPrefix};

/// The engine's pins in flight and the ones it holds.
#[derive(Debug, Default)]
pub(super) struct PinBook {
    /// Prefills under way: the caller's tokens, the pending pin and its job.
    pending: Vec<(Vec<u32>, PendingPin, Arc<PinJob>)>,
    /// Pins held until [`LlmEngine::release_pin`], by the caller's tokens.
    held: Vec<(Vec<u32>, PrefixHandle)>,
}

impl LlmEngine {
    /// Pin `tokens` for `job` (persisted under `dir` when given) and return at once. The job
    /// ends now when the blocks are cached or in a file; otherwise the prefill runs as a
    /// request among the others, each step reports its progress, and the job ends when it
    /// finishes, or as [`PinFailure::Cancelled`] at the first step after [`PinJob::cancel`].
    /// A pinned prefix stays held until [`LlmEngine::release_pin`] with the same tokens.
    pub fn begin_pin(&mut self, tokens: &[u32], dir: Option<&Path>, job: Arc<PinJob>) {
        job.set_total(self.full_blocks(tokens).len());
        if job.is_cancelled() {
            job.end(Err(PinFailure::Cancelled));
            return;
        }
        match self.start_pin(tokens, dir) {
            Ok(PinStart::Done(handle, source)) => self.hold(tokens.to_vec(), handle, source, &job),
            Ok(PinStart::Pending(pending)) => {
                self.pins.pending.push((tokens.to_vec(), pending, job))
            }
            Err(e) => job.end(Err(PinFailure::Failed(e.to_string()))),
        }
    }

    /// Release one pin begun with [`LlmEngine::begin_pin`] for `tokens`; whether one was held.
    pub fn release_pin(&mut self, tokens: &[u32]) -> bool {
        let Some(i) = self.pins.held.iter().position(|(t, _)| t == tokens) else {
            return false;
        };
        let (_, handle) = self.pins.held.remove(i);
        self.unpin_prefix(&handle);
        true
    }

    /// Whether a pin begun with [`LlmEngine::begin_pin`] is still prefilling.
    pub fn has_pending_pins(&self) -> bool {
        !self.pins.pending.is_empty()
    }

    fn hold(
        &mut self,
        tokens: Vec<u32>,
        handle: PrefixHandle,
        source: crate::PrefixSource,
        job: &PinJob,
    ) {
        job.end(Ok(PinnedPrefix {
            num_tokens: handle.num_tokens,
            source,
        }));
        self.pins.held.push((tokens, handle));
    }

    /// Before a step: stop the prefills whose job was cancelled.
    pub(super) fn cancel_pins(&mut self) {
        let cancelled: Vec<RequestId> = self
            .pins
            .pending
            .iter()
            .filter(|(_, p, job)| job.is_cancelled() && self.states.contains_key(&p.id()))
            .map(|(_, p, _)| p.id())
            .collect();
        cancelled.into_iter().for_each(|id| self.cancel(id));
    }

    /// After a step: how far each prefill has got.
    pub(super) fn publish_pin_progress(&self) {
        for (_, pending, job) in &self.pins.pending {
            if let Some(request) = self.scheduler.request(pending.id()) {
                job.set_done(request.num_computed_tokens);
            }
        }
    }

    /// Request `id` ended with `reason`: when it was a pin's prefill, pin it (or say why not).
    pub(super) fn settle_pin(&mut self, id: RequestId, reason: &FinishReason) {
        let Some(i) = self.pins.pending.iter().position(|(_, p, _)| p.id() == id) else {
            return;
        };
        let (tokens, pending, job) = self.pins.pending.swap_remove(i);
        if job.is_cancelled() || *reason == FinishReason::Cancelled {
            job.end(Err(PinFailure::Cancelled));
            return;
        }
        match self.finish_pin(pending) {
            Ok((handle, source, unsaved)) => {
                if let Some(e) = unsaved {
                    tracing::warn!(error = %e, "a pinned prefix could not be saved; the next start prefills it again");
                }
                self.hold(tokens, handle, source, &job);
            }
            Err(e) => job.end(Err(PinFailure::Failed(e.to_string()))),
        }
    }
}
