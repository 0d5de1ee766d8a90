//! `triage bench retrieval`: every retrieval mode on a QA data set (HotpotQA or SQuAD v2) —
//! Hit@k, Recall@k and MRR against the gold documents — plus ingestion throughput and the
//! latency of a hybrid query (embedding, dense, BM25 and fusion) on the same corpus.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use triage_eval::datasets::{self, QaDataset, QaExample};
use triage_retrieval::metrics::{hit_at, recall_at, reciprocal_rank, unique_documents};
use triage_retrieval::{
    rerank, BertEmbedder, CachedReranker, ChunkerConfig, Corpus, CorpusStore, Embedder, Hit,
    IngestReport, SearchMode, SearchOptions,
};
use triage_router::{write_pseudo_passages, LlmReranker, PSEUDO_PASSAGE_TOKENS};

use triage_fetch::data_file;
use triage_host::load_embedder;

use crate::error::{bail, Result};

/// Cut-offs reported.
pub const KS: [usize; 3] = [2, 5, 10];
/// Questions per batch of pseudo-passages.
const PSEUDO_BATCH: usize = 16;
/// Hits per arm the LLM reranks: the top 10, so reranking moves Hit@2, Hit@5 and MRR but not
/// Hit@10. Deeper pools cost about 1.5 s per passage on 2 cores.
const RERANK_DEPTH: usize = 10;

/// What to run.
#[derive(Debug, Clone)]
pub struct RetrievalBenchConfig {
    /// `hotpotqa` or `squad`.
    pub dataset: String,
    pub questions: usize,
    /// Questions (the first ones) that also run the LLM arms: reranking and dual-path.
    pub llm_questions: usize,
    pub model: String,
    pub embedder: String,
}

/// Mean scores of one arm over a set of questions.
#[derive(Debug, Serialize)]
pub struct ArmScores {
    pub arm: String,
    pub questions: usize,
    pub hit: BTreeMap<usize, f64>,
    pub recall: BTreeMap<usize, f64>,
    pub mrr: f64,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Serialize)]
pub struct Latency {
    pub queries: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct RetrievalBench {
    pub dataset: String,
    pub documents: usize,
    pub chunks: usize,
    pub ingest_s: f64,
    /// Chunks embedded by this run (0 when the corpus was already ingested).
    pub chunks_embedded: usize,
    pub chunks_per_s: f64,
    /// Hybrid query: embed + HNSW + BM25 + RRF, no reranking.
    pub hybrid_latency: Latency,
    /// Its parts: embedding the question, and the search itself.
    pub embed_latency: Latency,
    pub search_latency: Latency,
    pub arms: Vec<ArmScores>,
}

/// Per-question document rankings of one arm.
type Rankings = Vec<Vec<String>>;

/// The first `questions` questions of `hotpotqa` or `squad` with their corpus.
pub fn load_dataset(dataset: &str, questions: usize) -> Result<QaDataset> {
    match dataset {
        "hotpotqa" => Ok(datasets::hotpotqa(&data_file("hotpotqa.json")?, questions)?),
        "squad" => Ok(datasets::squad(&data_file("squad.json")?, questions)?),
        other => bail!("unknown data set {other:?}: use hotpotqa or squad"),
    }
}

fn load(config: &RetrievalBenchConfig) -> Result<QaDataset> {
    load_dataset(&config.dataset, config.questions)
}

/// The corpus of a data set, kept under `$TRIAGE_HOME` as `bench-<data>-<questions>`: a rerun
/// finds every document unchanged and skips the embedding.
pub fn dataset_corpus(
    data: &QaDataset,
    questions: usize,
    embedder: &BertEmbedder,
) -> Result<(Corpus, IngestReport)> {
    let store = CorpusStore::new(&triage_models::paths::triage_home());
    let name = format!("bench-{}-{}", data.name, questions);
    let tokenizer = embedder.model.tokenizer().clone();
    let report = store.ingest(
        &name,
        &data.documents,
        &[],
        embedder,
        &tokenizer,
        ChunkerConfig::default(),
    )?;
    Ok((store.open(&name)?, report))
}

fn documents_of(hits: &[Hit]) -> Vec<String> {
    unique_documents(hits.iter().map(|h| h.chunk.doc_id.as_str()))
        .into_iter()
        .map(str::to_string)
        .collect()
}

fn scores(arm: &str, rankings: &[Vec<String>], examples: &[QaExample]) -> ArmScores {
    let n = rankings.len().max(1) as f64;
    let mut hit = BTreeMap::new();
    let mut recall = BTreeMap::new();
    let mut mrr = 0.0;
    for (ranked, ex) in rankings.iter().zip(examples) {
        let ranked: Vec<&str> = ranked.iter().map(String::as_str).collect();
        for k in KS {
            *hit.entry(k).or_insert(0.0) += hit_at(&ranked, &ex.gold_docs, k) / n;
            *recall.entry(k).or_insert(0.0) += recall_at(&ranked, &ex.gold_docs, k) / n;
        }
        mrr += reciprocal_rank(&ranked, &ex.gold_docs) / n;
    }
    ArmScores {
        arm: arm.to_string(),
        questions: rankings.len(),
        hit,
        recall,
        mrr,
    }
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted_ms.len() - 1) as f64 * p).round() as usize;
    sorted_ms[idx]
}

fn latency(mut ms: Vec<f64>) -> Latency {
    ms.sort_by(f64::total_cmp);
    Latency {
        queries: ms.len(),
        p50_ms: percentile(&ms, 0.50),
        p95_ms: percentile(&ms, 0.95),
    }
}

/// Query latencies in milliseconds: whole hybrid query, embedding, search.
#[derive(Default)]
struct Timings {
    hybrid: Vec<f64>,
    embed: Vec<f64>,
    search: Vec<f64>,
}

/// Dense, BM25 and hybrid rankings of every question, and the hybrid query latencies.
fn cheap_arms(
    corpus: &Corpus,
    embedder: &dyn Embedder,
    examples: &[QaExample],
) -> Result<(BTreeMap<&'static str, Rankings>, Timings)> {
    let mut arms: BTreeMap<&'static str, Rankings> = BTreeMap::new();
    let mut timings = Timings::default();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    for ex in examples {
        let start = Instant::now();
        let v = embedder.embed(&[&ex.question])?.remove(0);
        timings.embed.push(ms(start));
        let options = |mode| SearchOptions {
            mode,
            k: 30,
            ..SearchOptions::default()
        };
        let searched = Instant::now();
        let hybrid = corpus.search(&ex.question, Some(&v), &options(SearchMode::Hybrid))?;
        timings.search.push(ms(searched));
        timings.hybrid.push(ms(start));
        let dense = corpus.search(&ex.question, Some(&v), &options(SearchMode::Dense))?;
        let bm25 = corpus.search(&ex.question, None, &options(SearchMode::Bm25))?;
        for (arm, hits) in [("bm25", bm25), ("dense", dense), ("hybrid", hybrid)] {
            arms.entry(arm).or_default().push(documents_of(&hits));
        }
    }
    Ok((arms, timings))
}

/// Dense + rerank, hybrid + rerank and dual-path rankings of `examples` with the base model.
fn llm_arms(
    corpus: &Corpus,
    embedder: &dyn Embedder,
    examples: &[QaExample],
    model: &str,
) -> Result<BTreeMap<&'static str, Rankings>> {
    let mut engine = crate::retrieve::base_engine(model)?;
    let mut arms: BTreeMap<&'static str, Rankings> = BTreeMap::new();
    let started = Instant::now();
    for (i, batch) in examples.chunks(PSEUDO_BATCH).enumerate() {
        let questions: Vec<&str> = batch.iter().map(|e| e.question.as_str()).collect();
        let passages = write_pseudo_passages(&mut engine, &questions, PSEUDO_PASSAGE_TOKENS)?;
        for (ex, passage) in batch.iter().zip(&passages) {
            let vectors = embedder.embed(&[&ex.question, passage])?;
            let options = |mode| SearchOptions {
                mode,
                k: 30,
                ..SearchOptions::default()
            };
            let dual = corpus.search_dual(&vectors[0], &vectors[1], &options(SearchMode::Dense))?;
            let depth = |mode| SearchOptions {
                k: RERANK_DEPTH,
                ..options(mode)
            };
            let dense =
                corpus.search(&ex.question, Some(&vectors[0]), &depth(SearchMode::Dense))?;
            let hybrid =
                corpus.search(&ex.question, Some(&vectors[0]), &depth(SearchMode::Hybrid))?;
            let mut llm = LlmReranker::new(&mut engine);
            let mut cached = CachedReranker::new(&mut llm);
            let dense_reranked = rerank(&ex.question, dense, &mut cached)?;
            let hybrid_reranked = rerank(&ex.question, hybrid, &mut cached)?;
            arms.entry("dual").or_default().push(documents_of(&dual));
            arms.entry("dense+rerank")
                .or_default()
                .push(documents_of(&dense_reranked));
            arms.entry("hybrid+rerank")
                .or_default()
                .push(documents_of(&hybrid_reranked));
        }
        eprintln!(
            "  LLM arms: {}/{} questions, {:.0} s",
            ((i + 1) * PSEUDO_BATCH).min(examples.len()),
            examples.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(arms)
}

/// Every arm's scores on the data set, with ingestion and query timings; progress on stderr.
pub fn bench_retrieval(config: &RetrievalBenchConfig) -> Result<RetrievalBench> {
    let data = load(config)?;
    let embedder = load_embedder(&config.embedder)?;
    eprintln!(
        "{}: ingesting {} documents",
        data.name,
        data.documents.len()
    );
    // On a rerun nothing is embedded again (the ingest rate is then not measured again).
    let start = Instant::now();
    let (corpus, report) = dataset_corpus(&data, config.questions, &embedder)?;
    let ingest_s = start.elapsed().as_secs_f64();
    eprintln!(
        "  {} chunks in {ingest_s:.1} s; searching {} questions",
        report.chunks_total,
        data.examples.len()
    );
    let (cheap, timings) = cheap_arms(&corpus, &embedder, &data.examples)?;
    let mut arms: Vec<ArmScores> = cheap
        .iter()
        .map(|(arm, r)| scores(arm, r, &data.examples))
        .collect();
    let n_llm = config.llm_questions.min(data.examples.len());
    if n_llm > 0 {
        let subset = &data.examples[..n_llm];
        for (arm, r) in &cheap {
            arms.push(scores(arm, &r[..n_llm], subset));
        }
        for (arm, r) in llm_arms(&corpus, &embedder, subset, &config.model)? {
            arms.push(scores(arm, &r, subset));
        }
    }
    Ok(RetrievalBench {
        dataset: data.name,
        documents: data.documents.len(),
        chunks: report.chunks_total,
        ingest_s,
        chunks_embedded: report.chunks_embedded,
        chunks_per_s: report.chunks_embedded as f64 / ingest_s,
        hybrid_latency: latency(timings.hybrid),
        embed_latency: latency(timings.embed),
        search_latency: latency(timings.search),
        arms,
    })
}
