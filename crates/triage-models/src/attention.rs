//! The interface between the model's forward pass and KV storage: the model hands each layer's
//! new Q, K, V to an `AttentionBackend`, which stores K/V and returns attention outputs. The
//! paged KV cache (`paged_kv_cache`) is the one implementation.

use candle_core::Tensor;
use triage_ops::QkvShape;

use crate::layers::RopeAt;
use crate::Result;

/// KV storage plus attention for one forward pass.
pub trait AttentionBackend {
    /// Store this step's `k`, `v` (`[num_kv_heads, n, head_dim]`) for layer `layer_idx` and return
    /// causal attention of `q` (`[num_heads, n, head_dim]`) over everything stored, as `[n,
    /// num_heads * head_dim]`.
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;

    /// [`Self::attend`] from the layer's stacked projection `qkv` (`[n, (num_heads + 2 ·
    /// kv_heads) · head_dim]`, each row `[q | k | v]`) before its `bias` and rope: a backend
    /// that can write the cache in the projection's dtype does bias, rope and the cache write in
    /// one kernel (`triage_ops::rope_and_cache`). This default splits the heads and calls
    /// `attend`.
    fn attend_stacked(
        &mut self,
        layer_idx: usize,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        rope: &RopeAt,
        shape: QkvShape,
    ) -> Result<Tensor> {
        attend_split(self, layer_idx, qkv, bias, rope, shape)
    }
}

/// [`AttentionBackend::attend_stacked`] op by op: bias, the heads split out, rope in the
/// projection's dtype, then `attend`.
pub fn attend_split<B: AttentionBackend + ?Sized>(
    backend: &mut B,
    layer_idx: usize,
    qkv: &Tensor,
    bias: Option<&Tensor>,
    rope: &RopeAt,
    s: QkvShape,
) -> Result<Tensor> {
    let n = qkv.dim(0)?;
    let qkv = match bias {
        Some(b) => qkv.broadcast_add(b)?,
        None => qkv.clone(),
    };
    let d = s.head_dim;
    let heads = |start: usize, num: usize| -> Result<Tensor> {
        // [n, num*d] columns of the stacked product -> [1, num, n, d]
        Ok(qkv
            .narrow(1, start * d, num * d)?
            .reshape((n, num, d))?
            .transpose(0, 1)?
            .unsqueeze(0)?
            .contiguous()?)
    };
    let rope = rope.to_dtype(qkv.dtype())?;
    let q = rope.apply(&heads(0, s.num_heads)?)?.squeeze(0)?;
    let k = rope.apply(&heads(s.num_heads, s.kv_heads)?)?.squeeze(0)?;
    let v = heads(s.num_heads + s.kv_heads, s.kv_heads)?.squeeze(0)?;
    backend.attend(layer_idx, &q, &k, &v)
}
