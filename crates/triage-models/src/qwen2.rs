//! Qwen2 / Qwen2.5: a Llama-style decoder whose Q, K and V projections carry a bias; its GGUF
//! files keep HF's rotate-half rope layout.

use crate::config::{ArchSpec, Architecture, RopeStyle};

/// What distinguishes Qwen2 in the shared decoder (`transformer.rs`).
pub static SPEC: ArchSpec = ArchSpec {
    arch: Architecture::Qwen2,
    qkv_bias: true,
    qk_norm: false,
    gguf_rope: RopeStyle::Neox,
    hf_rope: RopeStyle::Neox,
    default_rope_theta: 1_000_000.0,
};
