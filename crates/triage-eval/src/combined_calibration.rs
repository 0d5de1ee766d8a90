//! `triage calibrate --combined-fit`: the combined score as the escalation statistic. The
//! logistic model is fitted on dev RAG answers of other runs with the calibration questions
//! left out, so the threshold is chosen on P(wrong)s the model never saw, as test will see
//! them; the threshold is then chosen on the calibration questions' rag and lc answers by the
//! same rules as τ. Under a combined score, where abstaining is an allowed answer, a decline is
//! judged like any answer (the score reads `declined` as an input), so the dev sweep does not
//! force declines up either. Where it is not allowed, a decline is no answer and escalates, in
//! the router and in the sweep alike (forced RAG asks the routing's own prompt, declines
//! included).

use std::collections::{HashMap, HashSet};

use triage_policy::{is_decline, model_for, LogisticModel, COMBINED_INPUTS};
use triage_types::Calibration;

use crate::calibrate::{
    calibration_record, choose, dev_monitor_settings, monitor_settings, Chosen, Rule,
};
use crate::error::{EvalError, Result};
use crate::results::ResultRow;
use crate::signal_study::{fit_on, labelled, Labelled};
use crate::suites::Split;
use crate::sweep::{rag_lc_pairs, RagLcPair};
use crate::system::System;

/// The fitted score and the threshold chosen for it.
#[derive(Debug, Clone)]
pub struct CombinedCalibration {
    pub chosen: Chosen,
    pub calibration: Calibration,
    pub logistic: LogisticModel,
    /// With answers and declines fitted apart, the declines' model (`logistic` is then the
    /// answers').
    pub declines: Option<LogisticModel>,
    /// Escalate when P(wrong) is at least this (the router's comparison): the chosen τ, which
    /// the sweep escalates strictly above, moved to the next representable value.
    pub threshold: f64,
    /// Train answers the model was fitted on, and those left out because the calibration asks
    /// the same question.
    pub fit_answers: usize,
    pub left_out: usize,
}

/// Fit the combined score on `fit_rows`' RAG answers whose question `rows` does not ask (with
/// `apart`, one model on the answers and one on the declines), and choose its threshold on
/// `rows`' rag and lc pairs by `rule`.
pub fn calibrate_combined(
    rows: &[ResultRow],
    fit_rows: &[ResultRow],
    rule: Rule,
    apart: bool,
) -> Result<CombinedCalibration> {
    let tau = dev_monitor_settings(rows)?;
    if let Some(r) = fit_rows.iter().find(|r| r.split != Split::Dev) {
        return Err(EvalError::Invalid(format!(
            "the combined score is fitted on dev only; {} is from the {} split",
            r.example,
            r.split.as_str()
        )));
    }
    if let Some(other) = fit_rows
        .iter()
        .filter_map(|r| r.decision.monitor.as_ref())
        .find(|m| monitor_settings(&m.tau) != monitor_settings(&tau))
    {
        return Err(EvalError::Invalid(format!(
            "the fit runs' answers were monitored with other settings ({:?}) than the \
             calibration's ({:?}): fit the score on answers of the same model and estimator",
            monitor_settings(&other.tau),
            monitor_settings(&tau)
        )));
    }
    let asked: HashSet<&str> = rows.iter().map(|r| r.example.as_str()).collect();
    let (kept, left): (Vec<&ResultRow>, Vec<&ResultRow>) = fit_rows
        .iter()
        .filter(|r| r.system == System::Rag)
        .partition(|r| !asked.contains(r.example.as_str()));
    let train = labelled(kept);
    if train.iter().all(|l| l.wrong) || train.iter().all(|l| !l.wrong) {
        return Err(EvalError::Invalid(format!(
            "the combined score needs right and wrong RAG answers to fit on; the fit runs hold \
             {} monitored answers to questions the calibration does not ask",
            train.len()
        )));
    }
    let (logistic, declines) = if apart {
        let (declined, answered): (Vec<&Labelled>, Vec<&Labelled>) =
            train.iter().partition(|l| is_decline(&l.inputs));
        (
            fit(&answered, "answers")?,
            Some(fit(&declined, "declines")?),
        )
    } else {
        (fit(&train.iter().collect::<Vec<_>>(), "answers")?, None)
    };
    let pairs = scored_pairs(rows, |inputs| {
        model_for(inputs, &logistic, declines.as_ref())
            .predict(inputs)
            .ok()
    })?;
    let chosen = choose(&pairs, rule)?;
    let mut calibration = calibration_record(rows, &tau, pairs.len(), &chosen);
    calibration.rule = format!("combined score: {}", chosen.rule.replace('τ', "threshold"));
    Ok(CombinedCalibration {
        threshold: chosen.tau.next_up(),
        chosen,
        calibration,
        logistic,
        declines,
        fit_answers: train.len(),
        left_out: left.len(),
    })
}

/// The logistic of the combined score on `train` (`kind` names them in the error where they
/// hold one label only).
fn fit(train: &[&Labelled], kind: &str) -> Result<LogisticModel> {
    let every_input: Vec<usize> = (0..COMBINED_INPUTS.len()).collect();
    fit_on(train.iter().copied(), &every_input)
        .map_err(|e| EvalError::Invalid(format!("fitting the combined score: {e}")))?
        .ok_or_else(|| {
            let wrong = train.iter().filter(|l| l.wrong).count();
            EvalError::Invalid(format!(
                "the combined score's {kind} need right and wrong ones to fit on; the fit runs \
                 hold {} ({wrong} wrong) to questions the calibration does not ask",
                train.len()
            ))
        })
}

/// `rows`' rag and lc pairs with P(wrong) from `p_wrong` (given an answer's combined inputs)
/// as the statistic. An answer without a monitor statistic (no answer token) still escalates,
/// as in the pipeline; a decline does not on its own.
pub fn scored_pairs(
    rows: &[ResultRow],
    p_wrong: impl Fn(&[f32]) -> Option<f64>,
) -> Result<Vec<RagLcPair>> {
    let rag: Vec<&ResultRow> = rows.iter().filter(|r| r.system == System::Rag).collect();
    let inputs = labelled(rag.iter().copied());
    if inputs.len() != rag.len() {
        return Err(EvalError::Invalid(format!(
            "{} of {} rag answers carry no monitor record to score",
            rag.len() - inputs.len(),
            rag.len()
        )));
    }
    let scores: HashMap<&str, Option<f64>> = rag
        .iter()
        .zip(&inputs)
        .map(|(r, l)| (r.example.as_str(), p_wrong(&l.inputs)))
        .collect();
    Ok(judged_by_score(
        rag_lc_pairs(rows),
        &scores,
        abstention_allowed(rows),
    ))
}

/// Whether "unanswerable" may stand as the answer in `rows`' suite: some question has no gold
/// answer, which is how `triage eval` turns `routing.abstain` on.
pub fn abstention_allowed(rows: &[ResultRow]) -> bool {
    rows.iter().any(|r| r.golds.is_empty())
}

/// `pairs` with each example's P(wrong) from `scores` as the statistic: an answer without a
/// monitor statistic (no answer token) or without a score still escalates; a decline does on
/// its own only where abstaining is not an answer, as in the router.
pub fn judged_by_score(
    pairs: Vec<RagLcPair>,
    scores: &HashMap<&str, Option<f64>>,
    abstention_allowed: bool,
) -> Vec<RagLcPair> {
    pairs
        .into_iter()
        .map(|p| RagLcPair {
            statistic: p
                .statistic
                .and_then(|_| scores.get(p.example.as_str()).copied().flatten()),
            declined: p.declined && !abstention_allowed,
            ..p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::Floor;
    use crate::results::tests::row;
    use crate::sweep::point;
    use triage_policy::COMBINED_INPUTS;
    use triage_types::UNANSWERABLE;

    /// A RAG row whose monitor records `declined`, a span mean of `mean` and sample agreement
    /// `agreement`, right or wrong.
    fn rag(example: &str, correct: bool, mean: f32, agreement: f32, declined: bool) -> ResultRow {
        let mut r = row("rag", example, correct, 100);
        let mut m = crate::calibrate::tests::monitor_record("full_softmax");
        m.mean = Some(mean);
        m.signals.span_mean_entropy = mean;
        m.signals.sample_agreement = agreement;
        m.signals.declined = declined;
        if declined {
            r.answer = UNANSWERABLE.into();
            // A right decline answers a question without a gold answer.
            if correct {
                r.golds.clear();
            }
        }
        r.rag_statistic = Some(f64::from(mean));
        r.decision.monitor = Some(m);
        r
    }

    /// `n` questions named `prefix{i}`: RAG is wrong on every third (low sample agreement, a
    /// noisy entropy), LC right on all; every fifth RAG answer is a right decline.
    fn rows(prefix: &str, n: usize) -> Vec<ResultRow> {
        let mut out = Vec::new();
        for i in 0..n {
            let e = format!("{prefix}{i}");
            let wrong = i % 3 == 0;
            let agreement = if wrong { 0.2 } else { 0.9 } + 0.01 * (i % 7) as f32;
            out.push(rag(
                &e,
                !wrong,
                (i % 5) as f32 * 0.3,
                agreement,
                i % 5 == 1 && !wrong,
            ));
            out.push(row("lc", &e, true, 1_000));
        }
        out
    }

    #[test]
    fn the_threshold_is_chosen_on_questions_the_fit_never_saw() {
        let calibration = rows("q", 30);
        // The fit runs ask the calibration's first ten questions too, and 60 others.
        let mut fit = rows("q", 10);
        fit.extend(rows("f", 60));
        let c = calibrate_combined(
            &calibration,
            &fit,
            Rule::Cheapest(Floor::Retained(1.0)),
            false,
        )
        .unwrap();
        assert_eq!((c.fit_answers, c.left_out), (60, 10));
        // Sample agreement tells every wrong answer: reaching LC's accuracy escalates the ten
        // wrong ones and no right one, the right declines included.
        assert_eq!(c.chosen.at.accuracy, 1.0);
        assert!((c.chosen.at.escalation_rate - 10.0 / 30.0).abs() < 1e-12);
        assert!(c
            .calibration
            .rule
            .starts_with("combined score: cheapest threshold"));
        // The router escalates at P(wrong) ≥ threshold: the same answers as the sweep.
        let pairs = scored_pairs(&calibration, |x| c.logistic.predict(x).ok()).unwrap();
        for p in &pairs {
            let s = p.statistic.unwrap();
            assert_eq!(s >= c.threshold, p.escalates(c.chosen.tau), "{p:?}");
        }
        assert_eq!(c.logistic.weights.len(), COMBINED_INPUTS.len());
    }

    #[test]
    fn a_decline_is_scored_not_forced_up_and_no_answer_still_escalates() {
        let mut r = rows("q", 10);
        r[0].rag_statistic = None;
        assert!(abstention_allowed(&r) && r.iter().any(|x| x.answer == UNANSWERABLE));
        let pairs = scored_pairs(&r, |_| Some(0.1)).unwrap();
        assert!(pairs.iter().all(|p| !p.declined));
        assert_eq!(pairs[0].statistic, None);
        assert!(pairs[1..].iter().all(|p| p.statistic == Some(0.1)));
        // Above every P(wrong), only the answer without a statistic escalates.
        assert_eq!(point(&pairs, 0.5).escalation_rate, 0.1);
    }

    #[test]
    fn where_abstaining_is_no_answer_a_decline_escalates_whatever_the_score() {
        // Questions that all have a gold answer: every decline is wrong and asks for LC.
        let mut r = rows("q", 10);
        for (i, x) in r.iter_mut().enumerate() {
            if x.system == System::Rag && i % 4 == 0 {
                x.answer = UNANSWERABLE.into();
                x.score.correct = false;
                x.score.value = 0.0;
            }
        }
        r.retain(|x| !x.golds.is_empty());
        assert!(!abstention_allowed(&r));
        let pairs = scored_pairs(&r, |_| Some(0.1)).unwrap();
        let declined = pairs.iter().filter(|p| p.declined).count();
        assert!(declined > 0);
        // Above every P(wrong), the declines (and nothing else) escalate.
        let at = point(&pairs, 0.5);
        assert!((at.escalation_rate - declined as f64 / pairs.len() as f64).abs() < 1e-12);
    }

    #[test]
    fn test_rows_other_models_and_one_sided_fits_are_refused() {
        let calibration = rows("q", 12);
        let mut test = rows("f", 12);
        for r in &mut test {
            r.split = Split::Test;
        }
        let rule = Rule::Cheapest(Floor::Retained(0.95));
        let err = calibrate_combined(&calibration, &test, rule, false).unwrap_err();
        assert!(err.to_string().contains("dev only"), "{err}");
        // Answers of another base model cannot be scored alike.
        let mut other = rows("f", 12);
        for r in &mut other {
            if let Some(m) = r.decision.monitor.as_mut() {
                m.tau.model = "qwen2.5-coder-1.5b".into();
            }
        }
        let err = calibrate_combined(&calibration, &other, rule, false).unwrap_err();
        assert!(err.to_string().contains("other settings"), "{err}");
        // Fit runs that only ask the calibration's own questions leave nothing to fit on.
        let err = calibrate_combined(&calibration, &calibration, rule, false).unwrap_err();
        assert!(err.to_string().contains("right and wrong"), "{err}");
    }

    #[test]
    fn declines_fitted_apart_keep_a_signal_that_means_the_opposite_for_them() {
        // An answer is wrong where its samples disagree; a decline is wrong where they agree
        // (the model is sure the context lacks what it holds). One shared slope cannot say both.
        let fit_rows = |prefix: &str, n: usize| -> Vec<ResultRow> {
            let mut out = Vec::new();
            for i in 0..n {
                let e = format!("{prefix}{i}");
                let declined = i % 2 == 0;
                let agree = i % 4 < 2;
                let wrong = agree == declined;
                let agreement = if agree { 0.9 } else { 0.1 } + 0.01 * (i % 5) as f32;
                out.push(rag(&e, !wrong, 0.5, agreement, declined));
                out.push(row("lc", &e, true, 1_000));
            }
            out
        };
        let (calibration, fit) = (fit_rows("q", 40), fit_rows("f", 80));
        let rule = Rule::Cheapest(Floor::Retained(1.0));
        let apart = calibrate_combined(&calibration, &fit, rule, true).unwrap();
        let declines = apart.declines.as_ref().expect("a declines' model");
        let p = |m: &LogisticModel, r: &ResultRow| {
            let l = labelled([r]);
            m.predict(&l[0].inputs).unwrap()
        };
        // q0: a decline whose samples agree (wrong); q1: an answer whose samples agree (right).
        let (decline, answer) = (&calibration[0], &calibration[2]);
        assert!(p(declines, decline) > 0.5 && p(&apart.logistic, answer) < 0.5);
        // Every wrong answer escalates and no right one: LC's accuracy at the fewest tokens.
        assert_eq!(apart.chosen.at.accuracy, 1.0);
        assert!((apart.chosen.at.escalation_rate - 0.5).abs() < 1e-12);
        let one = calibrate_combined(&calibration, &fit, rule, false).unwrap();
        assert!(one.declines.is_none());
        assert!(one.chosen.at.escalation_rate > apart.chosen.at.escalation_rate);
        // Declines of one label cannot be fitted apart.
        let all_wrong: Vec<ResultRow> = fit
            .into_iter()
            .filter(|r| !(r.answer == UNANSWERABLE && r.score.correct))
            .collect();
        let err = calibrate_combined(&calibration, &all_wrong, rule, true).unwrap_err();
        assert!(
            err.to_string().contains("declines need right and wrong"),
            "{err}"
        );
    }
}
