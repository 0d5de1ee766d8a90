//! The stages that may answer without retrieval: the query classifier (global questions go to
//! long context) and the decide-then-retrieve gate's closed-book answer.

use std::time::Instant;

use triage_engine::Prompt;
use triage_models::chat_template::ChatMessage;

use super::prompts::GATE_SYSTEM;
use super::run::{greedy, ms, usage_of, Run};
use crate::error::{Result, RouterError};
use crate::generator::ModelRole;
use crate::pipeline::classifier::ClassifyWith;
use triage_types::QueryClass;
use triage_types::{ClassifierRecord, GateRecord, Stage};

impl Run<'_, '_> {
    pub(super) fn classify(&mut self) -> Result<QueryClass> {
        let Some(classifier) = self.pipeline.classifier.as_deref() else {
            return Ok(QueryClass::Point);
        };
        let started = Instant::now();
        let mut with = ClassifyWith {
            embedder: self.embedder,
            generator: &mut *self.generator,
        };
        let c = classifier
            .classify(&[self.request.question.as_str()], &mut with)?
            .pop()
            .ok_or_else(|| RouterError::Invalid("the classifier returned nothing".into()))?;
        let model = (classifier.name() == "zero_shot").then_some(ModelRole::Router);
        let prices = self.config().prices;
        self.record
            .add_stage(Stage::Classify, model, (0, 0, 0), ms(started), &prices);
        self.record.classifier = Some(ClassifierRecord {
            classifier: classifier.name().to_string(),
            label: c.label,
            p_global: c.p_global,
        });
        Ok(c.label)
    }

    /// The closed-book answer and its mean NLL (EOS excluded: the engine never emits it).
    pub(super) fn gate(&mut self, threshold: f32) -> Result<(String, Option<f32>)> {
        let started = Instant::now();
        let request = greedy(
            Prompt::Chat(vec![
                ChatMessage::new("system", GATE_SYSTEM),
                ChatMessage::new("user", self.request.question.trim()),
            ]),
            self.max_tokens(self.config().gate_max_tokens),
            0,
        );
        let g = self
            .generator
            .generate(ModelRole::Base, &[request], &mut |_, _, _| true)?
            .remove(0);
        let nll = (!g.tokens.is_empty())
            .then(|| g.tokens.iter().map(|t| -t.logprob).sum::<f32>() / g.tokens.len() as f32);
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Gate,
            Some(ModelRole::Base),
            usage_of(&g),
            ms(started),
            &prices,
        );
        let answered = nll.is_some_and(|n| n < threshold);
        self.record.gate = Some(GateRecord {
            mean_nll: nll,
            threshold,
            answered,
            answer: g.text.trim().to_string(),
        });
        Ok((g.text.trim().to_string(), nll))
    }
}
