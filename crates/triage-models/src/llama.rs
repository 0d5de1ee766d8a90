//! Llama (SmolLM2 and friends): no projection biases; llama.cpp's converter permutes the Q and K
//! rows of GGUF files so that rope pairs adjacent dimensions, while HF checkpoints rotate halves.

use crate::config::{ArchSpec, Architecture, RopeStyle};

/// What distinguishes Llama in the shared decoder (`transformer.rs`).
pub static SPEC: ArchSpec = ArchSpec {
    arch: Architecture::Llama,
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Interleaved,
    hf_rope: RopeStyle::Neox,
    default_rope_theta: 10_000.0,
};
