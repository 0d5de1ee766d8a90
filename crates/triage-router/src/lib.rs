//! Routing: the stages that answer a query as cheaply as it allows, built on the engines
//! (`triage-engine`) and the corpora (`triage-retrieval`). So far: retrieval as the pipeline runs
//! it, with the LLM relevance reranker and dual-path search. No HTTP here.
#![forbid(unsafe_code)]

pub mod error;
pub mod llm_reranker;
pub mod pseudo_passage;
pub mod retriever;

pub use error::{Result, RouterError};
pub use llm_reranker::LlmReranker;
pub use pseudo_passage::{write_pseudo_passage, write_pseudo_passages, PSEUDO_PASSAGE_TOKENS};
pub use retriever::{RerankWith, Retrieval, RetrieveMode, RetrieveParams, Retriever};
