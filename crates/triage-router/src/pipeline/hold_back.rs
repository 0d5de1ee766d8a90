//! Streaming a RAG answer that may still escalate: its text is withheld from the client until
//! the monitor accepts it, then released with the route announced first; an escalated answer's
//! text is never sent, so nothing streamed has to be retracted.

use triage_engine::entropy_monitor::Decision;

use super::prompts::declines;
use super::AnswerEvent;
use crate::routing_config::RoutePath;

/// When held text may reach the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Nothing to decide: the route is announced at once and the text streams as it comes.
    Immediately,
    /// Once the monitor accepts.
    OnAccept,
    /// Once the monitor accepts, unless the text so far declines (Self-Route).
    OnAcceptUnlessDeclined,
    /// Only once generation ended and the answer stands (the combined score needs it whole).
    AtEnd,
}

/// The client's view of one answer being generated.
#[derive(Debug)]
pub(super) struct HoldBack {
    path: RoutePath,
    release: Release,
    /// Whether an escalation while the text is held stops generation.
    stop_on_escalate: bool,
    /// Text generated but not sent.
    held: String,
    released: bool,
    /// Bytes sent, to find the tail the engine only hands over at the end.
    num_sent_bytes: usize,
}

impl HoldBack {
    /// Start an answer on `path`; with [`Release::Immediately`] its route is announced now.
    pub(super) fn start(
        path: RoutePath,
        release: Release,
        stop_on_escalate: bool,
        events: &mut dyn FnMut(AnswerEvent),
    ) -> Self {
        let released = release == Release::Immediately;
        if released {
            events(AnswerEvent::Route(path));
        }
        Self {
            path,
            release,
            stop_on_escalate,
            held: String::new(),
            released,
            num_sent_bytes: 0,
        }
    }

    /// One generated piece of text and the monitor's decision so far; returns whether generation
    /// should go on.
    pub(super) fn step(
        &mut self,
        piece: &str,
        decision: Decision,
        events: &mut dyn FnMut(AnswerEvent),
    ) -> bool {
        if self.released {
            self.num_sent_bytes += piece.len();
            events(AnswerEvent::Delta(piece.to_string()));
            return true;
        }
        self.held.push_str(piece);
        match decision {
            Decision::Escalate { .. } => !self.stop_on_escalate,
            Decision::Accept if self.may_release() => {
                self.released = true;
                self.num_sent_bytes += self.held.len();
                events(AnswerEvent::Route(self.path));
                events(AnswerEvent::Delta(std::mem::take(&mut self.held)));
                true
            }
            _ => true,
        }
    }

    fn may_release(&self) -> bool {
        match self.release {
            Release::Immediately | Release::OnAccept => true,
            Release::OnAcceptUnlessDeclined => !declines(&self.held),
            Release::AtEnd => false,
        }
    }

    /// Generation ended with `text` and the answer stands: send what the client has not seen,
    /// the whole answer if it was still held, else the tail the engine kept to the end (a
    /// stop-string prefix, partial UTF-8). An answer that escalates is dropped instead.
    pub(super) fn finish(self, text: &str, events: &mut dyn FnMut(AnswerEvent)) {
        if !self.released {
            events(AnswerEvent::Route(self.path));
            events(AnswerEvent::Delta(text.to_string()));
            return;
        }
        let tail = text.get(self.num_sent_bytes..).unwrap_or("");
        if !tail.is_empty() {
            events(AnswerEvent::Delta(tail.to_string()));
        }
    }
}
