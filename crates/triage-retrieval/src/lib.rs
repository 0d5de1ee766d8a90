//! Retrieval: documents into chunks, chunks into a corpus (embeddings, HNSW, BM25) stored as
//! atomic generations on disk, and dense, BM25, hybrid (RRF) and dual-path search. No HTTP here.
#![forbid(unsafe_code)]

pub mod backend;
pub mod bm25;
pub mod chunker;
pub mod conformance;
pub mod corpus;
pub mod dense;
pub mod documents;
pub mod dual_path;
pub mod embedder;
pub mod error;
pub mod features;
pub mod hybrid;
pub mod metrics;
pub mod rerank;

pub use backend::{HybridRanking, Ranked, SearchBackend};
pub use chunker::{Chunk, ChunkKind, ChunkerConfig};
pub use corpus::{Corpus, CorpusStore, Hit, IngestReport, SearchMode, SearchOptions};
pub use documents::{load_documents, Document};
pub use embedder::{BertEmbedder, Embedder, HashingEmbedder};
pub use error::{Result, RetrievalError};
pub use features::{retrieval_features, RetrievalFeatures};
pub use rerank::{rerank, CachedReranker, Reranker};
