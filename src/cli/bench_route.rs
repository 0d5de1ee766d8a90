//! `triage bench route`: the routing pipeline's first measurement. SQuAD v2 dev questions over
//! corpora made of their own article's first paragraphs, each answered three ways — forced RAG,
//! forced long context, and auto (RAG under the entropy monitor, escalating) — with accuracy,
//! tokens and time per path, and how well each uncertainty signal of the RAG answer predicts that
//! it is wrong (AUROC), including a cross-validated combined score.

use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use triage_retrieval::{ChunkerConfig, CorpusStore};
use triage_router::combined_score::{self, CombinedScore};
use triage_router::linear::{auroc, LogisticModel};

use triage::{Answer, AskRequest, Engine, ModelRole, Route, RoutePath, TriageConfig};
use triage_eval::scoring::{contains_answer, exact_match, f1};

/// What to run.
#[derive(Debug, Clone)]
pub struct RouteBenchConfig {
    pub questions: usize,
    /// Paragraphs of each article in its corpus.
    pub paragraphs: usize,
    pub per_article: usize,
    pub base: String,
    pub long_context: String,
    pub tau: Option<f32>,
    /// Fit the combined score on every question and freeze it here.
    pub save_combined: Option<std::path::PathBuf>,
    /// Write one JSON line per question (answers, scores, decision records) here.
    pub rows: Option<std::path::PathBuf>,
    /// Where the models run.
    pub device: triage_models::device::DeviceSpec,
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

/// One question's three answers.
struct Row {
    article: usize,
    question: String,
    golds: Vec<String>,
    rag: Answer,
    lc: Answer,
    auto: Answer,
}

fn correct(answer: &Answer, golds: &[String]) -> bool {
    contains_answer(&answer.text, golds)
}

fn scores(path: &str, answers: &[(&Answer, &[String])]) -> PathScores {
    let n = answers.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Answer, &[String]) -> f64| {
        answers.iter().map(|(a, g)| f(a, g)).sum::<f64>() / n
    };
    PathScores {
        path: path.to_string(),
        questions: answers.len(),
        exact_match: mean(&|a, g| f64::from(u8::from(exact_match(&a.text, g)))),
        f1: mean(&|a, g| f1(&a.text, g)),
        contains: mean(&|a, g| f64::from(u8::from(correct(a, g)))),
        mean_prompt_tokens: mean(&|a, _| a.usage.prompt_tokens as f64),
        mean_cached_prompt_tokens: mean(&|a, _| a.usage.cached_prompt_tokens as f64),
        mean_completion_tokens: mean(&|a, _| a.usage.completion_tokens as f64),
        mean_ms: mean(&|a, _| a.timings.total_ms),
        lc_rate: mean(&|a, _| f64::from(u8::from(a.decision.path == RoutePath::Lc))),
    }
}

/// The RAG answer's signals and retrieval features, in the combined score's input order.
fn signal_row(answer: &Answer) -> Option<Vec<f32>> {
    let monitor = answer.decision.monitor.as_ref()?;
    let features = answer.decision.retrieval.as_ref().and_then(|r| r.features);
    Some(combined_score::inputs(
        &monitor.signals,
        monitor.mean,
        features.as_ref(),
    ))
}

/// Names of the first signals of `combined_score::inputs`. "self-route declined" is left out
/// here: forced RAG runs without the decline prompt, so it is measured on the auto runs below.
const SIGNALS: [(usize, &str); 6] = [
    (0, "mean entropy (first 30 tokens)"),
    (1, "answer-span mean entropy"),
    (2, "max entropy"),
    (3, "mean NLL"),
    (4, "negative top-2 margin"),
    (6, "monitor statistic (answer-span mean, first 30)"),
];

fn signal_aurocs(rows: &[Row]) -> Result<Vec<SignalAuroc>> {
    let data: Vec<(usize, Vec<f32>, bool)> = rows
        .iter()
        .filter_map(|r| signal_row(&r.rag).map(|s| (r.article, s, !correct(&r.rag, &r.golds))))
        .collect();
    let labels: Vec<bool> = data.iter().map(|d| d.2).collect();
    let mut out: Vec<SignalAuroc> = SIGNALS
        .iter()
        .map(|&(j, name)| {
            let scores: Vec<f64> = data
                .iter()
                .map(|d| {
                    let v = f64::from(d.1[j]);
                    if v.is_finite() {
                        v
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            SignalAuroc {
                signal: name.to_string(),
                auroc: auroc(&scores, &labels),
            }
        })
        .collect();
    // The combined score: logistic regression on every signal and the six retrieval features,
    // scored out of fold (five folds by article, so no article is both fitted and scored).
    let mut predicted = vec![f64::NAN; data.len()];
    for fold in 0..5 {
        let (train, test): (Vec<usize>, Vec<usize>) =
            (0..data.len()).partition(|&i| data[i].0 % 5 != fold);
        let x: Vec<Vec<f32>> = train.iter().map(|&i| data[i].1.clone()).collect();
        let y: Vec<bool> = train.iter().map(|&i| data[i].2).collect();
        if test.is_empty() || !y.contains(&true) || !y.contains(&false) {
            continue;
        }
        let model = LogisticModel::fit(&x, &y, 1e-2)?;
        for i in test {
            predicted[i] = model.predict(&data[i].1)?;
        }
    }
    let scored: Vec<(f64, bool)> = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, _)| p.is_finite())
        .map(|(p, l)| (*p, *l))
        .collect();
    let (s, l): (Vec<f64>, Vec<bool>) = scored.into_iter().unzip();
    out.push(SignalAuroc {
        signal: "combined (logistic, 5-fold by article)".into(),
        auroc: auroc(&s, &l),
    });
    // The Self-Route decline, from the auto runs (whose RAG prompt allows it), against the
    // forced RAG answer being wrong.
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

fn ask(engine: &mut Engine, question: &str, route: Route, tau: Option<f32>) -> Result<Answer> {
    Ok(engine.ask(&AskRequest {
        corpus: "bench-route".into(),
        question: question.to_string(),
        route,
        tau,
        max_tokens: None,
    })?)
}

pub fn run(config: &RouteBenchConfig) -> Result<RouteBench> {
    let articles = triage_eval::datasets::squad_articles(
        &triage_fetch::data_file("squad.json")?,
        config.paragraphs,
        config.per_article,
        config.questions,
    )?;
    let mut triage_config = TriageConfig::default();
    triage_config.set_model(ModelRole::Base, &config.base);
    triage_config.set_model(ModelRole::LongContext, &config.long_context);
    triage_config.set_kv_budget("4096blocks");
    triage_config.set_device(config.device);
    let tau = config.tau.unwrap_or(triage_config.routing.monitor.tau);
    let store_dir = tempfile::tempdir().context("creating a scratch corpus store")?;
    let mut engine = Engine::new(triage_config)?.with_store(store_dir.path());
    let embedder = triage::load_embedder(triage::DEFAULT_EMBEDDER)?;
    let tokenizer = embedder.model.tokenizer().clone();
    let store = CorpusStore::new(store_dir.path());
    let mut rows = Vec::new();
    let mut corpus_tokens = Vec::new();
    let started = Instant::now();
    for (a, article) in articles.iter().enumerate() {
        store.ingest(
            "bench-route",
            &article.documents,
            &[],
            &embedder,
            &tokenizer,
            ChunkerConfig::default(),
        )?;
        let info = engine.load_corpus("bench-route")?;
        corpus_tokens.push(info.prefix_tokens.unwrap_or(0) as f64);
        for ex in &article.examples {
            // Auto first, so its RAG prompt is prefilled cold; the forced RAG run after it
            // finds most of the same prompt (the retrieved chunks) in the prefix cache.
            let auto = ask(&mut engine, &ex.question, Route::Auto, config.tau)?;
            let lc = ask(&mut engine, &ex.question, Route::Lc, config.tau)?;
            let rag = ask(&mut engine, &ex.question, Route::Rag, config.tau)?;
            rows.push(Row {
                article: a,
                question: ex.question.clone(),
                golds: ex.answers.clone(),
                rag,
                lc,
                auto,
            });
        }
        eprintln!(
            "  {} ({} paragraphs, {} prefix tokens): {} questions done, {:.0} s",
            article.title,
            article.documents.len(),
            info.prefix_tokens.unwrap_or(0),
            rows.len(),
            started.elapsed().as_secs_f64()
        );
        // The next article replaces this one; drop its documents from the scratch store.
        let ids: Vec<String> = article.documents.iter().map(|d| d.id.clone()).collect();
        store.ingest(
            "bench-route",
            &[],
            &ids,
            &embedder,
            &tokenizer,
            ChunkerConfig::default(),
        )?;
    }
    let pairs = |f: fn(&Row) -> &Answer| -> Vec<(&Answer, &[String])> {
        rows.iter().map(|r| (f(r), r.golds.as_slice())).collect()
    };
    if let Some(path) = &config.save_combined {
        let (x, y): (Vec<Vec<f32>>, Vec<bool>) = rows
            .iter()
            .filter_map(|r| signal_row(&r.rag).map(|s| (s, !correct(&r.rag, &r.golds))))
            .unzip();
        let model_id = triage_fetch::resolve_model(&config.base)?.0;
        let hash = CombinedScore::fit(&model_id, &x, &y, 0.5)?.save(path)?;
        eprintln!("combined score saved to {} (sha256 {hash})", path.display());
    }
    if let Some(path) = &config.rows {
        let mut out = String::new();
        for r in &rows {
            let one = |a: &Answer| {
                serde_json::json!({"text": a.text, "contains": correct(a, &r.golds),
                    "f1": f1(&a.text, &r.golds), "decision": a.decision, "usage": a.usage,
                    "timings": a.timings})
            };
            let line = serde_json::json!({"article": r.article, "question": r.question,
                "golds": r.golds, "rag": one(&r.rag), "lc": one(&r.lc), "auto": one(&r.auto)});
            out.push_str(&line.to_string());
            out.push('\n');
        }
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    let declined = rows
        .iter()
        .filter(|r| {
            r.auto
                .decision
                .monitor
                .as_ref()
                .is_some_and(|m| m.signals.declined)
        })
        .collect::<Vec<_>>();
    let decline_rate = declined.len() as f64 / rows.len().max(1) as f64;
    let decline_precision = (!declined.is_empty()).then(|| {
        declined
            .iter()
            .filter(|r| !correct(&r.rag, &r.golds))
            .count() as f64
            / declined.len() as f64
    });
    let rag_error_rate = rows.iter().filter(|r| !correct(&r.rag, &r.golds)).count() as f64
        / rows.len().max(1) as f64;
    Ok(RouteBench {
        questions: rows.len(),
        articles: articles.len(),
        mean_corpus_tokens: corpus_tokens.iter().sum::<f64>() / corpus_tokens.len().max(1) as f64,
        tau,
        paths: vec![
            scores("rag", &pairs(|r| &r.rag)),
            scores("lc", &pairs(|r| &r.lc)),
            scores("auto", &pairs(|r| &r.auto)),
        ],
        rag_error_rate,
        decline_rate,
        decline_precision,
        signals: signal_aurocs(&rows)?,
    })
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
