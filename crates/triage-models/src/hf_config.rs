//! Reading a HF `config.json` (Qwen2/Qwen2.5, Qwen3, Llama 3.x): every key that changes the
//! model's math is either implemented or refused with its name, never silently ignored.

use serde_json::Value;

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::{ModelError, Result};

impl ModelConfig {
    /// Read the config from a HF `config.json`, in transformers' v4 layout (`rope_theta`,
    /// `rope_scaling`) or v5's (`rope_parameters`).
    pub fn from_hf_json(json: &Value) -> Result<Self> {
        let model_type = json
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::MissingMetadata("model_type".into()))?;
        let arch = Architecture::parse(model_type)?;
        let spec = arch.spec();
        refuse_unsupported(json, arch)?;
        let num_heads = required(json, "num_attention_heads")?;
        let hidden_size = required(json, "hidden_size")?;
        let (rope_theta, rope_scaling) = rope(json)?;
        let config = ModelConfig {
            arch,
            vocab_size: required(json, "vocab_size")?,
            hidden_size,
            intermediate_size: required(json, "intermediate_size")?,
            num_layers: required(json, "num_hidden_layers")?,
            num_heads,
            num_kv_heads: optional(json, "num_key_value_heads")?.unwrap_or(num_heads),
            head_dim: optional(json, "head_dim")?.unwrap_or(hidden_size / num_heads.max(1)),
            rope_theta: rope_theta.unwrap_or(spec.default_rope_theta),
            rope_style: spec.hf_rope,
            rope_scaling,
            rms_norm_eps: number(json, "rms_norm_eps")?.unwrap_or(1e-6),
            context_length: required(json, "max_position_embeddings")?,
            qkv_bias: spec.qkv_bias,
            qk_norm: spec.qk_norm,
            tie_embeddings: flag(json, "tie_word_embeddings")?.unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }
}

fn unsupported(message: String) -> ModelError {
    ModelError::Unsupported(message)
}

/// Keys these architectures may carry whose non-default values triage does not implement.
fn refuse_unsupported(json: &Value, arch: Architecture) -> Result<()> {
    if let Some(act) = json.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(unsupported(format!("hidden_act = {act:?} (only \"silu\")")));
        }
    }
    // Qwen2 always has Q/K/V biases and no `attention_bias` key; for Qwen3 and Llama the key
    // would add biases to all four projections (the output one included).
    if arch != Architecture::Qwen2 && flag(json, "attention_bias")? == Some(true) {
        return Err(unsupported(
            "attention_bias = true (biases on the attention projections)".into(),
        ));
    }
    if flag(json, "mlp_bias")? == Some(true) {
        return Err(unsupported(
            "mlp_bias = true (biases on the MLP projections)".into(),
        ));
    }
    if flag(json, "use_sliding_window")? == Some(true) {
        return Err(unsupported(
            "use_sliding_window = true (sliding-window attention)".into(),
        ));
    }
    if let Some(types) = json.get("layer_types").and_then(Value::as_array) {
        if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(unsupported(format!(
                "layer_types contains {other} (only \"full_attention\")"
            )));
        }
    }
    if let Some(factor) = number(json, "partial_rotary_factor")? {
        if factor != 1.0 {
            return Err(unsupported(format!(
                "partial_rotary_factor = {factor} (rope over whole heads only)"
            )));
        }
    }
    if let Some(q) = json.get("quantization_config").filter(|v| !v.is_null()) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        return Err(unsupported(format!(
            "quantization_config (quant_method {method:?}): load a bf16/f16 checkpoint or a GGUF"
        )));
    }
    Ok(())
}

/// The rope base and scaling: from `rope_parameters` (transformers v5), else `rope_theta` and
/// `rope_scaling` (v4). `None` for the base: the architecture's default.
fn rope(json: &Value) -> Result<(Option<f32>, RopeScaling)> {
    if let Some(params) = json.get("rope_parameters").filter(|v| !v.is_null()) {
        let theta = number(params, "rope_theta")?.map(|t| t as f32);
        return Ok((theta, rope_scaling(params, "rope_parameters")?));
    }
    let theta = number(json, "rope_theta")?.map(|t| t as f32);
    let scaling = match json.get("rope_scaling").filter(|v| !v.is_null()) {
        Some(s) => rope_scaling(s, "rope_scaling")?,
        None => RopeScaling::None,
    };
    Ok((theta, scaling))
}

/// A `rope_scaling` object (or v5's `rope_parameters`): its `rope_type` (or the older `type`).
fn rope_scaling(obj: &Value, key: &str) -> Result<RopeScaling> {
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || -> Result<f32> {
        number(obj, "factor")?
            .map(|f| f as f32)
            .ok_or_else(|| ModelError::MissingMetadata(format!("{key}.factor")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => {
            let get = |k: &str| -> Result<f64> {
                number(obj, k)?.ok_or_else(|| ModelError::MissingMetadata(format!("{key}.{k}")))
            };
            Ok(RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: get("low_freq_factor")? as f32,
                high_freq_factor: get("high_freq_factor")? as f32,
                original_max_position_embeddings: get("original_max_position_embeddings")? as usize,
            })
        }
        other => Err(unsupported(format!(
            "{key} of type {other:?} (supported: default, linear, llama3)"
        ))),
    }
}

fn wrong_type(key: &str, want: &str, got: &Value) -> ModelError {
    ModelError::Invalid(format!("config.json: {key:?} must be {want}, got {got}"))
}

/// A non-negative integer key; `None` when absent or null.
fn optional(json: &Value, key: &str) -> Result<Option<usize>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| wrong_type(key, "a non-negative integer", v)),
    }
}

fn required(json: &Value, key: &str) -> Result<usize> {
    optional(json, key)?.ok_or_else(|| ModelError::MissingMetadata(key.to_string()))
}

fn number(json: &Value, key: &str) -> Result<Option<f64>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "a number", v)),
    }
}

fn flag(json: &Value, key: &str) -> Result<Option<bool>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| wrong_type(key, "true or false", v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base(model_type: &str) -> Value {
        json!({
            "model_type": model_type, "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 4096,
        })
    }

    fn with(model_type: &str, key: &str, value: Value) -> Value {
        let mut json = base(model_type);
        json[key] = value;
        json
    }

    #[test]
    fn qwen3_takes_head_dim_from_the_config() {
        let c = ModelConfig::from_hf_json(&with("qwen3", "head_dim", json!(32))).expect("config");
        assert_eq!(
            (c.arch, c.head_dim, c.qk_norm, c.qkv_bias),
            (Architecture::Qwen3, 32, true, false)
        );
        let c = ModelConfig::from_hf_json(&base("qwen3")).expect("config");
        assert_eq!(c.head_dim, 16);
    }

    #[test]
    fn llama3_rope_scaling_is_read_in_both_layouts() {
        let scaling = json!({
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"
        });
        let v4 = {
            let mut j = with("llama", "rope_scaling", scaling.clone());
            j["rope_theta"] = json!(500000.0);
            j
        };
        let mut params = scaling;
        params["rope_theta"] = json!(500000.0);
        let v5 = with("llama", "rope_parameters", params);
        let a = ModelConfig::from_hf_json(&v4).expect("v4");
        let b = ModelConfig::from_hf_json(&v5).expect("v5");
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 500000.0);
        assert_eq!(
            a.rope_scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
    }

    #[test]
    fn keys_that_change_the_math_are_refused_by_name() {
        let cases = [
            with("llama", "hidden_act", json!("gelu")),
            with("llama", "attention_bias", json!(true)),
            with("qwen3", "mlp_bias", json!(true)),
            with("qwen2", "use_sliding_window", json!(true)),
            with(
                "qwen3",
                "layer_types",
                json!(["full_attention", "sliding_attention"]),
            ),
            with("llama", "partial_rotary_factor", json!(0.5)),
            with(
                "llama",
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 4.0}),
            ),
            with(
                "qwen2",
                "quantization_config",
                json!({"quant_method": "awq"}),
            ),
        ];
        let names = [
            "hidden_act",
            "attention_bias",
            "mlp_bias",
            "use_sliding_window",
            "layer_types",
            "partial_rotary_factor",
            "yarn",
            "quantization_config",
        ];
        for (json, name) in cases.iter().zip(names) {
            let err = ModelConfig::from_hf_json(json).expect_err(name).to_string();
            assert!(err.contains(name), "{name}: {err}");
        }
        let err = ModelConfig::from_hf_json(&base("mistral")).expect_err("unknown type");
        assert!(err.to_string().contains("mistral"), "{err}");
    }

    #[test]
    fn defaults_and_harmless_keys_load() {
        let mut json = with("qwen2", "use_sliding_window", json!(false));
        json["sliding_window"] = json!(131072);
        json["attention_bias"] = json!(true);
        json["layer_types"] = json!(["full_attention", "full_attention"]);
        json["rope_scaling"] = Value::Null;
        json["hidden_act"] = json!("silu");
        json["pretraining_tp"] = json!(1);
        let c = ModelConfig::from_hf_json(&json).expect("config");
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert!(c.qkv_bias);
    }

    #[test]
    fn a_wrong_type_is_an_error_naming_the_key() {
        let err = ModelConfig::from_hf_json(&with("qwen2", "hidden_size", json!("64")))
            .expect_err("string");
        assert!(err.to_string().contains("hidden_size"), "{err}");
    }

    /// `ROPE_INIT_FUNCTIONS["llama3"]` of transformers 5.25 on Llama 3.1's values (factor 8,
    /// 1, 4, 8192; θ = 500000, head_dim 128): frequency 20 is kept, 30–34 lie in the smoothed
    /// band, 40 and 63 are divided by 8.
    const LLAMA3_REFERENCE: [(usize, f32); 6] = [
        (20, 0.016_560_44),
        (30, 0.0013718937),
        (32, 0.000_524_846),
        (34, 0.00017850779),
        (40, 3.428102e-5),
        (63, 3.068_926e-7),
    ];

    #[test]
    fn llama3_scaling_matches_transformers() {
        let d = 128;
        let mut inv: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / 500000f32.powf(2.0 * i as f32 / d as f32))
            .collect();
        let plain = inv.clone();
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
        .apply(&mut inv)
        .expect("apply");
        assert_eq!(inv[0], plain[0]);
        let rel = |a: f32, b: f32| ((a - b) / b).abs();
        for (i, want) in LLAMA3_REFERENCE {
            assert!(rel(inv[i], want) < 1e-5, "freq {i}: {} vs {want}", inv[i]);
        }
    }
}
