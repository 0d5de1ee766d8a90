//! `triage bench route`: the routing pipeline's first measurement. SQuAD v2 dev questions over
//! corpora made of their own article's first paragraphs, each answered three ways — forced RAG,
//! forced long context, and auto (RAG under the entropy monitor, escalating) — with accuracy,
//! tokens and time per path, and how well each uncertainty signal of the RAG answer predicts that
//! it is wrong (AUROC), including a cross-validated combined score.

use std::path::{Path, PathBuf};
use std::time::Instant;

use triage_eval::datasets::ArticleQa;
use triage_eval::route_analysis::{
    combined_training_set, declines, path_scores, rag_error_rate, signal_aurocs, RouteBench,
    RouteRow, RoutedAnswer,
};
use triage_eval::{contains_answer, f1};
use triage_host::load_embedder;
use triage_host::{Engine, TriageConfig};
use triage_policy::CombinedScore;
use triage_retrieval::TokenOffsets;
use triage_retrieval::{BertEmbedder, ChunkerConfig, CorpusStore};
use triage_router::{Answer, AskRequest, ModelRole, Route};

use crate::error::{fit_error, io, io_doing, Result};

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
    pub save_combined: Option<PathBuf>,
    /// Write one JSON line per question (answers, scores, decision records) here.
    pub rows: Option<PathBuf>,
    /// Where the models run.
    pub device: triage_models::DeviceSpec,
    /// The SQuAD v2 dev file (`triage_fetch::data_file("squad.json")`).
    pub squad: PathBuf,
    /// The sentence embedder the corpora are embedded and searched with (a default model's
    /// name or a folder).
    pub embedder: String,
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

/// The scratch corpus's name.
const CORPUS: &str = "bench-route";

fn ask(engine: &mut Engine, question: &str, route: Route, tau: Option<f32>) -> Result<Answer> {
    Ok(engine.ask(&AskRequest {
        corpus: CORPUS.into(),
        question: question.to_string(),
        route,
        tau,
        max_tokens: None,
    })?)
}

/// Answer every question three ways and measure each path and each signal; progress on stderr
/// (a line per article), the combined score and the rows written where `config` asks.
pub fn bench_route(config: &RouteBenchConfig) -> Result<RouteBench> {
    let articles = triage_eval::datasets::squad_articles(
        &config.squad,
        config.paragraphs,
        config.per_article,
        config.questions,
    )?;
    let mut triage_config = TriageConfig::default();
    triage_config.set_model(ModelRole::Base, &config.base)?;
    triage_config.set_model(ModelRole::LongContext, &config.long_context)?;
    triage_config.set_kv_budget("4096blocks");
    triage_config.set_device(config.device);
    triage_config.pipeline.embedder.clone_from(&config.embedder);
    let tau = config.tau.unwrap_or(triage_config.routing.monitor.tau);
    let store_dir = tempfile::tempdir().map_err(io_doing("creating a scratch corpus store"))?;
    let mut engine = Engine::new(triage_config)?.with_store(store_dir.path());
    let embedder = load_embedder(&config.embedder)?;
    let tokenizer = embedder.model.tokenizer().clone();
    let mut bench = Bench {
        engine: &mut engine,
        store: CorpusStore::new(store_dir.path()),
        embedder: &embedder,
        tokenizer: &tokenizer,
        tau: config.tau,
        rows: Vec::new(),
        corpus_tokens: Vec::new(),
        started: Instant::now(),
    };
    for (a, article) in articles.iter().enumerate() {
        bench.answer_article(a, article)?;
    }
    let (rows, corpus_tokens) = (bench.rows, bench.corpus_tokens);
    let analysed: Vec<RouteRow> = rows.iter().map(Row::analysed).collect();
    if let Some(path) = &config.save_combined {
        save_combined(&analysed, &config.base, path)?;
    }
    if let Some(path) = &config.rows {
        write_rows(&rows, path)?;
    }
    let mean_corpus_tokens = corpus_tokens.iter().sum::<f64>() / corpus_tokens.len().max(1) as f64;
    summarise(&analysed, articles.len(), mean_corpus_tokens, tau)
}

/// The engine answering, the scratch store each article's corpus goes through, and the rows so
/// far.
struct Bench<'a> {
    engine: &'a mut Engine,
    store: CorpusStore,
    embedder: &'a BertEmbedder,
    tokenizer: &'a dyn TokenOffsets,
    tau: Option<f32>,
    rows: Vec<Row>,
    corpus_tokens: Vec<f64>,
    started: Instant,
}

impl Bench<'_> {
    /// Load the article's paragraphs as the corpus, answer its questions three ways, then drop
    /// its documents from the scratch store (the next article replaces it).
    fn answer_article(&mut self, a: usize, article: &ArticleQa) -> Result<()> {
        self.ingest(&article.documents, &[])?;
        let info = self.engine.load_corpus(CORPUS)?;
        self.corpus_tokens
            .push(info.prefix_tokens.unwrap_or(0) as f64);
        for ex in &article.examples {
            // Auto first, so its RAG prompt is prefilled cold; the forced RAG run after it
            // finds most of the same prompt (the retrieved chunks) in the prefix cache.
            let auto = ask(self.engine, &ex.question, Route::Auto, self.tau)?;
            let lc = ask(self.engine, &ex.question, Route::Lc, self.tau)?;
            let rag = ask(self.engine, &ex.question, Route::Rag, self.tau)?;
            self.rows.push(Row {
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
            self.rows.len(),
            self.started.elapsed().as_secs_f64()
        );
        let ids: Vec<String> = article.documents.iter().map(|d| d.id.clone()).collect();
        self.ingest(&[], &ids)
    }

    fn ingest(&self, documents: &[triage_retrieval::Document], delete: &[String]) -> Result<()> {
        self.store.ingest(
            CORPUS,
            documents,
            delete,
            self.embedder,
            self.tokenizer,
            ChunkerConfig::default(),
        )?;
        Ok(())
    }
}

/// Fit the combined escalation score on every question and freeze it to `path`.
fn save_combined(analysed: &[RouteRow], base: &str, path: &Path) -> Result<()> {
    let (x, y) = combined_training_set(analysed);
    let model_id = triage_fetch::resolve_model(base)?.0;
    let hash = CombinedScore::fit(&model_id, &x, &y, 0.5)?.save(path)?;
    eprintln!("combined score saved to {} (sha256 {hash})", path.display());
    Ok(())
}

/// One JSON line per question: the three answers with their scores and decision records.
fn write_rows(rows: &[Row], path: &Path) -> Result<()> {
    let mut out = String::new();
    for r in rows {
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
    std::fs::write(path, out).map_err(io("writing", path))
}

/// Each path's scores and each signal's AUROC over the analysed rows.
fn summarise(
    analysed: &[RouteRow],
    articles: usize,
    mean_corpus_tokens: f64,
    tau: f32,
) -> Result<RouteBench> {
    let pairs = |f: fn(&RouteRow) -> &RoutedAnswer| -> Vec<(&RoutedAnswer, &[String])> {
        analysed
            .iter()
            .map(|r| (f(r), r.golds.as_slice()))
            .collect()
    };
    let (decline_rate, decline_precision) = declines(analysed);
    Ok(RouteBench {
        questions: analysed.len(),
        articles,
        mean_corpus_tokens,
        tau,
        paths: vec![
            path_scores("rag", &pairs(|r| &r.rag)),
            path_scores("lc", &pairs(|r| &r.lc)),
            path_scores("auto", &pairs(|r| &r.auto)),
        ],
        rag_error_rate: rag_error_rate(analysed),
        decline_rate,
        decline_precision,
        signals: signal_aurocs(analysed).map_err(fit_error)?,
    })
}
