//! The τ sweep, offline: each query's forced-RAG answer (with the monitor's statistic) and
//! forced long-context answer, joined, give the accuracy and cost of "RAG, escalating when the
//! statistic exceeds τ" for every τ without rerunning a model — the curve `triage calibrate`
//! chooses from and the report's accuracy–cost plot and area.

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

/// τ from `min` to `max` in `step`s, both ends included.
pub fn tau_grid(min: f64, max: f64, step: f64) -> Vec<f64> {
    let steps = ((max - min) / step).round().max(0.0) as usize;
    (0..=steps)
        .map(|i| ((min + i as f64 * step) * 1e6).round() / 1e6)
        .collect()
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
    fn the_grid_includes_both_ends() {
        let g = tau_grid(0.5, 2.5, 0.05);
        assert_eq!(g.len(), 41);
        assert_eq!((g[0], g[40]), (0.5, 2.5));
    }
}
