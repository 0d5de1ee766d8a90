//! Milvus as a `SearchBackend`: a corpus mirrored into a Milvus collection (chunk id, text with
//! a BM25 function, dense vector) and searched there — dense (HNSW, cosine), BM25 full text and
//! hybrid with Milvus's own RRF ranker. Only this crate knows gRPC; calls block on a private
//! single-threaded tokio runtime, so callers stay synchronous (and must not be inside a tokio
//! runtime themselves).
#![forbid(unsafe_code)]

mod backend;
mod error;

pub use backend::{collection_name, MilvusBackend, SyncReport};
pub use error::{MilvusError, Result};
