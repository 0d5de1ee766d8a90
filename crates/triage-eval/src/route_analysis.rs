//! What `triage bench route` concludes from its answers, without a model: per-path scores
//! (exact match, F1, containment, tokens, time), how often forced RAG is wrong and how often a
//! Self-Route decline is right, and each signal's AUROC for flagging a wrong RAG answer, with
//! the combined score fitted and scored out of fold by article.

use serde::Serialize;
use triage_policy::{auroc, combined_inputs, out_of_fold_p_wrong, PolicyError};
use triage_types::{DecisionRecord, RoutePath};

use crate::scoring::{contains_answer, exact_match, f1};

/// One answer as the analysis needs it: its text, usage and decision record.
#[derive(Debug, Clone)]
pub struct RoutedAnswer {
    pub text: String,
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_ms: f64,
    pub decision: DecisionRecord,
}

/// One question's three answers: forced RAG, forced long context, and the router's choice.
#[derive(Debug, Clone)]
pub struct RouteRow {
    /// Which article the question is about (the folds group by it).
    pub article: usize,
    pub question: String,
    pub golds: Vec<String>,
    pub rag: RoutedAnswer,
    pub lc: RoutedAnswer,
    pub auto: RoutedAnswer,
}

/// One path's totals.
#[derive(Debug, Clone, Serialize)]
pub struct PathScores {
    pub path: String,
    pub questions: usize,
    pub exact_match: f64,
    pub f1: f64,
    /// The gold answer occurs in the answer.
    pub contains: f64,
    pub mean_prompt_tokens: f64,
    pub mean_cached_prompt_tokens: f64,
    pub mean_completion_tokens: f64,
    pub mean_ms: f64,
    /// Answers that ended on the long-context path.
    pub lc_rate: f64,
}

/// One signal's power to flag a wrong RAG answer.
#[derive(Debug, Clone, Serialize)]
pub struct SignalAuroc {
    pub signal: String,
    pub auroc: Option<f64>,
}

/// Whether `answer` contains one of the gold answers (the benchmark's notion of right).
pub fn correct(answer: &RoutedAnswer, golds: &[String]) -> bool {
    contains_answer(&answer.text, golds)
}

fn rate(flags: impl Iterator<Item = bool>) -> f64 {
    let (hits, n) = flags.fold((0usize, 0usize), |(h, n), f| (h + usize::from(f), n + 1));
    hits as f64 / n.max(1) as f64
}

/// The totals of `answers` (each with its golds) on the path named `path`.
pub fn path_scores(path: &str, answers: &[(&RoutedAnswer, &[String])]) -> PathScores {
    let n = answers.len().max(1) as f64;
    let mean = |f: &dyn Fn(&RoutedAnswer, &[String]) -> f64| {
        answers.iter().map(|(a, g)| f(a, g)).sum::<f64>() / n
    };
    let flag = |b: bool| f64::from(u8::from(b));
    PathScores {
        path: path.to_string(),
        questions: answers.len(),
        exact_match: mean(&|a, g| flag(exact_match(&a.text, g))),
        f1: mean(&|a, g| f1(&a.text, g)),
        contains: mean(&|a, g| flag(correct(a, g))),
        mean_prompt_tokens: mean(&|a, _| a.prompt_tokens as f64),
        mean_cached_prompt_tokens: mean(&|a, _| a.cached_prompt_tokens as f64),
        mean_completion_tokens: mean(&|a, _| a.completion_tokens as f64),
        mean_ms: mean(&|a, _| a.total_ms),
        lc_rate: mean(&|a, _| flag(a.decision.path == RoutePath::Lc)),
    }
}

/// The RAG answer's signals and retrieval features, in the combined score's input order.
pub fn signal_row(answer: &RoutedAnswer) -> Option<Vec<f32>> {
    let monitor = answer.decision.monitor.as_ref()?;
    let features = answer.decision.retrieval.as_ref().and_then(|r| r.features);
    Some(combined_inputs(
        &monitor.signals,
        monitor.mean,
        features.as_ref(),
        monitor.grounding.as_ref(),
    ))
}

/// What the combined score is fitted on: each monitored forced-RAG answer's inputs, labelled
/// with whether it was wrong.
pub fn combined_training_set(rows: &[RouteRow]) -> (Vec<Vec<f32>>, Vec<bool>) {
    rows.iter()
        .filter_map(|r| signal_row(&r.rag).map(|s| (s, !correct(&r.rag, &r.golds))))
        .unzip()
}

/// Fraction of forced-RAG answers that do not contain the gold answer.
pub fn rag_error_rate(rows: &[RouteRow]) -> f64 {
    rate(rows.iter().map(|r| !correct(&r.rag, &r.golds)))
}

/// How often the router's RAG answer declined (Self-Route), and how often the forced RAG
/// answer to those questions was indeed wrong (none when nothing declined).
pub fn declines(rows: &[RouteRow]) -> (f64, Option<f64>) {
    let declined = |r: &&RouteRow| {
        r.auto
            .decision
            .monitor
            .as_ref()
            .is_some_and(|m| m.signals.declined)
    };
    let decline_rate = rate(rows.iter().map(|r| declined(&r)));
    let chosen: Vec<&RouteRow> = rows.iter().filter(declined).collect();
    let precision =
        (!chosen.is_empty()).then(|| rate(chosen.iter().map(|r| !correct(&r.rag, &r.golds))));
    (decline_rate, precision)
}

/// Names of the first signals of `combined_inputs`. "self-route declined" is left out here and
/// measured on the auto runs, whose router flags it (forced RAG answers of runs made before
/// forced RAG asked the routing's own prompt never decline).
const SIGNALS: [(usize, &str); 14] = [
    (0, "mean entropy (first 30 tokens)"),
    (1, "answer-span mean entropy"),
    (2, "max entropy"),
    (3, "mean NLL"),
    (4, "negative top-2 margin"),
    (6, "monitor statistic (answer-span mean, first 30)"),
    (13, "negative min token probability (answer span)"),
    (14, "max entropy (answer span)"),
    (15, "not verbatim in a retrieved chunk"),
    (16, "rank of the chunk holding the answer"),
    (17, "negative score of that chunk"),
    (18, "negative margin of that chunk over the next"),
    (19, "answer words not in the chunks"),
    (20, "sample disagreement (word F1 against the answer)"),
];

/// Folds of the out-of-fold fit; rows go to fold `article % FOLDS`.
const FOLDS: usize = 5;

/// One monitored forced-RAG answer: its article, its signal row, whether it was wrong.
type Labelled = (usize, Vec<f32>, bool);

/// Each signal's AUROC for a wrong forced-RAG answer, then the combined score's (out of fold),
/// then the Self-Route decline's (auto runs).
pub fn signal_aurocs(rows: &[RouteRow]) -> Result<Vec<SignalAuroc>, PolicyError> {
    let data: Vec<Labelled> = rows
        .iter()
        .filter_map(|r| signal_row(&r.rag).map(|s| (r.article, s, !correct(&r.rag, &r.golds))))
        .collect();
    // Each signal over the answers that have it, as `triage signals` judges it.
    let mut out: Vec<SignalAuroc> = SIGNALS
        .iter()
        .map(|&(j, name)| {
            let (scores, labels): (Vec<f64>, Vec<bool>) = data
                .iter()
                .filter(|d| d.1[j].is_finite())
                .map(|d| (f64::from(d.1[j]), d.2))
                .unzip();
            SignalAuroc {
                signal: name.to_string(),
                auroc: auroc(&scores, &labels),
            }
        })
        .collect();
    let (s, l) = out_of_fold(&data)?;
    out.push(SignalAuroc {
        signal: "combined (logistic, 5-fold by article)".into(),
        auroc: auroc(&s, &l),
    });
    let (declined, wrong): (Vec<f64>, Vec<bool>) = rows
        .iter()
        .filter_map(|r| {
            let m = r.auto.decision.monitor.as_ref()?;
            Some((
                f64::from(u8::from(m.signals.declined)),
                !correct(&r.rag, &r.golds),
            ))
        })
        .unzip();
    out.push(SignalAuroc {
        signal: "self-route declined (auto runs)".into(),
        auroc: auroc(&declined, &wrong),
    });
    Ok(out)
}

/// The combined score (logistic regression on every signal and the retrieval features) fitted
/// on four folds and scored on the fifth, by article, so no article is both fitted and scored.
fn out_of_fold(data: &[Labelled]) -> Result<(Vec<f64>, Vec<bool>), PolicyError> {
    let folded: Vec<(u64, Vec<f32>, bool)> = data
        .iter()
        .map(|(article, row, wrong)| ((article % FOLDS) as u64, row.clone(), *wrong))
        .collect();
    out_of_fold_p_wrong(&folded, FOLDS as u64)
}

/// The whole measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RouteBench {
    pub questions: usize,
    pub articles: usize,
    pub mean_corpus_tokens: f64,
    pub tau: f32,
    pub paths: Vec<PathScores>,
    /// Fraction of forced-RAG answers that do not contain the gold answer.
    pub rag_error_rate: f64,
    /// Auto runs whose RAG answer declined (Self-Route), and how often the forced RAG answer
    /// to those questions was indeed wrong.
    pub decline_rate: f64,
    pub decline_precision: Option<f64>,
    pub signals: Vec<SignalAuroc>,
}

/// The tables for benches/RESULTS.md.
pub fn markdown(b: &RouteBench) -> String {
    let mut s = format!(
        "{} SQuAD v2 dev questions over {} articles (corpus ≈ {:.0} tokens each), τ = {}\n\n\
         | path | EM | F1 | contains | prompt tok | cached | uncached | completion | ms | on lc |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        b.questions, b.articles, b.mean_corpus_tokens, b.tau
    );
    for p in &b.paths {
        s.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} |\n",
            p.path,
            p.exact_match,
            p.f1,
            p.contains,
            p.mean_prompt_tokens,
            p.mean_cached_prompt_tokens,
            p.mean_prompt_tokens - p.mean_cached_prompt_tokens,
            p.mean_completion_tokens,
            p.mean_ms,
            p.lc_rate
        ));
    }
    s.push_str(&format!(
        "\nRAG answers wrong (gold not contained): {:.3}; auto runs whose RAG answer declined: \
         {:.3}, of which a fraction {} had a wrong forced-RAG answer\n\n| signal | AUROC for a wrong RAG answer |\n|---|---|\n",
        b.rag_error_rate,
        b.decline_rate,
        b.decline_precision.map_or("n/a".into(), |p| format!("{p:.3}"))
    ));
    for sig in &b.signals {
        s.push_str(&format!(
            "| {} | {} |\n",
            sig.signal,
            sig.auroc.map_or("n/a".into(), |a| format!("{a:.3}"))
        ));
    }
    s
}

#[cfg(test)]
mod tests;
