//! Model architectures (one file each, whatever the weight format), weight loading (GGUF and
//! safetensors), tokenizers and chat templates.
#![deny(unsafe_code)]

// The API: the namespaces below, each a subject a caller works with, and the re-exports at
// the end. The layers, the architectures and the weight loaders behind them are private: a model
// is reached through `model::Model` and `transformer::Transformer`, whatever its architecture.
pub mod bert;
pub mod chat_template;
pub mod config;
pub mod model;
pub mod paged_kv_cache;
pub mod paths;
pub mod tokenizer;
pub mod transformer;

/// Tiny random-weight Qwen2/Llama models for tests (the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;

/// Tiny random BERT checkpoints for tests (the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod bert_fixtures;

mod attention;
mod device;
mod error;
mod expected_shapes;
mod fused_linear;
mod gguf_info;
mod hf_config;
mod layers;
mod llama;
mod qwen2;
mod qwen3;
mod safetensors_dir;
mod weights;

pub use device::{parse_kv_dtype, DeviceSpec};
pub use error::{ModelError, Result};
pub use gguf_info::GgufInfo;
