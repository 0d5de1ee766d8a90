//! Hyper-parameters of a decoder-only transformer, read from GGUF metadata or HF `config.json`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::{ModelError, Result};

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)` ("rotate half", GPT-NeoX; HF checkpoints and Qwen2 GGUF files).
    Neox,
    /// Pairs `(2i, 2i + 1)` (Llama GGUF files, whose Q/K rows were permuted at conversion).
    Interleaved,
}

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Qwen2,
    Llama,
}

impl Architecture {
    /// The architecture's name as GGUF's `general.architecture` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "qwen2",
            Architecture::Llama => "llama",
        }
    }

    /// Parse GGUF's `general.architecture` or HF's `model_type`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "qwen2" => Ok(Architecture::Qwen2),
            "llama" => Ok(Architecture::Llama),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// What the architecture file says about this architecture.
    pub fn spec(self) -> &'static ArchSpec {
        match self {
            Architecture::Qwen2 => &crate::qwen2::SPEC,
            Architecture::Llama => &crate::llama::SPEC,
        }
    }
}

/// The facts that distinguish one architecture from another in our shared decoder.
#[derive(Debug)]
pub struct ArchSpec {
    pub arch: Architecture,
    /// Q, K and V projections carry a bias.
    pub qkv_bias: bool,
    /// Rope pairing in GGUF files of this architecture.
    pub gguf_rope: RopeStyle,
    /// Rope pairing in HF safetensors checkpoints.
    pub hf_rope: RopeStyle,
    /// Default rope base when the file does not say.
    pub default_rope_theta: f32,
}

/// Hyper-parameters of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rms_norm_eps: f64,
    pub context_length: usize,
    pub qkv_bias: bool,
    pub tie_embeddings: bool,
}

impl ModelConfig {
    /// Check the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Invalid(format!("invalid model config: {m}")));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.num_layers == 0 {
            return bad(format!("{self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} heads is not a multiple of {} kv heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even", self.head_dim));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.context_length == 0 {
            return bad(format!("{self:?}"));
        }
        Ok(())
    }

    /// Read the config from GGUF metadata; `vocab_size` comes from the embedding tensor.
    pub fn from_gguf(md: &HashMap<String, Value>, vocab_size: usize, tie: bool) -> Result<Self> {
        let arch_name = md_str(md, "general.architecture")?;
        let arch = Architecture::parse(arch_name)?;
        let spec = arch.spec();
        let key = |k: &str| format!("{arch_name}.{k}");
        let num_heads = md_usize(md, &key("attention.head_count"))?;
        let hidden_size = md_usize(md, &key("embedding_length"))?;
        let head_dim = match md.get(&key("rope.dimension_count")) {
            Some(v) => value_usize(v, &key("rope.dimension_count"))?,
            None => hidden_size / num_heads.max(1),
        };
        let config = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: md_usize(md, &key("feed_forward_length"))?,
            num_layers: md_usize(md, &key("block_count"))?,
            num_heads,
            num_kv_heads: match md.get(&key("attention.head_count_kv")) {
                Some(v) => value_usize(v, &key("attention.head_count_kv"))?,
                None => num_heads,
            },
            head_dim,
            rope_theta: match md.get(&key("rope.freq_base")) {
                Some(v) => v
                    .to_f32()
                    .map_err(|e| bad_value(&key("rope.freq_base"), e))?,
                None => spec.default_rope_theta,
            },
            rope_style: spec.gguf_rope,
            rms_norm_eps: md
                .get(&key("attention.layer_norm_rms_epsilon"))
                .ok_or_else(|| {
                    ModelError::MissingMetadata(key("attention.layer_norm_rms_epsilon"))
                })?
                .to_f32()
                .map_err(|e| bad_value(&key("attention.layer_norm_rms_epsilon"), e))?
                as f64,
            context_length: md_usize(md, &key("context_length"))?,
            qkv_bias: spec.qkv_bias,
            tie_embeddings: tie,
        };
        config.validate()?;
        Ok(config)
    }

    /// Read the config from a HF `config.json`.
    pub fn from_hf_json(json: &serde_json::Value) -> Result<Self> {
        let model_type = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| ModelError::MissingMetadata("model_type".into()))?;
        let arch = Architecture::parse(model_type)?;
        let spec = arch.spec();
        let get = |k: &str| -> Result<usize> {
            json.get(k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingMetadata(k.to_string()))
        };
        let num_heads = get("num_attention_heads")?;
        let hidden_size = get("hidden_size")?;
        let config = ModelConfig {
            arch,
            vocab_size: get("vocab_size")?,
            hidden_size,
            intermediate_size: get("intermediate_size")?,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads: get("num_key_value_heads").unwrap_or(num_heads),
            head_dim: get("head_dim").unwrap_or(hidden_size / num_heads.max(1)),
            rope_theta: json
                .get("rope_theta")
                .and_then(|v| v.as_f64())
                .map(|v| v as f32)
                .unwrap_or(spec.default_rope_theta),
            rope_style: spec.hf_rope,
            rms_norm_eps: json
                .get("rms_norm_eps")
                .and_then(|v| v.as_f64())
                .unwrap_or(1e-6),
            context_length: get("max_position_embeddings")?,
            qkv_bias: spec.qkv_bias,
            tie_embeddings: json
                .get("tie_word_embeddings")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }
}

fn bad_value(key: &str, e: candle_core::Error) -> ModelError {
    ModelError::Invalid(format!("metadata key {key:?}: {e}"))
}

/// A string metadata value.
pub fn md_str<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a str> {
    md.get(key)
        .ok_or_else(|| ModelError::MissingMetadata(key.to_string()))?
        .to_string()
        .map(|s| s.as_str())
        .map_err(|e| bad_value(key, e))
}

/// An integer metadata value of any width.
pub fn md_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = md
        .get(key)
        .ok_or_else(|| ModelError::MissingMetadata(key.to_string()))?;
    value_usize(v, key)
}

fn value_usize(v: &Value, key: &str) -> Result<usize> {
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I8(x) if *x >= 0 => *x as u64,
        Value::I16(x) if *x >= 0 => *x as u64,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => {
            return Err(ModelError::Invalid(format!(
                "metadata key {key:?}: expected a non-negative integer, got {other:?}"
            )))
        }
    };
    usize::try_from(n).map_err(|_| ModelError::Invalid(format!("metadata key {key:?} too large")))
}
