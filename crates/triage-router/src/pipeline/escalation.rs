//! The escalation decision: from the signals a finished RAG answer leaves, whether it stands and
//! why, or why it goes to the long-context model. Pure, so every reason can be tested on its own.

use triage_engine::entropy_monitor::Decision;

use crate::RoutePath;

/// The calibrated combined score of one answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CombinedVerdict {
    pub p_wrong: f64,
    /// Escalate when `p_wrong` is at least this.
    pub threshold: f64,
}

/// The hidden-state probe's reading at the last prompt token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ProbeVerdict {
    pub score: f64,
    /// Escalate when `score` exceeds this.
    pub threshold: f64,
}

impl ProbeVerdict {
    pub fn escalates(&self) -> bool {
        self.score > self.threshold
    }
}

/// Where an answer that should not stand can go.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fallback {
    /// The long-context model can take the query over.
    LongContext,
    /// No escalation path; why (for the reason).
    Unavailable(String),
    /// The route was forced to RAG: the answer stands whatever the signals say.
    Forced,
}

/// What the RAG stage saw.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct EscalationSignals {
    /// The entropy monitor's final decision over the answer span. Under a combined score the
    /// monitor runs with τ = `f32::MAX` and only records.
    pub monitor: Decision,
    /// The configured (or requested) τ, for the reason.
    pub tau: f32,
    /// The monitor's statistic: the mean over the answer span's counted tokens.
    pub mean: Option<f32>,
    /// Generated tokens when the monitor decided.
    pub decided_at: Option<usize>,
    pub combined: Option<CombinedVerdict>,
    pub probe: Option<ProbeVerdict>,
    /// Not a single token of the answer carried content (empty, punctuation, only a preamble).
    pub no_content: bool,
    /// The base model said the context is insufficient (Self-Route prompt).
    pub declined: bool,
    /// "unanswerable" may be the final answer (`routing.abstain`); otherwise a decline is
    /// only ever a request for long context.
    pub abstention_allowed: bool,
    /// The path of the RAG answer (`rag` or `hybrid`).
    pub rag_path: RoutePath,
    pub fallback: Fallback,
}

/// What happens to the RAG answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Verdict {
    /// Whether the signals accept the answer (the monitor record's "accept" or "escalate").
    pub accepted: bool,
    /// The path that answers: the RAG path, or `lc` to escalate.
    pub path: RoutePath,
    pub reason: String,
}

/// Decide whether the RAG answer stands. An answer without content never counts as accepted,
/// nor does a decline, unless a combined score judges it where abstaining is an allowed answer;
/// with a combined score, P(wrong) reaching its threshold escalates however calm the entropy
/// was. The score reads `declined` among its inputs and learned from its dev split how often a
/// decline is wrong there (on SQuAD v2 "unanswerable" is often the right answer, and long
/// context rarely does better on it); where abstaining is not allowed, a decline is no answer.
pub(super) fn decide(s: &EscalationSignals) -> Verdict {
    let combined_escalates = s.combined.is_some_and(|c| c.p_wrong >= c.threshold);
    let accepted = !escalates_unscored(s, s.combined.is_some()) && !combined_escalates;
    let (path, reason) = match (accepted, &s.fallback) {
        (_, Fallback::Forced) => (
            s.rag_path,
            format!("route forced to {}", s.rag_path.as_str()),
        ),
        (true, _) => (s.rag_path, why_it_stands(s)),
        (false, Fallback::LongContext) => (RoutePath::Lc, format!("escalated: {}", why(s))),
        (false, Fallback::Unavailable(unavailable)) => (
            s.rag_path,
            format!("{}, but escalation is unavailable ({unavailable})", why(s)),
        ),
    };
    Verdict {
        accepted,
        path,
        reason,
    }
}

/// A calibrated threshold to four places for a reason (the file holds it whole): 0.9335, 0.5.
fn shown(threshold: f64) -> f64 {
    (threshold * 1e4).round() / 1e4
}

/// Whether the answer escalates whatever a combined score would say of it: the monitor, the
/// probe, an answer without content or a decline that escalates on its own. `scored` says
/// whether a combined score will judge it (`s.combined` may not be computed yet). A score can add
/// an escalation but never take one of these back, so an answer this settles needs nothing that
/// only the score reads (the samples, the self-check).
pub(super) fn escalates_unscored(s: &EscalationSignals, scored: bool) -> bool {
    s.monitor != Decision::Accept
        || s.probe.is_some_and(|p| p.escalates())
        || s.no_content
        || decline_escalates(s.declined, scored, s.abstention_allowed)
}

/// A decline escalates on its own unless a combined score judges it, which it does only where
/// "unanswerable" may stand as the answer.
fn decline_escalates(declined: bool, scored: bool, abstention_allowed: bool) -> bool {
    declined && !(scored && abstention_allowed)
}

fn declined_escalates(s: &EscalationSignals) -> bool {
    decline_escalates(s.declined, s.combined.is_some(), s.abstention_allowed)
}

/// Why an accepted answer stands: the signal that decided.
fn why_it_stands(s: &EscalationSignals) -> String {
    match s.combined {
        Some(c) => format!(
            "the combined score puts P(wrong) at {:.3} < {}",
            c.p_wrong,
            shown(c.threshold)
        ),
        None => format!(
            "the RAG answer's entropy stayed within τ (mean {})",
            s.mean.map_or("n/a".into(), |m| format!("{m:.3}"))
        ),
    }
}

/// Why an answer that was not accepted should escalate, the strongest signal first.
fn why(s: &EscalationSignals) -> String {
    if let Some(p) = s.probe.filter(ProbeVerdict::escalates) {
        format!(
            "the hidden-state probe scored {:.3} > {:.3} at the last prompt token",
            p.score, p.threshold
        )
    } else if declined_escalates(s) {
        "the base model said the context is insufficient".to_string()
    } else if s.no_content {
        "the RAG answer has no answer content".to_string()
    } else if let Some(c) = s.combined {
        format!(
            "the combined score puts P(wrong) at {:.3} ≥ {}",
            c.p_wrong,
            shown(c.threshold)
        )
    } else {
        format!(
            "the RAG answer's mean entropy exceeded τ = {} by step {}",
            s.tau,
            s.decided_at.unwrap_or(0)
        )
    }
}

#[cfg(test)]
mod tests {
    use triage_engine::entropy_monitor::{EntropyEstimator, EntropyMonitor, EntropyUnit};

    use super::*;

    const TAU: f32 = 0.5;

    /// A calm, contentful answer with long context to fall back on.
    fn calm() -> EscalationSignals {
        EscalationSignals {
            monitor: Decision::Accept,
            tau: TAU,
            mean: Some(0.1),
            decided_at: Some(3),
            combined: None,
            probe: None,
            no_content: false,
            declined: false,
            abstention_allowed: true,
            rag_path: RoutePath::Rag,
            fallback: Fallback::LongContext,
        }
    }

    fn unsure(s: &mut EscalationSignals) {
        s.monitor = Decision::Escalate { at_step: 2 };
        s.mean = Some(3.0);
        s.decided_at = Some(2);
    }

    fn combined(s: &mut EscalationSignals, p_wrong: f64) {
        s.combined = Some(CombinedVerdict {
            p_wrong,
            threshold: 0.5,
        });
    }

    fn unavailable(s: &mut EscalationSignals) {
        s.fallback = Fallback::Unavailable("the corpus is too long".into());
    }

    /// One row of a decision table: how the signals differ from [`calm`], and the verdict.
    struct Case {
        name: &'static str,
        change: fn(&mut EscalationSignals),
        accepted: bool,
        path: RoutePath,
        reason: &'static str,
    }

    fn check(cases: &[Case]) {
        for case in cases {
            let mut s = calm();
            (case.change)(&mut s);
            let expected = Verdict {
                accepted: case.accepted,
                path: case.path,
                reason: case.reason.to_string(),
            };
            assert_eq!(decide(&s), expected, "case {:?}: {s:?}", case.name);
        }
    }

    #[test]
    fn tau_decides_without_a_combined_score() {
        let stay = "the RAG answer's entropy stayed within τ (mean 0.100)";
        check(&[
            Case {
                name: "calm answer stands",
                change: |_| {},
                accepted: true,
                path: RoutePath::Rag,
                reason: stay,
            },
            Case {
                name: "hybrid answer keeps its path",
                change: |s| s.rag_path = RoutePath::Hybrid,
                accepted: true,
                path: RoutePath::Hybrid,
                reason: stay,
            },
            Case {
                name: "mean over τ escalates",
                change: unsure,
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the RAG answer's mean entropy exceeded τ = 0.5 by step 2",
            },
            Case {
                name: "mean over τ without a decision step",
                change: |s| {
                    unsure(s);
                    s.decided_at = None;
                },
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the RAG answer's mean entropy exceeded τ = 0.5 by step 0",
            },
        ]);
    }

    #[test]
    fn declines_and_answers_without_content_escalate_whatever_else_they_show() {
        check(&[
            Case {
                name: "decline escalates even when calm",
                change: |s| s.declined = true,
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the base model said the context is insufficient",
            },
            Case {
                name: "decline is named before no content and τ",
                change: |s| {
                    unsure(s);
                    s.declined = true;
                    s.no_content = true;
                },
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the base model said the context is insufficient",
            },
            Case {
                name: "no content escalates however calm",
                change: |s| s.no_content = true,
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the RAG answer has no answer content",
            },
            Case {
                name: "no content is named before the combined score",
                change: |s| {
                    combined(s, 0.9);
                    s.no_content = true;
                },
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the RAG answer has no answer content",
            },
        ]);
    }

    #[test]
    fn without_long_context_an_unaccepted_answer_is_kept_with_the_reason() {
        let stay = "the RAG answer's entropy stayed within τ (mean 0.100)";
        check(&[
            Case {
                name: "without escalation the decline is kept with the reason",
                change: |s| {
                    unavailable(s);
                    s.declined = true;
                },
                accepted: false,
                path: RoutePath::Rag,
                reason: "the base model said the context is insufficient, but escalation is \
                         unavailable (the corpus is too long)",
            },
            Case {
                name: "without escalation an unsure answer is kept with the reason",
                change: |s| {
                    unavailable(s);
                    unsure(s);
                },
                accepted: false,
                path: RoutePath::Rag,
                reason: "the RAG answer's mean entropy exceeded τ = 0.5 by step 2, but \
                         escalation is unavailable (the corpus is too long)",
            },
            Case {
                name: "without escalation a calm answer is accepted as usual",
                change: unavailable,
                accepted: true,
                path: RoutePath::Rag,
                reason: stay,
            },
        ]);
    }

    #[test]
    fn a_forced_route_keeps_the_answer_and_says_so() {
        check(&[
            Case {
                name: "a forced route keeps an unsure answer",
                change: |s| {
                    s.fallback = Fallback::Forced;
                    unsure(s);
                },
                accepted: false,
                path: RoutePath::Rag,
                reason: "route forced to rag",
            },
            Case {
                name: "a forced route keeps a calm hybrid answer",
                change: |s| {
                    s.fallback = Fallback::Forced;
                    s.rag_path = RoutePath::Hybrid;
                },
                accepted: true,
                path: RoutePath::Hybrid,
                reason: "route forced to hybrid",
            },
        ]);
    }

    #[test]
    fn the_combined_score_decides_instead_of_tau_and_judges_declines() {
        check(&[
            Case {
                name: "P(wrong) over the threshold escalates a calm answer",
                change: |s| combined(s, 0.9),
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the combined score puts P(wrong) at 0.900 ≥ 0.5",
            },
            Case {
                name: "P(wrong) exactly at the threshold escalates",
                change: |s| combined(s, 0.5),
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the combined score puts P(wrong) at 0.500 ≥ 0.5",
            },
            Case {
                name: "P(wrong) under the threshold keeps an answer whose mean is over τ",
                change: |s| {
                    combined(s, 0.1);
                    s.mean = Some(3.0);
                },
                accepted: true,
                path: RoutePath::Rag,
                reason: "the combined score puts P(wrong) at 0.100 < 0.5",
            },
            Case {
                name: "a NaN P(wrong) does not escalate",
                change: |s| combined(s, f64::NAN),
                accepted: true,
                path: RoutePath::Rag,
                reason: "the combined score puts P(wrong) at NaN < 0.5",
            },
            Case {
                name: "a calibrated threshold is shown to four places",
                change: |s| {
                    combined(s, 0.1);
                    s.combined = s.combined.map(|c| CombinedVerdict {
                        threshold: 0.933_510_475_768_914_1,
                        ..c
                    });
                },
                accepted: true,
                path: RoutePath::Rag,
                reason: "the combined score puts P(wrong) at 0.100 < 0.9335",
            },
            Case {
                name: "a decline the score trusts stands",
                change: |s| {
                    combined(s, 0.2);
                    s.declined = true;
                },
                accepted: true,
                path: RoutePath::Rag,
                reason: "the combined score puts P(wrong) at 0.200 < 0.5",
            },
            Case {
                name: "where abstaining is not an answer, a decline escalates whatever the score",
                change: |s| {
                    combined(s, 0.2);
                    s.declined = true;
                    s.abstention_allowed = false;
                },
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the base model said the context is insufficient",
            },
            Case {
                name: "a decline the score doubts escalates on the score",
                change: |s| {
                    combined(s, 0.7);
                    s.declined = true;
                },
                accepted: false,
                path: RoutePath::Lc,
                reason: "escalated: the combined score puts P(wrong) at 0.700 ≥ 0.5",
            },
            Case {
                name: "without escalation the score's reason is kept",
                change: |s| {
                    combined(s, 0.9);
                    unavailable(s);
                },
                accepted: false,
                path: RoutePath::Rag,
                reason: "the combined score puts P(wrong) at 0.900 ≥ 0.5, but escalation is \
                         unavailable (the corpus is too long)",
            },
        ]);
    }

    /// The monitor's decision on `values` over a window of 3.
    fn monitored(values: &[f32]) -> (Decision, Option<f32>) {
        let mut m =
            EntropyMonitor::new(TAU, 3, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        for &v in values {
            m.observe(v).unwrap();
        }
        (m.finish(), m.mean())
    }

    #[test]
    fn a_probe_over_its_threshold_escalates_a_calm_answer_and_says_why() {
        let mut s = calm();
        s.probe = Some(ProbeVerdict {
            score: 0.4,
            threshold: 0.5,
        });
        assert!(decide(&s).accepted);
        s.probe = Some(ProbeVerdict {
            score: 0.7,
            threshold: 0.5,
        });
        let v = decide(&s);
        assert!(!v.accepted && v.path == RoutePath::Lc);
        assert!(
            v.reason.contains("hidden-state probe scored 0.700"),
            "{}",
            v.reason
        );
        // A forced route still keeps the answer.
        s.fallback = Fallback::Forced;
        assert_eq!(decide(&s).path, RoutePath::Rag);
    }

    #[test]
    fn a_mean_exactly_at_tau_is_accepted_and_just_over_it_escalates() {
        let (monitor, mean) = monitored(&[TAU, TAU, TAU]);
        let at = decide(&EscalationSignals {
            monitor,
            mean,
            ..calm()
        });
        assert!(at.accepted, "{at:?}");
        assert_eq!(
            at.reason,
            "the RAG answer's entropy stayed within τ (mean 0.500)"
        );
        let (monitor, mean) = monitored(&[TAU, TAU, TAU + 0.01]);
        let over = decide(&EscalationSignals {
            monitor,
            mean,
            ..calm()
        });
        assert_eq!(over.path, RoutePath::Lc, "{over:?}");
    }

    #[test]
    fn an_answer_without_a_statistic_escalates_as_empty() {
        // No answer-span token: the monitor saw nothing, accepts, and has no mean.
        let (monitor, mean) = monitored(&[]);
        assert_eq!((monitor, mean), (Decision::Accept, None));
        let verdict = decide(&EscalationSignals {
            monitor,
            mean,
            no_content: true,
            ..calm()
        });
        assert_eq!(
            verdict.reason,
            "escalated: the RAG answer has no answer content"
        );
        // An accepted answer without a statistic says so rather than print a number.
        let verdict = decide(&EscalationSignals {
            monitor,
            mean,
            ..calm()
        });
        assert_eq!(
            verdict.reason,
            "the RAG answer's entropy stayed within τ (mean n/a)"
        );
    }
}
