//! One query in flight: its state (the request, the models, the growing decision record) and
//! the order in which the stages run for each route.

use std::time::Instant;

use triage_engine::SamplingParams;
use triage_engine::{EntropySettings, GenerateRequest, Prompt};
use triage_retrieval::Embedder;

use super::escalation::Fallback;
use super::plan::Plan;
use super::{AnswerEvent, AskRequest, CorpusView, Pipeline};
use crate::error::{Result, RouterError};
use crate::generator::{Generated, Generator};
use crate::{RagSearch, Route, RoutePath, RoutingConfig};
use triage_types::DecisionRecord;

/// Milliseconds since `since`.
pub(super) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// A greedy request for at most `max_tokens`, with `top_logprobs` alternatives per token.
pub(super) fn greedy(prompt: Prompt, max_tokens: usize, top_logprobs: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            logprobs: top_logprobs > 0,
            top_logprobs,
            ..SamplingParams::default()
        },
        entropy: EntropySettings::default(),
    }
}

/// (prompt, cached prompt, completion) tokens of a generation, for a stage record.
pub(super) fn usage_of(g: &Generated) -> (usize, usize, usize) {
    (
        g.usage.prompt_tokens,
        g.usage.cached_tokens,
        g.usage.completion_tokens,
    )
}

/// The path a RAG answer takes.
pub(super) fn rag_path(hybrid: bool) -> RoutePath {
    if hybrid {
        RoutePath::Hybrid
    } else {
        RoutePath::Rag
    }
}

fn validate(request: &AskRequest) -> Result<()> {
    if request.question.trim().is_empty() {
        return Err(RouterError::Invalid("the question is empty".into()));
    }
    if request.tau.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
        return Err(RouterError::Invalid(
            "tau must be a finite number >= 0".into(),
        ));
    }
    if request.max_tokens == Some(0) {
        return Err(RouterError::Invalid("max_tokens must be at least 1".into()));
    }
    Ok(())
}

/// One query in flight.
pub(super) struct Run<'p, 'a> {
    pub(super) pipeline: &'p Pipeline,
    pub(super) generator: &'a mut dyn Generator,
    pub(super) embedder: &'a dyn Embedder,
    pub(super) corpus: &'a CorpusView<'a>,
    pub(super) request: &'a AskRequest,
    pub(super) events: &'a mut dyn FnMut(AnswerEvent),
    pub(super) record: DecisionRecord,
}

impl<'p, 'a> Run<'p, 'a> {
    /// Check the request and estimate each path's cost.
    pub(super) fn start(
        pipeline: &'p Pipeline,
        generator: &'a mut dyn Generator,
        embedder: &'a dyn Embedder,
        corpus: &'a CorpusView<'a>,
        request: &'a AskRequest,
        events: &'a mut dyn FnMut(AnswerEvent),
    ) -> Result<Self> {
        validate(request)?;
        let mut run = Run {
            pipeline,
            generator,
            embedder,
            corpus,
            request,
            events,
            record: DecisionRecord::new(request.route != Route::Auto),
        };
        run.record.long_context_unavailable = corpus.long_context.as_ref().err().cloned();
        run.record.estimated_costs = run
            .estimate_costs()?
            .into_iter()
            .map(|(path, cost)| (path.to_string(), cost))
            .collect();
        Ok(run)
    }

    pub(super) fn config(&self) -> &RoutingConfig {
        &self.pipeline.config
    }

    pub(super) fn max_tokens(&self, configured: usize) -> usize {
        self.request.max_tokens.unwrap_or(configured)
    }

    pub(super) fn tau(&self) -> f32 {
        self.request.tau.unwrap_or(self.config().monitor.tau)
    }

    pub(super) fn announce(&mut self, path: RoutePath) {
        self.record.path = path;
        (self.events)(AnswerEvent::Route(path));
    }

    pub(super) fn lc_available(&self) -> bool {
        self.config().allows(RoutePath::Lc) && self.corpus.long_context.is_ok()
    }

    /// Where an unsure RAG answer can go.
    fn fallback(&self) -> Fallback {
        if self.lc_available() {
            return Fallback::LongContext;
        }
        Fallback::Unavailable(match &self.corpus.long_context {
            Err(e) => e.clone(),
            Ok(_) => "the lc path is not allowed".into(),
        })
    }

    /// Answer along the requested route.
    pub(super) fn answer(&mut self) -> Result<String> {
        match self.request.route {
            Route::Auto => self.auto(),
            Route::None => self.forced_none(),
            Route::Rag => self.forced_rag(self.always_hybrid()),
            Route::Hybrid => self.forced_rag(true),
            Route::Lc => self.long_context("route forced to lc", None),
        }
    }

    /// The cheapest path the signals allow: the plan's path, and from RAG the escalation the
    /// answer's signals call for.
    fn auto(&mut self) -> Result<String> {
        let hybrid = match self.plan_steps()? {
            Plan::Lc(reason) => return self.long_context(&reason, None),
            Plan::ClosedBook { answer, reason } => {
                self.record.reason = reason;
                return Ok(self.closed_book(answer));
            }
            Plan::Rag { hybrid } => hybrid,
        };
        let outcome = self.rag(hybrid, self.fallback())?;
        if outcome.verdict.path == RoutePath::Lc {
            return self.long_context(&outcome.verdict.reason, outcome.escalated_at);
        }
        // The answer stands: `rag` streamed it and recorded its path.
        self.record.reason = outcome.verdict.reason;
        Ok(outcome.generated.text)
    }

    fn forced_none(&mut self) -> Result<String> {
        let threshold = self.config().gate_nll.unwrap_or(f32::INFINITY);
        let (answer, _) = self.gate(threshold)?;
        self.record.reason = "route forced to none".into();
        Ok(self.closed_book(answer))
    }

    /// `search = "hybrid"`: every RAG answer, forced or not, searches dense and BM25.
    pub(super) fn always_hybrid(&self) -> bool {
        self.config().retrieval.search == RagSearch::Hybrid
    }

    fn forced_rag(&mut self, hybrid: bool) -> Result<String> {
        let outcome = self.rag(hybrid, Fallback::Forced)?;
        self.record.reason = outcome.verdict.reason;
        Ok(outcome.generated.text)
    }

    /// Send the gate's closed-book answer as the answer.
    fn closed_book(&mut self, answer: String) -> String {
        self.announce(RoutePath::None);
        (self.events)(AnswerEvent::Delta(answer.clone()));
        answer
    }

    /// Decide the first path without answering; a forced route is taken as given.
    pub(super) fn plan(&mut self) -> Result<()> {
        let path = match self.request.route {
            Route::Auto => return self.plan_only(),
            Route::None => RoutePath::None,
            Route::Rag => rag_path(self.always_hybrid()),
            Route::Hybrid => RoutePath::Hybrid,
            Route::Lc => RoutePath::Lc,
        };
        self.record.path = path;
        self.record.reason = format!("route forced to {}", path.as_str());
        Ok(())
    }
}
