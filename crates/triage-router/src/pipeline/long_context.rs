//! The long-context stage: the long-context model answers over the whole corpus, whose prefix is
//! pinned in its cache, so only the question is prefilled.

use std::time::Instant;

use triage_engine::entropy_monitor::Decision;
use triage_engine::Prompt;

use super::hold_back::{HoldBack, Release};
use super::prompts::{question_text, LC_DECLINE};
use super::run::{greedy, ms, usage_of, Run};
use crate::error::{Result, RouterError};
use crate::generator::ModelRole;
use crate::RoutePath;
use triage_types::Stage;

impl Run<'_, '_> {
    /// Answer with the long-context model over the whole corpus, streaming as it comes. An
    /// escalated answer passes the moment it was decided, and the record gets the handoff: the
    /// time from then to this model's first token.
    pub(super) fn long_context(
        &mut self,
        reason: &str,
        escalated_at: Option<Instant>,
    ) -> Result<String> {
        let lc = match &self.corpus.long_context {
            Ok(lc) => *lc,
            Err(why) => {
                return Err(RouterError::Invalid(format!(
                    "the long-context path is unavailable for corpus {:?}: {why}",
                    self.corpus.name
                )))
            }
        };
        let started = Instant::now();
        let model = self.generator.model(ModelRole::LongContext)?;
        let question = question_text(&self.request.question, self.config().abstain, LC_DECLINE);
        let request = greedy(
            Prompt::Tokens(lc.tokens(&model, &question)?),
            self.max_tokens(self.config().lc_max_tokens),
            0,
        );
        self.record.reason = reason.to_string();
        self.record.path = RoutePath::Lc;
        let events = &mut *self.events;
        // Nothing to decide: the answer streams from its first piece.
        let mut stream = HoldBack::start(RoutePath::Lc, Release::Immediately, false, events);
        let mut first_token = None;
        let g = self
            .generator
            .generate(ModelRole::LongContext, &[request], &mut |_, _, text| {
                first_token.get_or_insert_with(Instant::now);
                stream.step(text, Decision::Continue, events)
            })?
            .remove(0);
        stream.finish(&g.text, events);
        if let (Some(from), Some(to)) = (escalated_at, first_token) {
            self.record.handoff_ms = Some(to.duration_since(from).as_secs_f64() * 1e3);
        }
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Lc,
            Some(ModelRole::LongContext),
            usage_of(&g),
            ms(started),
            &prices,
        );
        Ok(g.text)
    }
}
