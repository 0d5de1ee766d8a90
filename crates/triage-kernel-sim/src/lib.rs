//! The CUDA kernels of `kernels/`, compiled as C++ against the simulator header
//! (`kernels/sim/cuda_sim.h`) and launched on the CPU with the geometry of `triage_ops::launch`.
//!
//! Each launcher checks the buffer sizes the kernel will touch against the geometry, so a test
//! can only get out-of-bounds accesses from the kernel itself (which ASan builds report), and
//! returns the simulator's message when it stopped a launch: a barrier or warp op reached by
//! only some threads, a shuffle naming an exited lane, a dynamic shared-memory guard overwritten.
//! The simulator's thread order and poison byte come from `CUDASIM_ORDER` and `CUDASIM_POISON`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use half::{bf16, f16};
use triage_ops::entropy_window::{EntropyWindowParams, STATE_WIDTH};
use triage_ops::launch::{self, LaunchGeometry};
use triage_ops::packed_width;
use triage_ops::{check_slots, KernelRows};

/// Why a simulated launch did not run to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError(pub String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

/// `Result` of a simulated launch.
pub type Result<T> = std::result::Result<T, SimError>;

/// [`LaunchGeometry`] as `cpp/launchers.cpp` reads it (public only because the launcher types
/// name it; its fields are private).
#[repr(C)]
pub struct SimGeometry {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
}

impl From<&LaunchGeometry> for SimGeometry {
    fn from(g: &LaunchGeometry) -> Self {
        Self {
            grid: [g.grid.0, g.grid.1, g.grid.2],
            block: [g.block.0, g.block.1, g.block.2],
            shared_mem_bytes: g.shared_mem_bytes,
        }
    }
}

/// `SimPagedAttention` of `cpp/launchers.cpp`.
#[repr(C)]
pub struct SimPagedAttention {
    out: *mut f32,
    part_out: *mut f32,
    part_max: *mut f32,
    part_sum: *mut f32,
    q: *const c_void,
    k_cache: *const c_void,
    v_cache: *const c_void,
    block_tables: *const u32,
    row_seq: *const u32,
    row_pos: *const u32,
    num_heads: c_int,
    kv_heads: c_int,
    head_dim: c_int,
    block_size: c_int,
    max_blocks_per_seq: c_int,
    num_partitions: c_int,
    scale: f32,
}

type LogitsReduceFn = unsafe extern "C" fn(
    *const SimGeometry,
    *const c_void,
    *mut f32,
    *mut f32,
    *mut u32,
    c_int,
    c_int,
    c_int,
) -> c_int;
type ReshapeAndCacheFn = unsafe extern "C" fn(
    *const SimGeometry,
    *const c_void,
    *mut c_void,
    *const u32,
    c_int,
) -> c_int;
type PagedAttentionFn = unsafe extern "C" fn(*const SimGeometry, *const SimPagedAttention) -> c_int;
type PrefillAttentionFn =
    unsafe extern "C" fn(*const SimGeometry, *const SimPrefillAttention) -> c_int;
type RopeAndCacheFn = unsafe extern "C" fn(*const SimGeometry, *const SimRopeAndCache) -> c_int;
type SiluMulFn =
    unsafe extern "C" fn(*const SimGeometry, *const c_void, *mut c_void, c_int) -> c_int;
type AddRmsNormFn = unsafe extern "C" fn(
    *const SimGeometry,
    *mut f32,
    *const c_void,
    *const f32,
    *mut c_void,
    c_int,
    f32,
) -> c_int;

extern "C" {
    fn cudasim_last_error() -> *const c_char;
    fn sim_logits_reduce_f32(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut f32,
        part_f: *mut f32,
        part_u: *mut u32,
        v: c_int,
        k: c_int,
        chunk: c_int,
    ) -> c_int;
    fn sim_logits_reduce_f16(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut f32,
        part_f: *mut f32,
        part_u: *mut u32,
        v: c_int,
        k: c_int,
        chunk: c_int,
    ) -> c_int;
    fn sim_logits_reduce_bf16(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut f32,
        part_f: *mut f32,
        part_u: *mut u32,
        v: c_int,
        k: c_int,
        chunk: c_int,
    ) -> c_int;
    fn sim_logits_reduce_merge_f32(
        g: *const SimGeometry,
        part_f: *const f32,
        part_u: *const u32,
        o: *mut f32,
        splits: c_int,
        k: c_int,
    ) -> c_int;
    fn sim_entropy_window_f32(
        g: *const SimGeometry,
        stats: *const f32,
        k: c_int,
        sampled_logprobs: *const f32,
        observe: *const u32,
        state: *mut f64,
        num_seqs: c_int,
        tau: f32,
        window: c_int,
        estimator: c_int,
        unit: c_int,
    ) -> c_int;
    fn sim_reshape_and_cache_f32(
        g: *const SimGeometry,
        r: *const c_void,
        c: *mut c_void,
        s: *const u32,
        n: c_int,
    ) -> c_int;
    fn sim_reshape_and_cache_f16(
        g: *const SimGeometry,
        r: *const c_void,
        c: *mut c_void,
        s: *const u32,
        n: c_int,
    ) -> c_int;
    fn sim_reshape_and_cache_bf16(
        g: *const SimGeometry,
        r: *const c_void,
        c: *mut c_void,
        s: *const u32,
        n: c_int,
    ) -> c_int;
    fn sim_paged_attention_f32(g: *const SimGeometry, a: *const SimPagedAttention) -> c_int;
    fn sim_prefill_attention_d64_f16(g: *const SimGeometry, a: *const SimPrefillAttention)
        -> c_int;
    fn sim_prefill_attention_d64_bf16(
        g: *const SimGeometry,
        a: *const SimPrefillAttention,
    ) -> c_int;
    fn sim_prefill_attention_d128_f16(
        g: *const SimGeometry,
        a: *const SimPrefillAttention,
    ) -> c_int;
    fn sim_prefill_attention_d128_bf16(
        g: *const SimGeometry,
        a: *const SimPrefillAttention,
    ) -> c_int;
    fn sim_paged_attention_f16(g: *const SimGeometry, a: *const SimPagedAttention) -> c_int;
    fn sim_paged_attention_bf16(g: *const SimGeometry, a: *const SimPagedAttention) -> c_int;
    fn sim_silu_mul_f32(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut c_void,
        inter: c_int,
    ) -> c_int;
    fn sim_add_rms_norm_f32(
        g: *const SimGeometry,
        residual: *mut f32,
        delta: *const c_void,
        weight: *const f32,
        out: *mut c_void,
        hidden: c_int,
        eps: f32,
    ) -> c_int;
    fn sim_silu_mul_f16(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut c_void,
        inter: c_int,
    ) -> c_int;
    fn sim_add_rms_norm_f16(
        g: *const SimGeometry,
        residual: *mut f32,
        delta: *const c_void,
        weight: *const f32,
        out: *mut c_void,
        hidden: c_int,
        eps: f32,
    ) -> c_int;
    fn sim_silu_mul_bf16(
        g: *const SimGeometry,
        x: *const c_void,
        o: *mut c_void,
        inter: c_int,
    ) -> c_int;
    fn sim_add_rms_norm_bf16(
        g: *const SimGeometry,
        residual: *mut f32,
        delta: *const c_void,
        weight: *const f32,
        out: *mut c_void,
        hidden: c_int,
        eps: f32,
    ) -> c_int;
    fn sim_rope_and_cache_f32(g: *const SimGeometry, a: *const SimRopeAndCache) -> c_int;
    fn sim_rope_and_cache_f16(g: *const SimGeometry, a: *const SimRopeAndCache) -> c_int;
    fn sim_rope_and_cache_bf16(g: *const SimGeometry, a: *const SimRopeAndCache) -> c_int;
    fn sim_paged_attention_merge_f32(
        g: *const SimGeometry,
        out: *mut f32,
        part_out: *const f32,
        part_max: *const f32,
        part_sum: *const f32,
        row_pos: *const u32,
        num_heads: c_int,
        head_dim: c_int,
        num_partitions: c_int,
    ) -> c_int;
}

/// A kernel element type: `f32`, `f16` or `bf16`.
pub trait Elem: launchers::Launchers + Copy + Send + Sync + 'static {}

impl Elem for f32 {}
impl Elem for f16 {}
impl Elem for bf16 {}

/// Each element type's launchers; private, so the FFI types stay inside this crate.
mod launchers {
    use super::*;

    pub trait Launchers {
        /// `logits_reduce_<dtype>`.
        const LOGITS_REDUCE: LogitsReduceFn;
        /// `reshape_and_cache_<dtype>`.
        const RESHAPE_AND_CACHE: ReshapeAndCacheFn;
        /// `paged_attention_<dtype>`.
        const PAGED_ATTENTION: PagedAttentionFn;
        /// `silu_mul_<dtype>`.
        const SILU_MUL: SiluMulFn;
        /// `add_rms_norm_<dtype>`.
        const ADD_RMS_NORM: AddRmsNormFn;
        /// `rope_and_cache_<dtype>`.
        const ROPE_AND_CACHE: RopeAndCacheFn;
    }

    impl Launchers for f32 {
        const LOGITS_REDUCE: LogitsReduceFn = sim_logits_reduce_f32;
        const RESHAPE_AND_CACHE: ReshapeAndCacheFn = sim_reshape_and_cache_f32;
        const PAGED_ATTENTION: PagedAttentionFn = sim_paged_attention_f32;
        const SILU_MUL: SiluMulFn = sim_silu_mul_f32;
        const ADD_RMS_NORM: AddRmsNormFn = sim_add_rms_norm_f32;
        const ROPE_AND_CACHE: RopeAndCacheFn = sim_rope_and_cache_f32;
    }

    impl Launchers for f16 {
        const LOGITS_REDUCE: LogitsReduceFn = sim_logits_reduce_f16;
        const RESHAPE_AND_CACHE: ReshapeAndCacheFn = sim_reshape_and_cache_f16;
        const PAGED_ATTENTION: PagedAttentionFn = sim_paged_attention_f16;
        const SILU_MUL: SiluMulFn = sim_silu_mul_f16;
        const ADD_RMS_NORM: AddRmsNormFn = sim_add_rms_norm_f16;
        const ROPE_AND_CACHE: RopeAndCacheFn = sim_rope_and_cache_f16;
    }

    impl Launchers for bf16 {
        const LOGITS_REDUCE: LogitsReduceFn = sim_logits_reduce_bf16;
        const RESHAPE_AND_CACHE: ReshapeAndCacheFn = sim_reshape_and_cache_bf16;
        const PAGED_ATTENTION: PagedAttentionFn = sim_paged_attention_bf16;
        const SILU_MUL: SiluMulFn = sim_silu_mul_bf16;
        const ADD_RMS_NORM: AddRmsNormFn = sim_add_rms_norm_bf16;
        const ROPE_AND_CACHE: RopeAndCacheFn = sim_rope_and_cache_bf16;
    }
}

/// A 16-bit element type, the inputs of the tensor-core kernels: `f16` or `bf16`.
pub trait HalfElem: Elem {
    /// `prefill_attention_d64_<dtype>` and `prefill_attention_d128_<dtype>`.
    #[doc(hidden)]
    const PREFILL_ATTENTION: [PrefillAttentionFn; 2];
}

impl HalfElem for f16 {
    const PREFILL_ATTENTION: [PrefillAttentionFn; 2] = [
        sim_prefill_attention_d64_f16,
        sim_prefill_attention_d128_f16,
    ];
}

impl HalfElem for bf16 {
    const PREFILL_ATTENTION: [PrefillAttentionFn; 2] = [
        sim_prefill_attention_d64_bf16,
        sim_prefill_attention_d128_bf16,
    ];
}

/// `SimPrefillAttention` of `cpp/launchers.cpp`.
#[repr(C)]
pub struct SimPrefillAttention {
    out: *mut f32,
    part_out: *mut f32,
    part_max: *mut f32,
    part_sum: *mut f32,
    q: *const c_void,
    k_cache: *const c_void,
    v_cache: *const c_void,
    block_tables: *const u32,
    row_seq: *const u32,
    row_pos: *const u32,
    tiles: *const u32,
    num_heads: c_int,
    kv_heads: c_int,
    block_size: c_int,
    max_blocks_per_seq: c_int,
    num_partitions: c_int,
    scale: f32,
}

/// One launch at a time: the simulator's static shared memory is a single process-wide section.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Runs one launcher under the lock and turns its status into a `Result`.
fn run(launcher: impl FnOnce() -> c_int) -> Result<()> {
    let _one_at_a_time = LAUNCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if launcher() == 0 {
        return Ok(());
    }
    #[allow(unsafe_code)]
    // SAFETY: the simulator returns a pointer to a NUL-terminated message it owns, valid until
    // the next launch, which the lock held here keeps from starting.
    let message = unsafe { CStr::from_ptr(cudasim_last_error()) };
    Err(SimError(message.to_string_lossy().into_owned()))
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(SimError(format!("launcher arguments: {}", what())))
    }
}

fn c_int_of(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| SimError(format!("{n} does not fit a C int")))
}

/// `logits_reduce_<dtype>` over `[rows, vocab]` logits (rows = grid x, splits = grid y) into
/// packed `out`, then `logits_reduce_merge_f32` when a row is split. `logits` may start anywhere
/// (the kernel reads a scalar head up to each chunk's first 16-byte boundary). The partial
/// buffers start poisoned, so a slot the merge reads unwritten shows.
pub fn logits_reduce<T: Elem>(
    g: &LaunchGeometry,
    logits: &[T],
    out: &mut [f32],
    vocab: usize,
    k: usize,
) -> Result<()> {
    let rows = g.grid.0 as usize;
    let (splits, chunk) = launch::logits_reduce_splits(vocab);
    check(
        logits.len() == rows * vocab
            && out.len() == rows * (4 + 2 * k)
            && g.grid.1 as usize == splits,
        || {
            format!(
                "{rows} rows of {vocab} in {} splits, k {k}: {} logits, {} outputs",
                g.grid.1,
                logits.len(),
                out.len()
            )
        },
    )?;
    check(k <= triage_ops::MAX_TOP_K, || format!("k {k}"))?;
    let mut part_f = vec![OUTPUT_POISON; rows * splits * (3 + k)];
    let mut part_u = vec![u32::MAX - 1; rows * splits * (1 + k)];
    let (c_vocab, c_k, c_chunk) = (c_int_of(vocab)?, c_int_of(k)?, c_int_of(chunk)?);
    let geometry = SimGeometry::from(g);
    #[allow(unsafe_code)]
    // SAFETY: the kernel reads `rows · vocab` logits and writes `rows · (4 + 2k)` outputs or
    // `rows · splits` partial slots, the lengths checked or allocated above; all outlive the
    // synchronous launch.
    run(|| unsafe {
        T::LOGITS_REDUCE(
            &geometry,
            logits.as_ptr().cast(),
            out.as_mut_ptr(),
            part_f.as_mut_ptr(),
            part_u.as_mut_ptr(),
            c_vocab,
            c_k,
            c_chunk,
        )
    })?;
    if splits == 1 {
        return Ok(());
    }
    let merge = launch::logits_reduce_merge(rows, k).map_err(|e| SimError(e.to_string()))?;
    let geometry = SimGeometry::from(&merge);
    let c_splits = c_int_of(splits)?;
    #[allow(unsafe_code)]
    // SAFETY: as above; the merge reads the partial slots the first launch wrote.
    run(|| unsafe {
        sim_logits_reduce_merge_f32(
            &geometry,
            part_f.as_ptr(),
            part_u.as_ptr(),
            out.as_mut_ptr(),
            c_splits,
            c_k,
        )
    })
}

/// One `entropy_window_f32` step for `observe.len()` sequences whose packed stats hold `k`
/// top-k entries; `state` is `[n, STATE_WIDTH]`.
pub fn entropy_window(
    g: &LaunchGeometry,
    p: &EntropyWindowParams,
    k: usize,
    stats: &[f32],
    sampled_logprobs: &[f32],
    observe: &[u32],
    state: &mut [f64],
) -> Result<()> {
    let n = observe.len();
    check(
        stats.len() == n * packed_width(k)
            && sampled_logprobs.len() == n
            && state.len() == STATE_WIDTH * n,
        || {
            format!(
                "{n} sequences: {} stats, {} states",
                stats.len(),
                state.len()
            )
        },
    )?;
    let geometry = SimGeometry::from(g);
    let (k, num_seqs, window) = (c_int_of(k)?, c_int_of(n)?, c_int_of(p.window)?);
    let (estimator, unit) = (p.estimator as c_int, p.unit as c_int);
    #[allow(unsafe_code)]
    // SAFETY: threads past `num_seqs` return at once; the others read and write only their own
    // rows of the buffers, whose lengths are checked above.
    run(|| unsafe {
        sim_entropy_window_f32(
            &geometry,
            stats.as_ptr(),
            k,
            sampled_logprobs.as_ptr(),
            observe.as_ptr(),
            state.as_mut_ptr(),
            num_seqs,
            p.tau,
            window,
            estimator,
            unit,
        )
    })
}

/// `reshape_and_cache_<dtype>`: `rows` (`[slots.len(), row_elems]`) into `cache`'s slots. The
/// slots are validated first with the same host check the CUDA op uses.
pub fn reshape_and_cache<T: Elem>(
    g: &LaunchGeometry,
    rows: &[T],
    cache: &mut [T],
    slots: &[u32],
    row_elems: usize,
) -> Result<()> {
    check(
        row_elems > 0
            && rows.len() == slots.len() * row_elems
            && g.grid.0 as usize == slots.len()
            && cache.len().is_multiple_of(row_elems),
        || {
            format!(
                "{} rows of {row_elems} for {} slots",
                rows.len(),
                slots.len()
            )
        },
    )?;
    check_slots(slots, cache.len() / row_elems).map_err(|e| SimError(e.to_string()))?;
    let geometry = SimGeometry::from(g);
    let row_elems = c_int_of(row_elems)?;
    #[allow(unsafe_code)]
    // SAFETY: every slot is padding (skipped) or within the cache, checked above, so each block
    // writes one whole row inside `cache` and reads one row of `rows`.
    run(|| unsafe {
        T::RESHAPE_AND_CACHE(
            &geometry,
            rows.as_ptr().cast(),
            cache.as_mut_ptr().cast(),
            slots.as_ptr(),
            row_elems,
        )
    })
}

/// `silu_mul_<dtype>` over `[rows, 2 · inter]` `gate_up` (rows = grid x) into `[rows, inter]`.
pub fn silu_mul<T: Elem>(
    g: &LaunchGeometry,
    gate_up: &[T],
    out: &mut [T],
    inter: usize,
) -> Result<()> {
    let rows = g.grid.0 as usize;
    check(
        inter > 0 && gate_up.len() == rows * 2 * inter && out.len() == rows * inter,
        || {
            format!(
                "{rows} rows of {inter}: {} inputs, {} outputs",
                gate_up.len(),
                out.len()
            )
        },
    )?;
    let geometry = SimGeometry::from(g);
    let inter = c_int_of(inter)?;
    #[allow(unsafe_code)]
    // SAFETY: the kernel reads `rows · 2 · inter` inputs and writes `rows · inter` outputs, the
    // lengths checked above; both slices outlive the synchronous launch.
    run(|| unsafe {
        T::SILU_MUL(
            &geometry,
            gate_up.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            inter,
        )
    })
}

/// `add_rms_norm_<dtype>` over `residual` (`[rows, hidden]`, rows = grid x), adding `delta`
/// first when given (`None` passes a null pointer), into `out` (`[rows, hidden]`).
pub fn add_rms_norm<T: Elem>(
    g: &LaunchGeometry,
    residual: &mut [f32],
    delta: Option<&[T]>,
    weight: &[f32],
    out: &mut [T],
    eps: f32,
) -> Result<()> {
    let rows = g.grid.0 as usize;
    let hidden = weight.len();
    check(
        hidden > 0
            && residual.len() == rows * hidden
            && out.len() == rows * hidden
            && delta.is_none_or(|d| d.len() == rows * hidden),
        || {
            format!(
                "{rows} rows of {hidden}: {} residual, {} outputs",
                residual.len(),
                out.len()
            )
        },
    )?;
    let geometry = SimGeometry::from(g);
    let delta = delta.map_or(std::ptr::null(), |d| d.as_ptr().cast());
    let hidden = c_int_of(hidden)?;
    #[allow(unsafe_code)]
    // SAFETY: block r reads and writes row r of `residual`, reads row r of `delta` (or nothing:
    // null) and the weights, and writes row r of `out`; the lengths are checked above and the
    // slices outlive the synchronous launch.
    run(|| unsafe {
        T::ADD_RMS_NORM(
            &geometry,
            residual.as_mut_ptr(),
            delta,
            weight.as_ptr(),
            out.as_mut_ptr().cast(),
            hidden,
            eps,
        )
    })
}

/// `rope_and_cache`'s arguments, as `launchers.cpp`'s `SimRopeAndCache`.
#[repr(C)]
pub struct SimRopeAndCache {
    qkv: *const c_void,
    bias: *const c_void,
    cos: *const f32,
    sin: *const f32,
    q_out: *mut c_void,
    k_cache: *mut c_void,
    v_cache: *mut c_void,
    slots: *const u32,
    num_heads: c_int,
    kv_heads: c_int,
    head_dim: c_int,
    neox: c_int,
}

/// The buffers of one `rope_and_cache_<dtype>` launch over `rows` rows (grid x).
pub struct RopeAndCacheBuffers<'a, T> {
    /// `[rows, (num_heads + 2 · kv_heads) · head_dim]`.
    pub qkv: &'a [T],
    /// `[(num_heads + 2 · kv_heads) · head_dim]`, or none (null).
    pub bias: Option<&'a [T]>,
    /// `[rows, head_dim / 2]` each.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    /// `[rows, num_heads, head_dim]`.
    pub q_out: &'a mut [T],
    /// `[num_slots, kv_heads, head_dim]` each.
    pub k_cache: &'a mut [T],
    pub v_cache: &'a mut [T],
    /// `[rows]`: a slot or `PADDING_SLOT`.
    pub slots: &'a [u32],
}

/// `rope_and_cache_<dtype>` with the shipped geometry for `shape`.
pub fn rope_and_cache<T: Elem>(
    shape: triage_ops::QkvShape,
    b: RopeAndCacheBuffers<'_, T>,
) -> Result<()> {
    let heads = shape.num_heads + 2 * shape.kv_heads;
    let (d, rows) = (shape.head_dim, b.slots.len());
    let row = shape.kv_heads * d;
    check(
        d.is_multiple_of(2)
            && b.qkv.len() == rows * heads * d
            && b.bias.is_none_or(|x| x.len() == heads * d)
            && b.cos.len() == rows * d / 2
            && b.sin.len() == rows * d / 2
            && b.q_out.len() == rows * shape.num_heads * d
            && b.k_cache.len() == b.v_cache.len()
            && b.k_cache.len().is_multiple_of(row.max(1)),
        || format!("{rows} rows for {shape:?}: {} projections", b.qkv.len()),
    )?;
    check_slots(b.slots, b.k_cache.len() / row.max(1)).map_err(|e| SimError(e.to_string()))?;
    let g = launch::rope_and_cache(rows, heads, d).map_err(|e| SimError(e.to_string()))?;
    let geometry = SimGeometry::from(&g);
    let args = SimRopeAndCache {
        qkv: b.qkv.as_ptr().cast(),
        bias: b.bias.map_or(std::ptr::null(), |x| x.as_ptr().cast()),
        cos: b.cos.as_ptr(),
        sin: b.sin.as_ptr(),
        q_out: b.q_out.as_mut_ptr().cast(),
        k_cache: b.k_cache.as_mut_ptr().cast(),
        v_cache: b.v_cache.as_mut_ptr().cast(),
        slots: b.slots.as_ptr(),
        num_heads: c_int_of(shape.num_heads)?,
        kv_heads: c_int_of(shape.kv_heads)?,
        head_dim: c_int_of(d)?,
        neox: c_int::from(shape.neox),
    };
    #[allow(unsafe_code)]
    // SAFETY: the buffers have the lengths the kernel indexes (checked above; slots checked
    // against the caches) and outlive the synchronous launch.
    run(|| unsafe { T::ROPE_AND_CACHE(&geometry, &args) })
}

/// Shapes of one paged-attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads (divides `num_heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Blocks in each cache.
    pub num_blocks: usize,
}

/// Fill value of every output and partial buffer before a launch, so an element the kernel
/// should have written and did not shows.
pub const OUTPUT_POISON: f32 = -7777.0;

/// `paged_attention_<dtype>` (and, past one partition, `paged_attention_merge_f32`) for the
/// query rows of `rows`, with `threads` per block. Returns `[rows, num_heads, head_dim]` f32.
pub fn paged_attention<T: Elem>(
    shape: &AttentionShape,
    rows: &KernelRows,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    threads: u32,
) -> Result<Vec<f32>> {
    let AttentionShape {
        num_heads,
        kv_heads,
        head_dim,
        block_size,
        num_blocks,
    } = *shape;
    let num_rows = rows.row_pos.len();
    let cache_len = num_blocks * block_size * kv_heads * head_dim;
    check(
        q.len() == num_rows * num_heads * head_dim
            && k_cache.len() == cache_len
            && v_cache.len() == cache_len
            && kv_heads > 0
            && num_heads.is_multiple_of(kv_heads)
            && rows_fit(rows, num_blocks, block_size),
        || {
            format!(
                "{num_rows} rows, {} q, {} cache elements",
                q.len(),
                k_cache.len()
            )
        },
    )?;
    let g = launch::paged_attention(
        num_heads,
        kv_heads,
        num_rows,
        rows.max_context_len,
        head_dim,
        std::mem::size_of::<T>(),
        threads,
    )
    .map_err(|e| SimError(e.to_string()))?;
    let num_partitions = g.grid.2 as usize;
    let mut out = vec![OUTPUT_POISON; num_rows * num_heads * head_dim];
    let mut part_out = vec![OUTPUT_POISON; num_rows * num_heads * num_partitions * head_dim];
    let mut part_max = vec![OUTPUT_POISON; num_rows * num_heads * num_partitions];
    let mut part_sum = part_max.clone();
    let args = SimPagedAttention {
        out: out.as_mut_ptr(),
        part_out: part_out.as_mut_ptr(),
        part_max: part_max.as_mut_ptr(),
        part_sum: part_sum.as_mut_ptr(),
        q: q.as_ptr().cast(),
        k_cache: k_cache.as_ptr().cast(),
        v_cache: v_cache.as_ptr().cast(),
        block_tables: rows.block_tables.as_ptr(),
        row_seq: rows.row_seq.as_ptr(),
        row_pos: rows.row_pos.as_ptr(),
        num_heads: c_int_of(num_heads)?,
        kv_heads: c_int_of(kv_heads)?,
        head_dim: c_int_of(head_dim)?,
        block_size: c_int_of(block_size)?,
        max_blocks_per_seq: c_int_of(rows.max_blocks_per_seq)?,
        num_partitions: c_int_of(num_partitions)?,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let geometry = SimGeometry::from(&g);
    #[allow(unsafe_code)]
    // SAFETY: the buffers have the sizes the kernel indexes (checked or allocated above, block
    // ids checked against the cache) and outlive the synchronous launch.
    run(|| unsafe { T::PAGED_ATTENTION(&geometry, &args) })?;
    if num_partitions > 1 {
        let parts = [&part_out[..], &part_max, &part_sum];
        merge_partitions(&mut out, parts, rows, num_heads, head_dim, threads)?;
    }
    Ok(out)
}

/// `paged_attention_merge_f32` over the partial results `[out, max, sum]` of a split launch
/// (`num_partitions` of them per row and head), into `out`.
fn merge_partitions(
    out: &mut [f32],
    [part_out, part_max, part_sum]: [&[f32]; 3],
    rows: &KernelRows,
    num_heads: usize,
    head_dim: usize,
    threads: u32,
) -> Result<()> {
    let num_rows = rows.row_pos.len();
    let num_partitions = part_max.len() / (num_rows * num_heads).max(1);
    check(
        out.len() == num_rows * num_heads * head_dim
            && part_max.len() == num_rows * num_heads * num_partitions
            && part_sum.len() == part_max.len()
            && part_out.len() == part_max.len() * head_dim,
        || {
            format!(
                "{num_rows} rows: partial buffers of {} and {}",
                part_out.len(),
                part_max.len()
            )
        },
    )?;
    let merge = launch::paged_attention_merge(num_heads, num_rows, threads)
        .map_err(|e| SimError(e.to_string()))?;
    let geometry = SimGeometry::from(&merge);
    let (h, d, p) = (
        c_int_of(num_heads)?,
        c_int_of(head_dim)?,
        c_int_of(num_partitions)?,
    );
    #[allow(unsafe_code)]
    // SAFETY: the merge reads `[rows, heads, partitions(, head_dim)]` partial buffers and writes
    // `[rows, heads, head_dim]` outputs, the lengths checked above; all outlive the launch.
    run(|| unsafe {
        sim_paged_attention_merge_f32(
            &geometry,
            out.as_mut_ptr(),
            part_out.as_ptr(),
            part_max.as_ptr(),
            part_sum.as_ptr(),
            rows.row_pos.as_ptr(),
            h,
            d,
            p,
        )
    })
}

/// Every row's sequence has a block table, every position fits its table, and every block id
/// lies inside a cache of `num_blocks` blocks: what the kernels cannot check.
fn rows_fit(rows: &KernelRows, num_blocks: usize, block_size: usize) -> bool {
    rows.row_seq.len() == rows.row_pos.len()
        && rows.block_tables.iter().all(|&b| (b as usize) < num_blocks)
        && rows
            .row_seq
            .iter()
            .all(|&s| (s as usize + 1) * rows.max_blocks_per_seq <= rows.block_tables.len())
        && rows
            .row_pos
            .iter()
            .all(|&p| (p as usize) < rows.max_blocks_per_seq * block_size)
}

/// `prefill_attention_d<head_dim>_<dtype>` (and, with several partitions,
/// `paged_attention_merge_f32`) for the query rows of `rows`, over the `tiles` of
/// `PagedAttentionMetadata::prefill_tiles` cut for `threads` per block. `num_partitions` is
/// what `launch::prefill_attention_partitions` chose, or any count covering the longest context
/// (a test may split a grid the launch would not). Returns `[rows, num_heads, head_dim]` f32.
#[allow(clippy::too_many_arguments)]
pub fn prefill_attention<T: HalfElem>(
    shape: &AttentionShape,
    rows: &KernelRows,
    tiles: &[u32],
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    threads: u32,
    num_partitions: usize,
) -> Result<Vec<f32>> {
    let AttentionShape {
        num_heads,
        kv_heads,
        head_dim,
        block_size,
        num_blocks,
    } = *shape;
    let num_rows = rows.row_pos.len();
    let cache_len = num_blocks * block_size * kv_heads * head_dim;
    let group = num_heads / kv_heads.max(1);
    let tile_rows = launch::prefill_tile_rows(threads);
    let tiles_ok = tiles.len().is_multiple_of(3)
        && tiles.chunks(3).all(|t| {
            let (first, count, m) = (t[0] as usize, t[1] as usize, t[2] as usize);
            first + count <= num_rows && m < count * group && m.is_multiple_of(tile_rows)
        });
    check(
        q.len() == num_rows * num_heads * head_dim
            && k_cache.len() == cache_len
            && v_cache.len() == cache_len
            && kv_heads > 0
            && num_heads.is_multiple_of(kv_heads)
            && tiles_ok
            && rows_fit(rows, num_blocks, block_size)
            && (num_partitions == 1
                || num_partitions >= launch::num_partitions(rows.max_context_len)),
        || {
            format!(
                "{num_rows} rows, {} q, {} cache elements, {} tile words, {num_partitions} partitions",
                q.len(),
                k_cache.len(),
                tiles.len()
            )
        },
    )?;
    let g = launch::prefill_attention(
        tiles.len() / 3,
        kv_heads,
        num_partitions,
        head_dim,
        std::mem::size_of::<T>(),
        threads,
    )
    .map_err(|e| SimError(e.to_string()))?;
    let launcher = T::PREFILL_ATTENTION[usize::from(head_dim == 128)];
    let mut out = vec![OUTPUT_POISON; num_rows * num_heads * head_dim];
    let mut part_out = vec![OUTPUT_POISON; num_rows * num_heads * num_partitions * head_dim];
    let mut part_max = vec![OUTPUT_POISON; num_rows * num_heads * num_partitions];
    let mut part_sum = part_max.clone();
    let args = SimPrefillAttention {
        out: out.as_mut_ptr(),
        part_out: part_out.as_mut_ptr(),
        part_max: part_max.as_mut_ptr(),
        part_sum: part_sum.as_mut_ptr(),
        q: q.as_ptr().cast(),
        k_cache: k_cache.as_ptr().cast(),
        v_cache: v_cache.as_ptr().cast(),
        block_tables: rows.block_tables.as_ptr(),
        row_seq: rows.row_seq.as_ptr(),
        row_pos: rows.row_pos.as_ptr(),
        tiles: tiles.as_ptr(),
        num_heads: c_int_of(num_heads)?,
        kv_heads: c_int_of(kv_heads)?,
        block_size: c_int_of(block_size)?,
        max_blocks_per_seq: c_int_of(rows.max_blocks_per_seq)?,
        num_partitions: c_int_of(num_partitions)?,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let geometry = SimGeometry::from(&g);
    #[allow(unsafe_code)]
    // SAFETY: the buffers have the sizes the kernel indexes (checked or allocated above: tiles
    // name rows inside `q`, block ids lie inside the caches) and outlive the synchronous launch.
    run(|| unsafe { launcher(&geometry, &args) })?;
    if num_partitions > 1 {
        // The CUDA path merges with the row kernel's block size, so the simulator does too.
        let parts = [&part_out[..], &part_max, &part_sum];
        let threads = launch::PAGED_ATTENTION_THREADS;
        merge_partitions(&mut out, parts, rows, num_heads, head_dim, threads)?;
    }
    Ok(out)
}
