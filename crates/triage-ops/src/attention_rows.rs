//! Attention of one query token read straight from a KV cache, without gathering or transposing
//! it: the token's query heads that share a KV head walk the key rows the caller names (the paged
//! cache names them through block tables, `paged_attention`'s decode rows).

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
