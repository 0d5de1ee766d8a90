//! `SearchBackend`: where a corpus's chunks are ranked. The embedded corpus (HNSW + tantivy files
//! under the data directory) is the default; `triage-milvus` mirrors a corpus into Milvus for
//! collections one machine cannot hold. A backend returns chunk ids and its own scores; the
//! corpus manifest turns ids into chunks. Both pass `conformance::check`.

use crate::error::Result;

/// Chunk ids, best first, with the backend's score (higher is better).
pub type Ranked = Vec<(String, f32)>;

/// A hybrid search: the fused order and the two arms it fused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HybridRanking {
    pub fused: Ranked,
    pub dense: Ranked,
    pub bm25: Ranked,
}

/// Ranks a corpus's chunks for a query.
pub trait SearchBackend {
    /// The `n` chunks most similar to `vector` (cosine). `exact` asks for a full scan where the
    /// backend has one.
    fn dense(&self, vector: &[f32], n: usize, exact: bool) -> Result<Ranked>;
    /// The `n` best BM25 matches for `query` (chunks sharing no term are not returned).
    fn bm25(&self, query: &str, n: usize) -> Result<Ranked>;
    /// `candidates` per arm fused by reciprocal rank fusion with constant `rrf_k` (ranks from 1).
    fn hybrid(
        &self,
        query: &str,
        vector: &[f32],
        candidates: usize,
        rrf_k: f32,
        exact: bool,
    ) -> Result<HybridRanking>;
}
