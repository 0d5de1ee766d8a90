//! triage: a local LLM inference engine with entropy-based routing. This crate is the public
//! façade (`triage::...`) over the workspace crates, plus model fetching and the CLI.
#![deny(unsafe_code)]

pub mod ask;
pub mod bench;
pub mod bench_retrieval;
pub mod bench_route;
pub mod catalog;
pub mod engine;
pub mod eval;
pub mod fetch;
pub mod resolve;
pub mod retrieve;
pub mod serve;
pub mod train;

pub use engine::{CorpusInfo, Engine, Error, ModelsConfig, TriageConfig};
pub use triage_engine::entropy_monitor::{
    Decision, EntropyEstimator, EntropyMonitor, EntropyUnit, StepValue, Threshold,
};
pub use triage_engine::generate::{
    generate, EntropySettings, FinishReason, GenerateRequest, GenerationOutput, Prompt, TokenOutput,
};
pub use triage_engine::sampler::SamplingParams;
pub use triage_engine::EngineError;
pub use triage_models::chat_template::ChatMessage;
pub use triage_models::model::Model;
pub use triage_models::transformer::LoadOptions;
pub use triage_models::{DeviceSpec, ModelError};
pub use triage_ops::{logits_reduce, LogitsStats};
pub use triage_router::{Answer, AnswerEvent, AskRequest, Route, RoutePath, RoutingConfig};

/// Version with git revision and enabled features, as `triage --version` prints it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("TRIAGE_GIT_REV"),
    ", features: ",
    env!("TRIAGE_FEATURES"),
    ")"
);
