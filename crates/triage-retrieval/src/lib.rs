//! Retrieval: documents into chunks, chunks into a corpus (embeddings, HNSW, BM25) stored as
//! atomic generations on disk, and dense, BM25, hybrid (RRF) and dual-path search. No HTTP here.
#![forbid(unsafe_code)]

// The API: the `metrics` namespace, `conformance` for backends' tests, and the re-exports below.
// The indexes (BM25, HNSW), fusion and dual-path selection behind a corpus are private.

/// Ranking quality measures (hit@k, recall@k, reciprocal rank) for the retrieval benches.
pub mod metrics;

/// The behaviour every `SearchBackend` must show, for backends' tests (the `test-support`
/// feature).
#[cfg(any(test, feature = "test-support"))]
pub mod conformance;

mod backend;
mod bm25;
mod chunker;
mod corpus;
mod dense;
mod documents;
mod dual_path;
mod embedder;
mod error;
mod features;
mod hybrid;
mod rerank;

pub use backend::{HybridRanking, Ranked, SearchBackend};
pub use chunker::{Chunk, ChunkKind, ChunkerConfig, TokenOffsets, WordOffsets};
pub use corpus::{Corpus, CorpusStore, Hit, IngestReport, SearchMode, SearchOptions};
pub use documents::{load_documents, Document, DocumentLimits};
pub use embedder::{BertEmbedder, Embedder, HashingEmbedder};
pub use error::{Result, RetrievalError};
pub use features::{retrieval_features, RetrievalFeatures};
pub use rerank::{rerank, CachedReranker, Reranker};
