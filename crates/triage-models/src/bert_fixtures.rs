//! Tiny random BERT checkpoints in the HF layout (a sentence-transformers folder, or a
//! sequence-classification one with `bert.` prefixes and a classifier head) with a small
//! WordPiece `tokenizer.json`, so tests of embedders and rerankers need no downloads.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::json;

use crate::{ModelError, Result};

const HIDDEN: usize = 32;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const INTERMEDIATE: usize = 64;
const POSITIONS: usize = 64;

/// The WordPiece vocabulary: specials, single letters and digits, their `##` continuations, and
/// punctuation. Every lower-case ASCII word tokenizes without `[UNK]`.
fn vocab() -> Vec<String> {
    let mut v: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .map(String::from)
        .to_vec();
    let chars: Vec<char> = ('a'..='z').chain('0'..='9').collect();
    v.extend(chars.iter().map(|c| c.to_string()));
    v.extend(chars.iter().map(|c| format!("##{c}")));
    v.extend(".,;:!?'\"()-".chars().map(|c| c.to_string()));
    v
}

fn tokenizer_json(vocab: &[String]) -> serde_json::Value {
    let ids: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<_> = vocab[..4]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                             "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special = |name: &str, id: usize| json!({"id": name, "ids": [id], "tokens": [name]});
    json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 8}, "direction": "Right", "pad_to_multiple_of": null,
                    "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": special("[CLS]", 2), "[SEP]": special("[SEP]", 3)}
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids}
    })
}

/// Write a tiny BERT folder to `dir`: a sentence embedder, or with `classifier` a
/// sequence-classification checkpoint (one relevance label). The shipped tokenizer truncates at
/// 8 and pads to 8, like real files that truncate below the model's limit, so loaders must
/// switch that off.
pub fn write_tiny_bert(dir: &Path, classifier: bool, seed: u64) -> Result<()> {
    let vocab = vocab();
    let io = |e: std::io::Error| ModelError::Io {
        path: dir.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let config = json!({
        "architectures": [if classifier { "BertForSequenceClassification" } else { "BertModel" }],
        "vocab_size": vocab.len(), "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "intermediate_size": INTERMEDIATE, "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    });
    let write = |name: &str, value: &serde_json::Value| {
        std::fs::write(dir.join(name), value.to_string()).map_err(io)
    };
    write("config.json", &config)?;
    write("tokenizer.json", &tokenizer_json(&vocab))?;
    if !classifier {
        write(
            "sentence_bert_config.json",
            &json!({"max_seq_length": 48, "do_lower_case": false}),
        )?;
    }
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut randn = |shape: &[usize], scale: f32| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect();
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
    };
    let p = if classifier { "bert." } else { "" };
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let ones = |n: usize| Tensor::ones(n, candle_core::DType::F32, &Device::Cpu);
    t.insert(
        format!("{p}embeddings.word_embeddings.weight"),
        randn(&[vocab.len(), HIDDEN], 1.0)?,
    );
    t.insert(
        format!("{p}embeddings.position_embeddings.weight"),
        randn(&[POSITIONS, HIDDEN], 0.5)?,
    );
    t.insert(
        format!("{p}embeddings.token_type_embeddings.weight"),
        randn(&[2, HIDDEN], 0.5)?,
    );
    t.insert(format!("{p}embeddings.LayerNorm.weight"), ones(HIDDEN)?);
    t.insert(
        format!("{p}embeddings.LayerNorm.bias"),
        randn(&[HIDDEN], 0.1)?,
    );
    for l in 0..LAYERS {
        let q = format!("{p}encoder.layer.{l}");
        let mut lin = |name: String, out: usize, inp: usize| -> Result<()> {
            t.insert(format!("{name}.weight"), randn(&[out, inp], 0.3)?);
            t.insert(format!("{name}.bias"), randn(&[out], 0.1)?);
            Ok(())
        };
        for part in ["query", "key", "value"] {
            lin(format!("{q}.attention.self.{part}"), HIDDEN, HIDDEN)?;
        }
        lin(format!("{q}.attention.output.dense"), HIDDEN, HIDDEN)?;
        lin(format!("{q}.intermediate.dense"), INTERMEDIATE, HIDDEN)?;
        lin(format!("{q}.output.dense"), HIDDEN, INTERMEDIATE)?;
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            t.insert(format!("{q}.{norm}.weight"), ones(HIDDEN)?);
            t.insert(format!("{q}.{norm}.bias"), randn(&[HIDDEN], 0.1)?);
        }
    }
    if classifier {
        t.insert(
            "bert.pooler.dense.weight".into(),
            randn(&[HIDDEN, HIDDEN], 0.3)?,
        );
        t.insert("bert.pooler.dense.bias".into(), randn(&[HIDDEN], 0.1)?);
        t.insert("classifier.weight".into(), randn(&[1, HIDDEN], 0.5)?);
        t.insert("classifier.bias".into(), randn(&[1], 0.1)?);
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors"))?;
    Ok(())
}
