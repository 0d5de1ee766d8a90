//! Launch geometry of every CUDA kernel in `kernels/`: grid, block and dynamic shared bytes.
//!
//! One function per kernel family, called both by the CUDA launches (`cuda_fwd`) and by the
//! simulator tests, so the geometry that is tested is the geometry that ships. Each takes the
//! block size as an argument so the tests can also run the smallest one ([`MIN_THREADS`]).
//! This file knows no CUDA: it is plain arithmetic, compiled with or without the `cuda` feature.

use crate::{OpsError, Result};

/// Threads of one warp; every kernel's block is a whole number of warps.
pub const WARP_SIZE: u32 = 32;
/// The smallest block every kernel supports: one warp.
pub const MIN_THREADS: u32 = WARP_SIZE;
/// The largest block a CUDA device accepts.
pub const MAX_THREADS: u32 = 1024;
/// Dynamic shared memory a block may use without opting in (48 KiB on every CUDA device).
pub const MAX_DEFAULT_SHARED_BYTES: u32 = 48 * 1024;

/// Block size of `logits_reduce`: 8 warps keep enough 16-byte loads in flight for a chunk.
pub const LOGITS_REDUCE_THREADS: u32 = 256;
/// Logits one `logits_reduce` block reduces at most: a row longer than this is split over
/// several blocks whose partial results `logits_reduce_merge` combines, so that a batch of a few
/// rows (decode) still puts a block on every multiprocessor (152k logits: 19 blocks a row).
pub const LOGITS_REDUCE_CHUNK: usize = 8192;
/// Blocks one row is split over at most (one merge thread each).
pub const LOGITS_REDUCE_MAX_SPLITS: usize = 32;
/// Block size of `entropy_window` (one thread per sequence).
pub const ENTROPY_WINDOW_THREADS: u32 = 64;
/// Block size of `reshape_and_cache` (one block per token row).
pub const RESHAPE_AND_CACHE_THREADS: u32 = 128;
/// Block size of `paged_attention` and its merge kernel.
pub const PAGED_ATTENTION_THREADS: u32 = 128;
/// Block size of `add_rms_norm` (one block per row: 6 elements a thread on a 1,536-wide row).
pub const RMS_NORM_THREADS: u32 = 256;
/// Block size of `silu_mul` (one column a thread).
pub const SILU_MUL_THREADS: u32 = 256;
/// Keys one `paged_attention` block scores: longer contexts are split into partitions of this
/// many keys whose partial results `paged_attention_merge` combines by log-sum-exp.
pub const PARTITION_SIZE: u32 = 512;
/// Block size of `prefill_attention`: 4 warps, each owning 16 (query row, head) pairs of a tile.
pub const PREFILL_ATTENTION_THREADS: u32 = 128;
/// Keys in one `prefill_attention` shared K/V tile (the kernel's `BLOCK_N`).
pub const PREFILL_KEY_TILE: usize = 64;
/// Elements each shared K/V row of `prefill_attention` is padded by (the kernel's `PAD`).
const PREFILL_ROW_PAD: usize = 8;
/// Head dims `prefill_attention` is instantiated for (`prefill_attention_d<dim>_<dtype>`).
pub const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];
/// A `prefill_attention` launch with fewer blocks than this (tiles × KV heads: a short chunk,
/// such as a question over a cached corpus) splits its keys into partitions of
/// [`PARTITION_SIZE`] so that every multiprocessor gets work (two blocks each on the 132 of an
/// H100 or H200). Derived from the hardware, not yet measured on a GPU: a 40-token question over
/// 32k keys on the 1.5B shape runs 504 blocks split (4 tiles × 2 KV heads × 63 partitions)
/// instead of 8.
pub const PREFILL_SPLIT_BELOW_BLOCKS: usize = 264;
/// The most bytes the partial results of a split `prefill_attention` launch may take; a launch
/// that would need more runs unsplit.
pub const PREFILL_SPLIT_MAX_BYTES: usize = 64 << 20;

/// Everything `cuLaunchKernel` needs besides the arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchGeometry {
    fn new(grid: (u32, u32, u32), threads: u32, shared_mem_bytes: u32) -> Result<Self> {
        check_threads(threads)?;
        if shared_mem_bytes > MAX_DEFAULT_SHARED_BYTES {
            return Err(OpsError::InvalidArgument(format!(
                "{shared_mem_bytes} bytes of shared memory exceed {MAX_DEFAULT_SHARED_BYTES}"
            )));
        }
        Ok(Self {
            grid,
            block: (threads, 1, 1),
            shared_mem_bytes,
        })
    }
}

fn check_threads(threads: u32) -> Result<()> {
    if !(MIN_THREADS..=MAX_THREADS).contains(&threads) || !threads.is_multiple_of(WARP_SIZE) {
        return Err(OpsError::InvalidArgument(format!(
            "block size {threads} is not a multiple of {WARP_SIZE} in {MIN_THREADS}..={MAX_THREADS}"
        )));
    }
    Ok(())
}

/// Largest grid extent in y and z (x allows 2^31 - 1).
const MAX_GRID_YZ: usize = 65_535;
const MAX_GRID_X: usize = (1 << 31) - 1;

/// One grid extent: at least 1 (an empty launch is the caller's bug) and at most `max`.
fn grid_dim(count: usize, max: usize, what: &str) -> Result<u32> {
    if count == 0 || count > max {
        return Err(OpsError::InvalidArgument(format!(
            "{count} {what} do not fit a grid extent of 1..={max}"
        )));
    }
    Ok(count as u32)
}

/// How `logits_reduce` cuts a row of `vocab` logits: `(splits, chunk)`, chunks of `chunk`
/// logits (a multiple of 8, so each starts on the row's 16-byte phase) with none empty. It
/// depends on the vocabulary only, so a row's result never depends on the batch around it.
pub fn logits_reduce_splits(vocab: usize) -> (usize, usize) {
    let splits = vocab
        .div_ceil(LOGITS_REDUCE_CHUNK)
        .clamp(1, LOGITS_REDUCE_MAX_SPLITS);
    let chunk = vocab.div_ceil(splits).div_ceil(8).max(1) * 8;
    (vocab.div_ceil(chunk).max(1), chunk)
}

/// `logits_reduce_<dtype>`: grid (rows, splits of [`logits_reduce_splits`]); each thread keeps
/// its own top-k list, and the block merges them in dynamic shared memory (`threads · k` ids and
/// values).
pub fn logits_reduce(
    num_rows: usize,
    vocab: usize,
    k: usize,
    threads: u32,
) -> Result<LaunchGeometry> {
    let (splits, _) = logits_reduce_splits(vocab);
    LaunchGeometry::new(
        (
            grid_dim(num_rows, MAX_GRID_X, "rows")?,
            grid_dim(splits, MAX_GRID_YZ, "splits")?,
            1,
        ),
        threads,
        top_k_shared_bytes(threads, k),
    )
}

/// `logits_reduce_merge_f32`: one warp per row, a thread per split, merging the splits' states
/// and top-k lists as one block merges its threads'.
pub fn logits_reduce_merge(num_rows: usize, k: usize) -> Result<LaunchGeometry> {
    let threads = LOGITS_REDUCE_MAX_SPLITS as u32;
    LaunchGeometry::new(
        (grid_dim(num_rows, MAX_GRID_X, "rows")?, 1, 1),
        threads,
        top_k_shared_bytes(threads, k),
    )
}

/// A top-k list of `k` (value, id) pairs per thread.
fn top_k_shared_bytes(threads: u32, k: usize) -> u32 {
    (threads as usize * k * (std::mem::size_of::<f32>() + std::mem::size_of::<u32>())) as u32
}

/// `add_rms_norm_<dtype>`: one block per row.
pub fn rms_norm(num_rows: usize, threads: u32) -> Result<LaunchGeometry> {
    LaunchGeometry::new((grid_dim(num_rows, MAX_GRID_X, "rows")?, 1, 1), threads, 0)
}

/// `silu_mul_<dtype>`: grid (rows, chunks of `threads` columns of the `inter` outputs).
pub fn silu_mul(num_rows: usize, inter: usize, threads: u32) -> Result<LaunchGeometry> {
    check_threads(threads)?;
    let chunks = inter.div_ceil(threads as usize);
    LaunchGeometry::new(
        (
            grid_dim(num_rows, MAX_GRID_X, "rows")?,
            grid_dim(chunks, MAX_GRID_YZ, "column chunks")?,
            1,
        ),
        threads,
        0,
    )
}

/// `rope_and_cache_<dtype>`: grid (rows, heads of the stacked projection), a thread per rotation
/// pair (`head_dim / 2`, rounded up to whole warps).
pub fn rope_and_cache(
    num_rows: usize,
    num_heads: usize,
    head_dim: usize,
) -> Result<LaunchGeometry> {
    let threads = (head_dim / 2).div_ceil(WARP_SIZE as usize).max(1) * WARP_SIZE as usize;
    LaunchGeometry::new(
        (
            grid_dim(num_rows, MAX_GRID_X, "rows")?,
            grid_dim(num_heads, MAX_GRID_YZ, "heads")?,
            1,
        ),
        u32::try_from(threads).unwrap_or(u32::MAX),
        0,
    )
}

/// `entropy_window_f32`: one thread per sequence.
pub fn entropy_window(num_seqs: usize, threads: u32) -> Result<LaunchGeometry> {
    let blocks = num_seqs.div_ceil(threads.max(1) as usize);
    LaunchGeometry::new(
        (grid_dim(blocks, MAX_GRID_X, "sequence blocks")?, 1, 1),
        threads,
        0,
    )
}

/// `reshape_and_cache_<dtype>`: one block per new token row.
pub fn reshape_and_cache(num_tokens: usize, threads: u32) -> Result<LaunchGeometry> {
    LaunchGeometry::new(
        (grid_dim(num_tokens, MAX_GRID_X, "token rows")?, 1, 1),
        threads,
        0,
    )
}

/// Partitions of [`PARTITION_SIZE`] keys needed by the longest context of a step.
pub fn num_partitions(max_context_len: usize) -> usize {
    max_context_len.div_ceil(PARTITION_SIZE as usize).max(1)
}

/// Query heads one `paged_attention` block serves (the kernel's `MAX_GROUP`): a KV head whose
/// group is larger gets several blocks along x.
pub const PAGED_ATTENTION_MAX_GROUP: usize = 8;
/// 16-byte vectors of a key row one `paged_attention` lane holds, at most.
const PAGED_ATTENTION_MAX_VECS_PER_LANE: usize = 4;

/// `paged_attention_<dtype>` over elements of `elem_bytes` bytes: one block per (KV head and a
/// chunk of at most [`PAGED_ATTENTION_MAX_GROUP`] of its query heads, query row, partition), so
/// each key and value row is read once for the chunk. Shared memory holds each warp's
/// online-softmax state (output, max and sum) for the chunk's heads, in f32; the chunk is made
/// smaller until it fits. A head dim that is not a whole number of 16-byte vectors, or that needs
/// more than 4 vectors per lane, is refused.
pub fn paged_attention(
    num_heads: usize,
    kv_heads: usize,
    num_rows: usize,
    max_context_len: usize,
    head_dim: usize,
    elem_bytes: usize,
    threads: u32,
) -> Result<LaunchGeometry> {
    if kv_heads == 0 || !num_heads.is_multiple_of(kv_heads) || elem_bytes == 0 {
        return Err(OpsError::InvalidArgument(format!(
            "paged attention over {num_heads} heads, {kv_heads} KV heads, {elem_bytes}-byte values"
        )));
    }
    let per_vec = 16 / elem_bytes;
    let num_vecs = head_dim / per_vec.max(1);
    let lanes = (num_vecs & num_vecs.wrapping_neg()).min(WARP_SIZE as usize);
    if per_vec == 0
        || num_vecs == 0
        || !head_dim.is_multiple_of(per_vec)
        || num_vecs / lanes > PAGED_ATTENTION_MAX_VECS_PER_LANE
    {
        return Err(OpsError::InvalidArgument(format!(
            "paged attention needs a head dim of 16-byte vectors, at most {PAGED_ATTENTION_MAX_VECS_PER_LANE} per lane: {head_dim} × {elem_bytes} bytes"
        )));
    }
    check_threads(threads)?;
    let group = num_heads / kv_heads;
    let num_warps = (threads / WARP_SIZE) as usize;
    let state_bytes =
        |heads: usize| num_warps * heads * (head_dim + 2) * std::mem::size_of::<f32>();
    let mut heads_per_block = group.min(PAGED_ATTENTION_MAX_GROUP);
    while heads_per_block > 1 && state_bytes(heads_per_block) > MAX_DEFAULT_SHARED_BYTES as usize {
        heads_per_block -= 1;
    }
    let chunks = group.div_ceil(heads_per_block);
    let grid = (
        grid_dim(kv_heads * chunks, MAX_GRID_X, "head chunks")?,
        grid_dim(num_rows, MAX_GRID_YZ, "query rows")?,
        grid_dim(num_partitions(max_context_len), MAX_GRID_YZ, "partitions")?,
    );
    LaunchGeometry::new(grid, threads, state_bytes(heads_per_block) as u32)
}

/// (Query row, head) pairs in one `prefill_attention` tile: 16 per warp.
pub fn prefill_tile_rows(threads: u32) -> usize {
    16 * (threads / WARP_SIZE) as usize
}

/// Partitions of a `prefill_attention` launch of `num_tiles` tiles over `num_rows` query rows:
/// one, unless the grid would leave multiprocessors idle ([`PREFILL_SPLIT_BELOW_BLOCKS`]), the
/// longest context spans several partitions, and their partial results fit
/// [`PREFILL_SPLIT_MAX_BYTES`].
pub fn prefill_attention_partitions(
    num_tiles: usize,
    kv_heads: usize,
    num_rows: usize,
    num_heads: usize,
    head_dim: usize,
    max_context_len: usize,
) -> usize {
    let partitions = num_partitions(max_context_len);
    let partial_bytes = num_rows * num_heads * partitions * (head_dim + 2) * 4;
    if num_tiles * kv_heads >= PREFILL_SPLIT_BELOW_BLOCKS
        || partitions == 1
        || partial_bytes > PREFILL_SPLIT_MAX_BYTES
    {
        1
    } else {
        partitions
    }
}

/// `prefill_attention_d<head_dim>_<dtype>` over 16-bit elements: grid (tiles, KV heads,
/// partitions); dynamic shared memory holds one K and one V tile of [`PREFILL_KEY_TILE`] keys,
/// each row padded by 8 elements. Head dims other than [`PREFILL_HEAD_DIMS`] and element sizes
/// other than 2 are refused (the caller then runs `paged_attention`).
pub fn prefill_attention(
    num_tiles: usize,
    kv_heads: usize,
    num_partitions: usize,
    head_dim: usize,
    elem_bytes: usize,
    threads: u32,
) -> Result<LaunchGeometry> {
    if !PREFILL_HEAD_DIMS.contains(&head_dim) || elem_bytes != 2 {
        return Err(OpsError::InvalidArgument(format!(
            "prefill attention runs head dims {PREFILL_HEAD_DIMS:?} of 16-bit floats, not {head_dim} × {elem_bytes} bytes"
        )));
    }
    check_threads(threads)?;
    let grid = (
        grid_dim(num_tiles, MAX_GRID_X, "query tiles")?,
        grid_dim(kv_heads, MAX_GRID_YZ, "KV heads")?,
        grid_dim(num_partitions, MAX_GRID_YZ, "partitions")?,
    );
    let shared = 2 * PREFILL_KEY_TILE * (head_dim + PREFILL_ROW_PAD) * elem_bytes;
    LaunchGeometry::new(grid, threads, shared as u32)
}

/// `paged_attention_merge_f32`: one block per (query head, query row), threads over head dims.
pub fn paged_attention_merge(
    num_heads: usize,
    num_rows: usize,
    threads: u32,
) -> Result<LaunchGeometry> {
    let grid = (
        grid_dim(num_heads, MAX_GRID_X, "heads")?,
        grid_dim(num_rows, MAX_GRID_YZ, "query rows")?,
        1,
    );
    LaunchGeometry::new(grid, threads, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_attention_takes_its_head_dims_in_16_bit_floats_and_fits_default_shared_memory() {
        for d in PREFILL_HEAD_DIMS {
            let g = prefill_attention(10, 2, 3, d, 2, PREFILL_ATTENTION_THREADS).unwrap();
            assert_eq!(g.grid, (10, 2, 3));
            assert_eq!(g.shared_mem_bytes as usize, 2 * 64 * (d + 8) * 2);
        }
        assert!(prefill_attention(10, 2, 1, 96, 2, PREFILL_ATTENTION_THREADS).is_err());
        assert!(prefill_attention(10, 2, 1, 128, 4, PREFILL_ATTENTION_THREADS).is_err());
        assert!(prefill_attention(0, 2, 1, 128, 2, PREFILL_ATTENTION_THREADS).is_err());
        assert_eq!(prefill_tile_rows(PREFILL_ATTENTION_THREADS), 64);
        assert_eq!(prefill_tile_rows(MIN_THREADS), 16);
    }

    #[test]
    fn prefill_attention_splits_only_a_small_grid_over_a_long_context() {
        // A 40-token question over a 32k prefix on the 1.5B shape: 4 tiles x 2 KV heads.
        assert_eq!(prefill_attention_partitions(4, 2, 40, 12, 128, 32_040), 63);
        // A 2k chunk: 192 tiles x 2 KV heads fill the GPU unsplit.
        assert_eq!(
            prefill_attention_partitions(192, 2, 2048, 12, 128, 34_000),
            1
        );
        // A context of one partition has nothing to split.
        assert_eq!(prefill_attention_partitions(4, 2, 40, 12, 128, 512), 1);
        // Partial results past the byte bound run unsplit.
        assert_eq!(
            prefill_attention_partitions(100, 1, 1500, 12, 128, 200_000),
            1
        );
    }

    #[test]
    fn block_sizes_are_whole_warps() {
        assert!(logits_reduce(1, 100, 20, 48).is_err());
        assert!(logits_reduce(1, 100, 20, 2048).is_err());
        assert!(logits_reduce(1, 100, 20, MIN_THREADS).is_ok());
    }

    #[test]
    fn logits_reduce_shared_memory_fits_at_the_largest_k() {
        let g = logits_reduce(64, 151_936, crate::MAX_TOP_K, LOGITS_REDUCE_THREADS).unwrap();
        assert_eq!(g.grid, (64, 19, 1));
        assert_eq!(g.shared_mem_bytes, 256 * 20 * 8);
        assert!(logits_reduce(1, 100, crate::MAX_TOP_K, MAX_THREADS).is_err());
        let merge = logits_reduce_merge(64, crate::MAX_TOP_K).unwrap();
        assert_eq!((merge.grid, merge.block.0), ((64, 1, 1), 32));
    }

    #[test]
    fn rows_split_into_chunks_that_cover_them_once() {
        for vocab in [1, 7, 8192, 8193, 32_000, 151_936, 1 << 20] {
            let (splits, chunk) = logits_reduce_splits(vocab);
            assert_eq!(chunk % 8, 0);
            assert!(splits <= LOGITS_REDUCE_MAX_SPLITS);
            assert!(
                chunk * (splits - 1) < vocab && vocab <= chunk * splits,
                "{vocab}"
            );
        }
        assert_eq!(logits_reduce_splits(8192), (1, 8192));
        assert_eq!(logits_reduce_splits(151_936), (19, 8000));
        // Past 32 · 8192 logits the chunks grow instead.
        assert_eq!(logits_reduce_splits(1 << 20).0, 32);
    }

    #[test]
    fn long_contexts_split_into_partitions() {
        assert_eq!(num_partitions(1), 1);
        assert_eq!(num_partitions(512), 1);
        assert_eq!(num_partitions(513), 2);
        assert_eq!(num_partitions(32 * 1024), 64);
        // The 0.5B: 14 heads over 2 KV heads, one block per KV head serving its 7.
        let g = paged_attention(14, 2, 16, 8192, 64, 2, PAGED_ATTENTION_THREADS).unwrap();
        assert_eq!(g.grid, (2, 16, 16));
        assert_eq!(g.shared_mem_bytes, 4 * 7 * (64 + 2) * 4);
    }

    #[test]
    fn paged_attention_splits_large_groups_and_refuses_odd_head_dims() {
        // 24 query heads per KV head: three blocks of 8 each.
        let g = paged_attention(48, 2, 1, 100, 128, 2, PAGED_ATTENTION_THREADS).unwrap();
        assert_eq!(g.grid, (6, 1, 1));
        // A wide block would need more shared memory: fewer heads per block, more blocks.
        let g = paged_attention(16, 2, 1, 100, 128, 4, MAX_THREADS).unwrap();
        assert!(g.shared_mem_bytes <= MAX_DEFAULT_SHARED_BYTES);
        assert!(g.grid.0 > 2, "{:?}", g.grid);
        // 20 bf16 values are not whole 16-byte vectors; 20 f32 values are 5 vectors in one lane.
        assert!(paged_attention(8, 2, 1, 10, 20, 2, PAGED_ATTENTION_THREADS).is_err());
        assert!(paged_attention(8, 2, 1, 10, 20, 4, PAGED_ATTENTION_THREADS).is_err());
        assert!(paged_attention(8, 3, 1, 10, 64, 2, PAGED_ATTENTION_THREADS).is_err());
    }

    #[test]
    fn empty_grids_are_errors() {
        assert!(reshape_and_cache(0, RESHAPE_AND_CACHE_THREADS).is_err());
        assert!(entropy_window(0, ENTROPY_WINDOW_THREADS).is_err());
    }
}
