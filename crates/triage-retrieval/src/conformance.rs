//! Behaviour every `SearchBackend` must show, checked on a small fixed corpus: a chunk's own
//! vector finds it first, BM25 returns exactly the chunks sharing a query word with the best
//! match first, and hybrid scores are reciprocal rank fusion of the backend's own two arms.
//! Each backend's tests run `check` (the embedded one in `tests/corpus.rs`, Milvus in
//! `triage-milvus`).

use crate::backend::{Ranked, SearchBackend};
use crate::corpus::Corpus;
use crate::documents::Document;
use crate::embedder::Embedder;

/// The corpus `check` expects: short one-chunk documents, one mentioning both "lava" and
/// "crust", one each mentioning only one of them, the rest neither.
pub fn documents() -> Vec<Document> {
    let texts = [
        (
            "both",
            "Lava breaks through the crust where the plates part.",
        ),
        ("lava", "Lava cools into black basalt on the shore."),
        ("crust", "Bakers brush the crust with egg before the oven."),
        ("tides", "Tides follow the moon around the planet."),
        ("bees", "Bees carry pollen between flowers all summer."),
        ("rails", "Night trains run on rails across the plain."),
        ("chess", "A chess clock limits each player's thinking time."),
        ("cellos", "Cellos and violins tune to the same note."),
    ];
    texts
        .iter()
        .map(|(id, text)| Document {
            id: id.to_string(),
            title: String::new(),
            text: text.to_string(),
        })
        .collect()
}

/// The query `check` searches with.
pub const QUERY: &str = "lava crust";

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn descending(name: &str, ranked: &Ranked) -> Result<(), String> {
    if ranked.windows(2).any(|w| w[0].1 < w[1].1) {
        return Err(format!("{name}: scores are not descending: {ranked:?}"));
    }
    Ok(())
}

/// Check `backend` against `corpus` (built from [`documents`] with `embedder`).
pub fn check(
    backend: &dyn SearchBackend,
    corpus: &Corpus,
    embedder: &dyn Embedder,
) -> Result<(), String> {
    let err = |e: crate::RetrievalError| e.to_string();
    let chunks = corpus.chunks();
    if chunks.len() != documents().len() {
        return Err(format!(
            "expected one chunk per document, got {}",
            chunks.len()
        ));
    }
    // Dense: every chunk's own vector finds it first.
    for chunk in chunks {
        let v = embedder.embed(&[&chunk.text]).map_err(err)?.remove(0);
        let found = backend.dense(&v, 3, false).map_err(err)?;
        descending("dense", &found)?;
        if found.len() != 3 || found[0].0 != chunk.id {
            return Err(format!(
                "dense: {:?} did not find itself first: {found:?}",
                chunk.doc_id
            ));
        }
        if (found[0].1 - 1.0).abs() > 1e-3 {
            return Err(format!("dense: self-similarity {} is not 1", found[0].1));
        }
    }
    // BM25: exactly the chunks sharing a word with the query, the one with both first.
    let query_words = words(QUERY);
    let matching: Vec<&str> = chunks
        .iter()
        .filter(|c| words(&c.text).iter().any(|w| query_words.contains(w)))
        .map(|c| c.id.as_str())
        .collect();
    let bm25 = backend.bm25(QUERY, 10).map_err(err)?;
    descending("bm25", &bm25)?;
    let mut got: Vec<&str> = bm25.iter().map(|(id, _)| id.as_str()).collect();
    let both = chunks
        .iter()
        .find(|c| c.doc_id == "both")
        .map(|c| c.id.as_str());
    if got.first().copied() != both {
        return Err(format!(
            "bm25: the chunk with both words is not first: {bm25:?}"
        ));
    }
    got.sort_unstable();
    let mut want = matching.clone();
    want.sort_unstable();
    if got != want {
        return Err(format!(
            "bm25 returned {got:?}, chunks with the words are {want:?}"
        ));
    }
    if !backend.bm25("zebra quartz", 10).map_err(err)?.is_empty() {
        return Err("bm25: a query sharing no word returned chunks".into());
    }
    // Hybrid: fused scores are RRF of the backend's own arms, ranks from 1.
    let v = embedder.embed(&[QUERY]).map_err(err)?.remove(0);
    let rrf_k = 60.0;
    let hybrid = backend.hybrid(QUERY, &v, 5, rrf_k, false).map_err(err)?;
    descending("hybrid", &hybrid.fused)?;
    if hybrid.dense.len() != 5 || hybrid.bm25 != bm25[..bm25.len().min(5)] {
        return Err(format!(
            "hybrid arms differ from the plain searches: {hybrid:?}"
        ));
    }
    let rank_term = |arm: &Ranked, id: &str| {
        arm.iter()
            .position(|(x, _)| x == id)
            .map_or(0.0, |i| 1.0 / (rrf_k + (i + 1) as f32))
    };
    for (id, score) in &hybrid.fused {
        let want = rank_term(&hybrid.dense, id) + rank_term(&hybrid.bm25, id);
        if want == 0.0 || (score - want).abs() > 1e-5 {
            return Err(format!("hybrid: {id} scored {score}, RRF gives {want}"));
        }
    }
    if hybrid.fused.first().map(|f| f.0.as_str()) != both {
        return Err(format!(
            "hybrid: the chunk with both words is not first: {hybrid:?}"
        ));
    }
    Ok(())
}
