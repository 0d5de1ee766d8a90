//! The engine: `LlmEngine` (continuous batching over the paged KV cache, the one decode loop),
//! each request's output processor, the sampler, stop strings and the entropy monitor.
#![deny(unsafe_code)]

pub mod engine_set;
pub mod entropy_monitor;
pub mod error;
pub mod generate;
pub mod llm_engine;
mod output_processor;
pub mod prefix_remote;
pub mod prefix_store;
pub mod relevance;
pub mod sampler;
pub mod stop;
pub mod weights_hash;
pub mod yes_no;

pub use engine_set::EngineSet;
pub use error::{EngineError, Result};
