//! triage: a local LLM inference engine with entropy-based routing. This crate is the public
//! API only: [`Engine`] (models, corpora and the routing pipeline in one process), its config
//! and errors, and re-exports of the workspace crates' types a caller needs. The command line
//! lives in the binary (`src/cli`).
#![forbid(unsafe_code)]

pub use triage_engine::entropy_monitor::{
    Decision, EntropyEstimator, EntropyMonitor, EntropyUnit, StepValue, Threshold,
};
pub use triage_engine::EngineError;
pub use triage_engine::SamplingParams;
pub use triage_engine::{
    generate, EntropySettings, FinishReason, GenerateRequest, GenerationOutput, Prompt, TokenOutput,
};
pub use triage_fetch::{
    DEFAULT_BASE_MODEL, DEFAULT_EMBEDDER, DEFAULT_LONG_CONTEXT_MODEL, DEFAULT_ROUTER_MODEL,
};
pub use triage_host::{
    error_kind, CorpusSummary, DocumentSummary, DocumentsChange, Engine, ErrorKind,
    HostError as Error, ModelEntry, PinStatus, PipelineSettings, Result, ServerSettings,
    TriageConfig,
};
pub use triage_host::{load_embedder, load_model};
pub use triage_models::chat_template::ChatMessage;
pub use triage_models::model::Model;
pub use triage_models::transformer::LoadOptions;
pub use triage_models::{DeviceSpec, ModelError};
pub use triage_ops::{logits_reduce, LogitsStats};
pub use triage_router::{
    Answer, AnswerEvent, AskRequest, ModelRole, Route, RoutePath, RoutingConfig,
};

/// Version with git revision and enabled features, as `triage --version` prints it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("TRIAGE_GIT_REV"),
    ", features: ",
    env!("TRIAGE_FEATURES"),
    ")"
);
