//! Routing: the stages that answer a query as cheaply as it allows, built on the engines
//! (`triage-engine`) and the corpora (`triage-retrieval`): query classification, the
//! decide-then-retrieve gate, retrieval with the gain policy, RAG under the entropy monitor, and
//! escalation to the long-context model over a pinned corpus prefix. No HTTP here, and no
//! policy math: the learned policies are fitted and scored by `triage-policy`.
//!
//! `pipeline/` holds the pipeline and its stages, `signals/` the feature extraction from an
//! answer, `retrieve/` retrieval as the router runs it; this file states the API.
#![forbid(unsafe_code)]

mod error;
mod generator;
mod pipeline;
mod retrieve;
mod routing_config;
mod signals;

pub use error::{Result, RouterError};
pub use generator::{Generated, Generator, PinnedPrefix, RoleEngines};
pub use pipeline::classifier::{
    best_threshold, evaluate, ClassifyWith, LearnedClassifier, QueryClassifier, ZeroShotClassifier,
};
pub use pipeline::long_context_prompt::{
    corpus_text, long_context_prompt, LongContextOrWhy, LongContextPrompt, QUESTION_HEADROOM,
};
pub use pipeline::{
    Answer, AnswerEvent, AnswerTimings, AnswerUsage, AskRequest, CorpusView, Pipeline,
};
pub use retrieve::llm_reranker::LlmReranker;
pub use retrieve::pseudo_passage::{
    write_pseudo_passage, write_pseudo_passages, PSEUDO_PASSAGE_TOKENS,
};
pub use retrieve::retriever::{RerankWith, Retrieval, RetrieveMode, RetrieveParams, Retriever};
pub use routing_config::{
    ClassifierSetting, MonitorSettings, RagSearch, RerankSetting, RetrievalSettings, Route,
    RoutingConfig,
};
/// The plain data the router's API speaks, defined in `triage-types` so the evaluation and the
/// server read it without the router.
pub use triage_types::{
    AnswerSignals, Calibration, ClassifierRecord, DecisionRecord, GateRecord, ModelRole,
    ModelUsage, MonitorRecord, MonitorVerdict, Price, Prices, QueryClass, RerankerKind,
    RetrievalRecord, RoutePath, SearchKind, Stage, StageRecord, TauRecord, UNANSWERABLE,
};
