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
    Qwen3,
    Llama,
}

impl Architecture {
    /// The architecture's name as GGUF's `general.architecture` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Llama => "llama",
        }
    }

    /// Parse GGUF's `general.architecture` or HF's `model_type`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "qwen2" => Ok(Architecture::Qwen2),
            "qwen3" => Ok(Architecture::Qwen3),
            "llama" => Ok(Architecture::Llama),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// What the architecture file says about this architecture.
    pub fn spec(self) -> &'static ArchSpec {
        match self {
            Architecture::Qwen2 => &crate::qwen2::SPEC,
            Architecture::Qwen3 => &crate::qwen3::SPEC,
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
    /// Each head of Q and K is RMS-normalised (its own weight, `head_dim` wide) before rope.
    pub qk_norm: bool,
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
    /// How the rotary frequencies are rescaled for long contexts.
    pub rope_scaling: RopeScaling,
    pub rms_norm_eps: f64,
    pub context_length: usize,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub tie_embeddings: bool,
}

/// A rescaling of the rotary frequencies `θ^(-2i/d)`: what HF's `rope_scaling` (or
/// `rope_parameters`) and a GGUF file's `rope_freqs.weight` declare.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every frequency divided by `factor` (HF `linear`, GGUF `rope.scaling.type = linear`).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, the band between
    /// interpolated smoothly (transformers' `_compute_llama3_parameters`).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// Each frequency divided by its own factor: llama.cpp stores Llama 3's scaling this way,
    /// as the `rope_freqs.weight` tensor (`head_dim / 2` values).
    FreqFactors(Vec<f32>),
}

fn finite_positive(x: f32) -> bool {
    x.is_finite() && x > 0.0
}

impl RopeScaling {
    /// Factors that scale no frequency to zero, infinity or NaN, and a llama3 band whose high
    /// edge lies above its low one (the smoothing divides by their difference).
    pub fn is_valid(&self) -> bool {
        match self {
            RopeScaling::None => true,
            RopeScaling::Linear { factor } => finite_positive(*factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                finite_positive(*factor)
                    && finite_positive(*low_freq_factor)
                    && high_freq_factor > low_freq_factor
                    && high_freq_factor.is_finite()
                    && *original_max_position_embeddings > 0
            }
            RopeScaling::FreqFactors(f) => f.iter().all(|&x| finite_positive(x)),
        }
    }

    /// The frequencies `inv_freq` (one per pair of a head's dimensions) rescaled.
    pub fn apply(&self, inv_freq: &mut [f32]) -> Result<()> {
        match self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_context = *original_max_position_embeddings as f32;
                let low_freq_wavelen = old_context / low_freq_factor;
                let high_freq_wavelen = old_context / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_freq_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_freq_wavelen {
                        let smooth = (old_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::FreqFactors(factors) => {
                if factors.len() != inv_freq.len() {
                    return Err(ModelError::Invalid(format!(
                        "rope_freqs has {} factors for {} rotary frequencies",
                        factors.len(),
                        inv_freq.len()
                    )));
                }
                inv_freq.iter_mut().zip(factors).for_each(|(f, s)| *f /= s);
            }
        }
        Ok(())
    }
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
        if !self.rope_scaling.is_valid() || !finite_positive(self.rope_theta) {
            return bad(format!(
                "rope theta {} with scaling {:?}",
                self.rope_theta, self.rope_scaling
            ));
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
        // Qwen3 declares `key_length` (128) apart from hidden / heads (64 for the 0.6B).
        let head_dim = match (
            md.get(&key("attention.key_length")),
            md.get(&key("rope.dimension_count")),
        ) {
            (Some(v), _) => value_usize(v, &key("attention.key_length"))?,
            (None, Some(v)) => value_usize(v, &key("rope.dimension_count"))?,
            (None, None) => hidden_size / num_heads.max(1),
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
            rope_scaling: gguf_rope_scaling(md, arch_name)?,
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
            qk_norm: spec.qk_norm,
            tie_embeddings: tie,
        };
        config.validate()?;
        Ok(config)
    }
}

/// A GGUF file's declared rope scaling: none, or linear. Llama 3's scaling is not declared here but
/// stored as the `rope_freqs.weight` tensor, which the loader reads (`RopeScaling::FreqFactors`).
fn gguf_rope_scaling(md: &HashMap<String, Value>, arch_name: &str) -> Result<RopeScaling> {
    let type_key = format!("{arch_name}.rope.scaling.type");
    let kind = match md.get(&type_key) {
        None => return Ok(RopeScaling::None),
        Some(v) => v.to_string().map_err(|e| bad_value(&type_key, e))?.as_str(),
    };
    match kind {
        "none" => Ok(RopeScaling::None),
        "linear" => {
            let factor_key = format!("{arch_name}.rope.scaling.factor");
            let factor = md
                .get(&factor_key)
                .ok_or_else(|| ModelError::MissingMetadata(factor_key.clone()))?
                .to_f32()
                .map_err(|e| bad_value(&factor_key, e))?;
            Ok(RopeScaling::Linear { factor })
        }
        other => Err(ModelError::Unsupported(format!(
            "{type_key} = {other:?} (supported: none, linear, and Llama 3's rope_freqs tensor)"
        ))),
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
