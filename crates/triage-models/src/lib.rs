//! Model architectures (one file each, whatever the weight format), weight loading (GGUF and
//! safetensors), tokenizers and chat templates.
#![deny(unsafe_code)]

pub mod attention;
pub mod bert;
pub mod bert_fixtures;
pub mod chat_template;
pub mod config;
pub mod device;
pub mod error;
pub mod fixtures;
pub mod fused_linear;
pub mod gguf_info;
pub mod layers;
pub mod llama;
pub mod model;
pub mod paged_kv_cache;
pub mod paths;
pub mod qwen2;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use device::DeviceSpec;
pub use error::{ModelError, Result};
