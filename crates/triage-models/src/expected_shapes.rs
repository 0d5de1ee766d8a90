//! The shape the config gives each tensor, checked against the file's before any is read, so
//! a checkpoint that disagrees with its `config.json` is an error naming the tensor (and its
//! shard), not a failed matmul later.

use crate::config::ModelConfig;
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// Decoder layer `i`'s tensors (by GGUF name) and the shapes the config gives them.
fn layer_shapes(c: &ModelConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    let (h, d) = (c.hidden_size, c.head_dim);
    let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
    let p = format!("blk.{i}");
    let mut shapes = vec![
        (format!("{p}.attn_norm.weight"), vec![h]),
        (format!("{p}.attn_q.weight"), vec![q, h]),
        (format!("{p}.attn_k.weight"), vec![kv, h]),
        (format!("{p}.attn_v.weight"), vec![kv, h]),
        (format!("{p}.attn_output.weight"), vec![h, q]),
        (format!("{p}.ffn_norm.weight"), vec![h]),
        (format!("{p}.ffn_gate.weight"), vec![c.intermediate_size, h]),
        (format!("{p}.ffn_up.weight"), vec![c.intermediate_size, h]),
        (format!("{p}.ffn_down.weight"), vec![h, c.intermediate_size]),
    ];
    if c.qkv_bias {
        shapes.push((format!("{p}.attn_q.bias"), vec![q]));
        shapes.push((format!("{p}.attn_k.bias"), vec![kv]));
        shapes.push((format!("{p}.attn_v.bias"), vec![kv]));
    }
    if c.qk_norm {
        shapes.push((format!("{p}.attn_q_norm.weight"), vec![d]));
        shapes.push((format!("{p}.attn_k_norm.weight"), vec![d]));
    }
    shapes
}

/// The embedding, the untied LM head and the final norm.
fn end_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut shapes = vec![
        (
            "token_embd.weight".to_string(),
            vec![c.vocab_size, c.hidden_size],
        ),
        ("output_norm.weight".to_string(), vec![c.hidden_size]),
    ];
    if !c.tie_embeddings {
        shapes.push((
            "output.weight".to_string(),
            vec![c.vocab_size, c.hidden_size],
        ));
    }
    shapes
}

fn check(w: &WeightSource, c: &ModelConfig, shapes: Vec<(String, Vec<usize>)>) -> Result<()> {
    for (name, want) in shapes {
        // A missing tensor is the read's error, which says where it was looked for.
        let Some(got) = w.dims(&name) else { continue };
        if got != want {
            return Err(ModelError::Invalid(format!(
                "tensor {} has shape {got:?}, but the config (hidden {}, intermediate {}, {} \
                 heads / {} kv heads of {}, vocab {}) gives it {want:?}",
                w.describe(&name),
                c.hidden_size,
                c.intermediate_size,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                c.vocab_size
            )));
        }
    }
    Ok(())
}

/// Layer `i`'s tensors have the config's shapes.
pub fn check_layer(w: &WeightSource, c: &ModelConfig, i: usize) -> Result<()> {
    check(w, c, layer_shapes(c, i))
}

/// The embedding, head and final norm have the config's shapes.
pub fn check_ends(w: &WeightSource, c: &ModelConfig) -> Result<()> {
    check(w, c, end_shapes(c))
}
