//! The interface between the model's forward pass and KV storage: the model hands each layer's
//! new Q, K, V to an `AttentionBackend`, which stores K/V and returns attention outputs. The
//! paged KV cache (`paged_kv_cache`) is the one implementation.

use candle_core::Tensor;

use crate::Result;

/// KV storage plus attention for one forward pass.
pub trait AttentionBackend {
    /// Store this step's `k`, `v` (`[num_kv_heads, n, head_dim]`) for layer `layer_idx` and return
    /// causal attention of `q` (`[num_heads, n, head_dim]`) over everything stored, as `[n,
    /// num_heads * head_dim]`.
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;
}
