//! Causal grouped-query attention on the CPU in tiles of keys with an online softmax (flash
//! attention), reading K and V in place from a slot-major cache (`[slots, kv_heads, head_dim]`,
//! f32, f16 or bf16) through each sequence's block table. Prefill, prefill over a cached prefix
//! and decode are one loop; no score matrix is ever held whole; and a row's result does not depend
//! on the rows computed with it, so a prompt gives the same bits in one pass or in chunks, alone
//! or batched, from a paged cache or a contiguous one.
//!
//! A task is up to 16 query tokens × one KV head with the query heads that share it, so a group's
//! heads read each key once; where that gives fewer tasks than threads (a decode step), a group's
//! heads are split over tasks too. With an f16 cache the x86 kernels prefetch the next key tile
//! into L2 while this one is widened (decode attention of a 1.5B layer at 16k: 2.33 → 1.60–1.71
//! ms; benches/RESULTS.md, "Decode that keeps up with memory").

mod tile;

#[cfg(test)]
mod tests;

use candle_core::{CpuStorage, DType, Layout, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::{Isa, KernelCells, KernelChoice};
use crate::{OpsError, Result};
use tile::{RowState, FEW_ROWS, KEY_TILE, LANES};

/// Query tokens per task: their rows share each key tile's conversion to f32.
const TOKENS_PER_TASK: usize = 16;

/// K or V rows as the cache stores them.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl KvRows<'_> {
    fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
            KvRows::BF16(v) => v.len(),
        }
    }

    /// `dst.len()` values from `start`, as f32 (exact for every stored type).
    #[inline(always)]
    fn read(&self, start: usize, dst: &mut [f32]) {
        let end = start + dst.len();
        match self {
            KvRows::F32(v) => dst.copy_from_slice(&v[start..end]),
            KvRows::F16(v) => v[start..end].convert_to_f32_slice(dst),
            KvRows::BF16(v) => v[start..end].convert_to_f32_slice(dst),
        }
    }
}

/// One sequence's part of a step: where its keys sit and which positions it queries.
#[derive(Debug, Clone, Copy)]
pub struct SeqKeys<'a> {
    /// Its blocks in order: position `p` sits in slot
    /// `block_table[p / block_size] * block_size + p % block_size`.
    pub block_table: &'a [u32],
    pub block_size: usize,
    /// Tokens in the cache, this step's included.
    pub seq_len: usize,
    /// The last `query_len` positions are queried; the queries of all sequences are concatenated
    /// in order.
    pub query_len: usize,
}

impl SeqKeys<'_> {
    fn slot(&self, pos: usize) -> usize {
        self.block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }
}

/// Head counts and size of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The loop's compiled forms. All give the same bits (every product is a fused multiply-add in
/// a fixed order); they differ in vector width only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The loop as the target compiles it, for any CPU.
    Portable,
    /// x86 AVX2 + FMA + F16C.
    Avx2,
    /// x86 AVX-512 (512-bit vectors, twice the rows per register group).
    Avx512,
}

impl KernelChoice for AttentionKernel {
    /// Its names: `portable`, `avx2`, `avx512`.
    const ENV: &'static str = "TRIAGE_ATTENTION_KERNEL";
    const PORTABLE: Self = AttentionKernel::Portable;

    fn name(self) -> &'static str {
        match self {
            AttentionKernel::Portable => "portable",
            AttentionKernel::Avx2 => "avx2",
            AttentionKernel::Avx512 => "avx512",
        }
    }

    fn detect() -> Vec<Self> {
        let isa = Isa::get();
        let mut kernels = vec![AttentionKernel::Portable];
        if isa.avx2_fma() && isa.f16c {
            kernels.push(AttentionKernel::Avx2);
            if isa.avx512f {
                kernels.push(AttentionKernel::Avx512);
            }
        }
        kernels
    }

    fn cells() -> &'static KernelCells<Self> {
        static CELLS: KernelCells<AttentionKernel> = KernelCells::new();
        &CELLS
    }
}

/// Causal attention of `q` (`[tokens, num_heads, head_dim]`, row-major) over the caches `k` and
/// `v` (`[slots, kv_heads, head_dim]`, already holding this step's rows), for the sequences
/// `seqs`. Returns `[tokens, num_heads, head_dim]`.
pub fn flash_attention(
    q: &[f32],
    shape: AttentionShape,
    k: KvRows,
    v: KvRows,
    seqs: &[SeqKeys],
) -> Result<Vec<f32>> {
    flash_attention_with(AttentionKernel::best(), q, shape, k, v, seqs)
}

/// [`flash_attention`] with a chosen kernel (tests and benchmarks compare them).
pub fn flash_attention_with(
    kernel: AttentionKernel,
    q: &[f32],
    shape: AttentionShape,
    k: KvRows,
    v: KvRows,
    seqs: &[SeqKeys],
) -> Result<Vec<f32>> {
    check(q, shape, k, v, seqs)?;
    if !AttentionKernel::available().contains(&kernel) {
        return Err(OpsError::InvalidArgument(format!(
            "attention kernel {} does not run on this CPU",
            kernel.name()
        )));
    }
    let inputs = Inputs {
        q,
        shape,
        k,
        v,
        seqs,
    };
    let tasks = tasks(shape, seqs, candle_core::utils::get_num_threads());
    let results = crate::cpu::pool::map(tasks.len(), |i| run_task(kernel, &inputs, &tasks[i]));
    let (heads, d) = (shape.num_heads, shape.head_dim);
    let groups = heads / shape.kv_heads;
    let mut out = vec![0f32; q.len()];
    for (task, rows) in tasks.iter().zip(&results) {
        let first_head = task.kv_head * groups + task.first_head;
        for (t, token_rows) in rows.chunks_exact(task.num_heads * d).enumerate() {
            let start = ((task.first_token + t) * heads + first_head) * d;
            out[start..start + token_rows.len()].copy_from_slice(token_rows);
        }
    }
    Ok(out)
}

/// Shapes agree, and every key a query can see lies inside the cache.
fn check(q: &[f32], shape: AttentionShape, k: KvRows, v: KvRows, seqs: &[SeqKeys]) -> Result<()> {
    let bad = |m: String| Err(OpsError::InvalidArgument(format!("flash_attention: {m}")));
    let AttentionShape {
        num_heads,
        kv_heads,
        head_dim,
    } = shape;
    if kv_heads == 0 || head_dim == 0 || !num_heads.is_multiple_of(kv_heads) {
        return bad(format!(
            "{num_heads} heads over {kv_heads} KV heads of {head_dim}"
        ));
    }
    let tokens: usize = seqs.iter().map(|s| s.query_len).sum();
    if q.len() != tokens * num_heads * head_dim {
        return bad(format!("{} query values for {tokens} tokens", q.len()));
    }
    let row = kv_heads * head_dim;
    if k.len() != v.len() || !k.len().is_multiple_of(row) {
        return bad(format!(
            "K has {} values, V {}, rows of {row}",
            k.len(),
            v.len()
        ));
    }
    let num_slots = k.len() / row;
    for (i, s) in seqs.iter().enumerate() {
        let blocks = s.seq_len.div_ceil(s.block_size.max(1));
        let outside = s.block_table.get(..blocks).is_none_or(|used| {
            used.iter()
                .any(|&b| (b as usize + 1) * s.block_size > num_slots)
        });
        if s.block_size == 0 || s.query_len > s.seq_len || outside {
            return bad(format!(
                "sequence {i}: {} queries of {} tokens in {} blocks of {} over {num_slots} slots",
                s.query_len,
                s.seq_len,
                s.block_table.len(),
                s.block_size
            ));
        }
    }
    Ok(())
}

struct Inputs<'a> {
    q: &'a [f32],
    shape: AttentionShape,
    k: KvRows<'a>,
    v: KvRows<'a>,
    seqs: &'a [SeqKeys<'a>],
}

/// Consecutive query tokens of one sequence, against one KV head, for some of the query heads
/// that share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Task {
    seq: usize,
    first_token: usize,
    num_tokens: usize,
    first_pos: usize,
    kv_head: usize,
    /// Within the KV head's group of query heads.
    first_head: usize,
    num_heads: usize,
}

/// Blocks of [`TOKENS_PER_TASK`] tokens × KV heads; where that leaves fewer tasks than
/// `threads` (a decode step), each KV head's query heads are split too. The longest tasks come
/// first, so the pool's last grabs are short ones.
fn tasks(shape: AttentionShape, seqs: &[SeqKeys], threads: usize) -> Vec<Task> {
    let groups = shape.num_heads / shape.kv_heads;
    let blocks: usize = seqs
        .iter()
        .map(|s| s.query_len.div_ceil(TOKENS_PER_TASK))
        .sum();
    let splits = (1..=groups)
        .find(|&s| groups.is_multiple_of(s) && blocks * shape.kv_heads * s >= threads)
        .unwrap_or(groups);
    let heads_per_task = groups / splits;
    let mut tasks = Vec::new();
    let mut first_token = 0;
    for (seq, s) in seqs.iter().enumerate() {
        let first_pos = s.seq_len - s.query_len;
        for t0 in (0..s.query_len).step_by(TOKENS_PER_TASK) {
            for kv_head in 0..shape.kv_heads {
                for split in 0..splits {
                    tasks.push(Task {
                        seq,
                        first_token: first_token + t0,
                        num_tokens: TOKENS_PER_TASK.min(s.query_len - t0),
                        first_pos: first_pos + t0,
                        kv_head,
                        first_head: split * heads_per_task,
                        num_heads: heads_per_task,
                    });
                }
            }
        }
        first_token += s.query_len;
    }
    tasks.sort_by_key(|t| std::cmp::Reverse(t.first_pos + t.num_tokens));
    tasks
}

/// One task's output, `[num_tokens, num_heads, head_dim]`, through `kernel`.
fn run_task(kernel: AttentionKernel, inputs: &Inputs, task: &Task) -> Vec<f32> {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `flash_attention_with` runs only kernels in `available()`, which lists Avx2
        // where the CPU has AVX2, FMA and F16C.
        #[allow(unsafe_code)]
        AttentionKernel::Avx2 => unsafe { x86::task_avx2(inputs, task) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; Avx512 is listed where the CPU also has AVX-512 F.
        #[allow(unsafe_code)]
        AttentionKernel::Avx512 => unsafe { x86::task_avx512(inputs, task) },
        _ => task_rows::<4, 1, 4, 1, _>(inputs, task, &PortableRows),
    }
}

/// The loop's CPU-specific pieces: reading cache rows as f32, prefetching them, and decode's
/// scores (a type, so each compiled form of the loop gets what its CPU does best; all give the
/// same bits).
trait TileOps {
    fn read(&self, rows: &KvRows, start: usize, dst: &mut [f32]);

    /// Asks for the `len` values from `start` to be on their way into cache (a hint).
    fn prefetch(&self, _rows: &KvRows, _start: usize, _len: usize) {}

    /// [`tile::rows_as_lanes_scores`].
    #[inline(always)]
    fn few_rows_scores(
        &self,
        state: &mut RowState,
        q_t: &[f32],
        keys: &[f32],
        num_keys: usize,
        scale: f32,
    ) {
        let d = q_t.len() / FEW_ROWS;
        tile::rows_as_lanes_scores(state, q_t, keys, num_keys, d, scale);
    }
}

/// Through `half`'s slice conversions (which detect F16C at run time per call).
struct PortableRows;

impl TileOps for PortableRows {
    #[inline(always)]
    fn read(&self, rows: &KvRows, start: usize, dst: &mut [f32]) {
        rows.read(start, dst)
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm256_cvtph_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_storeu_ps, _mm_loadu_si128, _mm_prefetch, _MM_HINT_T1,
    };

    use super::tile::{RowState, FEW_ROWS, KEY_TILE};
    use super::{task_rows, Inputs, KvRows, Task, TileOps};

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn task_avx2(inputs: &Inputs, task: &Task) -> Vec<f32> {
        task_rows::<4, 1, 6, 1, _>(inputs, task, &F16cRows(()))
    }

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) fn task_avx512(inputs: &Inputs, task: &Task) -> Vec<f32> {
        task_rows::<6, 2, 6, 4, _>(inputs, task, &F16cRows(()))
    }

    /// Converts f16 rows eight values per instruction, inlined into the loop. Its field is
    /// private, so a value exists only inside the functions above, which run only on CPUs with
    /// F16C: holding one proves the instruction is there.
    struct F16cRows(());

    impl TileOps for F16cRows {
        #[inline(always)]
        fn read(&self, rows: &KvRows, start: usize, dst: &mut [f32]) {
            let KvRows::F16(values) = rows else {
                return rows.read(start, dst);
            };
            let src = &values[start..start + dst.len()];
            let done = dst.len() / 8 * 8;
            let mut chunks = dst.chunks_exact_mut(8);
            for (d, s) in (&mut chunks).zip(src.chunks_exact(8)) {
                // SAFETY: a `F16cRows` exists only where F16C runs (see the type); `s` holds 8
                // f16 values (16 bytes, read unaligned) and `d` 8 f32 slots (written unaligned).
                unsafe {
                    let halves = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                    _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(halves));
                }
            }
            for (d, s) in chunks.into_remainder().iter_mut().zip(&src[done..]) {
                *d = s.to_f32();
            }
        }

        #[inline(always)]
        fn prefetch(&self, rows: &KvRows, start: usize, len: usize) {
            let KvRows::F16(values) = rows else {
                return;
            };
            // 32 f16 values per 64-byte line.
            for line in values[start..start + len].chunks(32) {
                // SAFETY: a prefetch is a hint that never faults; the address is in `values`.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast::<i8>()) };
            }
        }

        #[inline(always)]
        fn few_rows_scores(
            &self,
            state: &mut RowState,
            q_t: &[f32],
            keys: &[f32],
            num_keys: usize,
            scale: f32,
        ) {
            // SAFETY: a `F16cRows` exists only inside functions that run where AVX2, FMA and
            // F16C do (see the type).
            unsafe { few_rows_scores_avx2(state, q_t, keys, num_keys, scale) }
        }
    }

    /// [`super::tile::rows_as_lanes_scores`] written out: per query column one 8-lane load of
    /// the rows' values and, per key, one fused multiply-add of its value broadcast, eight keys
    /// (eight chains) at a time: the same chain per (row, key) as the generic loop, so the same
    /// bits. The generic loop compiled for AVX-512 merged pairs of keys into 512-bit registers
    /// through shuffles that cost more than the products (a decode step at a 16k context read
    /// its K/V at ≈ 4.5 GB/s).
    ///
    /// # Safety
    /// The CPU runs AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn few_rows_scores_avx2(
        state: &mut RowState,
        q_t: &[f32],
        keys: &[f32],
        num_keys: usize,
        scale: f32,
    ) {
        const KB: usize = 8;
        let d = q_t.len() / FEW_ROWS;
        let (dim, rows) = (state.dim, state.max.len().min(FEW_ROWS));
        assert!(d <= dim && keys.len() >= KEY_TILE * dim && num_keys <= KEY_TILE);
        for k0 in (0..num_keys).step_by(KB) {
            // KEY_TILE is a multiple of KB, so the eight keys lie inside `keys` (the tile's
            // unused ones hold stale values whose scores nobody reads).
            let tile = &keys[k0 * dim..(k0 + KB) * dim];
            let mut acc = [_mm256_setzero_ps(); KB];
            for (i, q) in q_t.chunks_exact(FEW_ROWS).enumerate() {
                // SAFETY: `q` holds FEW_ROWS = 8 values; `j * dim + i < KB * dim = tile.len()`.
                unsafe {
                    let qv = _mm256_loadu_ps(q.as_ptr());
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let k = _mm256_set1_ps(*tile.get_unchecked(j * dim + i));
                        *acc = _mm256_fmadd_ps(k, qv, *acc);
                    }
                }
            }
            for (j, acc) in acc.iter().enumerate() {
                let mut lanes = [0f32; FEW_ROWS];
                // SAFETY: `lanes` holds 8 f32.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *acc) };
                for (r, &a) in lanes.iter().enumerate().take(rows) {
                    state.p[r * KEY_TILE + k0 + j] = a * scale;
                }
            }
        }
    }
}

/// The task's rows (token-major, then head) folded tile by tile over keys `0..=last position`;
/// a row folds only the keys at or before its position. Scores come from
/// [`tile::rows_as_lanes_scores`] for a task of at most [`FEW_ROWS`] rows (decode) and from
/// [`tile::keys_as_lanes_scores`] in groups of `ROWS` rows × `SC` chunks of 16 keys otherwise: the
/// same bits.
/// The weighted values go in register blocks of `VR` rows × `VC` chunks of 16 columns.
#[inline(always)]
fn task_rows<const ROWS: usize, const SC: usize, const VR: usize, const VC: usize, R: TileOps>(
    inputs: &Inputs,
    task: &Task,
    reader: &R,
) -> Vec<f32> {
    let AttentionShape {
        num_heads,
        kv_heads,
        head_dim: d,
    } = inputs.shape;
    let dim = d.next_multiple_of(LANES);
    let groups = num_heads / kv_heads;
    let rows = task.num_tokens * task.num_heads;
    let few = rows <= FEW_ROWS;
    let mut state = RowState::new(rows.next_multiple_of(ROWS), dim);
    let mut q_t = vec![0f32; if few { d * FEW_ROWS } else { 0 }];
    for r in 0..rows {
        let head = task.kv_head * groups + task.first_head + r % task.num_heads;
        let src = ((task.first_token + r / task.num_heads) * num_heads + head) * d;
        let q = &inputs.q[src..src + d];
        state.q[r * dim..r * dim + d].copy_from_slice(q);
        if few {
            q.iter()
                .enumerate()
                .for_each(|(i, &x)| q_t[i * FEW_ROWS + r] = x);
        }
    }
    let scale = 1.0 / (d as f32).sqrt();
    let seq = &inputs.seqs[task.seq];
    let last_pos = task.first_pos + task.num_tokens - 1;
    let mut keys = vec![0f32; KEY_TILE * dim];
    let mut keys_t = vec![0f32; if few { 0 } else { d * KEY_TILE }];
    let mut values = vec![0f32; KEY_TILE * dim];
    let mut visible = vec![0usize; state.max.len()];
    for tile_start in (0..=last_pos).step_by(KEY_TILE) {
        let num_keys = KEY_TILE.min(last_pos + 1 - tile_start);
        let next_keys = (last_pos + 1).saturating_sub(tile_start + KEY_TILE);
        for j in 0..num_keys {
            let start = (seq.slot(tile_start + j) * kv_heads + task.kv_head) * d;
            reader.read(&inputs.k, start, &mut keys[j * dim..j * dim + d]);
            reader.read(&inputs.v, start, &mut values[j * dim..j * dim + d]);
            // The same key of the next tile starts its way from memory while this tile computes
            // (the rows of one KV head are strided, which the hardware prefetcher follows late).
            if j < next_keys {
                let next = (seq.slot(tile_start + KEY_TILE + j) * kv_heads + task.kv_head) * d;
                reader.prefetch(&inputs.k, next, d);
                reader.prefetch(&inputs.v, next, d);
            }
        }
        if few {
            reader.few_rows_scores(&mut state, &q_t, &keys, num_keys, scale);
        } else {
            transpose(
                &keys,
                dim,
                num_keys.next_multiple_of(SC * LANES),
                d,
                &mut keys_t,
            );
            for row0 in (0..rows).step_by(ROWS) {
                tile::keys_as_lanes_scores::<ROWS, SC>(
                    &mut state, row0, &keys_t, num_keys, d, scale,
                );
            }
        }
        for (r, visible) in visible.iter_mut().enumerate() {
            let pos = task.first_pos + r / task.num_heads;
            *visible = if r < rows {
                (pos + 1).saturating_sub(tile_start).min(num_keys)
            } else {
                0
            };
            tile::softmax_row(&mut state, r, *visible);
        }
        for (g, group) in visible[..rows].chunks(VR).enumerate() {
            let used = group.iter().copied().max().unwrap_or(0);
            if used > 0 {
                tile::weighted_values::<VR, VC>(&mut state, g * VR, group.len(), &values, used);
            }
        }
    }
    let mut out = vec![0f32; rows * d];
    for (r, o) in out.chunks_exact_mut(d).enumerate() {
        let sum = state.sum[r];
        for (o, &acc) in o.iter_mut().zip(&state.out[r * dim..]) {
            *o = acc / sum;
        }
    }
    out
}

/// The first `num_keys` rows of `keys` (`[KEY_TILE][dim]`) transposed into `t` (`[d][KEY_TILE]`).
#[inline(always)]
fn transpose(keys: &[f32], dim: usize, num_keys: usize, d: usize, t: &mut [f32]) {
    for j in 0..num_keys {
        for i in 0..d {
            t[i * KEY_TILE + j] = keys[j * dim + i];
        }
    }
}

/// [`flash_attention`] on tensors: `q` `[tokens, num_heads, head_dim]` (converted to f32), caches
/// whose last two dims are `[kv_heads, head_dim]` and whose leading dims count slots
/// (`[num_blocks, block_size, ..]` or `[capacity, ..]`), contiguous CPU tensors of one float
/// dtype. Returns `[tokens, num_heads, head_dim]` f32.
pub fn flash_attention_tensors(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seqs: &[SeqKeys],
) -> Result<Tensor> {
    let (tokens, num_heads, head_dim) = q.dims3()?;
    let dims = k_cache.dims();
    if dims.len() < 2 || v_cache.dims() != dims || dims[dims.len() - 1] != head_dim {
        return Err(OpsError::InvalidArgument(format!(
            "flash_attention: q {:?}, k cache {dims:?}, v cache {:?}",
            q.dims(),
            v_cache.dims()
        )));
    }
    let shape = AttentionShape {
        num_heads,
        kv_heads: dims[dims.len() - 2],
        head_dim,
    };
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k_cache.storage_and_layout();
    let (vs, vl) = v_cache.storage_and_layout();
    let KvRows::F32(qd) = cpu_rows(&qs, ql)? else {
        return Err(OpsError::InvalidArgument(
            "flash_attention: f32 queries".into(),
        ));
    };
    let out = flash_attention(qd, shape, cpu_rows(&ks, kl)?, cpu_rows(&vs, vl)?, seqs)?;
    Ok(Tensor::from_vec(
        out,
        (tokens, num_heads, head_dim),
        q.device(),
    )?)
}

/// A contiguous CPU tensor's values.
fn cpu_rows<'a>(storage: &'a Storage, layout: &Layout) -> Result<KvRows<'a>> {
    let (start, len) = (layout.start_offset(), layout.shape().elem_count());
    let Storage::Cpu(cpu) = storage else {
        return Err(OpsError::InvalidArgument(
            "flash_attention: CPU tensors only".into(),
        ));
    };
    if !layout.is_contiguous() {
        return Err(OpsError::InvalidArgument(
            "flash_attention: contiguous caches only".into(),
        ));
    }
    match cpu {
        CpuStorage::F32(v) => Ok(KvRows::F32(&v[start..start + len])),
        CpuStorage::F16(v) => Ok(KvRows::F16(&v[start..start + len])),
        CpuStorage::BF16(v) => Ok(KvRows::BF16(&v[start..start + len])),
        _ => Err(OpsError::InvalidArgument(
            "flash_attention: f32, f16 or bf16 caches only".into(),
        )),
    }
}
