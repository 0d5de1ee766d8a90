//! `triage bench route`: the routing pipeline's first measurement. SQuAD v2 dev questions over
//! corpora made of their own article's first paragraphs, each answered three ways — forced RAG,
//! forced long context, and auto (RAG under the entropy monitor, escalating) — with accuracy,
//! tokens and time per path, and how well each uncertainty signal of the RAG answer predicts that
//! it is wrong (AUROC), including a cross-validated combined score.

use std::time::Instant;

use anyhow::{Context, Result};
use triage_eval::route_analysis::{
    combined_training_set, declines, path_scores, rag_error_rate, signal_aurocs, RouteRow,
    RoutedAnswer,
};
pub use triage_eval::route_analysis::{markdown, RouteBench};
use triage_policy::CombinedScore;
use triage_retrieval::{ChunkerConfig, CorpusStore};

use triage::{Answer, AskRequest, Engine, ModelRole, Route, TriageConfig};
use triage_eval::{contains_answer, f1};

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
    pub device: triage_models::DeviceSpec,
}

/// One question's three answers, as the engine gave them.
struct Row {
    article: usize,
    question: String,
    golds: Vec<String>,
    rag: Answer,
    lc: Answer,
    auto: Answer,
}

/// What the analysis reads of an answer.
fn routed(a: &Answer) -> RoutedAnswer {
    RoutedAnswer {
        text: a.text.clone(),
        prompt_tokens: a.usage.prompt_tokens,
        cached_prompt_tokens: a.usage.cached_prompt_tokens,
        completion_tokens: a.usage.completion_tokens,
        total_ms: a.timings.total_ms,
        decision: a.decision.clone(),
    }
}

impl Row {
    fn analysed(&self) -> RouteRow {
        RouteRow {
            article: self.article,
            question: self.question.clone(),
            golds: self.golds.clone(),
            rag: routed(&self.rag),
            lc: routed(&self.lc),
            auto: routed(&self.auto),
        }
    }
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
    triage_config.set_model(ModelRole::Base, &config.base)?;
    triage_config.set_model(ModelRole::LongContext, &config.long_context)?;
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
    let analysed: Vec<RouteRow> = rows.iter().map(Row::analysed).collect();
    if let Some(path) = &config.save_combined {
        let (x, y) = combined_training_set(&analysed);
        let model_id = triage_fetch::resolve_model(&config.base)?.0;
        let hash = CombinedScore::fit(&model_id, &x, &y, 0.5)?.save(path)?;
        eprintln!("combined score saved to {} (sha256 {hash})", path.display());
    }
    if let Some(path) = &config.rows {
        let mut out = String::new();
        for r in &rows {
            let one = |a: &Answer| {
                serde_json::json!({"text": a.text, "contains": contains_answer(&a.text, &r.golds),
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
    let pairs = |f: fn(&RouteRow) -> &RoutedAnswer| -> Vec<(&RoutedAnswer, &[String])> {
        analysed
            .iter()
            .map(|r| (f(r), r.golds.as_slice()))
            .collect()
    };
    let (decline_rate, decline_precision) = declines(&analysed);
    Ok(RouteBench {
        questions: rows.len(),
        articles: articles.len(),
        mean_corpus_tokens: corpus_tokens.iter().sum::<f64>() / corpus_tokens.len().max(1) as f64,
        tau,
        paths: vec![
            path_scores("rag", &pairs(|r| &r.rag)),
            path_scores("lc", &pairs(|r| &r.lc)),
            path_scores("auto", &pairs(|r| &r.auto)),
        ],
        rag_error_rate: rag_error_rate(&analysed),
        decline_rate,
        decline_precision,
        signals: signal_aurocs(&analysed)?,
    })
}
