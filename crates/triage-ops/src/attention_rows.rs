//! Attention of few query rows (decode) read straight from a KV cache, without gathering or
//! transposing it: each task is one token's query heads that share a KV head, walking the key
//! rows the caller names. The paged cache names them through block tables
//! (`paged_attention`), the contiguous single-sequence cache by position
//! ([`cached_attention_rows`]).

use candle_core::{DType, Tensor};

use crate::paged_attention::f32_slice;
use crate::{OpsError, Result};

/// `a · b` in eight interleaved partial sums, which the compiler keeps in one vector register
/// (a single running sum would be scalar); the order depends on the length alone.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xs, ys) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = xs
        .remainder()
        .iter()
        .zip(ys.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in xs.zip(ys) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Softmax attention of `queries` (`groups` rows of `head_dim`, the heads that share one KV head)
/// over the key and value rows starting at `bases` in `k` and `v`, into `out` (`groups` rows).
/// Two passes over the keys: scores and their max, then one exp per key and the weighted sum of
/// values (an online softmax would rescale the output at every key).
pub(crate) fn attend_row(
    queries: &[f32],
    k: &[f32],
    v: &[f32],
    bases: &[usize],
    head_dim: usize,
    out: &mut [f32],
) {
    let scale = 1.0 / (head_dim as f32).sqrt();
    let groups = queries.len() / head_dim;
    let num_keys = bases.len();
    let mut weights = vec![0f32; groups * num_keys];
    for (j, &base) in bases.iter().enumerate() {
        let key = &k[base..base + head_dim];
        for (g, qrow) in queries.chunks_exact(head_dim).enumerate() {
            weights[g * num_keys + j] = dot(qrow, key) * scale;
        }
    }
    let mut sums = vec![0f32; groups];
    for (w, l) in weights.chunks_exact_mut(num_keys).zip(sums.iter_mut()) {
        let m = w.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        for p in w.iter_mut() {
            *p = (*p - m).exp();
            *l += *p;
        }
    }
    out.fill(0.0);
    for (j, &base) in bases.iter().enumerate() {
        let vrow = &v[base..base + head_dim];
        for (g, og) in out.chunks_exact_mut(head_dim).enumerate() {
            let p = weights[g * num_keys + j];
            og.iter_mut().zip(vrow).for_each(|(acc, &v)| *acc += p * v);
        }
    }
    for (og, l) in out.chunks_exact_mut(head_dim).zip(&sums) {
        og.iter_mut().for_each(|x| *x /= l);
    }
}

/// Causal attention of the last `n` of `len` positions (`q`: `[heads, n, head_dim]`) over a
/// contiguous cache `k`, `v` (`[kv_heads, capacity, head_dim]`, f32 on the CPU, positions
/// `0..len` filled; the rest is never read). Returns `[n, heads * head_dim]`, as
/// `causal_attention` does, without copying the cache: a decode step costs its own keys only.
pub fn cached_attention_rows(q: &Tensor, k: &Tensor, v: &Tensor, len: usize) -> Result<Tensor> {
    let (num_heads, n, head_dim) = q.dims3()?;
    let (kv_heads, capacity, kd) = k.dims3()?;
    if kv_heads == 0
        || num_heads % kv_heads != 0
        || kd != head_dim
        || v.dims() != k.dims()
        || n > len
        || len > capacity
    {
        return Err(OpsError::InvalidArgument(format!(
            "cached attention: q {:?}, k {:?}, v {:?}, {len} positions",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    let groups = num_heads / kv_heads;
    // [n, heads, d]: a token's heads side by side, those of one KV head adjacent.
    let q = q.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (qd, kdata, vdata) = (
        f32_slice(&qs, ql)?,
        f32_slice(&ks, kl)?,
        f32_slice(&vs, vl)?,
    );
    let mut out = vec![0f32; n * num_heads * head_dim];
    // Chunk `idx` is token `idx / kv_heads`'s `groups` heads over KV head `idx % kv_heads`.
    crate::pool::for_each_chunk_mut(&mut out, groups * head_dim, |idx, o| {
        let (t, kvh) = (idx / kv_heads, idx % kv_heads);
        let pos = len - n + t;
        let first = kvh * capacity * head_dim;
        let bases: Vec<usize> = (0..=pos).map(|j| first + j * head_dim).collect();
        let q0 = (t * num_heads + kvh * groups) * head_dim;
        attend_row(&qd[q0..q0 + groups * head_dim], kdata, vdata, &bases, head_dim, o);
    });
    Ok(Tensor::from_vec(out, (n, num_heads * head_dim), q.device())?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::causal_attention::causal_attention_slow;

    #[test]
    fn cached_rows_match_the_reference_and_never_read_past_the_sequence() {
        // 7 query heads over 2 KV heads of 16; capacity 64 with the unused slots NaN, so a read
        // past `len` poisons the output.
        let dev = Device::Cpu;
        for (n, len) in [(1, 1), (1, 37), (3, 40), (5, 64)] {
            let q = Tensor::randn(0f32, 1.0, (14, n, 16), &dev).unwrap();
            let fill = |seed: f32| {
                let live = (Tensor::randn(0f32, 1.0, (2, len, 16), &dev).unwrap() + seed as f64)
                    .unwrap();
                let dead = Tensor::full(f32::NAN, (2, 64 - len, 16), &dev).unwrap();
                (live.clone(), Tensor::cat(&[live, dead], 1).unwrap())
            };
            let ((k, k_cache), (v, v_cache)) = (fill(0.0), fill(0.5));
            let fast = cached_attention_rows(&q, &k_cache, &v_cache, len).unwrap();
            let slow = causal_attention_slow(&q, &k, &v).unwrap();
            let diff = (fast - slow)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-5, "n {n}, len {len}: {diff}");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((4, 2, 8), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((2, 16, 8), DType::F32, &dev).unwrap();
        assert!(cached_attention_rows(&q, &k, &k, 17).is_err());
        assert!(cached_attention_rows(&q, &k, &k, 1).is_err());
        let k3 = Tensor::zeros((3, 16, 8), DType::F32, &dev).unwrap();
        assert!(cached_attention_rows(&q, &k3, &k3, 4).is_err());
    }
}
