//! The combined score's part of a run's report, where the RAG answers recorded P(wrong) (a run
//! under `[routing.monitor] combined_score`): its AUROC for a wrong RAG answer and for "long
//! context fixes it", and the offline sweep over its quantiles, each decline judged by the
//! score as the pipeline judges it (not forced up as under τ).

use std::collections::HashMap;

use serde::Serialize;
use triage_policy::auroc;

use crate::combined_calibration::{abstention_allowed, judged_by_score};
use crate::results::ResultRow;
use crate::sweep::{
    apgr, by_escalation_rate, curve_area, point, quantile_taus, rag_lc_pairs, CurveArea, SweepPoint,
};
use crate::system::System;

/// The combined score over a run's paired rag and lc answers.
#[derive(Debug, Clone, Serialize)]
pub struct CombinedSweep {
    /// RAG answers that recorded P(wrong).
    pub n: usize,
    /// The threshold the run's routing escalated at (P(wrong) ≥ it).
    pub threshold: Option<f64>,
    pub auroc_wrong: Option<f64>,
    pub auroc_lc_fixes: Option<f64>,
    /// At every 5% of escalation, P(wrong) as τ (escalating strictly above).
    pub sweep: Vec<SweepPoint>,
    pub area: Option<CurveArea>,
    pub apgr: Option<f64>,
}

/// `None` unless some `rag` row of `rows` (the queries every system answered) recorded P(wrong).
pub fn combined_sweep(rows: &[ResultRow]) -> Option<CombinedSweep> {
    let monitors: Vec<(&ResultRow, Option<f64>, Option<f64>)> = rows
        .iter()
        .filter(|r| r.system == System::Rag)
        .filter_map(|r| {
            let m = r.decision.monitor.as_ref()?;
            Some((r, m.combined_p_wrong, m.combined_threshold))
        })
        .collect();
    if monitors.iter().all(|(_, p, _)| p.is_none()) {
        return None;
    }
    let scores: HashMap<&str, Option<f64>> = monitors
        .iter()
        .map(|(r, p, _)| (r.example.as_str(), *p))
        .collect();
    let pairs = judged_by_score(rag_lc_pairs(rows), &scores, abstention_allowed(rows));
    let scored: Vec<(f64, bool, bool)> = pairs
        .iter()
        .filter_map(|p| {
            let wrong = p.rag_value < 1.0;
            Some((p.statistic?, wrong, wrong && p.lc_value >= 1.0))
        })
        .collect();
    let column = |f: fn(&(f64, bool, bool)) -> bool| -> (Vec<f64>, Vec<bool>) {
        scored.iter().map(|x| (x.0, f(x))).unzip()
    };
    let (s, wrong) = column(|x| x.1);
    let (_, fixes) = column(|x| x.2);
    let curve: Vec<SweepPoint> = quantile_taus(&pairs)
        .into_iter()
        .map(|t| point(&pairs, t))
        .collect();
    Some(CombinedSweep {
        n: scored.len(),
        threshold: monitors.iter().find_map(|(_, _, t)| *t),
        auroc_wrong: auroc(&s, &wrong),
        auroc_lc_fixes: auroc(&s, &fixes),
        sweep: by_escalation_rate(&curve, 20),
        area: curve_area(&pairs),
        apgr: apgr(&pairs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::row;

    /// Ten queries: RAG wrong on the four with the highest P(wrong), LC right on all but the
    /// last; the first RAG answer a right decline (its question has no answer) with a low
    /// P(wrong).
    fn rows(recorded: bool) -> Vec<ResultRow> {
        let mut out = Vec::new();
        for i in 0..10 {
            let e = format!("e{i}");
            let mut rag = row("rag", &e, i < 6, 100);
            rag.rag_statistic = Some(1.0);
            if i == 0 {
                rag.answer = "unanswerable".into();
                rag.golds.clear();
            }
            let mut m = crate::calibrate::tests::monitor_record("full_softmax");
            if recorded {
                m.combined_p_wrong = Some(f64::from(i) / 10.0);
                m.combined_threshold = Some(0.55);
            }
            rag.decision.monitor = Some(m);
            out.push(rag);
            out.push(row("lc", &e, i < 9, 1_000));
        }
        out
    }

    #[test]
    fn the_recorded_score_ranks_the_wrong_answers_and_sweeps_without_forcing_declines() {
        assert!(combined_sweep(&rows(false)).is_none());
        let c = combined_sweep(&rows(true)).unwrap();
        assert_eq!((c.n, c.threshold), (10, Some(0.55)));
        assert_eq!(c.auroc_wrong, Some(1.0));
        // LC fixes three of the four wrong answers (6, 7, 8), all above every right one; the
        // ninth is wrong for both and scores highest.
        let fixes = c.auroc_lc_fixes.unwrap();
        assert!(fixes > 0.8 && fixes < 1.0, "{fixes}");
        // No escalation at all is on the sweep: the decline is not forced up.
        assert_eq!(c.sweep[0].escalation_rate, 0.0);
        assert!((c.sweep[0].accuracy - 0.6).abs() < 1e-12);
        assert!(c.apgr.unwrap() > 0.5);
        // The run's report carries the section; a run under τ does not.
        let md = |recorded| crate::report::markdown(&crate::report::build(&rows(recorded), 7));
        assert!(md(true).contains("## Combined score"));
        assert!(!md(false).contains("## Combined score"));
    }
}
