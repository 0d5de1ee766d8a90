//! The engine: sampler, generation loop and entropy monitor (the model runner grows here with
//! the paged KV cache).
#![deny(unsafe_code)]

pub mod entropy_monitor;
pub mod error;
pub mod generate;
pub mod llm_engine;
pub mod sampler;
pub mod stop;

pub use error::{EngineError, Result};
