//! BERT encoders from HF safetensors checkpoints: `BertModel` (embeddings, post-norm encoder
//! layers, exact-erf GELU), `SentenceEmbedder` (sentence-transformers' mean pooling and L2
//! normalisation, batched with padding masks) and `CrossEncoder` (a sequence-classification head
//! on the [CLS] vector, the ms-marco-MiniLM layout).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, D};

use crate::{ModelError, Result};

/// The fields of a BERT `config.json` the encoder needs.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
}

impl BertConfig {
    pub fn from_json(json: &serde_json::Value) -> Result<Self> {
        let get = |k: &str| {
            json.get(k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| {
                    ModelError::Invalid(format!("BERT config.json lacks the integer {k:?}"))
                })
        };
        if let Some(act) = json.get("hidden_act").and_then(|v| v.as_str()) {
            if act != "gelu" {
                return Err(ModelError::Invalid(format!(
                    "BERT hidden_act {act:?} is not supported (only \"gelu\")"
                )));
            }
        }
        let config = Self {
            vocab_size: get("vocab_size")?,
            hidden_size: get("hidden_size")?,
            num_layers: get("num_hidden_layers")?,
            num_heads: get("num_attention_heads")?,
            intermediate_size: get("intermediate_size")?,
            max_position_embeddings: get("max_position_embeddings")?,
            type_vocab_size: get("type_vocab_size").unwrap_or(2),
            layer_norm_eps: json
                .get("layer_norm_eps")
                .and_then(|v| v.as_f64())
                .unwrap_or(1e-12),
        };
        if config.num_heads == 0 || !config.hidden_size.is_multiple_of(config.num_heads) {
            return Err(ModelError::Invalid(format!(
                "hidden_size {} is not a multiple of {} heads",
                config.hidden_size, config.num_heads
            )));
        }
        Ok(config)
    }
}

struct Weights {
    tensors: HashMap<String, Tensor>,
    prefix: String,
}

impl Weights {
    fn get(&self, name: &str) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        self.tensors
            .get(&full)
            .cloned()
            .ok_or_else(|| ModelError::Invalid(format!("BERT checkpoint lacks {full}")))
    }

    fn linear(&self, name: &str) -> Result<(Tensor, Tensor)> {
        Ok((
            self.get(&format!("{name}.weight"))?,
            self.get(&format!("{name}.bias"))?,
        ))
    }

    fn norm(&self, name: &str) -> Result<(Tensor, Tensor)> {
        Ok((
            self.get(&format!("{name}.weight"))?,
            self.get(&format!("{name}.bias"))?,
        ))
    }
}

struct Layer {
    qkv: [(Tensor, Tensor); 3],
    attn_out: (Tensor, Tensor),
    attn_norm: (Tensor, Tensor),
    up: (Tensor, Tensor),
    down: (Tensor, Tensor),
    out_norm: (Tensor, Tensor),
}

/// A BERT encoder.
pub struct BertModel {
    config: BertConfig,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: (Tensor, Tensor),
    layers: Vec<Layer>,
    device: Device,
}

impl std::fmt::Debug for BertModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertModel")
            .field("config", &self.config)
            .finish()
    }
}

fn linear(x: &Tensor, (w, b): &(Tensor, Tensor)) -> Result<Tensor> {
    Ok(x.broadcast_matmul(&w.t()?)?.broadcast_add(b)?)
}

fn layer_norm(x: &Tensor, (w, b): &(Tensor, Tensor), eps: f64) -> Result<Tensor> {
    Ok(candle_nn::ops::layer_norm(x, w, b, eps as f32)?)
}

/// Read a folder's `config.json` and its single `model.safetensors` (f32/f16/bf16 → f32).
fn read_checkpoint(
    dir: &Path,
    device: &Device,
) -> Result<(serde_json::Value, HashMap<String, Tensor>)> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::InvalidModel {
            path: config_path.clone(),
            message: e.to_string(),
        })?;
    let weights_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&weights_path).map_err(io(&weights_path))?;
    let tensors = candle_core::safetensors::load_buffer(&bytes, device)
        .map_err(|e| ModelError::InvalidModel {
            path: weights_path.clone(),
            message: e.to_string(),
        })?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::F32)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    Ok((json, tensors))
}

impl BertModel {
    fn from_weights(config: BertConfig, w: &Weights, device: &Device) -> Result<Self> {
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                qkv: [
                    w.linear(&format!("{p}.attention.self.query"))?,
                    w.linear(&format!("{p}.attention.self.key"))?,
                    w.linear(&format!("{p}.attention.self.value"))?,
                ],
                attn_out: w.linear(&format!("{p}.attention.output.dense"))?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"))?,
                up: w.linear(&format!("{p}.intermediate.dense"))?,
                down: w.linear(&format!("{p}.output.dense"))?,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(Self {
            word: w.get("embeddings.word_embeddings.weight")?,
            position: w.get("embeddings.position_embeddings.weight")?,
            token_type: w.get("embeddings.token_type_embeddings.weight")?,
            embed_norm: w.norm("embeddings.LayerNorm")?,
            layers,
            config,
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Hidden states `[batch, seq, hidden]` for `ids` and `mask` (`[batch, seq]`, 1 = token,
    /// 0 = padding); padded positions never influence real ones.
    pub fn forward(&self, ids: &Tensor, type_ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (batch, seq) = ids.dims2()?;
        if seq > self.config.max_position_embeddings {
            return Err(ModelError::Invalid(format!(
                "{seq} tokens exceed the encoder's {} positions",
                self.config.max_position_embeddings
            )));
        }
        let positions = Tensor::arange(0u32, seq as u32, &self.device)?;
        let x = self
            .word
            .embedding(&ids.flatten_all()?)?
            .reshape((batch, seq, ()))?
            .broadcast_add(&self.position.embedding(&positions)?)?
            .add(
                &self
                    .token_type
                    .embedding(&type_ids.flatten_all()?)?
                    .reshape((batch, seq, ()))?,
            )?;
        let mut x = layer_norm(&x, &self.embed_norm, self.config.layer_norm_eps)?;
        // Additive mask: 0 for tokens, -inf-like for padding, broadcast over heads and queries.
        let bias = ((mask.to_dtype(DType::F32)? - 1.0)? * 1e9)?.reshape((batch, 1, 1, seq))?;
        for layer in &self.layers {
            x = self.layer(&x, layer, &bias)?;
        }
        Ok(x)
    }

    fn layer(&self, x: &Tensor, layer: &Layer, bias: &Tensor) -> Result<Tensor> {
        let (batch, seq, hidden) = x.dims3()?;
        let heads = self.config.num_heads;
        let head_dim = hidden / heads;
        let split = |t: Tensor| -> Result<Tensor> {
            Ok(t.reshape((batch, seq, heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = split(linear(x, &layer.qkv[0])?)?;
        let k = split(linear(x, &layer.qkv[1])?)?;
        let v = split(linear(x, &layer.qkv[2])?)?;
        let scores = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? / (head_dim as f64).sqrt())?
            .broadcast_add(bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let context = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((batch, seq, hidden))?;
        let eps = self.config.layer_norm_eps;
        let x = layer_norm(
            &(linear(&context, &layer.attn_out)? + x)?,
            &layer.attn_norm,
            eps,
        )?;
        let h = linear(&x, &layer.up)?.gelu_erf()?;
        layer_norm(&(linear(&h, &layer.down)? + x)?, &layer.out_norm, eps)
    }
}

/// Token ids of a batch, padded to the longest, with the attention mask.
fn pad_batch(
    tokenizer: &tokenizers::Tokenizer,
    texts: &[&str],
    pairs: Option<&[&str]>,
    max_len: usize,
    device: &Device,
) -> Result<(Tensor, Tensor, Tensor)> {
    let tok_err = |e: tokenizers::Error| ModelError::Invalid(format!("tokenizer: {e}"));
    let mut rows = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let enc = match pairs {
            Some(p) => tokenizer.encode((*text, p[i]), true).map_err(tok_err)?,
            None => tokenizer.encode(*text, true).map_err(tok_err)?,
        };
        let mut ids = enc.get_ids().to_vec();
        let mut types = enc.get_type_ids().to_vec();
        if ids.len() > max_len {
            // Keep the closing [SEP] when cutting, as the tokenizer's own truncation does.
            let last = *ids.last().unwrap_or(&0);
            ids.truncate(max_len);
            types.truncate(max_len);
            if let Some(end) = ids.last_mut() {
                *end = last;
            }
        }
        rows.push((ids, types));
    }
    let seq = rows
        .iter()
        .map(|(ids, _)| ids.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for (row_ids, row_types) in &rows {
        let pad = seq - row_ids.len();
        ids.extend(row_ids.iter().copied().chain(std::iter::repeat_n(0, pad)));
        types.extend(row_types.iter().copied().chain(std::iter::repeat_n(0, pad)));
        mask.extend(std::iter::repeat_n(1u32, row_ids.len()).chain(std::iter::repeat_n(0, pad)));
    }
    let shape = (rows.len(), seq);
    Ok((
        Tensor::from_vec(ids, shape, device)?,
        Tensor::from_vec(types, shape, device)?,
        Tensor::from_vec(mask, shape, device)?,
    ))
}

/// Load `tokenizer.json` with its padding and truncation switched off (we pad per batch and
/// truncate at the encoder's real limit; the MiniLM file ships with truncation at 128).
fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = dir.join("tokenizer.json");
    let mut tokenizer =
        tokenizers::Tokenizer::from_file(&path).map_err(|e| ModelError::InvalidModel {
            path: path.clone(),
            message: e.to_string(),
        })?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| ModelError::Invalid(format!("tokenizer: {e}")))?;
    Ok(tokenizer)
}

/// The token limit of a sentence-transformers folder: `sentence_bert_config.json`'s
/// `max_seq_length`, else the encoder's positions.
fn max_seq_length(dir: &Path, config: &BertConfig) -> usize {
    std::fs::read_to_string(dir.join("sentence_bert_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|j| j.get("max_seq_length").and_then(|v| v.as_u64()))
        .map_or(config.max_position_embeddings, |v| v as usize)
        .min(config.max_position_embeddings)
}

/// Sentence embeddings: BERT, mean pooling over real tokens, L2 normalisation.
#[derive(Debug)]
pub struct SentenceEmbedder {
    model: BertModel,
    tokenizer: tokenizers::Tokenizer,
    max_len: usize,
}

/// Texts embedded per forward pass.
pub const EMBED_BATCH: usize = 32;

impl SentenceEmbedder {
    /// Load a sentence-transformers folder (`config.json`, `model.safetensors`,
    /// `tokenizer.json`, optionally `sentence_bert_config.json`).
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let (json, tensors) = read_checkpoint(dir, device)?;
        let config = BertConfig::from_json(&json)?;
        let prefix = if tensors.contains_key("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let weights = Weights {
            tensors,
            prefix: prefix.into(),
        };
        let max_len = max_seq_length(dir, &config);
        Ok(Self {
            model: BertModel::from_weights(config, &weights, device)?,
            tokenizer: load_tokenizer(dir)?,
            max_len,
        })
    }

    /// Embedding width.
    pub fn dim(&self) -> usize {
        self.model.config.hidden_size
    }

    /// Tokens kept per text; longer texts are cut (sentence-transformers does the same).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The tokenizer (chunkers count tokens with it).
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// Unit-length embeddings of `texts`, in batches of [`EMBED_BATCH`]. Texts of similar length
    /// share a batch (less padding); the result is in the order given.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let sorted: Vec<&str> = order.iter().map(|&i| texts[i]).collect();
        let embedded = self.embed_in_order(&sorted)?;
        let mut out = vec![Vec::new(); texts.len()];
        for (i, v) in order.into_iter().zip(embedded) {
            out[i] = v;
        }
        Ok(out)
    }

    fn embed_in_order(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(EMBED_BATCH) {
            let (ids, types, mask) = pad_batch(
                &self.tokenizer,
                batch,
                None,
                self.max_len,
                &self.model.device,
            )?;
            let hidden = self.model.forward(&ids, &types, &mask)?;
            let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&m)?.sum(1)?;
            let counts = m.sum(1)?.clamp(1e-9, f64::MAX)?;
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean
                .sqr()?
                .sum_keepdim(D::Minus1)?
                .sqrt()?
                .clamp(1e-12, f64::MAX)?;
            out.extend(mean.broadcast_div(&norm)?.to_vec2::<f32>()?);
        }
        Ok(out)
    }
}

/// A BERT sequence-classification checkpoint used as a reranker: the score of a (query,
/// passage) pair is the classifier's logit on the pooled [CLS] vector.
#[derive(Debug)]
pub struct CrossEncoder {
    model: BertModel,
    tokenizer: tokenizers::Tokenizer,
    pooler: (Tensor, Tensor),
    classifier: (Tensor, Tensor),
    max_len: usize,
}

impl CrossEncoder {
    /// Load an HF `BertForSequenceClassification` folder (`bert.*` plus `classifier.*`).
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let (json, tensors) = read_checkpoint(dir, device)?;
        let config = BertConfig::from_json(&json)?;
        let weights = Weights {
            tensors,
            prefix: "bert.".into(),
        };
        let pooler = weights.linear("pooler.dense")?;
        let root = Weights {
            tensors: weights.tensors.clone(),
            prefix: String::new(),
        };
        let classifier = root.linear("classifier")?;
        let max_len = config.max_position_embeddings.min(512);
        Ok(Self {
            model: BertModel::from_weights(config, &weights, device)?,
            tokenizer: load_tokenizer(dir)?,
            pooler,
            classifier,
            max_len,
        })
    }

    /// One relevance logit per (query, passage) pair, higher = more relevant.
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(passages.len());
        for batch in passages.chunks(EMBED_BATCH) {
            let queries = vec![query; batch.len()];
            let (ids, types, mask) = pad_batch(
                &self.tokenizer,
                &queries,
                Some(batch),
                self.max_len,
                &self.model.device,
            )?;
            let hidden = self.model.forward(&ids, &types, &mask)?;
            let cls = hidden.narrow(1, 0, 1)?.squeeze(1)?;
            let pooled = linear(&cls, &self.pooler)?.tanh()?;
            let logits = linear(&pooled, &self.classifier)?;
            // One label: its logit. Two or more: the last (ms-marco's "relevant") minus the first.
            let n = logits.dim(1)?;
            let score = if n == 1 {
                logits.squeeze(1)?
            } else {
                (logits.narrow(1, n - 1, 1)? - logits.narrow(1, 0, 1)?)?.squeeze(1)?
            };
            out.extend(score.to_vec1::<f32>()?);
        }
        Ok(out)
    }
}
