//! One layer's stacked Q/K/V projection made ready for attention in one pass: the bias added,
//! rotary embedding applied to Q and K, Q returned as `[rows, num_heads, head_dim]`, K and V
//! written into their slots of the paged caches. On a GPU that is one kernel
//! (`kernels/rope_and_cache.cu`) where the unfused layer launched eleven (bias, three head
//! copies, two ropes, two transposes, two cache writes, a Q transpose).

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
use crate::cuda::rope_and_cache as cuda;

use candle_core::{DType, Device, Tensor};

use crate::elem::Elem;
use crate::paged_attention::{reshape_and_cache_mapped, reshape_and_cache_slow, SlotMapping};
use crate::{OpsError, Result};

/// The heads of one stacked projection and how rope pairs their elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvShape {
    pub num_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Pairs (i, i + head_dim/2) when set (GPT-NeoX, Qwen2 and Llama in HF form); (2i, 2i + 1)
    /// otherwise.
    pub neox: bool,
}

impl QkvShape {
    fn width(self) -> usize {
        (self.num_heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Elements of pair `t`.
    fn pair(self, t: usize) -> (usize, usize) {
        match self.neox {
            true => (t, t + self.head_dim / 2),
            false => (2 * t, 2 * t + 1),
        }
    }
}

/// The inputs besides the caches.
#[derive(Debug, Clone, Copy)]
pub struct RopeInputs<'a> {
    /// `[rows, (num_heads + 2 · kv_heads) · head_dim]`: each row `[q | k | v]`.
    pub qkv: &'a Tensor,
    /// `[(num_heads + 2 · kv_heads) · head_dim]` in `qkv`'s dtype, or none.
    pub bias: Option<&'a Tensor>,
    /// `[rows, head_dim / 2]` f32 each: the rows' angles.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

fn check(
    x: &RopeInputs<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &SlotMapping,
    s: QkvShape,
) -> Result<usize> {
    let (rows, width) = x.qkv.dims2()?;
    let half = s.head_dim / 2;
    let dtype = x.qkv.dtype();
    let cache_row = [s.kv_heads, s.head_dim];
    let ok = s.head_dim.is_multiple_of(2)
        && s.head_dim > 0
        && s.kv_heads > 0
        && width == s.width()
        && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && x.bias
            .is_none_or(|b| b.dims() == [width] && b.dtype() == dtype)
        && x.cos.dims() == [rows, half]
        && x.sin.dims() == [rows, half]
        && x.cos.dtype() == DType::F32
        && x.sin.dtype() == DType::F32
        && k_cache.dtype() == dtype
        && v_cache.dims() == k_cache.dims()
        && v_cache.dtype() == dtype
        && k_cache.dims().len() == 4
        && k_cache.dims()[2..] == cache_row
        && slots.tensor().dims() == [rows];
    if !ok {
        return Err(OpsError::InvalidArgument(format!(
            "rope_and_cache: qkv {:?} {dtype:?} for {s:?}, cos {:?}, caches {:?} {:?}, {} slots",
            x.qkv.dims(),
            x.cos.dims(),
            k_cache.dims(),
            k_cache.dtype(),
            slots.tensor().elem_count()
        )));
    }
    Ok(rows)
}

/// Rows `[q | k | v]` with the bias added and Q and K rotated: `(q, k, v)` as flat
/// `[rows, heads, head_dim]` buffers in `T`.
fn cpu_rows<T: Elem>(
    qkv: &[T],
    bias: Option<&[T]>,
    cos: &[f32],
    sin: &[f32],
    s: QkvShape,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (d, half) = (s.head_dim, s.head_dim / 2);
    let mut outs = (Vec::new(), Vec::new(), Vec::new());
    for (r, row) in qkv.chunks_exact(s.width()).enumerate() {
        for head in 0..s.num_heads + 2 * s.kv_heads {
            let col = head * d;
            let x = |i: usize| row[col + i].widen() + bias.map_or(0.0, |b| b[col + i].widen());
            let mut out = vec![T::narrow(0.0); d];
            let rotate = head < s.num_heads + s.kv_heads;
            for t in 0..half {
                let (a, b) = s.pair(t);
                let (mut xa, mut xb) = (x(a), x(b));
                if rotate {
                    let (c, si) = (cos[r * half + t], sin[r * half + t]);
                    (xa, xb) = (xa * c - xb * si, xa * si + xb * c);
                }
                out[a] = T::narrow(xa);
                out[b] = T::narrow(xb);
            }
            match head {
                h if h < s.num_heads => outs.0.extend(out),
                h if h < s.num_heads + s.kv_heads => outs.1.extend(out),
                _ => outs.2.extend(out),
            }
        }
    }
    outs
}

fn cpu<T: Elem>(
    x: &RopeInputs<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &SlotMapping,
    s: QkvShape,
    rows: usize,
) -> Result<Tensor> {
    let qkv = x.qkv.flatten_all()?.to_vec1::<T>()?;
    let bias = x.bias.map(|b| b.to_vec1::<T>()).transpose()?;
    let (cos, sin) = (
        x.cos.flatten_all()?.to_vec1::<f32>()?,
        x.sin.flatten_all()?.to_vec1::<f32>()?,
    );
    let (q, k, v) = cpu_rows(&qkv, bias.as_deref(), &cos, &sin, s);
    let (d, dev) = (s.head_dim, &Device::Cpu);
    reshape_and_cache_mapped(
        k_cache,
        &Tensor::from_vec(k, (rows, s.kv_heads, d), dev)?,
        slots,
    )?;
    reshape_and_cache_mapped(
        v_cache,
        &Tensor::from_vec(v, (rows, s.kv_heads, d), dev)?,
        slots,
    )?;
    Ok(Tensor::from_vec(q, (rows, s.num_heads, d), dev)?)
}

/// Bias, rope and the cache writes of one layer: returns Q as `[rows, num_heads, head_dim]` in
/// `qkv`'s dtype and writes K and V (rows of `[kv_heads, head_dim]`) to `slots` of the caches
/// (`[num_blocks, block_size, kv_heads, head_dim]` in `qkv`'s dtype), skipping padding slots.
pub fn rope_and_cache(
    x: RopeInputs<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &SlotMapping,
    shape: QkvShape,
) -> Result<Tensor> {
    let rows = check(&x, k_cache, v_cache, slots, shape)?;
    if k_cache.device().is_cuda() {
        return cuda::rope_and_cache_cuda(&x, k_cache, v_cache, slots, shape);
    }
    let x = RopeInputs {
        qkv: &x.qkv.contiguous()?,
        ..x
    };
    match x.qkv.dtype() {
        DType::F16 => cpu::<half::f16>(&x, k_cache, v_cache, slots, shape, rows),
        DType::BF16 => cpu::<half::bf16>(&x, k_cache, v_cache, slots, shape, rows),
        _ => cpu::<f32>(&x, k_cache, v_cache, slots, shape, rows),
    }
}

/// Reference: the projection split into heads, the bias added, candle's `rope`/`rope_i` in f32,
/// and `reshape_and_cache_slow` into copies of the caches. Returns `(q, k_cache, v_cache)`.
pub fn rope_and_cache_slow(
    x: RopeInputs<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &[u32],
    s: QkvShape,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (rows, _) = x.qkv.dims2()?;
    let mut qkv = x.qkv.to_dtype(DType::F32)?;
    if let Some(b) = x.bias {
        qkv = qkv.broadcast_add(&b.to_dtype(DType::F32)?)?;
    }
    let d = s.head_dim;
    let heads = |start: usize, num: usize| -> Result<Tensor> {
        // [rows, num·d] -> [1, num, rows, d]
        Ok(qkv
            .narrow(1, start * d, num * d)?
            .reshape((rows, num, d))?
            .transpose(0, 1)?
            .unsqueeze(0)?
            .contiguous()?)
    };
    let rope = |t: Tensor| -> Result<Tensor> {
        Ok(match s.neox {
            true => candle_nn::rotary_emb::rope_slow(&t, x.cos, x.sin)?,
            false => candle_nn::rotary_emb::rope_i_slow(&t, x.cos, x.sin)?,
        })
    };
    let back = |t: Tensor| -> Result<Tensor> { Ok(t.squeeze(0)?.transpose(0, 1)?.contiguous()?) };
    let q = back(rope(heads(0, s.num_heads)?)?)?;
    let k = back(rope(heads(s.num_heads, s.kv_heads)?)?)?;
    let v = back(heads(s.num_heads + s.kv_heads, s.kv_heads)?)?;
    let dtype = x.qkv.dtype();
    let k_cache = reshape_and_cache_slow(k_cache, &k.to_dtype(dtype)?, slots)?;
    let v_cache = reshape_and_cache_slow(v_cache, &v.to_dtype(dtype)?, slots)?;
    Ok((q.to_dtype(dtype)?, k_cache, v_cache))
}
