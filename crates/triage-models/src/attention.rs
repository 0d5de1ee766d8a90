//! The interface between the model's forward pass and KV storage: the model hands each layer's
//! new Q, K, V to an `AttentionBackend`, which stores K/V and returns attention outputs. The
//! contiguous single-sequence cache here is the one `generate` uses (one sequence, no block
//! bookkeeping).

use candle_core::{DType, Tensor};
use triage_ops::flash_attention::{flash_attention_tensors, SeqKeys};

use crate::{ModelError, Result};

pub use triage_ops::causal_attention::{causal_attention, causal_attention_slow};

/// KV storage plus attention for one forward pass.
pub trait AttentionBackend {
    /// Store this step's `k`, `v` (`[num_kv_heads, n, head_dim]`) for layer `layer_idx` and return
    /// causal attention of `q` (`[num_heads, n, head_dim]`) over everything stored, as `[n,
    /// num_heads * head_dim]`.
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;
}

/// A growable contiguous K/V cache for one sequence: per layer `[capacity, kv_heads, head_dim]`,
/// the layout of one paged block, so on the CPU it is read in place by the same flash-attention
/// loop as the paged cache (a prompt gives the same bits through either). Stored in f16 on the
/// CPU unless told otherwise (half of f32's bytes, as llama.cpp keeps it), in K's own dtype on a
/// GPU. Room is made for [`Self::reserve`]d tokens at once, else by doubling, so a long prompt
/// prefilled in chunks is not copied at every chunk.
#[derive(Debug)]
pub struct ContiguousKvCache {
    layers: Vec<Option<LayerCache>>,
    reserved: usize,
    dtype: Option<DType>,
}

#[derive(Debug)]
struct LayerCache {
    /// `[capacity, kv_heads, head_dim]`.
    k: Tensor,
    /// `[capacity, kv_heads, head_dim]`.
    v: Tensor,
    len: usize,
}

impl ContiguousKvCache {
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: (0..num_layers).map(|_| None).collect(),
            reserved: 0,
            dtype: None,
        }
    }

    /// A cache that stores K and V in `dtype` (f32, f16 or bf16).
    pub fn with_dtype(num_layers: usize, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(ModelError::Invalid(format!(
                "a {dtype:?} KV cache: caches are f32, f16 or bf16"
            )));
        }
        Ok(Self {
            dtype: Some(dtype),
            ..Self::new(num_layers)
        })
    }

    /// Make room for `tokens` in all at the next growth (a generation knows its prompt and
    /// token limit; one allocation then holds it all).
    pub fn reserve(&mut self, tokens: usize) {
        self.reserved = tokens;
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

    /// Store `k`, `v` (`[kv_heads, n, head_dim]`) after the layer's tokens; returns the layer,
    /// holding them.
    fn append(&mut self, layer_idx: usize, k: &Tensor, v: &Tensor) -> Result<&LayerCache> {
        let dtype = match self.dtype {
            Some(dtype) => dtype,
            None if k.device().is_cpu() => DType::F16,
            None => k.dtype(),
        };
        let reserved = self.reserved;
        let slot = self
            .layers
            .get_mut(layer_idx)
            .ok_or_else(|| ModelError::Invalid(format!("layer {layer_idx} out of range")))?;
        let (kv_heads, n, head_dim) = k.dims3()?;
        let old = slot
            .as_ref()
            .map_or((0, 0), |l| (l.len, l.k.dim(0).unwrap_or(0)));
        let (len, capacity) = old;
        if len + n > capacity {
            let capacity = (len + n).max(reserved).max(2 * capacity);
            let shape = (capacity, kv_heads, head_dim);
            let new_k = Tensor::zeros(shape, dtype, k.device())?;
            let new_v = Tensor::zeros(shape, dtype, k.device())?;
            if let Some(old) = slot.as_ref().filter(|l| l.len > 0) {
                new_k.slice_set(&old.k.narrow(0, 0, old.len)?, 0, 0)?;
                new_v.slice_set(&old.v.narrow(0, 0, old.len)?, 0, 0)?;
            }
            *slot = Some(LayerCache {
                k: new_k,
                v: new_v,
                len,
            });
        }
        let layer = slot
            .as_mut()
            .ok_or_else(|| ModelError::Invalid("layer cache missing after growth".into()))?;
        let rows = |x: &Tensor| x.transpose(0, 1)?.to_dtype(dtype)?.contiguous();
        layer.k.slice_set(&rows(k)?, 0, layer.len)?;
        layer.v.slice_set(&rows(v)?, 0, layer.len)?;
        layer.len += n;
        Ok(layer)
    }
}

impl AttentionBackend for ContiguousKvCache {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let layer = self.append(layer_idx, k, v)?;
        let (num_heads, n, head_dim) = q.dims3()?;
        if q.device().is_cpu() {
            let table = [0u32];
            let seq = SeqKeys {
                block_table: &table,
                block_size: layer.k.dim(0)?,
                seq_len: layer.len,
                query_len: n,
            };
            let q = q.transpose(0, 1)?.contiguous()?; // [n, heads, d]
            let out = flash_attention_tensors(&q, &layer.k, &layer.v, &[seq])?;
            return Ok(out.reshape((n, num_heads * head_dim))?);
        }
        // On a GPU: K and V as `[kv_heads, len, d]` in the query's dtype, then dense attention.
        let all = |x: &Tensor| -> Result<Tensor> {
            Ok(x.narrow(0, 0, layer.len)?
                .transpose(0, 1)?
                .to_dtype(q.dtype())?
                .contiguous()?)
        };
        Ok(causal_attention(q, &all(&layer.k)?, &all(&layer.v)?)?)
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
        let mut steps = ContiguousKvCache::new(1); // grows (copying what it holds) at 30 and 31
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
        // Each row attends alone, in a fixed order: the same bits in steps as in one pass.
        let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
        assert_eq!(rows(&full), rows(&stepped));
        // Stored in f16 by default, near the f32 reference.
        let reference = causal_attention_slow(&q, &k, &v).unwrap();
        assert!(max_abs_diff(&full, &reference) < 2e-3);
        let mut exact = ContiguousKvCache::with_dtype(1, candle_core::DType::F32).unwrap();
        let full_f32 = exact.attend(0, &q, &k, &v).unwrap();
        assert!(max_abs_diff(&full_f32, &reference) < 2e-5);
    }
}
