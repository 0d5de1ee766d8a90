//! Dense causal grouped-query attention over contiguous K/V, in query chunks so a long prompt
//! never materialises its whole score matrix; heads sharing a KV head are viewed together so K/V
//! are never copied per head.

use candle_core::{DType, Device, Tensor};

use crate::{OpsError, Result};

/// Query rows processed at once.
pub const QUERY_CHUNK: usize = 256;

fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax_last_dim(x)?)
}

/// Causal grouped-query attention of the last `n` positions (`q`: `[heads, n, d]`) over `k`, `v`
/// (`[kv_heads, total, d]`, the queries being the last `n` of the `total` positions).
/// Returns `[n, heads * d]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    causal_attention_kt(q, &k.t()?.contiguous()?, &v.contiguous()?)
}

/// [`causal_attention`] with the keys already transposed (`k_t`: `[kv_heads, d, total]`). `k_t`
/// and `v` may be views into larger buffers (a cache narrowed to its filled positions): the
/// matrix products read them in place, so a decode step costs its own keys, not a copy of the
/// cache.
pub fn causal_attention_kt(q: &Tensor, k_t: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (num_heads, n, head_dim) = q.dims3()?;
    let (kv_heads, kd, total) = k_t.dims3()?;
    if kv_heads == 0 || num_heads % kv_heads != 0 || total < n || kd != head_dim {
        return Err(OpsError::InvalidArgument(format!(
            "attention shapes: q {:?}, k transposed {:?}",
            q.dims(),
            k_t.dims()
        )));
    }
    let groups = num_heads / kv_heads;
    let past = total - n;
    let scale = 1.0 / (head_dim as f64).sqrt();
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
pub fn causal_mask(rows: usize, keys: usize, first_pos: usize, device: &Device) -> Result<Tensor> {
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
