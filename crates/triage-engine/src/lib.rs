//! The engine: `LlmEngine` (continuous batching over the paged KV cache, the one decode loop),
//! each request's output processor, the sampler, stop strings and the entropy monitor.
#![deny(unsafe_code)]

// The API: two namespaces (the entropy monitor, the persisted-prefix format) and the re-exports
// below. The decode loop's parts (output processor, stop strings, CUDA graphs) are private.

/// The entropy monitor and its knobs (estimator, unit, window, thresholds, decisions).
pub mod entropy_monitor;
/// Persisted KV prefixes: the file format, saving and what a miss means.
pub mod prefix_store;

mod engine_set;
mod error;
mod generate;
mod llm_engine;
mod output_processor;
mod pin_job;
mod prefix_remote;
mod relevance;
mod sampler;
mod stop;
mod weights_hash;
mod yes_no;

pub use engine_set::EngineSet;
pub use error::{EngineError, Result};
pub use generate::{
    generate, tokenize_prompt, EntropySettings, FinishReason, GenerateRequest, GenerationOutput,
    MeanEntropy, Prompt, Timings, TokenOutput,
};
pub use llm_engine::{
    EngineConfig, EventSink, KvBudget, LlmEngine, PendingPin, PinStart, PrefixSource, RequestId,
    StreamEvent, Usage,
};
pub use pin_job::{PinFailure, PinJob, PinOutcome, PinnedPrefix};
pub use prefix_remote::PrefixRemote;
pub use relevance::{relevance_scores, RelevanceJudge};
pub use sampler::{SamplingParams, MAX_TOP_LOGPROBS};
pub use yes_no::YesNoJudge;
