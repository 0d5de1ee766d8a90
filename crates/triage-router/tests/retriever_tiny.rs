//! `Retriever` on a tiny random model and a hashed bag-of-words corpus: dual-path search scores
//! by joint similarity to the model's pseudo-passage, a reranker reorders the pool and scores
//! each passage once, and missing pieces are errors.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::{EngineConfig, LlmEngine};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_retrieval::WordOffsets;
use triage_retrieval::{ChunkerConfig, Corpus, CorpusStore, Document, HashingEmbedder, Reranker};
use triage_router::{RerankWith, RetrieveMode, RetrieveParams, Retriever};

const EMBEDDER: HashingEmbedder = HashingEmbedder { dim: 64 };

fn engine(dir: &tempfile::TempDir) -> LlmEngine {
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    let model = Model::load("tiny", &path, &LoadOptions::default()).unwrap();
    LlmEngine::new(Arc::new(model), EngineConfig::default()).unwrap()
}

fn corpus(dir: &tempfile::TempDir) -> Corpus {
    let texts = [
        (
            "volcano",
            "Magma rises through the crust and erupts as lava.",
        ),
        ("ocean", "Tides follow the moon and waves cross the ocean."),
        (
            "bread",
            "Yeast ferments the dough, which rises before baking.",
        ),
        ("forest", "Old trees shade the forest floor from the sun."),
        ("desert", "Dunes move with the wind across the hot desert."),
    ];
    let docs: Vec<Document> = texts
        .iter()
        .map(|(id, text)| Document {
            id: id.to_string(),
            title: id.to_string(),
            text: text.to_string(),
        })
        .collect();
    let store = CorpusStore::new(dir.path());
    let chunker = ChunkerConfig {
        max_tokens: 64,
        overlap_tokens: 0,
    };
    store
        .ingest("c", &docs, &[], &EMBEDDER, &WordOffsets, chunker)
        .unwrap();
    store.open("c").unwrap()
}

/// Prefers passages that mention a word; counts how often each passage is scored.
struct WordReranker {
    word: &'static str,
    calls: HashMap<String, usize>,
}

impl Reranker for WordReranker {
    fn score(&mut self, _query: &str, passages: &[&str]) -> triage_retrieval::Result<Vec<f32>> {
        Ok(passages
            .iter()
            .map(|p| {
                *self.calls.entry(p.to_string()).or_default() += 1;
                if p.contains(self.word) {
                    1.0
                } else {
                    -(p.len() as f32) / 1000.0
                }
            })
            .collect())
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn dual_path_scores_hits_against_the_question_and_the_models_pseudo_passage() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mut engine) = (corpus(&dir), engine(&dir));
    let mut retriever = Retriever {
        corpus: &corpus,
        embedder: &EMBEDDER,
        generator: Some(&mut engine),
        backend: None,
    };
    let params = RetrieveParams {
        mode: RetrieveMode::Dual,
        k: 3,
        ..RetrieveParams::default()
    };
    let question = "what rises through the crust";
    let found = retriever
        .retrieve(question, &params, RerankWith::None)
        .unwrap();
    let passage = found
        .pseudo_passage
        .expect("dual mode writes a pseudo-passage");
    assert!(found.features.is_none());
    assert_eq!(found.hits.len(), 3);
    let (q, p) = (EMBEDDER.vector(question), EMBEDDER.vector(&passage));
    for pair in found.hits.windows(2) {
        assert!(pair[0].score >= pair[1].score);
    }
    for hit in &found.hits {
        let v = EMBEDDER.vector(&hit.chunk.text);
        assert!((hit.score - (dot(&v, &q) + dot(&v, &p))).abs() < 1e-5);
        assert!(hit.dense_rank.is_some() || hit.pseudo_rank.is_some());
    }
    assert!(!engine.has_unfinished());
}

#[test]
fn a_reranker_reorders_the_pool_scores_each_passage_once_and_yields_features() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(&dir);
    let mut retriever = Retriever {
        corpus: &corpus,
        embedder: &EMBEDDER,
        generator: None,
        backend: None,
    };
    let mut reranker = WordReranker {
        word: "Dunes",
        calls: HashMap::new(),
    };
    let params = RetrieveParams {
        mode: RetrieveMode::Hybrid,
        k: 2,
        ..RetrieveParams::default()
    };
    let found = retriever
        .retrieve("what rises", &params, RerankWith::Custom(&mut reranker))
        .unwrap();
    // The desert chunk shares no word with the query, yet the reranker's favourite wins: the
    // whole candidate pool was reranked, not just the top k.
    assert_eq!(found.hits.len(), 2);
    assert_eq!(found.hits[0].chunk.doc_id, "desert");
    assert_eq!(found.hits[0].score, 1.0);
    let features = found.features.expect("features come with a reranker");
    assert!(features.top1_dense.is_finite() && features.top1_dense > 0.0);
    assert!((0.0..=1.0).contains(&features.dense_rerank_overlap));
    // The dense arm (for the features) and the hybrid pool share passages: one score each.
    assert!(!reranker.calls.is_empty());
    assert!(
        reranker.calls.values().all(|&n| n == 1),
        "{:?}",
        reranker.calls
    );
}

#[test]
fn missing_models_and_bad_settings_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mut engine) = (corpus(&dir), engine(&dir));
    let mut retriever = Retriever {
        corpus: &corpus,
        embedder: &EMBEDDER,
        generator: None,
        backend: None,
    };
    let dual = RetrieveParams {
        mode: RetrieveMode::Dual,
        ..RetrieveParams::default()
    };
    let err = retriever
        .retrieve("q", &dual, RerankWith::None)
        .unwrap_err();
    assert!(err.to_string().contains("need a base model"), "{err}");
    let zero = RetrieveParams {
        k: 0,
        ..RetrieveParams::default()
    };
    assert!(retriever.retrieve("q", &zero, RerankWith::None).is_err());
    // The tiny vocabulary has no single-token yes/no: the LLM reranker says so.
    retriever.generator = Some(&mut engine);
    let err = retriever
        .retrieve("q", &RetrieveParams::default(), RerankWith::Llm)
        .unwrap_err();
    assert!(err.to_string().contains("yes/no"), "{err}");
}
