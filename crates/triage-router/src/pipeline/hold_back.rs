//! Streaming a RAG answer that may still escalate: its text is withheld from the client until
//! the monitor accepts it, then released with the route announced first; an escalated answer's
//! text is never sent, so nothing streamed has to be retracted.

use triage_engine::entropy_monitor::Decision;

use super::prompts::declines;
use super::AnswerEvent;
use crate::RoutePath;

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

#[cfg(test)]
mod tests {
    use super::*;

    const ESCALATE: Decision = Decision::Escalate { at_step: 2 };

    /// Feed `pieces` with their decisions, then finish with `text` if the answer stands; returns
    /// the events the client saw and whether generation would have gone on after each piece.
    fn stream(
        release: Release,
        stop_on_escalate: bool,
        pieces: &[(&str, Decision)],
        stands_as: Option<&str>,
    ) -> (Vec<AnswerEvent>, Vec<bool>) {
        let mut events = Vec::new();
        let mut sink = |e| events.push(e);
        let mut hold = HoldBack::start(RoutePath::Rag, release, stop_on_escalate, &mut sink);
        let go_on: Vec<bool> = pieces
            .iter()
            .map(|(piece, decision)| hold.step(piece, *decision, &mut sink))
            .collect();
        if let Some(text) = stands_as {
            hold.finish(text, &mut sink);
        }
        (events, go_on)
    }

    fn route() -> AnswerEvent {
        AnswerEvent::Route(RoutePath::Rag)
    }

    fn delta(text: &str) -> AnswerEvent {
        AnswerEvent::Delta(text.to_string())
    }

    #[test]
    fn held_text_is_released_after_the_route_once_the_monitor_accepts() {
        let pieces = [
            ("Paris", Decision::Continue),
            (" is", Decision::Accept),
            (" big", Decision::Accept),
        ];
        let (events, go_on) = stream(Release::OnAccept, true, &pieces, Some("Paris is big"));
        assert_eq!(events, [route(), delta("Paris is"), delta(" big")]);
        assert_eq!(go_on, [true, true, true]);
    }

    #[test]
    fn nothing_is_released_from_an_answer_that_escalates() {
        let pieces = [("Maybe", Decision::Continue), (" Lyon", ESCALATE)];
        let (events, go_on) = stream(Release::OnAccept, true, &pieces, None);
        assert_eq!(events, []);
        assert_eq!(go_on, [true, false], "an escalation stops generation");
        let (events, go_on) = stream(Release::OnAccept, false, &pieces, None);
        assert_eq!(events, []);
        assert_eq!(go_on, [true, true], "unless configured to run on");
    }

    #[test]
    fn streaming_from_the_start_announces_first_and_never_stops() {
        let pieces = [("Maybe", Decision::Continue), (" Lyon", ESCALATE)];
        let (events, go_on) = stream(Release::Immediately, true, &pieces, Some("Maybe Lyon"));
        assert_eq!(events, [route(), delta("Maybe"), delta(" Lyon")]);
        assert_eq!(go_on, [true, true]);
    }

    #[test]
    fn the_tail_the_engine_kept_to_the_end_is_flushed() {
        // A stop-string prefix (".") and the rest of a character split across tokens ("é") reach
        // the client only in the final text.
        let pieces = [("Caf", Decision::Accept), ("", Decision::Accept)];
        let (events, _) = stream(Release::OnAccept, true, &pieces, Some("Café."));
        assert_eq!(events, [route(), delta("Caf"), delta(""), delta("é.")]);
        let (events, _) = stream(Release::Immediately, true, &pieces, Some("Caf"));
        assert_eq!(events, [route(), delta("Caf"), delta("")], "no empty tail");
    }

    #[test]
    fn an_answer_still_held_at_the_end_is_sent_whole_if_it_stands() {
        // The combined score needs the whole answer, so even an accepting monitor releases
        // nothing until the end.
        let pieces = [("Paris", Decision::Accept), (" is", Decision::Accept)];
        let (events, go_on) = stream(Release::AtEnd, true, &pieces, Some("Paris is"));
        assert_eq!(events, [route(), delta("Paris is")]);
        assert_eq!(go_on, [true, true]);
        let (events, _) = stream(Release::AtEnd, true, &pieces, None);
        assert_eq!(events, [], "and nothing when it escalates");
    }

    #[test]
    fn a_declining_answer_is_not_released_under_self_route() {
        let pieces = [("Unanswerable", Decision::Accept), (".", Decision::Accept)];
        let (events, _) = stream(Release::OnAcceptUnlessDeclined, true, &pieces, None);
        assert_eq!(events, []);
        let pieces = [("Paris", Decision::Accept)];
        let (events, _) = stream(Release::OnAcceptUnlessDeclined, true, &pieces, None);
        assert_eq!(events, [route(), delta("Paris")]);
    }
}
