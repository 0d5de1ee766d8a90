//! Tiny random-weight models for tests: the same weights written as a GGUF file and as a HF
//! safetensors folder, with a byte-level BPE tokenizer, so tests never download anything.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::config::Architecture;
use crate::{ModelError, Result};

/// Shape of a tiny model. Matrix inner dimensions are multiples of 32 so Q8_0 applies.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub arch: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub context_length: usize,
    /// Rows of the embedding (and LM head): [`TINY_VOCAB`], or more for a real model's shape (the
    /// tokenizer still knows only the tiny vocabulary; ids past it decode to nothing).
    pub vocab_size: usize,
    pub seed: u64,
}

impl TinySpec {
    /// A 2-layer model with grouped-query attention (4 heads over 2 KV heads of 16 dims).
    pub fn new(arch: Architecture) -> Self {
        Self {
            arch,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            context_length: 512,
            vocab_size: TINY_VOCAB,
            seed: 7,
        }
    }

    /// A real model's shape with random weights, for GPU checks where no real weights can
    /// travel: `qwen2.5-0.5b` or `qwen2.5-1.5b` (their `config.json` sizes, 32k context).
    pub fn real_shape(name: &str) -> Option<Self> {
        let (hidden_size, intermediate_size, num_layers, num_heads) = match name {
            "qwen2.5-0.5b" => (896, 4864, 24, 14),
            "qwen2.5-1.5b" => (1536, 8960, 28, 12),
            _ => return None,
        };
        Some(Self {
            arch: Architecture::Qwen2,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads: 2,
            context_length: 32_768,
            vocab_size: 151_936,
            seed: 7,
        })
    }

    /// `hidden / heads`, except Qwen3's, which is twice that (as in Qwen3-0.6B: 128 against
    /// 1024 / 16), so that the tests see Q and K wider than the hidden state.
    pub fn head_dim(&self) -> usize {
        match self.arch {
            Architecture::Qwen3 => 2 * self.hidden_size / self.num_heads,
            _ => self.hidden_size / self.num_heads,
        }
    }

    /// Qwen fixtures tie the LM head to the embedding, Llama fixtures do not.
    fn tied(&self) -> bool {
        self.arch == Architecture::Qwen2
    }
}

/// Ids of the tiny vocabulary: 256 byte tokens, two merged tokens, then special tokens.
pub const TINY_ENDOFTEXT: u32 = 258;
pub const TINY_IM_START: u32 = 259;
pub const TINY_IM_END: u32 = 260;
pub const TINY_VOCAB: usize = 261;

const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's byte-to-printable-character map, so every byte is one vocabulary entry.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut map = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        map[*b as usize] = char::from_u32(c).unwrap_or('?');
    }
    map
}

/// The tokenizer's GGUF metadata.
pub fn tiny_tokenizer_metadata(arch: Architecture) -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    tokens.push("he".into());
    tokens.push("\u{120}t".into()); // "Ġt": a space then 't'
    tokens.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    let types: Vec<Value> = (0..TINY_VOCAB)
        .map(|i| Value::I32(if i < 258 { 1 } else { 3 }))
        .collect();
    let merges = ["h e", "\u{120} t"];
    let pre = match arch {
        Architecture::Qwen2 | Architecture::Qwen3 => "qwen2",
        Architecture::Llama => "smollm",
    };
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(
                merges
                    .iter()
                    .map(|m| Value::String(m.to_string()))
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        (
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(TINY_ENDOFTEXT),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(TINY_IM_END),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(CHAT_TEMPLATE.into()),
        ),
    ]
}

fn model_metadata(spec: &TinySpec) -> Vec<(String, Value)> {
    let a = spec.arch.name();
    let mut md = vec![
        ("general.architecture".to_string(), Value::String(a.into())),
        (
            "general.name".to_string(),
            Value::String(format!("tiny-{a}")),
        ),
        (
            format!("{a}.context_length"),
            Value::U32(spec.context_length as u32),
        ),
        (
            format!("{a}.embedding_length"),
            Value::U32(spec.hidden_size as u32),
        ),
        (
            format!("{a}.block_count"),
            Value::U32(spec.num_layers as u32),
        ),
        (
            format!("{a}.feed_forward_length"),
            Value::U32(spec.intermediate_size as u32),
        ),
        (
            format!("{a}.attention.head_count"),
            Value::U32(spec.num_heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(spec.num_kv_heads as u32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        (
            format!("{a}.attention.key_length"),
            Value::U32(spec.head_dim() as u32),
        ),
    ];
    md.extend(tiny_tokenizer_metadata(spec.arch));
    md
}

/// Random weights in HF layout (rotate-half rope), keyed by GGUF tensor name.
pub fn tiny_weights(spec: &TinySpec) -> Result<Vec<(String, Tensor)>> {
    let dev = &Device::Cpu;
    let (h, i, d) = (spec.hidden_size, spec.intermediate_size, spec.head_dim());
    let state = std::cell::Cell::new(spec.seed);
    let randn = |shape: &[usize], std: f64| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| (normal(&state) * std) as f32).collect();
        Ok(Tensor::from_vec(values, shape, dev)?)
    };
    let norm = |n: usize| -> Result<Tensor> { Ok((randn(&[n], 0.1)? + 1.0)?) };
    // Projections keep the tiny model's output scale at any width (1 at hidden size 64), so a
    // real-shaped model's activations stay in range through its layers.
    let scale = (64.0 / h as f64).sqrt();
    let matrix = |shape: &[usize], std: f64| randn(shape, std * scale);
    let mut w = vec![(
        "token_embd.weight".to_string(),
        randn(&[spec.vocab_size, h], 1.0)?,
    )];
    for l in 0..spec.num_layers {
        let p = format!("blk.{l}");
        w.push((format!("{p}.attn_norm.weight"), norm(h)?));
        w.push((
            format!("{p}.attn_q.weight"),
            matrix(&[spec.num_heads * d, h], 0.2)?,
        ));
        w.push((
            format!("{p}.attn_k.weight"),
            matrix(&[spec.num_kv_heads * d, h], 0.2)?,
        ));
        w.push((
            format!("{p}.attn_v.weight"),
            matrix(&[spec.num_kv_heads * d, h], 0.2)?,
        ));
        if spec.arch == Architecture::Qwen2 {
            w.push((
                format!("{p}.attn_q.bias"),
                randn(&[spec.num_heads * d], 0.1)?,
            ));
            w.push((
                format!("{p}.attn_k.bias"),
                randn(&[spec.num_kv_heads * d], 0.1)?,
            ));
            w.push((
                format!("{p}.attn_v.bias"),
                randn(&[spec.num_kv_heads * d], 0.1)?,
            ));
        }
        if spec.arch == Architecture::Qwen3 {
            w.push((format!("{p}.attn_q_norm.weight"), norm(d)?));
            w.push((format!("{p}.attn_k_norm.weight"), norm(d)?));
        }
        w.push((
            format!("{p}.attn_output.weight"),
            matrix(&[h, spec.num_heads * d], 0.2)?,
        ));
        w.push((format!("{p}.ffn_norm.weight"), norm(h)?));
        w.push((format!("{p}.ffn_gate.weight"), matrix(&[i, h], 0.2)?));
        w.push((format!("{p}.ffn_up.weight"), matrix(&[i, h], 0.2)?));
        w.push((format!("{p}.ffn_down.weight"), matrix(&[h, i], 0.15)?));
    }
    w.push(("output_norm.weight".to_string(), norm(h)?));
    if !spec.tied() {
        w.push((
            "output.weight".to_string(),
            matrix(&[spec.vocab_size, h], 0.3)?,
        ));
    }
    Ok(w)
}

/// A standard normal draw (SplitMix64 + Box-Muller): reproducible without a `rand` dependency.
fn normal(state: &std::cell::Cell<u64>) -> f64 {
    let next = || {
        let mut z = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let u1 = next().max(f64::MIN_POSITIVE);
    let u2 = next();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// llama.cpp's Q/K row permutation for Llama GGUF files: per head, row `2j` takes HF row `j` and
/// row `2j + 1` takes HF row `d/2 + j`, so interleaved rope equals HF's rotate-half rope.
fn permute_for_interleaved_rope(w: &Tensor, num_heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    let d = rows / num_heads;
    Ok(w.reshape((num_heads, 2, d / 2, cols))?
        .transpose(1, 2)?
        .reshape((rows, cols))?)
}

/// Write the tiny model as GGUF; 2-D weights in `matrix_dtype` (e.g. Q8_0 or F32), the rest F32.
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec, matrix_dtype: GgmlDType) -> Result<()> {
    let mut qtensors = Vec::new();
    for (name, t) in tiny_weights(spec)? {
        let t = if spec.arch == Architecture::Llama && name.ends_with("attn_q.weight") {
            permute_for_interleaved_rope(&t, spec.num_heads)?
        } else if spec.arch == Architecture::Llama && name.ends_with("attn_k.weight") {
            permute_for_interleaved_rope(&t, spec.num_kv_heads)?
        } else {
            t
        };
        let dtype = if t.rank() == 2 {
            matrix_dtype
        } else {
            GgmlDType::F32
        };
        qtensors.push((name, QTensor::quantize(&t, dtype)?));
    }
    let md = model_metadata(spec);
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qtensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    gguf_file::write(&mut file, &md_refs, &t_refs)?;
    std::io::Write::flush(&mut file).map_err(io)?;
    Ok(())
}

/// Write the tiny model as a HF folder: `config.json`, `model.safetensors` (in `dtype`) and
/// `tokenizer.json` (built from the same vocabulary).
pub fn write_tiny_safetensors(dir: &Path, spec: &TinySpec, dtype: DType) -> Result<()> {
    write_sharded_safetensors(dir, spec, dtype, 1)
}

/// [`write_tiny_safetensors`] in `num_shards` files named as transformers' `save_pretrained`
/// names them (`model-00001-of-00003.safetensors`, …) with `model.safetensors.index.json`, the
/// tensors dealt to the shards in turn; one shard is a plain `model.safetensors`.
pub fn write_sharded_safetensors(
    dir: &Path,
    spec: &TinySpec,
    dtype: DType,
    num_shards: usize,
) -> Result<()> {
    let io = |source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let num_shards = num_shards.max(1);
    let mut shards: Vec<HashMap<String, Tensor>> = vec![HashMap::new(); num_shards];
    for (i, (name, t)) in tiny_weights(spec)?.into_iter().enumerate() {
        let hf = crate::weights::hf_name(&name)
            .ok_or_else(|| ModelError::Invalid(format!("no HF name for {name}")))?;
        shards[i % num_shards].insert(hf, t.to_dtype(dtype)?);
    }
    if num_shards == 1 {
        candle_core::safetensors::save(&shards[0], dir.join("model.safetensors"))?;
    } else {
        let mut weight_map = serde_json::Map::new();
        for (i, shard) in shards.into_iter().enumerate() {
            let file = format!("model-{:05}-of-{num_shards:05}.safetensors", i + 1);
            for name in shard.keys() {
                weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
            }
            candle_core::safetensors::save(&shard, dir.join(&file))?;
        }
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).map_err(io)?;
    }
    let config = serde_json::json!({
        "model_type": spec.arch.name(),
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim(),
        "max_position_embeddings": spec.context_length,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": spec.tied(),
    });
    std::fs::write(dir.join("config.json"), config.to_string()).map_err(io)?;
    let md: HashMap<String, Value> = tiny_tokenizer_metadata(spec.arch).into_iter().collect();
    let tokenizer = crate::tokenizer::tokenizer_from_gguf(&md)?;
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let tok_config = serde_json::json!({
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).map_err(io)?;
    Ok(())
}
