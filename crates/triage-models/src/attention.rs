//! The interface between the model's forward pass and KV storage: the model hands each layer's
//! new Q, K, V to an `AttentionBackend`, which stores K/V and returns attention outputs. The
//! contiguous single-sequence cache here is the first backend (and later the test reference for
//! the paged one).

use candle_core::{DType, Device, Tensor};

use crate::layers::softmax_last_dim;
use crate::{ModelError, Result};

/// Query rows processed at once, so a long prompt never materialises its whole score matrix.
pub const QUERY_CHUNK: usize = 256;

/// KV storage plus attention for one forward pass.
pub trait AttentionBackend {
    /// Store this step's `k`, `v` (`[num_kv_heads, n, head_dim]`) for layer `layer_idx` and return
    /// causal attention of `q` (`[num_heads, n, head_dim]`) over everything stored, as `[n,
    /// num_heads * head_dim]`.
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;
}

/// A growable contiguous K/V cache for one sequence.
#[derive(Debug)]
pub struct ContiguousKvCache {
    layers: Vec<Option<LayerCache>>,
    capacity_step: usize,
}

#[derive(Debug)]
struct LayerCache {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl ContiguousKvCache {
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: (0..num_layers).map(|_| None).collect(),
            capacity_step: 512,
        }
    }

    /// Tokens stored (in layer 0).
    pub fn seq_len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |l| l.len)
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
    }

    /// Keep only the first `len` tokens (the rest is overwritten by later appends).
    pub fn truncate(&mut self, len: usize) {
        for layer in self.layers.iter_mut().flatten() {
            layer.len = layer.len.min(len);
        }
    }

    fn append(&mut self, layer_idx: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let slot = self
            .layers
            .get_mut(layer_idx)
            .ok_or_else(|| ModelError::Invalid(format!("layer {layer_idx} out of range")))?;
        let (kv_heads, n, head_dim) = k.dims3()?;
        let step = self.capacity_step;
        let layer = match slot {
            Some(layer) if layer.k.dim(1)? >= layer.len + n => layer,
            _ => {
                let old_len = slot.as_ref().map_or(0, |l| l.len);
                let capacity = (old_len + n).div_ceil(step) * step;
                let (dtype, device) = (k.dtype(), k.device().clone());
                let new_k = Tensor::zeros((kv_heads, capacity, head_dim), dtype, &device)?;
                let new_v = Tensor::zeros((kv_heads, capacity, head_dim), dtype, &device)?;
                if let Some(old) = slot.as_ref() {
                    if old.len > 0 {
                        new_k.slice_set(&old.k.narrow(1, 0, old.len)?.contiguous()?, 1, 0)?;
                        new_v.slice_set(&old.v.narrow(1, 0, old.len)?.contiguous()?, 1, 0)?;
                    }
                }
                slot.insert(LayerCache {
                    k: new_k,
                    v: new_v,
                    len: old_len,
                })
            }
        };
        layer.k.slice_set(&k.contiguous()?, 1, layer.len)?;
        layer.v.slice_set(&v.contiguous()?, 1, layer.len)?;
        layer.len += n;
        Ok((
            layer.k.narrow(1, 0, layer.len)?,
            layer.v.narrow(1, 0, layer.len)?,
        ))
    }
}

impl AttentionBackend for ContiguousKvCache {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (k_all, v_all) = self.append(layer_idx, k, v)?;
        causal_attention(q, &k_all, &v_all)
    }
}

/// Causal grouped-query attention of the last `n` positions (`q`: `[heads, n, d]`) over `k`, `v`
/// (`[kv_heads, total, d]`, the queries being the last `n` of the `total` positions).
/// Returns `[n, heads * d]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (num_heads, n, head_dim) = q.dims3()?;
    let (kv_heads, total, _) = k.dims3()?;
    if kv_heads == 0 || num_heads % kv_heads != 0 || total < n {
        return Err(ModelError::Invalid(format!(
            "attention shapes: q {:?}, k {:?}",
            q.dims(),
            k.dims()
        )));
    }
    let groups = num_heads / kv_heads;
    let past = total - n;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let k_t = k.t()?.contiguous()?; // [kv_heads, d, total]
    let v = v.contiguous()?;
    // Heads sharing a KV head are adjacent: view q as [kv_heads, groups * rows, d] so K/V are
    // never copied per head.
    let q = q.reshape((kv_heads, groups, n, head_dim))?;
    let mut outputs = Vec::with_capacity(n.div_ceil(QUERY_CHUNK));
    let mut start = 0;
    while start < n {
        let rows = QUERY_CHUNK.min(n - start);
        let keys = past + start + rows; // keys visible to the last row of this chunk
        let q_c = q
            .narrow(2, start, rows)?
            .reshape((kv_heads, groups * rows, head_dim))?;
        let k_c = k_t.narrow(2, 0, keys)?;
        let v_c = v.narrow(1, 0, keys)?;
        let mut scores = (q_c.matmul(&k_c)? * scale)?; // [kv_heads, groups*rows, keys]
        if rows > 1 {
            let mask = causal_mask(rows, keys, past + start, q.device())?; // [rows, keys]
            let mask = mask
                .unsqueeze(0)?
                .broadcast_as((groups, rows, keys))?
                .reshape((groups * rows, keys))?;
            scores = scores.broadcast_add(&mask)?;
        }
        let probs = softmax_last_dim(&scores)?;
        let out = probs.matmul(&v_c)?; // [kv_heads, groups*rows, d]
        outputs.push(out.reshape((num_heads, rows, head_dim))?);
        start += rows;
    }
    let out = if outputs.len() == 1 {
        outputs.remove(0)
    } else {
        Tensor::cat(&outputs, 1)?
    };
    Ok(out.transpose(0, 1)?.reshape((n, num_heads * head_dim))?)
}

/// `[rows, keys]` additive mask: row `r` (position `first_pos + r`) sees keys `0..=first_pos + r`.
fn causal_mask(rows: usize, keys: usize, first_pos: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..rows)
        .flat_map(|r| {
            (0..keys).map(move |j| {
                if j <= first_pos + r {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(mask, (rows, keys), device)?.to_dtype(DType::F32)?)
}

/// Reference attention: per head, a plain softmax(QKᵀ/√d + mask)V with K/V repeated per head.
pub fn causal_attention_slow(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (num_heads, n, head_dim) = q.dims3()?;
    let (kv_heads, total, _) = k.dims3()?;
    let groups = num_heads / kv_heads;
    let mut heads = Vec::with_capacity(num_heads);
    for h in 0..num_heads {
        let qh = q.get(h)?;
        let kh = k.get(h / groups)?;
        let vh = v.get(h / groups)?;
        let scores = (qh.matmul(&kh.t()?)? / (head_dim as f64).sqrt())?;
        let mask = causal_mask(n, total, total - n, q.device())?;
        let probs = candle_nn::ops::softmax(&(scores + mask)?, 1)?;
        heads.push(probs.matmul(&vh)?);
    }
    Ok(Tensor::stack(&heads, 0)?
        .transpose(0, 1)?
        .reshape((n, num_heads * head_dim))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(shape: (usize, usize, usize)) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu).expect("randn")
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn chunked_gqa_attention_matches_reference() {
        // 600 rows cross the 256-row chunk boundary twice; 8 heads over 2 KV heads.
        for (n, past) in [(1, 0), (1, 37), (5, 0), (600, 0), (300, 120)] {
            let q = randn((8, n, 16));
            let k = randn((2, past + n, 16));
            let v = randn((2, past + n, 16));
            let fast = causal_attention(&q, &k, &v).unwrap();
            let slow = causal_attention_slow(&q, &k, &v).unwrap();
            assert!(max_abs_diff(&fast, &slow) < 1e-4, "n={n} past={past}");
        }
    }

    #[test]
    fn cache_append_in_steps_equals_one_shot() {
        let (q, k, v) = (randn((4, 40, 8)), randn((2, 40, 8)), randn((2, 40, 8)));
        let mut one = ContiguousKvCache::new(1);
        let full = one.attend(0, &q, &k, &v).unwrap();
        let mut steps = ContiguousKvCache::new(1);
        steps.capacity_step = 16; // force re-allocation while growing
        let mut parts = Vec::new();
        for (start, len) in [(0, 30), (30, 1), (31, 9)] {
            let part = steps
                .attend(
                    0,
                    &q.narrow(1, start, len).unwrap(),
                    &k.narrow(1, start, len).unwrap(),
                    &v.narrow(1, start, len).unwrap(),
                )
                .unwrap();
            parts.push(part);
        }
        let stepped = Tensor::cat(&parts, 0).unwrap();
        assert_eq!(steps.seq_len(), 40);
        assert!(max_abs_diff(&full, &stepped) < 1e-5);
    }
}
