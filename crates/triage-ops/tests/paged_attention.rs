//! Paged KV ops against their `*_slow` references on random inputs, with every unused cache slot
//! set to NaN so that a read outside a sequence poisons the result.

use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use triage_ops::{
    paged_attention, paged_attention_planned, paged_attention_rows, paged_attention_slow,
    reshape_and_cache, reshape_and_cache_slow, slot_of, DeviceRows, PagedAttentionMetadata,
    PagedAttentionPlan,
};

const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 24;
const KV_HEADS: usize = 2;
const HEADS: usize = 8;
const HEAD_DIM: usize = 16;
/// |fast - slow| bound: both accumulate in f32, in different orders.
const TOL: f32 = 1e-4;

fn randn(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn nan_cache() -> Tensor {
    Tensor::full(
        f32::NAN,
        (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM),
        &Device::Cpu,
    )
    .unwrap()
}

/// Three sequences: a prefill over a cached prefix, a fresh prefill, and a decode step.
fn scenario(seed: u64) -> (Tensor, Tensor, Tensor, PagedAttentionMetadata) {
    scenario_with(seed, vec![13, 6, 9], vec![5, 6, 1])
}

fn scenario_with(
    seed: u64,
    seq_lens: Vec<usize>,
    query_lens: Vec<usize>,
) -> (Tensor, Tensor, Tensor, PagedAttentionMetadata) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut free: Vec<u32> = (1..NUM_BLOCKS as u32).collect();
    free.shuffle(&mut rng); // blocks out of order, as after churn
    let block_tables: Vec<Vec<u32>> = seq_lens
        .iter()
        .map(|&len: &usize| {
            (0..len.div_ceil(BLOCK_SIZE))
                .map(|_| free.pop().unwrap())
                .collect()
        })
        .collect();
    let meta = PagedAttentionMetadata {
        block_size: BLOCK_SIZE,
        block_tables,
        seq_lens,
        query_lens,
    };
    let (k_cache, v_cache) = (nan_cache(), nan_cache());
    let row = KV_HEADS * HEAD_DIM;
    for s in 0..meta.seq_lens.len() {
        let len = meta.seq_lens[s];
        let slots: Vec<u32> = (0..len)
            .map(|p| slot_of(&meta.block_tables[s], BLOCK_SIZE, p))
            .collect();
        let slots = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
        let k = Tensor::from_vec(
            randn(&mut rng, len * row),
            (len, KV_HEADS, HEAD_DIM),
            &Device::Cpu,
        )
        .unwrap();
        let v = Tensor::from_vec(
            randn(&mut rng, len * row),
            (len, KV_HEADS, HEAD_DIM),
            &Device::Cpu,
        )
        .unwrap();
        reshape_and_cache(&k_cache, &k, &slots).unwrap();
        reshape_and_cache(&v_cache, &v, &slots).unwrap();
    }
    let n: usize = meta.query_lens.iter().sum();
    let q = Tensor::from_vec(
        randn(&mut rng, n * HEADS * HEAD_DIM),
        (n, HEADS, HEAD_DIM),
        &Device::Cpu,
    )
    .unwrap();
    (q, k_cache, v_cache, meta)
}

#[test]
fn paged_attention_matches_reference_and_never_reads_unused_slots() {
    // Seeds 0-4: short query runs (the per-row kernel); 5-9: a 20-row prefill over a 20-token
    // cached prefix next to them (the gather + matmul path for that sequence).
    for seed in 0..10 {
        let (q, k, v, meta) = if seed < 5 {
            scenario(seed)
        } else {
            scenario_with(seed, vec![40, 6, 9], vec![20, 6, 1])
        };
        let fast = paged_attention(&q, &k, &v, &meta).unwrap();
        let slow = paged_attention_slow(&q, &k, &v, &meta).unwrap();
        let fast = fast.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let slow = slow.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            fast.iter().all(|x| x.is_finite()),
            "seed {seed}: NaN read from an unused slot"
        );
        let diff = fast
            .iter()
            .zip(&slow)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < TOL, "seed {seed}: max abs diff {diff}");
    }
}

/// Decode rows read from device tensors (a captured step's buffer): tables wider than any row
/// needs (padded with block 0), rows listed out of order, a padding row at position 0. Each
/// real row equals the reference; a table naming a block past the cache is an error.
#[test]
fn decode_rows_from_device_tensors_match_the_reference() {
    for seed in 0..4 {
        let (q, k, v, meta) = scenario_with(seed, vec![13, 6, 9], vec![1, 1, 1]);
        let want = paged_attention_slow(&q, &k, &v, &meta).unwrap();
        let width = 6;
        let order = [2u32, 0, 1];
        let mut tables = vec![0u32; 4 * width];
        for (row, &s) in order.iter().enumerate() {
            let table = &meta.block_tables[s as usize];
            tables[row * width..row * width + table.len()].copy_from_slice(table);
        }
        // The padding row reads slot 0 of block 0, which holds NaN: only its own output shows it.
        let positions: Vec<u32> = order
            .iter()
            .map(|&s| meta.seq_lens[s as usize] as u32 - 1)
            .chain([0])
            .collect();
        let cpu = |data: &[u32]| Tensor::new(data, &Device::Cpu).unwrap();
        let rows = DeviceRows {
            block_tables: cpu(&tables),
            row_seq: cpu(&[0, 1, 2, 3]),
            row_pos: cpu(&positions),
            max_blocks_per_seq: width,
            max_context_len: width * BLOCK_SIZE,
        };
        let q_rows: Vec<Tensor> = order
            .iter()
            .map(|&s| q.get(s as usize).unwrap())
            .chain([q.get(0).unwrap()])
            .collect();
        let q_rows = Tensor::stack(&q_rows, 0).unwrap();
        let got = paged_attention_rows(&q_rows, &k, &v, &rows).unwrap();
        for (row, &s) in order.iter().enumerate() {
            let g = got
                .get(row)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let w = want.get(s as usize).unwrap().flatten_all().unwrap();
            let w = w.to_vec1::<f32>().unwrap();
            let diff = g
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < TOL, "seed {seed} row {row}: max abs diff {diff}");
        }
        let mut bad = tables.clone();
        bad[0] = NUM_BLOCKS as u32;
        let rows = DeviceRows {
            block_tables: cpu(&bad),
            ..rows
        };
        assert!(paged_attention_rows(&q_rows, &k, &v, &rows).is_err());
    }
}

#[test]
fn reshape_and_cache_matches_reference_and_touches_only_its_slots() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let cache = Tensor::from_vec(
        randn(&mut rng, NUM_BLOCKS * BLOCK_SIZE * KV_HEADS * HEAD_DIM),
        (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM),
        &Device::Cpu,
    )
    .unwrap();
    let slots: Vec<u32> = vec![17, 3, 40, 95, 4];
    let rows = Tensor::from_vec(
        randn(&mut rng, 5 * KV_HEADS * HEAD_DIM),
        (5, KV_HEADS, HEAD_DIM),
        &Device::Cpu,
    )
    .unwrap();
    let expected = reshape_and_cache_slow(&cache, &rows, &slots).unwrap();
    reshape_and_cache(
        &cache,
        &rows,
        &Tensor::new(slots.as_slice(), &Device::Cpu).unwrap(),
    )
    .unwrap();
    let (a, b) = (
        cache.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        expected.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert_eq!(a, b);
    let out_of_range = Tensor::new(&[(NUM_BLOCKS * BLOCK_SIZE) as u32], &Device::Cpu).unwrap();
    assert!(reshape_and_cache(&cache, &rows.narrow(0, 0, 1).unwrap(), &out_of_range).is_err());
}

#[test]
fn inconsistent_metadata_is_an_error() {
    let (q, k, v, mut meta) = scenario(1);
    meta.query_lens[0] += 1;
    assert!(paged_attention(&q, &k, &v, &meta).is_err());
    let (q, k, v, mut meta) = scenario(1);
    meta.seq_lens[1] = 99;
    assert!(paged_attention(&q, &k, &v, &meta).is_err());
    // A block id past the cache is refused before any kernel reads it.
    let (q, k, v, mut meta) = scenario(1);
    meta.block_tables[0][0] = k.dim(0).unwrap() as u32;
    assert!(paged_attention(&q, &k, &v, &meta).is_err());
    // Caches without KV heads, or of two dtypes, are errors, not a division by zero.
    let (q, k, v, meta) = scenario(1);
    let (blocks, block_size, _, head_dim) = k.dims4().unwrap();
    let empty = Tensor::zeros((blocks, block_size, 0, head_dim), DType::F32, &Device::Cpu).unwrap();
    assert!(paged_attention(&q, &empty, &empty, &meta).is_err());
    assert!(paged_attention(&q, &k, &v.to_dtype(DType::F16).unwrap(), &meta).is_err());
}

/// A forward pass makes one plan per step and attends through it in every layer: each layer's
/// result is the one-off call's, and a plan is refused for a cache or a query it was not made for.
#[test]
fn one_plan_serves_every_layer_of_a_step() {
    let (q, k, v, meta) = scenario_with(11, vec![40, 6, 9], vec![20, 6, 1]);
    let plan = PagedAttentionPlan::new(meta.clone(), NUM_BLOCKS, &Device::Cpu).unwrap();
    assert!(plan.device_rows().is_none(), "a CPU plan uploads nothing");
    let once = paged_attention(&q, &k, &v, &meta).unwrap();
    for _layer in 0..3 {
        let planned = paged_attention_planned(&q, &k, &v, &plan).unwrap();
        assert_eq!(
            planned.to_vec3::<f32>().unwrap(),
            once.to_vec3::<f32>().unwrap()
        );
    }
    let fewer_blocks = k.narrow(0, 0, NUM_BLOCKS - 1).unwrap();
    assert!(paged_attention_planned(&q, &fewer_blocks, &fewer_blocks, &plan).is_err());
    let fewer_rows = q.narrow(0, 0, 10).unwrap();
    assert!(paged_attention_planned(&fewer_rows, &k, &v, &plan).is_err());
    let mut bad = meta;
    bad.block_tables[2][0] = NUM_BLOCKS as u32;
    assert!(PagedAttentionPlan::new(bad, NUM_BLOCKS, &Device::Cpu).is_err());
}

/// The CUDA forms against the CPU forms (which the tests above hold to the references): the
/// caches go to the GPU in each float dtype, with NaN in every unused slot, and the CPU reads
/// the same rounded values in f32, so only the summation order differs.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use candle_core::DType;
    use triage_ops::{reshape_and_cache_mapped, SlotMapping, PADDING_SLOT};
    use triage_testkit::max_abs_diff;

    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    /// |cuda - cpu| bound: same inputs, f32 accumulation in a different order.
    const CUDA_TOL: f32 = 1e-3;

    fn gpu() -> Device {
        Device::new_cuda(0).expect("the cuda feature's tests need a CUDA device")
    }

    /// `t` rounded through `dtype` (what the GPU holds), as f32 on the CPU.
    fn rounded(t: &Tensor, dtype: DType) -> Tensor {
        t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()
    }

    /// Sequences with `seq_lens` tokens (random K/V) in a NaN cache of `num_blocks` blocks.
    fn long_scenario(
        seed: u64,
        num_blocks: usize,
        seq_lens: Vec<usize>,
        query_lens: Vec<usize>,
    ) -> (Tensor, Tensor, Tensor, PagedAttentionMetadata) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut free: Vec<u32> = (0..num_blocks as u32).collect();
        free.shuffle(&mut rng);
        let block_tables: Vec<Vec<u32>> = seq_lens
            .iter()
            .map(|&len| {
                (0..len.div_ceil(BLOCK_SIZE))
                    .map(|_| free.pop().unwrap())
                    .collect()
            })
            .collect();
        let shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM);
        let k_cache = Tensor::full(f32::NAN, shape, &Device::Cpu).unwrap();
        let v_cache = Tensor::full(f32::NAN, shape, &Device::Cpu).unwrap();
        for (table, &len) in block_tables.iter().zip(&seq_lens) {
            let slots: Vec<u32> = (0..len).map(|p| slot_of(table, BLOCK_SIZE, p)).collect();
            let slots = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
            for cache in [&k_cache, &v_cache] {
                let n = len * KV_HEADS * HEAD_DIM;
                let rows =
                    Tensor::from_vec(randn(&mut rng, n), (len, KV_HEADS, HEAD_DIM), &Device::Cpu)
                        .unwrap();
                reshape_and_cache(cache, &rows, &slots).unwrap();
            }
        }
        let n: usize = query_lens.iter().sum();
        let q = Tensor::from_vec(
            randn(&mut rng, n * HEADS * HEAD_DIM),
            (n, HEADS, HEAD_DIM),
            &Device::Cpu,
        )
        .unwrap();
        let meta = PagedAttentionMetadata {
            block_size: BLOCK_SIZE,
            block_tables,
            seq_lens,
            query_lens,
        };
        (q, k_cache, v_cache, meta)
    }

    #[test]
    fn paged_attention_matches_cpu_in_every_dtype_and_partition_count() {
        let dev = gpu();
        let scenarios = [
            scenario(3),
            scenario_with(8, vec![40, 6, 9], vec![20, 6, 1]),
            // 1300 keys: three partitions of 512, merged by log-sum-exp.
            long_scenario(9, 500, vec![1300, 7, 600], vec![3, 7, 1]),
        ];
        for (i, (q, k, v, meta)) in scenarios.iter().enumerate() {
            for dtype in DTYPES {
                let (q_r, k_r, v_r) = (rounded(q, dtype), rounded(k, dtype), rounded(v, dtype));
                let want = paged_attention(&q_r, &k_r, &v_r, meta).unwrap();
                let to_gpu = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
                let got = paged_attention(&to_gpu(q), &to_gpu(k), &to_gpu(v), meta).unwrap();
                assert_eq!(got.dims(), want.dims());
                let got = got.to_device(&Device::Cpu).unwrap();
                let diff = max_abs_diff(&got, &want);
                assert!(
                    diff < CUDA_TOL,
                    "scenario {i} {dtype:?}: max abs diff {diff}"
                );
            }
        }
    }

    /// One sequence per entry of `seq_lens` (random K/V in a NaN cache), `query_lens` rows
    /// each, at a model's attention shape.
    fn shaped_scenario(
        seed: u64,
        (heads, kv_heads, head_dim, block_size): (usize, usize, usize, usize),
        seq_lens: Vec<usize>,
        query_lens: Vec<usize>,
    ) -> (Tensor, Tensor, Tensor, PagedAttentionMetadata) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let num_blocks = seq_lens
            .iter()
            .map(|l| l.div_ceil(block_size))
            .sum::<usize>()
            + 2;
        let mut free: Vec<u32> = (0..num_blocks as u32).collect();
        free.shuffle(&mut rng);
        let block_tables: Vec<Vec<u32>> = seq_lens
            .iter()
            .map(|&len| {
                (0..len.div_ceil(block_size))
                    .map(|_| free.pop().unwrap())
                    .collect()
            })
            .collect();
        let row = kv_heads * head_dim;
        let mut k = vec![f32::NAN; num_blocks * block_size * row];
        let mut v = k.clone();
        for (table, &len) in block_tables.iter().zip(&seq_lens) {
            for pos in 0..len {
                let slot = slot_of(table, block_size, pos) as usize;
                k[slot * row..(slot + 1) * row].copy_from_slice(&randn(&mut rng, row));
                v[slot * row..(slot + 1) * row].copy_from_slice(&randn(&mut rng, row));
            }
        }
        let shape = (num_blocks, block_size, kv_heads, head_dim);
        let n: usize = query_lens.iter().sum();
        let q = randn(&mut rng, n * heads * head_dim);
        let meta = PagedAttentionMetadata {
            block_size,
            block_tables,
            seq_lens,
            query_lens,
        };
        (
            Tensor::from_vec(q, (n, heads, head_dim), &Device::Cpu).unwrap(),
            Tensor::from_vec(k, shape, &Device::Cpu).unwrap(),
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap(),
            meta,
        )
    }

    /// The tensor-core prefill kernel (picked by the plan for f16/bf16 prefill steps at head dims
    /// 64 and 128) against the CPU op on the same rounded values and against the row kernel on
    /// the same device tensors: split (a chunk and a question over a long prefix) and unsplit (a
    /// 3k-token prompt). P is rounded to the input type before the PV product, so the bound is
    /// four of the type's relative steps (outputs are means of values up to ~2 in magnitude).
    #[test]
    fn prefill_attention_matches_cpu_and_the_row_kernel() {
        let dev = gpu();
        let cases = [
            shaped_scenario(21, (12, 2, 128, 16), vec![737, 45, 20], vec![37, 1, 20]),
            shaped_scenario(22, (14, 2, 64, 16), vec![3000], vec![3000]),
            shaped_scenario(23, (12, 2, 128, 16), vec![32_040], vec![40]),
        ];
        for (i, (q, k, v, meta)) in cases.iter().enumerate() {
            for (dtype, step) in [(DType::F16, 2f32.powi(-11)), (DType::BF16, 2f32.powi(-8))] {
                let (q_r, k_r, v_r) = (rounded(q, dtype), rounded(k, dtype), rounded(v, dtype));
                let want = paged_attention(&q_r, &k_r, &v_r, meta).unwrap();
                let to_gpu = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
                let (q_g, k_g, v_g) = (to_gpu(q), to_gpu(k), to_gpu(v));
                let plan = PagedAttentionPlan::new(meta.clone(), k.dim(0).unwrap(), &dev).unwrap();
                let got = paged_attention_planned(&q_g, &k_g, &v_g, &plan).unwrap();
                let rows = plan.device_rows().unwrap();
                let by_rows = paged_attention_rows(&q_g, &k_g, &v_g, rows).unwrap();
                let got = got.to_device(&Device::Cpu).unwrap();
                let by_rows = by_rows.to_device(&Device::Cpu).unwrap();
                let bound = 4.0 * 2.0 * step + 1e-3;
                let (vs_cpu, vs_rows) = (max_abs_diff(&got, &want), max_abs_diff(&got, &by_rows));
                assert!(
                    vs_cpu < bound,
                    "case {i} {dtype:?}: {vs_cpu} from the CPU op"
                );
                assert!(
                    vs_rows < bound,
                    "case {i} {dtype:?}: {vs_rows} from the row kernel"
                );
                assert!(
                    max_abs_diff(&by_rows, &want) < CUDA_TOL,
                    "case {i} {dtype:?}: row kernel"
                );
            }
        }
    }

    #[test]
    fn reshape_and_cache_matches_cpu_and_checks_slots_before_writing() {
        let dev = gpu();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM);
        let cache = Tensor::from_vec(
            randn(&mut rng, shape.0 * shape.1 * shape.2 * shape.3),
            shape,
            &Device::Cpu,
        )
        .unwrap();
        let rows = Tensor::from_vec(
            randn(&mut rng, 5 * KV_HEADS * HEAD_DIM),
            (5, KV_HEADS, HEAD_DIM),
            &Device::Cpu,
        )
        .unwrap();
        let slots = vec![17, PADDING_SLOT, 40, 95, 4];
        for dtype in DTYPES {
            let want =
                reshape_and_cache_slow(&rounded(&cache, dtype), &rounded(&rows, dtype), &slots)
                    .unwrap();
            let gpu_cache = cache.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
            let gpu_rows = rows.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
            let mapped = SlotMapping::new(slots.clone(), &dev).unwrap();
            reshape_and_cache_mapped(&gpu_cache, &gpu_rows, &mapped).unwrap();
            let got = gpu_cache
                .to_dtype(DType::F32)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap();
            assert_eq!(max_abs_diff(&got, &want), 0.0, "{dtype:?}");

            // Through the plain API the slots are copied back for the same check.
            let before = got;
            let bad = Tensor::new(&[3u32, (NUM_BLOCKS * BLOCK_SIZE) as u32], &dev).unwrap();
            let two_rows = gpu_rows.narrow(0, 0, 2).unwrap();
            assert!(reshape_and_cache(&gpu_cache, &two_rows, &bad).is_err());
            let after = gpu_cache
                .to_dtype(DType::F32)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap();
            assert_eq!(
                max_abs_diff(&before, &after),
                0.0,
                "{dtype:?}: a rejected call wrote"
            );
        }
    }
}

/// `prefill_attention`'s tiles name every (row, head) pair of every sequence exactly once, stay
/// inside their sequence, and list a sequence's tiles last first (the longest key ranges start
/// first).
#[test]
fn prefill_tiles_cover_every_row_and_head_once_last_tile_first() {
    let meta = PagedAttentionMetadata {
        block_size: 16,
        block_tables: vec![vec![0; 60], vec![1], vec![2; 2]],
        seq_lens: vec![937, 9, 20],
        query_lens: vec![37, 1, 20],
    };
    for (group, tile_rows) in [(1, 16), (6, 64), (7, 16)] {
        let tiles = meta.prefill_tiles(group, tile_rows);
        let mut seen = vec![0u32; 58 * group];
        let mut first_pairs: Vec<(u32, u32)> = Vec::new();
        for t in tiles.chunks(3) {
            let (first, rows, m) = (t[0], t[1], t[2] as usize);
            first_pairs.push((first, t[2]));
            for pair in m..(m + tile_rows).min(rows as usize * group) {
                seen[first as usize * group + pair] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "group {group}: {seen:?}");
        let seq0: Vec<u32> = first_pairs
            .iter()
            .filter(|p| p.0 == 0)
            .map(|p| p.1)
            .collect();
        assert!(seq0.windows(2).all(|w| w[0] > w[1]), "{seq0:?}");
    }
}
