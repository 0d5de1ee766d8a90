//! Routing: the stages that answer a query as cheaply as it allows, built on the engines
//! (`triage-engine`) and the corpora (`triage-retrieval`): query classification, the
//! decide-then-retrieve gate, retrieval with the gain policy, RAG under the entropy monitor, and
//! escalation to the long-context model over a pinned corpus prefix. No HTTP here.
#![forbid(unsafe_code)]

pub mod answer_span;
pub mod classifier;
pub mod combined_score;
pub mod decision;
pub mod error;
pub mod gain_policy;
pub mod generator;
pub mod grounding;
pub mod linear;
pub mod llm_reranker;
pub mod long_context;
pub mod pipeline;
pub mod probe;
pub mod pseudo_passage;
pub mod retriever;
pub mod routing_config;
pub mod sample_agreement;

pub use error::{Result, RouterError};
pub use generator::{Generated, Generator, ModelRole, PinnedPrefix, RoleEngines};
pub use llm_reranker::LlmReranker;
pub use pipeline::{Answer, AnswerEvent, AskRequest, CorpusView, Pipeline};
pub use pseudo_passage::{write_pseudo_passage, write_pseudo_passages, PSEUDO_PASSAGE_TOKENS};
pub use retriever::{RerankWith, Retrieval, RetrieveMode, RetrieveParams, Retriever};
pub use routing_config::{Route, RoutePath, RoutingConfig};
