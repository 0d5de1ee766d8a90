//! The τ sweep, offline: each query's forced-RAG answer (with the monitor's statistic) and
//! forced long-context answer, joined, give the accuracy and cost of "RAG, escalating when the
//! statistic exceeds τ" for every τ at the statistic's quantiles without rerunning a model —
//! the curve `triage calibrate` chooses from, the report's accuracy–cost plot and area, and
//! RouteLLM's performance gap recovered (PGR, APGR).

use std::collections::HashMap;

use serde::Serialize;

use triage_types::UNANSWERABLE;

use crate::results::ResultRow;
use crate::scoring::abstains;
use crate::system::System;

/// One query's two answers.
#[derive(Debug, Clone, PartialEq)]
pub struct RagLcPair {
    pub example: String,
    /// The monitor statistic of the RAG answer; `None` (no answer token) always escalates.
    pub statistic: Option<f64>,
    /// The RAG answer abstained ("unanswerable"): it escalates whatever τ, as in the pipeline.
    pub declined: bool,
    pub rag_value: f64,
    pub lc_value: f64,
    pub rag_tokens: f64,
    pub lc_tokens: f64,
    pub rag_cost: f64,
    pub lc_cost: f64,
}

impl RagLcPair {
    pub fn escalates(&self, tau: f64) -> bool {
        self.declined || self.statistic.is_none_or(|s| s > tau)
    }
}

/// Join the `rag` and `lc` rows by example, in the order of the `rag` rows.
pub fn rag_lc_pairs(rows: &[ResultRow]) -> Vec<RagLcPair> {
    let lc: HashMap<&str, &ResultRow> = rows
        .iter()
        .filter(|r| r.system == System::Lc)
        .map(|r| (r.example.as_str(), r))
        .collect();
    rows.iter()
        .filter(|r| r.system == System::Rag)
        .filter_map(|r| {
            let l = lc.get(r.example.as_str())?;
            Some(RagLcPair {
                example: r.example.clone(),
                statistic: r.rag_statistic,
                declined: abstains(&r.answer, UNANSWERABLE),
                rag_value: r.score.value,
                lc_value: l.score.value,
                rag_tokens: r.total_tokens() as f64,
                lc_tokens: l.total_tokens() as f64,
                rag_cost: r.cost,
                lc_cost: l.cost,
            })
        })
        .collect()
}

/// RAG escalating above τ, over a set of queries. The RAG answer is counted whole even when it
/// escalates (the engine stops it at the deciding token, so real runs cost a little less).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SweepPoint {
    pub tau: f64,
    pub escalation_rate: f64,
    pub accuracy: f64,
    pub mean_tokens: f64,
    pub mean_cost: f64,
}

pub fn point(pairs: &[RagLcPair], tau: f64) -> SweepPoint {
    let n = pairs.len().max(1) as f64;
    let (mut esc, mut acc, mut tokens, mut cost) = (0.0, 0.0, 0.0, 0.0);
    for p in pairs {
        let up = p.escalates(tau);
        esc += f64::from(u8::from(up));
        acc += if up { p.lc_value } else { p.rag_value };
        tokens += p.rag_tokens + if up { p.lc_tokens } else { 0.0 };
        cost += p.rag_cost + if up { p.lc_cost } else { 0.0 };
    }
    SweepPoint {
        tau,
        escalation_rate: esc / n,
        accuracy: acc / n,
        mean_tokens: tokens / n,
        mean_cost: cost / n,
    }
}

/// Every distinct split of `pairs` by their statistic, as τ: below the smallest value (every
/// answer with a statistic escalates), the midpoints between consecutive distinct values, and
/// the largest value (none escalates on its statistic), ascending. These are the quantiles of
/// the statistic, so no split is missed whatever its unit or scale (a fixed grid in steps of
/// 0.05 nats cannot split answers that all lie within 0.19 nats).
pub fn quantile_taus(pairs: &[RagLcPair]) -> Vec<f64> {
    let mut values: Vec<f64> = pairs
        .iter()
        .filter_map(|p| p.statistic)
        .filter(|s| s.is_finite())
        .collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    let (Some(&first), Some(&last)) = (values.first(), values.last()) else {
        // No statistic: every answer escalates at any τ.
        return vec![0.0];
    };
    let below = match values.get(1) {
        Some(&second) => first - (second - first) / 2.0,
        None => first - 0.5,
    };
    let mut taus = vec![below];
    taus.extend(values.windows(2).map(|w| w[0] + (w[1] - w[0]) / 2.0));
    taus.push(last);
    taus
}

/// `curve` (any order) at escalation rates 0, 1/`steps`, …, 1: for each, the point escalating
/// the most without exceeding it; duplicates dropped. For tables and plots of a long sweep.
pub fn by_escalation_rate(curve: &[SweepPoint], steps: usize) -> Vec<SweepPoint> {
    let mut out: Vec<SweepPoint> = Vec::new();
    for j in 0..=steps {
        let budget = j as f64 / steps.max(1) as f64 + 1e-12;
        let best = curve
            .iter()
            .filter(|p| p.escalation_rate <= budget)
            .max_by(|a, b| {
                a.escalation_rate
                    .total_cmp(&b.escalation_rate)
                    .then(b.mean_tokens.total_cmp(&a.mean_tokens))
            });
        if let Some(p) = best {
            if out.last() != Some(p) {
                out.push(*p);
            }
        }
    }
    out
}

/// RouteLLM's performance gap recovered: how much of the way from RAG's accuracy to long
/// context's a router's accuracy goes. `None` when the two tie (there is no gap). Where long
/// context scores below RAG the gap is negative, and so is the PGR of a router that beats RAG.
pub fn pgr(accuracy: f64, rag: f64, lc: f64) -> Option<f64> {
    ((lc - rag).abs() > 1e-12).then(|| (accuracy - rag) / (lc - rag))
}

/// RouteLLM's average PGR, as the area under PGR against the escalation rate over the quantile
/// sweep: from RAG alone (no escalation, PGR 0) through every split to escalating everything
/// (PGR 1). Escalating at random gives 0.5; a perfect signal, which escalates the answers LC
/// fixes first, gives 1 − f/2 where f is their share (0.75 when LC fixes half). `None` unless
/// long context scores above RAG: with a negative gap, the better a signal finds the answers LC
/// fixes, the more negative its PGR along the way, so the area would rank signals backwards.
pub fn apgr(pairs: &[RagLcPair]) -> Option<f64> {
    if pairs.is_empty() {
        return None;
    }
    let n = pairs.len() as f64;
    let rag = pairs.iter().map(|p| p.rag_value).sum::<f64>() / n;
    let lc = pairs.iter().map(|p| p.lc_value).sum::<f64>() / n;
    if lc <= rag + 1e-12 {
        return None;
    }
    let mut points: Vec<(f64, f64)> = quantile_taus(pairs)
        .into_iter()
        .chain([f64::NEG_INFINITY])
        .map(|t| point(pairs, t))
        .filter_map(|p| Some((p.escalation_rate, pgr(p.accuracy, rag, lc)?)))
        .collect();
    points.push((0.0, 0.0));
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    Some(
        points
            .windows(2)
            .map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0)
            .sum(),
    )
}

/// The area under the accuracy–tokens curve of every threshold, tokens scaled to [0, 1] from
/// RAG alone (nothing escalates) to RAG then LC for every query, with the accuracy at a cost
/// the best reached at that cost or less; and the same area for routing at random (the
/// straight line between the ends).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurveArea {
    pub area: f64,
    pub random: f64,
}

pub fn curve_area(pairs: &[RagLcPair]) -> Option<CurveArea> {
    if pairs.is_empty() {
        return None;
    }
    let mut taus: Vec<f64> = pairs.iter().filter_map(|p| p.statistic).collect();
    taus.push(f64::INFINITY);
    taus.push(f64::NEG_INFINITY);
    let mut points: Vec<SweepPoint> = taus.into_iter().map(|t| point(pairs, t)).collect();
    points.sort_by(|a, b| a.mean_tokens.total_cmp(&b.mean_tokens));
    let (lo, hi) = (points[0].mean_tokens, points[points.len() - 1].mean_tokens);
    let (first, last) = (points[0].accuracy, points[points.len() - 1].accuracy);
    if hi <= lo {
        return None;
    }
    let mut area = 0.0;
    let mut best = first;
    let mut prev = (0.0, first);
    for p in &points[1..] {
        let x = (p.mean_tokens - lo) / (hi - lo);
        let y = best.max(p.accuracy);
        area += (x - prev.0) * (prev.1 + y) / 2.0;
        best = y;
        prev = (x, y);
    }
    Some(CurveArea {
        area,
        random: (first + last) / 2.0,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query whose RAG answer costs 100 tokens (cost 1) and whose LC answer costs 1,000 (10).
    pub(crate) fn pair(statistic: Option<f64>, rag: bool, lc: bool) -> RagLcPair {
        RagLcPair {
            example: String::new(),
            statistic,
            declined: false,
            rag_value: f64::from(u8::from(rag)),
            lc_value: f64::from(u8::from(lc)),
            rag_tokens: 100.0,
            lc_tokens: 1_000.0,
            rag_cost: 1.0,
            lc_cost: 10.0,
        }
    }

    #[test]
    fn a_point_escalates_above_tau_and_always_without_a_statistic() {
        let pairs = [
            pair(Some(0.2), true, true),
            pair(Some(0.9), false, true),
            pair(None, false, true),
        ];
        let p = point(&pairs, 0.5);
        assert!((p.escalation_rate - 2.0 / 3.0).abs() < 1e-12);
        assert!((p.accuracy - 1.0).abs() < 1e-12);
        assert!((p.mean_tokens - (300.0 + 2_000.0) / 3.0).abs() < 1e-9);
        assert!((p.mean_cost - 23.0 / 3.0).abs() < 1e-9);
        // At τ = 0.9 the second query stays on RAG (not strictly above).
        assert!((point(&pairs, 0.9).accuracy - 2.0 / 3.0).abs() < 1e-12);
        // A declined answer escalates at any τ.
        let mut declined = pairs[0].clone();
        declined.declined = true;
        assert!(declined.escalates(f64::INFINITY) && !pairs[0].escalates(f64::INFINITY));
    }

    #[test]
    fn a_perfect_signal_has_a_larger_area_than_random() {
        // Wrong RAG answers have high statistics: escalating them first gains everything early.
        let pairs: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i < 5, true))
            .collect();
        // Accuracy climbs from 0.5 to 1 over the first half of the tokens, then stays:
        // 0.5·0.75 + 0.5·1.
        let a = curve_area(&pairs).unwrap();
        assert!((a.random - 0.75).abs() < 1e-12);
        assert!((a.area - 0.875).abs() < 1e-9, "{a:?}");
        // The reversed signal escalates the right answers first: flat at 0.5 for half the
        // tokens, then the climb: 0.5·0.5 + 0.5·0.75, worse than random.
        let reversed: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i >= 5, true))
            .collect();
        let b = curve_area(&reversed).unwrap();
        assert!((b.area - 0.625).abs() < 1e-9, "{b:?}");
    }

    #[test]
    fn quantile_taus_give_every_split_of_close_statistics() {
        // Statistics 0.01 nats apart (a grid in steps of 0.05 splits none of them), one tied.
        let pairs: Vec<RagLcPair> = [0.11, 0.12, 0.12, 0.13, 0.15]
            .iter()
            .map(|&s| pair(Some(s), true, true))
            .chain([pair(None, true, true)])
            .collect();
        let taus = quantile_taus(&pairs);
        assert_eq!(taus.len(), 5, "{taus:?}");
        let rates: Vec<f64> = taus
            .iter()
            .map(|&t| point(&pairs, t).escalation_rate * 6.0)
            .collect();
        // The answer without a statistic always escalates; with it, all five answers that
        // have one, then 4 (the tie goes together), 2, 1 and none of them.
        for (rate, want) in rates.iter().zip([6.0, 5.0, 3.0, 2.0, 1.0]) {
            assert!((rate - want).abs() < 1e-9, "{rates:?}");
        }
        assert!(taus.windows(2).all(|w| w[0] < w[1]), "{taus:?}");
        assert_eq!(quantile_taus(&[pair(None, true, true)]), vec![0.0]);
    }

    #[test]
    fn the_sweep_thinned_by_escalation_rate_keeps_the_most_escalating_point_per_budget() {
        let pairs: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i < 5, true))
            .collect();
        let curve: Vec<SweepPoint> = quantile_taus(&pairs)
            .into_iter()
            .map(|t| point(&pairs, t))
            .collect();
        let thin = by_escalation_rate(&curve, 4);
        let rates: Vec<f64> = thin.iter().map(|p| p.escalation_rate).collect();
        // Budgets 0, 0.25, 0.5, 0.75, 1 with tenths available: 0, 0.2, 0.5, 0.7, 1.
        assert_eq!(rates, vec![0.0, 0.2, 0.5, 0.7, 1.0]);
    }

    #[test]
    fn pgr_and_apgr_of_perfect_random_and_reversed_signals() {
        assert_eq!(pgr(0.75, 0.5, 1.0), Some(0.5));
        assert_eq!(pgr(0.7, 0.6, 0.6), None);
        // LC below RAG: a router that beats RAG recovers a negative share of the gap.
        assert!(pgr(0.7, 0.6, 0.4).unwrap() < 0.0);
        // Wrong RAG answers (LC right on all) have the high statistics: escalating them first
        // recovers the whole gap by half the queries. PGR climbs 0 → 1 over [0, 0.5], then
        // stays: 0.25 + 0.5.
        let perfect: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i < 5, true))
            .collect();
        assert!((apgr(&perfect).unwrap() - 0.75).abs() < 1e-9);
        // Reversed: right answers go first, PGR flat at 0 until half, then 0 → 1: 0.25.
        let reversed: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i >= 5, true))
            .collect();
        assert!((apgr(&reversed).unwrap() - 0.25).abs() < 1e-9);
        // A signal that cannot separate anything (one value) jumps from 0 to all: 0.5.
        let flat: Vec<RagLcPair> = (0..10).map(|i| pair(Some(1.0), i < 5, true)).collect();
        assert!((apgr(&flat).unwrap() - 0.5).abs() < 1e-9);
        // LC below RAG: a perfect signal's PGR goes negative before it reaches 1, so there is
        // no APGR to report.
        let below: Vec<RagLcPair> = (0..10)
            .map(|i| pair(Some(f64::from(i)), i < 8, !(4..8).contains(&i)))
            .collect();
        assert_eq!(apgr(&below), None);
        // No gap, no APGR.
        let tie: Vec<RagLcPair> = (0..4)
            .map(|i| pair(Some(f64::from(i)), true, true))
            .collect();
        assert_eq!(apgr(&tie), None);
    }
}
