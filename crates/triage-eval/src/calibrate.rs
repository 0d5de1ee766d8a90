//! `triage calibrate`'s choice of τ from dev results, among the quantiles of the RAG answers'
//! statistic (every distinct split of the dev answers, `sweep::quantile_taus`): by default the
//! elbow of the accuracy–cost curve (where a lower τ's marginal accuracy gain falls below its
//! marginal cost, priced at the exchange rate of going from RAG alone to RAG then LC for every
//! query), and when an accuracy floor is set and the elbow misses it, the cheapest τ that meets
//! it; the cheapest τ meeting a floor outright (the frozen operating point of a headline pair);
//! or the τ that escalates a target share of the dev answers.

use sha2::{Digest, Sha256};
use triage_types::{Calibration, TauRecord};

use crate::error::{EvalError, Result};
use crate::results::ResultRow;
use crate::suites::Split;
use crate::sweep::{point, quantile_taus, rag_lc_pairs, RagLcPair, SweepPoint};
use crate::system::System;

/// An accuracy floor for τ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Floor {
    None,
    /// Accuracy at least this.
    Accuracy(f64),
    /// Accuracy at least this fraction of long context's.
    Retained(f64),
}

/// How τ is picked among the quantiles of the dev statistic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The elbow, or the cheapest τ meeting the floor where the elbow misses it.
    Elbow(Floor),
    /// The cheapest τ meeting the floor, whatever the elbow: "at least this much of long
    /// context's accuracy for the fewest tokens".
    Cheapest(Floor),
    /// The τ escalating the largest share of the dev answers not above this one (the
    /// statistic's quantile at one minus it).
    EscalationRate(f64),
}

/// The sweep and the τ chosen from it.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub tau: f64,
    pub rule: String,
    pub at: SweepPoint,
    /// One point per quantile τ, ascending τ.
    pub curve: Vec<SweepPoint>,
    pub rag_accuracy: f64,
    pub lc_accuracy: f64,
    pub lc_tokens: f64,
}

/// Choose τ for `pairs` by `rule`.
pub fn choose(pairs: &[RagLcPair], rule: Rule) -> Result<Chosen> {
    if pairs.is_empty() {
        return Err(EvalError::Invalid(
            "calibration needs queries answered by both the rag and the lc systems".into(),
        ));
    }
    let n = pairs.len() as f64;
    let rag_accuracy = pairs.iter().map(|p| p.rag_value).sum::<f64>() / n;
    let lc_accuracy = pairs.iter().map(|p| p.lc_value).sum::<f64>() / n;
    let lc_tokens = pairs.iter().map(|p| p.lc_tokens).sum::<f64>() / n;
    let curve: Vec<SweepPoint> = quantile_taus(pairs)
        .into_iter()
        .map(|t| point(pairs, t))
        .collect();
    let (at, rule) = match rule {
        Rule::Elbow(floor) => elbow_or_floor(pairs, &curve, floor, lc_accuracy)?,
        Rule::Cheapest(floor) => match floor.min_accuracy(lc_accuracy) {
            Some(a) => (cheapest_meeting(&curve, a, lc_accuracy)?, format!("cheapest τ with accuracy ≥ {a:.3}")),
            None => {
                return Err(EvalError::Invalid(
                    "the cheapest τ needs an accuracy floor (a minimum accuracy or share of long context's)".into(),
                ))
            }
        },
        Rule::EscalationRate(rate) => at_escalation_rate(&curve, rate)?,
    };
    Ok(Chosen {
        tau: at.tau,
        rule,
        at,
        curve,
        rag_accuracy,
        lc_accuracy,
        lc_tokens,
    })
}

impl Rule {
    /// The accuracy the rule's floor asks for, given long context's (none for the escalation
    /// rate, which has no floor).
    pub fn floor_accuracy(self, lc_accuracy: f64) -> Option<f64> {
        match self {
            Rule::Elbow(floor) | Rule::Cheapest(floor) => floor.min_accuracy(lc_accuracy),
            Rule::EscalationRate(_) => None,
        }
    }
}

/// Whether operating point `other` beats `mine`, two points chosen by one rule on the same dev
/// questions (long context's answers shared, e.g. RAG asked with and without Self-Route's
/// decline offer): where both reach `floor` the cheaper wins, otherwise the more accurate, and
/// the cheaper of equals; a tie keeps `mine`.
pub fn beats(other: &SweepPoint, mine: &SweepPoint, floor: Option<f64>) -> bool {
    let reaches = |p: &SweepPoint| floor.is_some_and(|a| p.accuracy + 1e-12 >= a);
    let cheaper = other.mean_tokens < mine.mean_tokens;
    if reaches(other) && reaches(mine) {
        return cheaper;
    }
    match other.accuracy.total_cmp(&mine.accuracy) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => cheaper,
    }
}

impl Floor {
    /// The accuracy this floor asks for, given long context's.
    fn min_accuracy(self, lc_accuracy: f64) -> Option<f64> {
        match self {
            Floor::None => None,
            Floor::Accuracy(a) => Some(a),
            Floor::Retained(f) => Some(f * lc_accuracy),
        }
    }
}

/// The exchange rate the elbow prices cost at: accuracy per unit cost from never escalating to
/// always. Where long context is no better than RAG that rate is not positive and would reward
/// cost, so the rate runs from never to the most accurate point instead; where nothing beats
/// RAG alone, cost is all there is and the rate is infinite (the elbow is the cheapest point).
fn exchange_rate(pairs: &[RagLcPair], curve: &[SweepPoint]) -> f64 {
    let never = point(pairs, f64::INFINITY);
    let rate_to = |p: &SweepPoint| {
        (p.mean_cost > never.mean_cost)
            .then(|| (p.accuracy - never.accuracy) / (p.mean_cost - never.mean_cost))
            .filter(|r| *r > 0.0)
    };
    let best = curve.iter().max_by(|x, y| {
        x.accuracy
            .total_cmp(&y.accuracy)
            .then(y.mean_cost.total_cmp(&x.mean_cost))
    });
    rate_to(&point(pairs, f64::NEG_INFINITY))
        .or_else(|| best.and_then(rate_to))
        .unwrap_or(f64::INFINITY)
}

/// The elbow maximises accuracy − rate · cost (ties to the larger, cheaper τ); a floor it misses
/// takes the cheapest point that meets it.
fn elbow_or_floor(
    pairs: &[RagLcPair],
    curve: &[SweepPoint],
    floor: Floor,
    lc_accuracy: f64,
) -> Result<(SweepPoint, String)> {
    let rate = exchange_rate(pairs, curve);
    let value = |p: &SweepPoint| {
        if rate.is_finite() {
            p.accuracy - rate * p.mean_cost
        } else {
            -p.mean_cost
        }
    };
    let elbow = curve
        .iter()
        .rev()
        .fold(None::<&SweepPoint>, |best, p| match best {
            Some(b) if value(b) >= value(p) - 1e-12 => Some(b),
            _ => Some(p),
        })
        .copied()
        .ok_or_else(|| EvalError::Invalid("no statistic to choose τ from".into()))?;
    match floor.min_accuracy(lc_accuracy) {
        Some(a) if elbow.accuracy + 1e-12 < a => Ok((
            cheapest_meeting(curve, a, lc_accuracy)?,
            format!(
                "cheapest τ with accuracy ≥ {a:.3} (the elbow has {:.3})",
                elbow.accuracy
            ),
        )),
        Some(a) => Ok((elbow, format!("elbow (meets accuracy ≥ {a:.3})"))),
        None => Ok((elbow, "elbow".into())),
    }
}

/// The cheapest point with accuracy at least `a` (the larger τ of equals), or an error naming
/// the best this dev set reaches.
fn cheapest_meeting(curve: &[SweepPoint], a: f64, lc_accuracy: f64) -> Result<SweepPoint> {
    let cheapest = curve
        .iter()
        .filter(|p| p.accuracy + 1e-12 >= a)
        .min_by(|x, y| {
            x.mean_cost
                .total_cmp(&y.mean_cost)
                .then(y.tau.total_cmp(&x.tau))
        })
        .copied();
    cheapest.ok_or_else(|| {
        match curve
            .iter()
            .max_by(|x, y| x.accuracy.total_cmp(&y.accuracy))
        {
            Some(best) => EvalError::Invalid(format!(
                "no τ reaches accuracy {a:.3} on this dev set (best {:.3} at τ = {}, {:.1}% \
             escalated; long context alone {lc_accuracy:.3})",
                best.accuracy,
                best.tau,
                100.0 * best.escalation_rate
            )),
            None => EvalError::Invalid("no statistic to choose τ from".into()),
        }
    })
}

/// The point escalating the most without exceeding `rate` (the cheapest of equals).
fn at_escalation_rate(curve: &[SweepPoint], rate: f64) -> Result<(SweepPoint, String)> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(EvalError::Invalid(format!(
            "a target escalation rate is a share in [0, 1], not {rate}"
        )));
    }
    let best = curve
        .iter()
        .filter(|p| p.escalation_rate <= rate + 1e-12)
        .max_by(|a, b| {
            a.escalation_rate
                .total_cmp(&b.escalation_rate)
                .then(b.mean_cost.total_cmp(&a.mean_cost))
        })
        .copied();
    let least = curve
        .iter()
        .map(|p| p.escalation_rate)
        .fold(f64::INFINITY, f64::min);
    let p = best.ok_or_else(|| {
        EvalError::Invalid(format!(
            "no τ escalates at most {:.1}% of this dev set: declined answers and answers without \
             a statistic escalate at any τ ({:.1}%)",
            100.0 * rate,
            100.0 * least
        ))
    })?;
    Ok((
        p,
        format!(
            "escalation rate ≤ {:.1}% (dev: {:.1}%)",
            100.0 * rate,
            100.0 * p.escalation_rate
        ),
    ))
}

/// SHA-256 over the dev examples' ids, questions and gold answers, in id order.
pub fn data_hash(rows: &[ResultRow]) -> String {
    let mut items: Vec<(&str, &str, &[String])> = rows
        .iter()
        .filter(|r| r.system == System::Rag)
        .map(|r| (r.example.as_str(), r.question.as_str(), r.golds.as_slice()))
        .collect();
    items.sort();
    let mut h = Sha256::new();
    for (id, q, golds) in items {
        h.update(id.as_bytes());
        h.update([0]);
        h.update(q.as_bytes());
        for g in golds {
            h.update([0]);
            h.update(g.as_bytes());
        }
        h.update([1]);
    }
    format!("{:x}", h.finalize())
}

/// What a τ only holds for: the model, estimator, unit and window it was applied with.
pub(crate) fn monitor_settings(tau: &TauRecord) -> impl PartialEq + std::fmt::Debug + '_ {
    (tau.model.as_str(), tau.estimator, tau.unit, tau.window)
}

/// Calibrate τ from the `rag` and `lc` rows of a dev run.
pub fn calibrate(rows: &[ResultRow], rule: Rule) -> Result<(Chosen, Calibration)> {
    let tau = dev_monitor_settings(rows)?;
    let pairs = rag_lc_pairs(rows);
    let chosen = choose(&pairs, rule)?;
    let calibration = calibration_record(rows, &tau, pairs.len(), &chosen);
    Ok((chosen, calibration))
}

/// The monitor settings the dev `rows`' RAG answers were recorded under, checking that every
/// row is from the dev split and every RAG answer had the same settings.
pub(crate) fn dev_monitor_settings(rows: &[ResultRow]) -> Result<TauRecord> {
    if rows.is_empty() {
        return Err(EvalError::Invalid("the results file is empty".into()));
    }
    if let Some(r) = rows.iter().find(|r| r.split != Split::Dev) {
        return Err(EvalError::Invalid(format!(
            "τ is tuned on dev only; {} is from the {} split",
            r.example,
            r.split.as_str()
        )));
    }
    // The monitor's settings and model, from the RAG answers' decision records.
    let taus: Vec<&TauRecord> = rows
        .iter()
        .filter(|r| r.system == System::Rag)
        .filter_map(|r| r.decision.monitor.as_ref().map(|m| &m.tau))
        .collect();
    let Some(tau) = taus.first() else {
        return Err(EvalError::Invalid(
            "no rag answer carries a monitor record: run triage eval with the rag and lc systems"
                .into(),
        ));
    };
    if let Some(other) = taus
        .iter()
        .find(|t| monitor_settings(t) != monitor_settings(tau))
    {
        return Err(EvalError::Invalid(format!(
            "the rag answers were monitored with different settings ({:?} and {:?}); \
             calibrate one model and estimator at a time",
            monitor_settings(tau),
            monitor_settings(other)
        )));
    }
    Ok((*tau).clone())
}

/// What the routing file records of a choice made on `queries` dev pairs of `rows`.
pub(crate) fn calibration_record(
    rows: &[ResultRow],
    tau: &TauRecord,
    queries: usize,
    chosen: &Chosen,
) -> Calibration {
    Calibration {
        model: tau.model.clone(),
        estimator: tau.estimator,
        unit: tau.unit,
        window: tau.window,
        suite: rows.first().map(|r| r.suite.clone()).unwrap_or_default(),
        split: Split::Dev.as_str().to_string(),
        queries,
        data_sha256: data_hash(rows),
        rule: chosen.rule.clone(),
        accuracy: chosen.at.accuracy,
        rag_accuracy: chosen.rag_accuracy,
        lc_accuracy: chosen.lc_accuracy,
        escalation_rate: chosen.at.escalation_rate,
        accuracy_retained: if chosen.lc_accuracy > 0.0 {
            chosen.at.accuracy / chosen.lc_accuracy
        } else {
            f64::NAN
        },
        token_reduction: 1.0 - chosen.at.mean_tokens / chosen.lc_tokens.max(1.0),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn of_two_settings_the_cheaper_wins_above_the_floor_and_the_more_accurate_below_it() {
        let at = |accuracy: f64, mean_tokens: f64| SweepPoint {
            tau: 0.5,
            escalation_rate: 0.1,
            accuracy,
            mean_tokens,
            mean_cost: mean_tokens / 1e6,
        };
        let floor = Some(0.40);
        // Both reach the floor: fewer tokens wins, even at lower accuracy.
        assert!(beats(&at(0.41, 900.0), &at(0.45, 5_000.0), floor));
        assert!(!beats(&at(0.45, 5_000.0), &at(0.41, 900.0), floor));
        // One reaches it: it is the more accurate, and wins whatever it costs.
        assert!(beats(&at(0.42, 6_000.0), &at(0.30, 700.0), floor));
        assert!(!beats(&at(0.30, 700.0), &at(0.42, 6_000.0), floor));
        // Neither, or no floor: the more accurate; equals go to the cheaper; a tie stays.
        assert!(beats(&at(0.35, 9_000.0), &at(0.30, 700.0), floor));
        assert!(beats(&at(0.35, 9_000.0), &at(0.30, 700.0), None));
        assert!(beats(&at(0.30, 600.0), &at(0.30, 700.0), None));
        assert!(!beats(&at(0.30, 700.0), &at(0.30, 700.0), None));
        let floor = Rule::Cheapest(Floor::Retained(0.95))
            .floor_accuracy(0.4)
            .unwrap();
        assert!((floor - 0.38).abs() < 1e-12, "{floor}");
        assert_eq!(Rule::EscalationRate(0.2).floor_accuracy(0.4), None);
    }

    fn pair(statistic: f64, rag: bool, lc: bool) -> RagLcPair {
        crate::sweep::tests::pair(Some(statistic), rag, lc)
    }

    /// RAG is right below statistic 1.0 and wrong from it on; LC is always right.
    fn pairs() -> Vec<RagLcPair> {
        (0..20)
            .map(|i| {
                let s = f64::from(i) / 10.0;
                pair(s, s < 1.0, true)
            })
            .collect()
    }

    #[test]
    fn the_elbow_escalates_exactly_the_wrong_answers() {
        let c = choose(&pairs(), Rule::Elbow(Floor::None)).unwrap();
        // Escalating statistics > τ: τ in [0.9, 1.0) escalates all ten wrong answers and no
        // right one; the quantile τ there is the midpoint, 0.95.
        assert!((c.tau - 0.95).abs() < 1e-9, "{}", c.tau);
        assert!((c.at.accuracy - 1.0).abs() < 1e-12);
        assert!((c.at.escalation_rate - 0.5).abs() < 1e-12);
        assert_eq!((c.rag_accuracy, c.lc_accuracy), (0.5, 1.0));
    }

    #[test]
    fn a_floor_the_elbow_misses_takes_the_cheapest_tau_that_meets_it() {
        // RAG is wrong at statistics 0.3, 1.2, 1.5, 1.8 and 1.9; LC is always right. The
        // exchange rate is 0.25 accuracy per 10 cost units: fixing an answer gains 0.05 and
        // escalating one costs 0.0125, so the elbow escalates the top eight (τ in [1.1, 1.2),
        // fixing four: accuracy 0.95) and leaves the lone wrong answer at 0.3 alone.
        let ps: Vec<RagLcPair> = (0..20)
            .map(|i| pair(f64::from(i) / 10.0, ![3, 12, 15, 18, 19].contains(&i), true))
            .collect();
        let elbow = choose(&ps, Rule::Elbow(Floor::None)).unwrap();
        assert!((elbow.tau - 1.15).abs() < 1e-9, "{}", elbow.tau);
        assert!((elbow.at.accuracy - 0.95).abs() < 1e-12);
        // A floor the elbow meets keeps it.
        let met = choose(&ps, Rule::Elbow(Floor::Retained(0.9))).unwrap();
        assert_eq!(met.tau, elbow.tau);
        assert!(met.rule.starts_with("elbow"), "{}", met.rule);
        // Accuracy 0.99 needs the answer at 0.3 escalated: the largest such τ is 0.25.
        let floor = choose(&ps, Rule::Elbow(Floor::Accuracy(0.99))).unwrap();
        assert!((floor.tau - 0.25).abs() < 1e-9, "{}", floor.tau);
        assert!(floor.rule.contains("cheapest"), "{}", floor.rule);
        // Above what escalating everything reaches, no τ does: a clear error.
        let err = choose(&ps, Rule::Elbow(Floor::Retained(1.01))).unwrap_err();
        assert!(
            err.to_string().contains("no τ reaches accuracy 1.010"),
            "{err}"
        );
    }

    #[test]
    fn with_long_context_below_rag_the_elbow_does_not_buy_cost() {
        // kv-retrieval at 16k: LC is right on fewer answers than RAG, so never→always loses
        // accuracy, a negative exchange rate that once rewarded cost (75 % escalated there).
        // Here RAG is wrong at the top four statistics (16..19); LC fixes 19, 18 and 16, misses
        // 17, and is wrong on 10..15 where RAG is right: LC 0.65 against RAG 0.8.
        let ps: Vec<RagLcPair> = (0..20)
            .map(|i| pair(f64::from(i), i < 16, i < 10 || [16, 18, 19].contains(&i)))
            .collect();
        let c = choose(&ps, Rule::Elbow(Floor::None)).unwrap();
        // Priced from never to the most accurate point (the top four, 0.95), the elbow is the
        // top two: two fixes for two escalations, above that chord; the next two escalations
        // buy one fix.
        assert!((c.at.accuracy - 0.9).abs() < 1e-12, "{:?}", c.at);
        assert!((c.at.escalation_rate - 0.1).abs() < 1e-12, "{:?}", c.at);
        // Where escalating never helps, the elbow is not to escalate.
        let hopeless: Vec<RagLcPair> = (0..20).map(|i| pair(f64::from(i), i < 16, i < 8)).collect();
        let c = choose(&hopeless, Rule::Elbow(Floor::None)).unwrap();
        assert_eq!(c.at.escalation_rate, 0.0, "{:?}", c.at);
    }

    #[test]
    fn the_cheapest_rule_takes_the_cheapest_tau_over_the_floor_even_below_the_elbow() {
        let ps = pairs();
        // The elbow escalates all ten wrong answers (accuracy 1.0); 90 % of LC needs only the
        // top eight.
        let c = choose(&ps, Rule::Cheapest(Floor::Retained(0.9))).unwrap();
        assert!((c.at.accuracy - 0.9).abs() < 1e-12, "{:?}", c.at);
        assert!((c.at.escalation_rate - 0.4).abs() < 1e-12, "{:?}", c.at);
        assert!(
            c.rule.starts_with("cheapest τ with accuracy ≥ 0.900"),
            "{}",
            c.rule
        );
        // RAG alone meeting the floor escalates nothing.
        let c = choose(&ps, Rule::Cheapest(Floor::Accuracy(0.5))).unwrap();
        assert_eq!(c.at.escalation_rate, 0.0);
        assert!(choose(&ps, Rule::Cheapest(Floor::None)).is_err());
        assert!(choose(&ps, Rule::Cheapest(Floor::Retained(1.01))).is_err());
    }

    #[test]
    fn quantiles_split_statistics_no_grid_could() {
        // kv-retrieval's case: every statistic within 0.19 nats, the wrong answers the top
        // three (0.170, 0.175, 0.180), 0.005 nats apart; a 0.05-nat grid escalates all or none
        // of them.
        let ps: Vec<RagLcPair> = (0..20)
            .map(|i| pair(0.085 + 0.005 * f64::from(i), i < 17, true))
            .collect();
        let c = choose(&ps, Rule::Elbow(Floor::None)).unwrap();
        assert!((c.at.accuracy - 1.0).abs() < 1e-12 && (c.at.escalation_rate - 0.15).abs() < 1e-12);
        assert!(c.tau > 0.165 && c.tau < 0.170, "{}", c.tau);
        assert_eq!(c.curve.len(), 21);
    }

    #[test]
    fn a_target_escalation_rate_takes_the_quantile_that_meets_it() {
        let ps = pairs();
        // A fifth of twenty: the four largest statistics (1.6..1.9) escalate.
        let c = choose(&ps, Rule::EscalationRate(0.2)).unwrap();
        assert!((c.at.escalation_rate - 0.2).abs() < 1e-12, "{:?}", c.at);
        assert!((c.tau - 1.55).abs() < 1e-9, "{}", c.tau);
        assert!(c.rule.contains("20.0%"), "{}", c.rule);
        // Between quantiles, the one below: 0.23 escalates four, not five.
        let c = choose(&ps, Rule::EscalationRate(0.23)).unwrap();
        assert!((c.at.escalation_rate - 0.2).abs() < 1e-12);
        // Declined answers escalate at any τ: a target under their share cannot be met.
        let mut declined = ps.clone();
        for p in declined.iter_mut().take(3) {
            p.declined = true;
        }
        let err = choose(&declined, Rule::EscalationRate(0.1)).unwrap_err();
        assert!(err.to_string().contains("(15.0%)"), "{err}");
        assert!(choose(&ps, Rule::EscalationRate(1.5)).is_err());
    }

    /// A monitor record like the engine's, with `estimator` (as named in JSON).
    pub(crate) fn monitor_record(estimator: &str) -> triage_types::MonitorRecord {
        let nan = f32::NAN;
        triage_types::MonitorRecord {
            tau: TauRecord {
                tau: 0.6,
                model: "qwen2.5-coder-0.5b".into(),
                estimator: serde_json::from_value(serde_json::json!(estimator)).unwrap(),
                unit: triage_types::EntropyUnit::Nats,
                window: 30,
            },
            trace: Vec::new(),
            in_answer_span: Vec::new(),
            mean: None,
            decided_at: None,
            decision: triage_types::MonitorVerdict::Accept,
            signals: triage_types::AnswerSignals {
                mean_entropy: nan,
                span_mean_entropy: nan,
                max_entropy: nan,
                mean_nll: nan,
                mean_top2_margin: nan,
                declined: false,
                min_token_prob: nan,
                span_max_entropy: nan,
                sample_agreement: nan,
                self_check: nan,
            },
            grounding: None,
            probe: None,
            probe_score: None,
            probe_threshold: None,
            combined_p_wrong: None,
            combined_threshold: None,
            rag_answer: String::new(),
        }
    }

    /// rag and lc rows of `n` queries: RAG right on the low-statistic half, LC always right,
    /// the RAG rows carrying a monitor record like the engine's.
    fn rows(n: usize, estimator: &str) -> Vec<ResultRow> {
        use crate::results::tests::row;
        let mut out = Vec::new();
        for i in 0..n {
            let e = format!("e{i}");
            let mut rag = row("rag", &e, i < n / 2, 100);
            rag.rag_statistic = Some(i as f64 / n as f64 * 2.0);
            rag.decision.monitor = Some(monitor_record(estimator));
            out.push(rag);
            out.push(row("lc", &e, true, 1_000));
        }
        out
    }

    #[test]
    fn calibration_records_the_monitor_settings_and_the_dev_data() {
        let r = rows(20, "full_softmax");
        let (chosen, c) = calibrate(&r, Rule::Elbow(Floor::None)).unwrap();
        assert_eq!(c.model, "qwen2.5-coder-0.5b");
        assert_eq!((c.window, c.queries), (30, 20));
        assert_eq!(
            (c.suite.as_str(), c.split.as_str()),
            ("kv-retrieval", "dev")
        );
        // The ten wrong RAG answers have statistics 1.0 to 1.9: τ just under 1.0 escalates
        // exactly them.
        assert!((chosen.tau - 0.95).abs() < 1e-9, "{}", chosen.tau);
        assert!((c.accuracy - 1.0).abs() < 1e-12 && (c.escalation_rate - 0.5).abs() < 1e-12);
        assert_eq!(c.data_sha256, data_hash(&r));
        assert_eq!(c.data_sha256.len(), 64);
        // Another question set hashes differently.
        assert_ne!(data_hash(&rows(19, "full_softmax")), c.data_sha256);
    }

    #[test]
    fn calibration_refuses_test_rows_and_mixed_monitor_settings() {
        let mut r = rows(10, "full_softmax");
        r[0].split = Split::Test;
        let err = calibrate(&r, Rule::Elbow(Floor::None)).unwrap_err();
        assert!(err.to_string().contains("dev only"), "{err}");
        let mut r = rows(10, "full_softmax");
        r.extend(rows(10, "sampled_nll").into_iter().map(|mut x| {
            x.example = format!("other-{}", x.example);
            x
        }));
        let err = calibrate(&r, Rule::Elbow(Floor::None)).unwrap_err();
        assert!(err.to_string().contains("different settings"), "{err}");
        let err = calibrate(&[], Rule::Elbow(Floor::None)).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
