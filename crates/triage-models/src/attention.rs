//! The interface between the model's forward pass and KV storage: the model hands each layer's
//! new Q, K, V to an `AttentionBackend`, which stores K/V and returns attention outputs. The
//! contiguous single-sequence cache here is the first backend (and later the test reference for
//! the paged one).

use candle_core::Tensor;

use crate::{ModelError, Result};

pub use triage_ops::causal_attention::{
    causal_attention, causal_attention_kt, causal_attention_slow, QUERY_CHUNK,
};

/// KV storage plus attention for one forward pass.
pub trait AttentionBackend {
    /// Store this step's `k`, `v` (`[num_kv_heads, n, head_dim]`) for layer `layer_idx` and return
    /// causal attention of `q` (`[num_heads, n, head_dim]`) over everything stored, as `[n,
    /// num_heads * head_dim]`.
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;
}

/// A growable contiguous K/V cache for one sequence. Keys are kept transposed
/// (`[kv_heads, head_dim, capacity]`) and values as they come (`[kv_heads, capacity, head_dim]`),
/// so attention multiplies views of the filled positions in place: a decode step reads its keys
/// once instead of copying and transposing the whole cache (which made decode at 2,048 tokens
/// run at a third of its short-context speed).
#[derive(Debug)]
pub struct ContiguousKvCache {
    layers: Vec<Option<LayerCache>>,
    capacity_step: usize,
}

#[derive(Debug)]
struct LayerCache {
    /// `[kv_heads, head_dim, capacity]`.
    k_t: Tensor,
    /// `[kv_heads, capacity, head_dim]`.
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

    /// Store `k`, `v` after the layer's tokens; returns the layer, holding them.
    fn append(&mut self, layer_idx: usize, k: &Tensor, v: &Tensor) -> Result<&LayerCache> {
        let slot = self
            .layers
            .get_mut(layer_idx)
            .ok_or_else(|| ModelError::Invalid(format!("layer {layer_idx} out of range")))?;
        let (kv_heads, n, head_dim) = k.dims3()?;
        let step = self.capacity_step;
        let fits = match slot.as_ref() {
            Some(layer) => layer.v.dim(1)? >= layer.len + n,
            None => false,
        };
        if !fits {
            let old_len = slot.as_ref().map_or(0, |l| l.len);
            let capacity = (old_len + n).div_ceil(step) * step;
            let (dtype, device) = (k.dtype(), k.device().clone());
            let k_t = Tensor::zeros((kv_heads, head_dim, capacity), dtype, &device)?;
            let new_v = Tensor::zeros((kv_heads, capacity, head_dim), dtype, &device)?;
            if let Some(old) = slot.as_ref() {
                if old.len > 0 {
                    k_t.slice_set(&old.k_t.narrow(2, 0, old.len)?.contiguous()?, 2, 0)?;
                    new_v.slice_set(&old.v.narrow(1, 0, old.len)?.contiguous()?, 1, 0)?;
                }
            }
            *slot = Some(LayerCache {
                k_t,
                v: new_v,
                len: old_len,
            });
        }
        let layer = slot
            .as_mut()
            .ok_or_else(|| ModelError::Invalid("layer cache missing after growth".into()))?;
        layer.k_t.slice_set(&k.t()?.contiguous()?, 2, layer.len)?;
        layer.v.slice_set(&v.contiguous()?, 1, layer.len)?;
        layer.len += n;
        Ok(layer)
    }
}

impl AttentionBackend for ContiguousKvCache {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let layer = self.append(layer_idx, k, v)?;
        let k_t = layer.k_t.narrow(2, 0, layer.len)?;
        let v_all = layer.v.narrow(1, 0, layer.len)?;
        Ok(causal_attention_kt(q, &k_t, &v_all)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

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
