//! The RAG stage: retrieve, answer with the base model under the entropy monitor (its text held
//! back while it may still escalate), judge the finished answer and record what the monitor saw.

use std::time::Instant;

use triage_engine::entropy_monitor::{Decision, EntropyMonitor};
use triage_engine::YesNoJudge;
use triage_engine::{FinishReason, GenerateRequest, Prompt};
use triage_models::chat_template::ChatMessage;
use triage_retrieval::Hit;

use super::escalation::{
    decide, escalates_unscored, CombinedVerdict, EscalationSignals, Fallback, ProbeVerdict, Verdict,
};
use super::hold_back::{HoldBack, Release};
use super::prompts::{declines, rag_user, RAG_SYSTEM, SELF_CHECK};
use super::run::{greedy, ms, rag_path, usage_of, Run};
use crate::error::{Result, RouterError};
use crate::generator::{Generated, ModelRole};
use crate::signals::answer_span::{
    answer_span_text, AnswerSignals, AnswerSpanFilter, FromTokens, SpanMonitor,
};
use crate::signals::grounding::grounding;
use crate::signals::probe_states;
use crate::signals::sample_agreement::{agreement, Sample};
use crate::RoutePath;
use triage_types::GroundingFeatures;
use triage_types::{MonitorRecord, MonitorVerdict, Stage, TauRecord};

/// What the RAG stage produced.
pub(super) struct RagOutcome {
    pub generated: Generated,
    /// Whether the answer stands (on the RAG path) or escalates (to `lc`), and why.
    pub verdict: Verdict,
    /// When it escalates, the moment that was decided: the monitor's or the probe's decision
    /// mid-answer, else the verdict on the finished answer. The handoff is timed from here.
    pub escalated_at: Option<Instant>,
}

/// A generation under the monitor, with what was seen while it ran.
struct Held {
    generated: Generated,
    hold: HoldBack,
    probed: Option<ProbeVerdict>,
    /// The first token at which the monitor or the probe escalated (with long context to take
    /// over).
    escalated_at: Option<Instant>,
}

/// What was asked after the answer: the samples' agreement with it and its self-check (both NaN
/// when not configured or not asked).
struct FollowUps {
    agreement: f32,
    self_check: f32,
}

impl FollowUps {
    const NOT_ASKED: Self = Self {
        agreement: f32::NAN,
        self_check: f32::NAN,
    };
}

/// The judgement of a finished answer, with the signals the record keeps.
struct Judged {
    verdict: Verdict,
    signals: AnswerSignals,
    grounding: GroundingFeatures,
    probe: Option<ProbeVerdict>,
    combined: Option<CombinedVerdict>,
}

impl Run<'_, '_> {
    /// Retrieve, then answer with the base model under the monitor. When the answer can escalate
    /// (`fallback` is long context), its text is held until the monitor accepts it and
    /// generation stops at an escalation; otherwise it streams as it comes and the monitor only
    /// records.
    pub(super) fn rag(&mut self, hybrid: bool, fallback: Fallback) -> Result<RagOutcome> {
        let hits = self.retrieve(hybrid)?;
        let started = Instant::now();
        let base = self.generator.model(ModelRole::Base)?;
        let tau = self.tau();
        self.check_fitted_on(&base.name)?;
        let mut span = self.span_monitor(tau)?;
        let can_escalate = fallback == Fallback::LongContext;
        // The prompt is the configuration's whatever the fallback, so a forced RAG answer is
        // the routed one's first stage, word for word (calibration reads forced answers to judge
        // routed ones). A decline escalates when long context can take over (Self-Route, or
        // abstention allowed: only long context sees everything); otherwise it is the answer.
        let abstain = self.config().abstain;
        let offers_decline = self.config().monitor.self_route || abstain;
        let self_route = offers_decline && can_escalate;
        let request = self.rag_request(&hits, offers_decline);
        let path = rag_path(hybrid);
        let release = self.release(can_escalate, self_route);
        let stop_on_escalate = self.config().monitor.stop_on_escalate;
        let hold = HoldBack::start(path, release, stop_on_escalate, &mut *self.events);
        let Held {
            generated,
            hold,
            probed,
            escalated_at,
        } = self.generate_held(request.clone(), &mut span, hold, can_escalate)?;
        let escalation = self.escalation_signals(
            &generated,
            &mut span,
            tau,
            offers_decline,
            probed,
            path,
            fallback,
        );
        let follow_ups = self.follow_ups(&request, &generated, &escalation, can_escalate)?;
        let judged = self.judge(&generated, &hits, follow_ups, &span, escalation)?;
        let escalated_at = (judged.verdict.path == RoutePath::Lc)
            .then(|| escalated_at.unwrap_or_else(Instant::now));
        if judged.verdict.path == path {
            hold.finish(&generated.text, &mut *self.events);
            self.record.path = path;
        }
        self.record_rag(started, &generated, &span, tau, &base.name, &judged);
        Ok(RagOutcome {
            generated,
            verdict: judged.verdict,
            escalated_at,
        })
    }

    /// When the held-back answer reaches the caller: at once where nothing can take it back;
    /// under a combined score only at the end (the score reads the whole answer); else when the
    /// monitor accepts it (and, with Self-Route, it does not decline).
    fn release(&self, can_escalate: bool, self_route: bool) -> Release {
        match (can_escalate, self.pipeline.combined.is_some(), self_route) {
            (false, _, _) => Release::Immediately,
            (true, true, _) => Release::AtEnd,
            (true, false, true) => Release::OnAcceptUnlessDeclined,
            (true, false, false) => Release::OnAccept,
        }
    }

    /// The samples and the self-check are read only by the combined score: an answer that
    /// escalates whatever the score says (the monitor, the probe, a decline) is not charged for
    /// them. A forced answer asks them all, for calibration to read.
    fn follow_ups(
        &mut self,
        request: &GenerateRequest,
        generated: &Generated,
        escalation: &EscalationSignals,
        can_escalate: bool,
    ) -> Result<FollowUps> {
        let scored = self.pipeline.combined.is_some();
        if can_escalate && escalates_unscored(escalation, scored) {
            return Ok(FollowUps::NOT_ASKED);
        }
        Ok(FollowUps {
            agreement: self.sample_agreement(request, generated)?,
            // A decline claims nothing the context could bear out: it is not checked.
            self_check: if escalation.declined {
                f32::NAN
            } else {
                self.self_check(request, generated)?
            },
        })
    }

    /// τ and the combined score were fitted on one model's answers; refuse another's.
    fn check_fitted_on(&self, base: &str) -> Result<()> {
        if let Some(c) = &self.config().monitor.calibration {
            if c.model != base {
                return Err(RouterError::Invalid(format!(
                    "τ was calibrated on {:?}, the base model is {:?}: run triage calibrate \
                     for this model",
                    c.model, base
                )));
            }
        }
        if let Some(p) = &self.pipeline.probe {
            if p.model_id != base {
                return Err(RouterError::Invalid(format!(
                    "the hidden-state probe was fitted on {:?}, the base model is {:?}",
                    p.model_id, base
                )));
            }
        }
        if let Some(c) = &self.pipeline.combined {
            if c.model.model_id != base {
                return Err(RouterError::Invalid(format!(
                    "the combined score was fitted on {:?}, the base model is {:?}",
                    c.model.model_id, base
                )));
            }
        }
        Ok(())
    }

    /// The entropy monitor over the answer span. With the combined score the monitor only
    /// records: the decision needs the whole answer.
    fn span_monitor(&self, tau: f32) -> Result<SpanMonitor> {
        let settings = &self.config().monitor;
        let monitor_tau = if self.pipeline.combined.is_some() {
            f32::MAX
        } else {
            tau
        };
        let monitor = EntropyMonitor::new(
            monitor_tau,
            settings.window,
            settings.estimator,
            settings.unit,
        )?;
        let filter = AnswerSpanFilter::new(&settings.preambles);
        Ok(SpanMonitor::new(filter, monitor))
    }

    fn rag_request(&self, hits: &[Hit], decline: bool) -> GenerateRequest {
        let mut request = greedy(
            Prompt::Chat(vec![
                ChatMessage::new("system", RAG_SYSTEM),
                ChatMessage::new("user", rag_user(&self.request.question, hits, decline)),
            ]),
            self.max_tokens(self.config().rag_max_tokens),
            2,
        );
        let monitor = &self.config().monitor;
        if !monitor.probe_layers.is_empty() {
            request.params.hidden_layers = monitor.probe_layers.clone();
            request.params.hidden_steps = monitor.probe_steps.max(1);
        }
        if let Some(p) = &self.pipeline.probe {
            if !request.params.hidden_layers.contains(&p.layer) {
                request.params.hidden_layers.push(p.layer);
            }
            request.params.hidden_steps = request.params.hidden_steps.max(1);
        }
        request
    }

    /// Generate under the monitor, each piece going through `hold`. With a probe, the first
    /// token's state at the probe's layer (the last prompt token's) is read first: over its
    /// threshold, and with long context to escalate to, the answer escalates there.
    fn generate_held(
        &mut self,
        request: GenerateRequest,
        span: &mut SpanMonitor,
        mut hold: HoldBack,
        can_escalate: bool,
    ) -> Result<Held> {
        let mut failure = None;
        let mut probed = None;
        let mut escalated_at = None;
        let probe = self.pipeline.probe.as_ref().map(|p| {
            let at = request
                .params
                .hidden_layers
                .iter()
                .position(|&l| l == p.layer);
            (p, at)
        });
        let events = &mut *self.events;
        let generated = self
            .generator
            .generate(ModelRole::Base, &[request], &mut |_, token, text| {
                let mut decision = match span.observe(token) {
                    Ok(decision) => decision,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                };
                if let (Some((p, Some(at))), None) = (probe, probed) {
                    let Some(state) = token.hidden.get(at) else {
                        failure = Some(RouterError::Invalid(
                            "the engine returned no hidden state for the probe".into(),
                        ));
                        return false;
                    };
                    match p.judge(state) {
                        Ok((score, escalates)) => {
                            probed = Some(ProbeVerdict {
                                score,
                                threshold: p.threshold,
                            });
                            if escalates && can_escalate {
                                decision = Decision::Escalate { at_step: 1 };
                            }
                        }
                        Err(e) => {
                            failure = Some(e.into());
                            return false;
                        }
                    }
                }
                if can_escalate && escalated_at.is_none() {
                    if let Decision::Escalate { .. } = decision {
                        escalated_at = Some(Instant::now());
                    }
                }
                hold.step(text, decision, events)
            })?
            .remove(0);
        match failure {
            Some(e) => Err(e),
            None => Ok(Held {
                generated,
                hold,
                probed,
                escalated_at,
            }),
        }
    }

    /// Draws the configured short samples from `request`'s prompt (cached by the greedy answer
    /// just generated), records their tokens as a stage, and returns their agreement with the
    /// greedy answer span; NaN when none are configured.
    fn sample_agreement(&mut self, request: &GenerateRequest, greedy: &Generated) -> Result<f32> {
        let settings = &self.config().monitor;
        if settings.samples == 0 {
            return Ok(f32::NAN);
        }
        let started = Instant::now();
        let preambles = settings.preambles.clone();
        let requests: Vec<GenerateRequest> = (0..settings.samples)
            .map(|i| {
                let mut r = request.clone();
                r.params.hidden_layers.clear();
                r.params.temperature = settings.sample_temperature;
                r.params.max_tokens = Some(settings.sample_tokens);
                r.params.seed = Some(i as u64);
                r
            })
            .collect();
        let drawn = self
            .generator
            .generate(ModelRole::Base, &requests, &mut |_, _, _| true)?;
        // The samples re-read the RAG prompt from the cache: charged are the tokens they
        // compute (the prompt's uncached tail and their own), not the prompt again k times.
        let usage = drawn.iter().fold((0, 0, 0), |acc, g| {
            let (p, c, n) = usage_of(g);
            (acc.0 + p.saturating_sub(c), 0, acc.2 + n)
        });
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Samples,
            Some(ModelRole::Base),
            usage,
            ms(started),
            &prices,
        );
        let samples: Vec<Sample> = drawn
            .iter()
            .map(|g| Sample {
                span: answer_span_text(&g.tokens, &preambles),
                truncated: g.finish_reason == FinishReason::Length,
            })
            .collect();
        Ok(agreement(
            &answer_span_text(&greedy.tokens, &preambles),
            &samples,
        ))
    }

    /// Asks the configured judge (the base model, its RAG prompt cached, or the long-context
    /// model) whether the context bears out the answer just given; records the stage and returns
    /// log p(yes) − log p(no), NaN when not configured.
    fn self_check(&mut self, request: &GenerateRequest, answer: &Generated) -> Result<f32> {
        let settings = &self.config().monitor;
        if !settings.self_check {
            return Ok(f32::NAN);
        }
        let role = settings.self_check_model;
        let Prompt::Chat(messages) = &request.prompt else {
            return Err(RouterError::Invalid("the RAG prompt is not a chat".into()));
        };
        let started = Instant::now();
        let judge = YesNoJudge::new(&self.generator.model(role)?.tokenizer)?;
        let mut messages = messages.clone();
        messages.push(ChatMessage::new("assistant", answer.text.trim()));
        messages.push(ChatMessage::new("user", SELF_CHECK));
        let checked = self
            .generator
            .generate(
                role,
                &[judge.request(Prompt::Chat(messages))],
                &mut |_, _, _| true,
            )?
            .into_iter()
            .next()
            .ok_or_else(|| RouterError::Invalid("the self-check produced no answer".into()))?;
        // Like the samples, charged are the tokens it computes: on the base model the answer,
        // the question and one step, not the cached RAG prompt again.
        let (prompt, cached, completion) = usage_of(&checked);
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::SelfCheck,
            Some(role),
            (prompt.saturating_sub(cached), 0, completion),
            ms(started),
            &prices,
        );
        checked
            .tokens
            .first()
            .map(|t| judge.score(t))
            .ok_or_else(|| RouterError::Invalid("the self-check produced no token".into()))
    }

    /// What the finished answer shows before anything is asked after it; the combined score,
    /// which needs the follow-ups, is left to [`Self::judge`].
    #[allow(clippy::too_many_arguments)]
    fn escalation_signals(
        &self,
        generated: &Generated,
        span: &mut SpanMonitor,
        tau: f32,
        offers_decline: bool,
        probe: Option<ProbeVerdict>,
        rag_path: RoutePath,
        fallback: Fallback,
    ) -> EscalationSignals {
        EscalationSignals {
            monitor: span.finish(),
            tau,
            mean: span.span_mean(),
            decided_at: span.decided_at,
            combined: None,
            probe,
            // An answer without a single content token (empty, or only punctuation) answered
            // nothing, however calm its tokens were.
            no_content: !span.trace.iter().any(|&(_, in_span)| in_span),
            declined: offers_decline && declines(&generated.text),
            abstention_allowed: self.config().abstain,
            rag_path,
            fallback,
        }
    }

    /// The finished answer's signals, its combined score and the escalation decision on them.
    fn judge(
        &self,
        generated: &Generated,
        hits: &[Hit],
        follow_ups: FollowUps,
        span: &SpanMonitor,
        mut escalation: EscalationSignals,
    ) -> Result<Judged> {
        let settings = &self.config().monitor;
        let signals = AnswerSignals {
            sample_agreement: follow_ups.agreement,
            self_check: follow_ups.self_check,
            ..AnswerSignals::from_tokens(
                &generated.tokens,
                &settings.preambles,
                settings.window,
                escalation.declined,
            )
        };
        let chunks: Vec<(&str, f32)> = hits
            .iter()
            .map(|h| (h.chunk.text.as_str(), h.score))
            .collect();
        let grounding = grounding(
            &self.request.question,
            &answer_span_text(&generated.tokens, &settings.preambles),
            &chunks,
        );
        let features = self.record.retrieval.as_ref().and_then(|r| r.features);
        let combined = match &self.pipeline.combined {
            Some(c) => {
                let row = triage_policy::combined_inputs(
                    &signals,
                    span.span_mean(),
                    features.as_ref(),
                    Some(&grounding),
                );
                Some(CombinedVerdict {
                    p_wrong: c.p_wrong(&row)?,
                    threshold: c.model.threshold,
                })
            }
            None => None,
        };
        escalation.combined = combined;
        Ok(Judged {
            verdict: decide(&escalation),
            signals,
            grounding,
            combined,
            probe: escalation.probe,
        })
    }

    /// The stage's tokens and time, and what the monitor saw.
    fn record_rag(
        &mut self,
        started: Instant,
        generated: &Generated,
        span: &SpanMonitor,
        tau: f32,
        base: &str,
        judged: &Judged,
    ) {
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Rag,
            Some(ModelRole::Base),
            usage_of(generated),
            ms(started),
            &prices,
        );
        let settings = &self.pipeline.config.monitor;
        let (trace, in_span): (Vec<f32>, Vec<bool>) = span.trace.iter().copied().unzip();
        self.record.monitor = Some(MonitorRecord {
            tau: TauRecord {
                tau,
                model: base.to_string(),
                estimator: settings.estimator,
                unit: settings.unit,
                window: settings.window,
            },
            trace,
            in_answer_span: in_span,
            mean: span.span_mean(),
            decided_at: span.decided_at,
            decision: if judged.verdict.accepted {
                MonitorVerdict::Accept
            } else {
                MonitorVerdict::Escalate
            },
            signals: judged.signals,
            grounding: Some(judged.grounding),
            probe: probe_states(
                &settings.probe_layers,
                &generated
                    .tokens
                    .iter()
                    .map(|t| t.hidden.as_slice())
                    .filter(|h| !h.is_empty())
                    .collect::<Vec<_>>(),
            ),
            probe_score: judged.probe.map(|p| p.score),
            probe_threshold: judged.probe.map(|p| p.threshold),
            combined_p_wrong: judged.combined.map(|c| c.p_wrong),
            combined_threshold: judged.combined.map(|c| c.threshold),
            rag_answer: generated.text.trim().to_string(),
        });
    }
}
