//! The engine: sampler, generation loop and entropy monitor (the model runner grows here with
//! the paged KV cache).
#![deny(unsafe_code)]

pub mod engine_set;
pub mod entropy_monitor;
pub mod error;
pub mod generate;
pub mod llm_engine;
pub mod prefix_remote;
pub mod prefix_store;
pub mod relevance;
pub mod sampler;
pub mod stop;
pub mod weights_hash;
pub mod yes_no;

pub use engine_set::EngineSet;
pub use error::{EngineError, Result};
