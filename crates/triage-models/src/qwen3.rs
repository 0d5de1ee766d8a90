//! Qwen3: a Llama-style decoder without projection biases whose Q and K heads are each
//! RMS-normalised before rope, with `head_dim` declared apart from `hidden / heads`.

use crate::config::{ArchSpec, Architecture, RopeStyle};

/// What distinguishes Qwen3 in the shared decoder (`transformer.rs`).
pub static SPEC: ArchSpec = ArchSpec {
    arch: Architecture::Qwen3,
    qkv_bias: false,
    qk_norm: true,
    gguf_rope: RopeStyle::Neox,
    hf_rope: RopeStyle::Neox,
    default_rope_theta: 1_000_000.0,
};
