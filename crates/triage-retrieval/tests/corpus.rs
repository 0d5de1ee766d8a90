//! Corpora end to end with a deterministic stand-in embedder: ingest, search in every mode,
//! incremental updates and deletes, and a failed ingest leaving the previous corpus live.

use std::cell::Cell;

use triage_retrieval::{
    ChunkerConfig, CorpusStore, Document, Embedder, HashingEmbedder, RetrievalError, SearchMode,
    SearchOptions, WordOffsets,
};

/// `HashingEmbedder` with a call counter that can be told to fail.
struct BagOfWords {
    calls: Cell<usize>,
    fail_after: Option<usize>,
}

impl BagOfWords {
    fn new() -> Self {
        Self {
            calls: Cell::new(0),
            fail_after: None,
        }
    }

    fn vector(text: &str) -> Vec<f32> {
        HashingEmbedder { dim: 64 }.vector(text)
    }
}

impl Embedder for BagOfWords {
    fn id(&self) -> String {
        "bag-of-words-64".into()
    }
    fn dim(&self) -> usize {
        64
    }
    fn embed(&self, texts: &[&str]) -> triage_retrieval::Result<Vec<Vec<f32>>> {
        self.calls.set(self.calls.get() + texts.len());
        if self.fail_after.is_some_and(|n| self.calls.get() > n) {
            return Err(RetrievalError::Invalid("embedder failed".into()));
        }
        Ok(texts.iter().map(|t| Self::vector(t)).collect())
    }
}

fn doc(id: &str, text: &str) -> Document {
    Document {
        id: id.into(),
        title: format!("title {id}"),
        text: text.into(),
    }
}

fn docs() -> Vec<Document> {
    vec![
        doc(
            "volcano",
            "# Volcanoes\n\nMagma rises through the crust and erupts as lava.",
        ),
        doc(
            "ocean",
            "Tides follow the moon. Waves carry energy across the ocean.",
        ),
        doc(
            "bread",
            "Yeast ferments the dough, which rises before baking bread.",
        ),
    ]
}

const CHUNKER: ChunkerConfig = ChunkerConfig {
    max_tokens: 32,
    overlap_tokens: 4,
};

#[test]
fn ingested_corpora_answer_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    let e = BagOfWords::new();
    let report = store
        .ingest("sci", &docs(), &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(
        (report.added, report.chunks_total),
        (3, 4),
        "the heading is its own chunk"
    );
    let corpus = store.open("sci").unwrap();
    assert_eq!(corpus.num_documents(), 3);
    let q = "lava erupts through the crust";
    let qv = BagOfWords::vector(q);
    for mode in [SearchMode::Dense, SearchMode::Bm25, SearchMode::Hybrid] {
        for exact in [true, false] {
            let options = SearchOptions {
                mode,
                k: 2,
                exact,
                ..SearchOptions::default()
            };
            let hits = corpus.search(q, Some(&qv), &options).unwrap();
            assert_eq!(hits[0].chunk.doc_id, "volcano", "{mode:?} exact={exact}");
            assert!(hits.len() <= 2);
        }
    }
    let hybrid = corpus
        .search(q, Some(&qv), &SearchOptions::default())
        .unwrap();
    assert!(hybrid[0].dense_rank.is_some() && hybrid[0].bm25_rank.is_some());
    assert!(
        (hybrid[0].score
            - (1.0 / (60.0 + hybrid[0].dense_rank.unwrap() as f32)
                + 1.0 / (60.0 + hybrid[0].bm25_rank.unwrap() as f32)))
            .abs()
            < 1e-6
    );
    assert!(
        corpus.search(q, None, &SearchOptions::default()).is_err(),
        "dense needs a vector"
    );
    let bm25_only = SearchOptions {
        mode: SearchMode::Bm25,
        ..SearchOptions::default()
    };
    assert!(corpus
        .search("\"unbalanced: (quote", None, &bm25_only)
        .is_ok());
    assert!(matches!(
        store.open("nope"),
        Err(RetrievalError::UnknownCorpus(_))
    ));
    assert!(store.open("../etc").is_err());
    assert_eq!(store.list().unwrap(), vec!["sci".to_string()]);
}

#[test]
fn reingesting_skips_unchanged_replaces_changed_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    let e = BagOfWords::new();
    store
        .ingest("c", &docs(), &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    let live = std::fs::read_to_string(dir.path().join("corpora/c/CURRENT")).unwrap();
    let again = store
        .ingest("c", &docs(), &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!((again.unchanged, again.chunks_embedded), (3, 0));
    // Nothing changed, so no new generation (and no index rebuild).
    let still = std::fs::read_to_string(dir.path().join("corpora/c/CURRENT")).unwrap();
    assert_eq!(live, still);
    assert!(!dir.path().join("corpora/c/gen-000002").exists());
    assert_eq!(store.open("c").unwrap().generation, 1);
    let mut changed = docs();
    changed[1].text = "Sourdough starters are living cultures.".into();
    let r = store
        .ingest("c", &changed[1..2], &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!((r.updated, r.chunks_embedded, r.chunks_total), (1, 1, 4));
    let corpus = store.open("c").unwrap();
    // A change is a new generation: `c@2` names these chunks, `c@1` the old ones.
    assert_eq!(corpus.generation, 2);
    let q = "sourdough cultures";
    let options = SearchOptions {
        mode: SearchMode::Bm25,
        k: 1,
        ..SearchOptions::default()
    };
    assert_eq!(
        corpus.search(q, None, &options).unwrap()[0].chunk.doc_id,
        "ocean"
    );
    let r = store
        .ingest("c", &[], &["bread".to_string()], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!((r.deleted, r.chunks_total), (1, 3));
    assert_eq!(store.open("c").unwrap().num_documents(), 2);
    let err = store.ingest("c", &[], &["bread".to_string()], &e, &WordOffsets, CHUNKER);
    assert!(err.unwrap_err().to_string().contains("no document"));
    let other = ChunkerConfig {
        max_tokens: 64,
        overlap_tokens: 4,
    };
    assert!(store
        .ingest("c", &docs(), &[], &e, &WordOffsets, other)
        .is_err());
    let twice = vec![doc("x", "a"), doc("x", "b")];
    assert!(store
        .ingest("c", &twice, &[], &e, &WordOffsets, CHUNKER)
        .is_err());
}

#[test]
fn a_failed_ingest_leaves_the_previous_corpus_live() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    store
        .ingest("c", &docs(), &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    let failing = BagOfWords {
        calls: Cell::new(0),
        fail_after: Some(0),
    };
    let more = vec![doc("new", "entirely new words here")];
    assert!(store
        .ingest("c", &more, &[], &failing, &WordOffsets, CHUNKER)
        .is_err());
    let corpus = store.open("c").unwrap();
    assert_eq!(
        corpus.num_documents(),
        3,
        "the old generation is still live"
    );
    // The next good ingest succeeds and leaves exactly one generation.
    store
        .ingest("c", &more, &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(store.open("c").unwrap().num_documents(), 4);
    let gens = std::fs::read_dir(dir.path().join("corpora/c"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("gen-")
        })
        .count();
    assert_eq!(gens, 1);
}

#[test]
fn reranking_orders_hits_by_the_cross_encoder_and_feeds_the_features() {
    use triage_models::bert::CrossEncoder;
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    store
        .ingest("c", &docs(), &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    let corpus = store.open("c").unwrap();
    let q = "lava erupts through the crust";
    let options = SearchOptions {
        mode: SearchMode::Dense,
        exact: true,
        ..SearchOptions::default()
    };
    let hits = corpus
        .search(q, Some(&BagOfWords::vector(q)), &options)
        .unwrap();
    let ce_dir = dir.path().join("ce");
    triage_models::bert_fixtures::write_tiny_bert(&ce_dir, true, 9).unwrap();
    let mut ce = CrossEncoder::load(&ce_dir, &candle_core::Device::Cpu).unwrap();
    let reranked = triage_retrieval::rerank(q, hits.clone(), &mut ce).unwrap();
    assert_eq!(reranked.len(), hits.len());
    assert!(reranked.windows(2).all(|w| w[0].score >= w[1].score));
    let texts: Vec<&str> = reranked.iter().map(|h| h.chunk.text.as_str()).collect();
    let direct = ce.score(q, &texts).unwrap();
    for (h, s) in reranked.iter().zip(direct) {
        assert!((h.score - s).abs() < 1e-5);
    }
    let dense: Vec<(String, f32)> = hits
        .iter()
        .map(|h| (h.chunk.id.clone(), h.dense_score.unwrap()))
        .collect();
    let order: Vec<(String, triage_retrieval::ChunkKind)> = reranked
        .iter()
        .map(|h| (h.chunk.id.clone(), h.chunk.kind))
        .collect();
    let f = triage_retrieval::retrieval_features(&dense, &order);
    assert!((f.top1_dense - dense[0].1).abs() < 1e-6);
    assert_eq!(
        f.dense_rerank_overlap, 1.0,
        "reranking reorders the same candidates"
    );
    assert!(
        (f.structural_fraction - 0.25).abs() < 1e-6,
        "one heading among four chunks"
    );
}

#[test]
fn dual_path_search_ranks_by_joint_similarity_to_question_and_pseudo_passage() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    store
        .ingest("c", &docs(), &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    let corpus = store.open("c").unwrap();
    // The question alone points at baking; the pseudo-passage says it is about magma, and the
    // volcano chunk shares the word "rises" with the question.
    let question = "what rises";
    let passage = "magma erupts as lava through the crust";
    let (q, p) = (BagOfWords::vector(question), BagOfWords::vector(passage));
    let options = SearchOptions {
        k: 2,
        exact: true,
        ..SearchOptions::default()
    };
    let hits = corpus.search_dual(&q, &p, &options).unwrap();
    assert_eq!(hits.len(), 2);
    let joint = |text: &str| {
        let v = BagOfWords::vector(text);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        dot(&v, &q) + dot(&v, &p)
    };
    for h in &hits {
        assert!((h.score - joint(&h.chunk.text)).abs() < 1e-5);
        assert!(h.dense_rank.is_some() || h.pseudo_rank.is_some());
        assert_eq!(h.bm25_rank, None);
    }
    assert!(hits[0].score >= hits[1].score);
    assert_eq!(hits[0].chunk.doc_id, "volcano");
    // Vectors of the wrong width are an error, not a panic.
    let err = corpus.search_dual(&q[..8], &p, &options).unwrap_err();
    assert!(err.to_string().contains("width 64"), "{err}");
}

#[test]
fn the_embedded_corpus_passes_the_backend_conformance_checks() {
    use triage_retrieval::conformance;
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    let embedder = HashingEmbedder { dim: 64 };
    store
        .ingest(
            "c",
            &conformance::documents(),
            &[],
            &embedder,
            &WordOffsets,
            CHUNKER,
        )
        .unwrap();
    let corpus = store.open("c").unwrap();
    conformance::check(&corpus, &corpus, &embedder).unwrap();
}

/// One writer at a time: while another holds a corpus's lock (another `triage ingest`, or the
/// server), an ingest is refused as busy and leaves the live generation alone; once the lock is
/// released it goes through.
#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    store
        .ingest("c", &docs(), &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    let lock_path = dir.path().join("corpora/c/.lock");
    let other = std::fs::OpenOptions::new()
        .write(true)
        .open(&lock_path)
        .unwrap();
    other.lock().unwrap();
    let more = vec![doc("new", "entirely new words here")];
    let err = store
        .ingest("c", &more, &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap_err();
    assert!(
        matches!(err, RetrievalError::Busy(ref n) if n == "c"),
        "{err}"
    );
    assert_eq!(store.open("c").unwrap().num_documents(), 3);
    other.unlock().unwrap();
    store
        .ingest("c", &more, &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(store.open("c").unwrap().num_documents(), 4);
}

/// Deleting a corpus removes it whole; an unknown one is `UnknownCorpus`; one being written by
/// another process is busy and stays.
#[test]
fn a_corpus_deletes_whole_unless_another_writer_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    store
        .ingest("c", &docs(), &[], &BagOfWords::new(), &WordOffsets, CHUNKER)
        .unwrap();
    let other = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("corpora/c/.lock"))
        .unwrap();
    other.lock().unwrap();
    assert!(matches!(store.delete("c"), Err(RetrievalError::Busy(_))));
    assert_eq!(store.open("c").unwrap().num_documents(), 3);
    other.unlock().unwrap();
    store.delete("c").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert!(matches!(
        store.open("c"),
        Err(RetrievalError::UnknownCorpus(_))
    ));
    assert!(matches!(
        store.delete("c"),
        Err(RetrievalError::UnknownCorpus(_))
    ));
    assert!(!dir.path().join("corpora/c").exists());
}

/// The long-context prefix is the corpus in chunk order: documents keep their place across
/// updates and new ones come last, so an append leaves every earlier token where it was.
#[test]
fn documents_keep_their_place_and_new_ones_come_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    let e = BagOfWords::new();
    let order = |store: &CorpusStore| {
        let mut ids: Vec<String> = Vec::new();
        for c in store.open("c").unwrap().chunks() {
            if ids.last() != Some(&c.doc_id) {
                ids.push(c.doc_id.clone());
            }
        }
        ids
    };
    store
        .ingest("c", &docs(), &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(order(&store), ["volcano", "ocean", "bread"]);
    let added = [doc("apple", "Apples grow on trees in orchards.")];
    store
        .ingest("c", &added, &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(order(&store), ["volcano", "ocean", "bread", "apple"]);
    let mut changed = docs();
    changed[1].text = "Currents carry heat around the planet.".into();
    store
        .ingest("c", &changed[1..2], &[], &e, &WordOffsets, CHUNKER)
        .unwrap();
    assert_eq!(order(&store), ["volcano", "ocean", "bread", "apple"]);
    store
        .ingest(
            "c",
            &[],
            &["volcano".to_string()],
            &e,
            &WordOffsets,
            CHUNKER,
        )
        .unwrap();
    assert_eq!(order(&store), ["ocean", "bread", "apple"]);
}
