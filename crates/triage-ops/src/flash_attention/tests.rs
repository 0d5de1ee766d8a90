//! Flash attention against the naive paged reference, across kernels, cache dtypes, batching and
//! chunking; the exp and the lane sum it is built on.

use candle_core::{Device, Tensor};
use half::{bf16, f16};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_testkit::max_abs_diff;

use super::tile::{exp_nonpositive, lane_sum};
use super::*;
use crate::paged_attention::{paged_attention_slow, PagedAttentionMetadata};

/// Absolute tolerance against the f32 reference (softmax weights sum to 1 and values are in
/// [-1, 1]; the exp is within a few ulp of libm's).
const TOL_F32: f32 = 2e-5;

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A paged cache of `num_slots` slots filled with NaN where no sequence keeps a key, so that a
/// read past a sequence shows in the output.
struct Case {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<Vec<u32>>,
    block_size: usize,
    seq_lens: Vec<usize>,
    query_lens: Vec<usize>,
}

impl Case {
    /// Sequences `(seq_len, query_len)`, their blocks interleaved through the cache (block 0 is
    /// never used).
    fn new(shape: AttentionShape, block_size: usize, seqs: &[(usize, usize)], seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let row = shape.kv_heads * shape.head_dim;
        let num_blocks: usize = 1 + seqs.iter().map(|s| s.0.div_ceil(block_size)).sum::<usize>();
        let mut k = vec![f32::NAN; num_blocks * block_size * row];
        let mut v = k.clone();
        let mut tables = vec![Vec::new(); seqs.len()];
        let mut next = 1u32;
        let max_blocks = seqs
            .iter()
            .map(|s| s.0.div_ceil(block_size))
            .max()
            .unwrap_or(0);
        for b in 0..max_blocks {
            for (s, &(len, _)) in seqs.iter().enumerate() {
                if b < len.div_ceil(block_size) {
                    tables[s].push(next);
                    next += 1;
                }
            }
        }
        for (s, &(len, _)) in seqs.iter().enumerate() {
            for p in 0..len {
                let slot = tables[s][p / block_size] as usize * block_size + p % block_size;
                k[slot * row..(slot + 1) * row].copy_from_slice(&random(&mut rng, row));
                v[slot * row..(slot + 1) * row].copy_from_slice(&random(&mut rng, row));
            }
        }
        let tokens: usize = seqs.iter().map(|s| s.1).sum();
        Self {
            shape,
            q: random(&mut rng, tokens * shape.num_heads * shape.head_dim),
            k,
            v,
            tables,
            block_size,
            seq_lens: seqs.iter().map(|s| s.0).collect(),
            query_lens: seqs.iter().map(|s| s.1).collect(),
        }
    }

    fn seqs(&self) -> Vec<SeqKeys<'_>> {
        (0..self.tables.len())
            .map(|s| SeqKeys {
                block_table: &self.tables[s],
                block_size: self.block_size,
                seq_len: self.seq_lens[s],
                query_len: self.query_lens[s],
            })
            .collect()
    }

    fn run(&self, kernel: AttentionKernel) -> Vec<f32> {
        let (k, v) = (KvRows::F32(&self.k), KvRows::F32(&self.v));
        flash_attention_with(kernel, &self.q, self.shape, k, v, &self.seqs()).unwrap()
    }

    fn reference(&self) -> Vec<f32> {
        let AttentionShape {
            num_heads,
            kv_heads,
            head_dim,
        } = self.shape;
        let cache = |x: &[f32]| {
            let blocks = x.len() / (self.block_size * kv_heads * head_dim);
            let shape = (blocks, self.block_size, kv_heads, head_dim);
            Tensor::from_vec(x.to_vec(), shape, &Device::Cpu).unwrap()
        };
        let tokens = self.q.len() / (num_heads * head_dim);
        let q = Tensor::from_vec(self.q.clone(), (tokens, num_heads, head_dim), &Device::Cpu);
        let meta = PagedAttentionMetadata {
            block_size: self.block_size,
            block_tables: self.tables.clone(),
            seq_lens: self.seq_lens.clone(),
            query_lens: self.query_lens.clone(),
        };
        let out = paged_attention_slow(&q.unwrap(), &cache(&self.k), &cache(&self.v), &meta);
        out.unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}

/// A sequence whose keys fill one block of `block_size` slots from slot 0 (the contiguous layout).
fn one_block(block_size: usize, seq_len: usize, query_len: usize) -> SeqKeys<'static> {
    SeqKeys {
        block_table: &[0],
        block_size,
        seq_len,
        query_len,
    }
}

fn shape(num_heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
    AttentionShape {
        num_heads,
        kv_heads,
        head_dim,
    }
}

#[test]
fn matches_the_reference_for_prefill_prefix_and_decode() {
    // Qwen-like GQA (6 heads per KV head, d = 128), SmolLM2-like (3 per KV head, d = 64), and a
    // head size that is not a multiple of 16; prompts cross key tiles and task boundaries.
    let cases = [
        (shape(12, 2, 128), 16, vec![(150, 150)]),
        (shape(9, 3, 64), 16, vec![(200, 37), (70, 1), (65, 65)]),
        (shape(4, 2, 40), 8, vec![(1, 1), (129, 2), (33, 33)]),
        (shape(2, 2, 16), 32, vec![(300, 1)]),
    ];
    for (i, (shape, block_size, seqs)) in cases.into_iter().enumerate() {
        let case = Case::new(shape, block_size, &seqs, i as u64);
        let reference = case.reference();
        for &kernel in AttentionKernel::available() {
            let out = case.run(kernel);
            assert!(
                out.iter().all(|x| x.is_finite()),
                "case {i}: a NaN slot was read"
            );
            let diff = max_abs_diff(&out, &reference);
            assert!(diff < TOL_F32, "case {i}, {kernel:?}: {diff}");
        }
    }
}

#[test]
fn every_kernel_gives_the_same_bits() {
    // The 1.5B's, the 0.5B's and SmolLM2's head groups (6, 7 and 3 query heads per KV head: row
    // blocks whole and cut short in every kernel's blocking), and head sizes whose columns leave a
    // remainder after the widest blocks (80) or fill none (40).
    let cases = [
        (shape(12, 2, 128), vec![(333, 70), (90, 1)]),
        (shape(14, 2, 64), vec![(150, 70), (40, 1)]),
        (shape(9, 3, 80), vec![(100, 37), (20, 1)]),
        (shape(4, 2, 40), vec![(70, 19)]),
    ];
    for (i, (shape, seqs)) in cases.into_iter().enumerate() {
        let case = Case::new(shape, 16, &seqs, 7 + i as u64);
        let portable = case.run(AttentionKernel::Portable);
        for &kernel in AttentionKernel::available() {
            assert_eq!(case.run(kernel), portable, "case {i}, {kernel:?}");
        }
    }
}

#[test]
fn a_row_gives_the_same_bits_in_one_pass_in_chunks_and_batched() {
    // One 200-token prompt: all at once, then 3 + 64 + 133 positions over the cached rest, then
    // its last token alone next to two other sequences. Same cache, so every row must agree
    // bit for bit with the one-pass result.
    let shape = shape(12, 2, 128);
    let whole = Case::new(shape, 16, &[(200, 200)], 3);
    let one_pass = whole.run(AttentionKernel::best());
    let row = shape.num_heads * shape.head_dim;
    let mut chunked = Vec::new();
    for (end, len) in [(3, 3), (67, 64), (200, 133)] {
        let mut part = Case::new(shape, 16, &[(200, 200)], 3);
        part.seq_lens = vec![end];
        part.query_lens = vec![len];
        part.q = whole.q[(end - len) * row..end * row].to_vec();
        chunked.extend(part.run(AttentionKernel::best()));
    }
    assert_eq!(chunked, one_pass);

    let mut batched = Case::new(shape, 16, &[(50, 5), (200, 200), (80, 1)], 11);
    // Put the prompt's keys and last query into the second sequence's place.
    for p in 0..200 {
        let from = whole.tables[0][p / 16] as usize * 16 + p % 16;
        let to = batched.tables[1][p / 16] as usize * 16 + p % 16;
        let (a, b) = (from * 2 * 128, to * 2 * 128);
        batched.k[b..b + 256].copy_from_slice(&whole.k[a..a + 256]);
        batched.v[b..b + 256].copy_from_slice(&whole.v[a..a + 256]);
    }
    batched.query_lens = vec![5, 1, 1];
    let mut q = batched.q[..5 * row].to_vec();
    q.extend_from_slice(&whole.q[199 * row..]);
    q.extend_from_slice(&batched.q[5 * row..6 * row]);
    batched.q = q;
    let out = batched.run(AttentionKernel::best());
    assert_eq!(&out[5 * row..6 * row], &one_pass[199 * row..]);
}

#[test]
fn half_precision_caches_read_as_their_f32_values() {
    // An f16 or bf16 cache gives exactly what an f32 cache holding the same (rounded) values
    // gives, and stays near the f32 reference.
    let mut case = Case::new(shape(6, 2, 64), 16, &[(120, 30), (40, 1)], 5);
    let f16_k: Vec<f16> = case.k.iter().map(|&x| f16::from_f32(x)).collect();
    let f16_v: Vec<f16> = case.v.iter().map(|&x| f16::from_f32(x)).collect();
    let bf16_k: Vec<bf16> = case.k.iter().map(|&x| bf16::from_f32(x)).collect();
    let bf16_v: Vec<bf16> = case.v.iter().map(|&x| bf16::from_f32(x)).collect();
    let exact = case.reference();
    let run = |k, v, case: &Case| flash_attention(&case.q, case.shape, k, v, &case.seqs()).unwrap();
    let from_f16 = run(KvRows::F16(&f16_k), KvRows::F16(&f16_v), &case);
    let from_bf16 = run(KvRows::BF16(&bf16_k), KvRows::BF16(&bf16_v), &case);
    assert!(max_abs_diff(&from_f16, &exact) < 2e-3);
    assert!(max_abs_diff(&from_bf16, &exact) < 2e-2);
    case.k = f16_k.iter().map(|x| x.to_f32()).collect();
    case.v = f16_v.iter().map(|x| x.to_f32()).collect();
    assert_eq!(from_f16, case.run(AttentionKernel::best()));
}

#[test]
fn keys_outside_the_cache_and_bad_shapes_are_errors() {
    let case = Case::new(shape(4, 2, 16), 16, &[(40, 4)], 1);
    let (k, v) = (KvRows::F32(&case.k), KvRows::F32(&case.v));
    let mut seqs = case.seqs();
    let past_end = [case.tables[0][0], case.tables[0][1], 99];
    seqs[0].block_table = &past_end;
    assert!(flash_attention(&case.q, case.shape, k, v, &seqs).is_err());
    let short = [case.tables[0][0]];
    seqs[0].block_table = &short;
    assert!(flash_attention(&case.q, case.shape, k, v, &seqs).is_err());
    let seqs = case.seqs();
    assert!(flash_attention(&case.q[1..], case.shape, k, v, &seqs).is_err());
    assert!(flash_attention(&case.q, shape(3, 2, 16), k, v, &seqs).is_err());
    assert!(flash_attention(&case.q, case.shape, k, KvRows::F32(&case.v[1..]), &seqs).is_err());
}

#[test]
fn tensors_in_the_paged_and_contiguous_layouts_give_the_same_bits() {
    let case = Case::new(shape(4, 2, 32), 16, &[(70, 70)], 9);
    let paged = case.run(AttentionKernel::best());
    // The same keys laid out contiguously, as a cache of 96 slots in one block.
    let row = 2 * 32;
    let mut k = vec![0f32; 96 * row];
    let mut v = k.clone();
    for p in 0..70 {
        let slot = case.tables[0][p / 16] as usize * 16 + p % 16;
        k[p * row..(p + 1) * row].copy_from_slice(&case.k[slot * row..(slot + 1) * row]);
        v[p * row..(p + 1) * row].copy_from_slice(&case.v[slot * row..(slot + 1) * row]);
    }
    let k = Tensor::from_vec(k, (96, 2, 32), &Device::Cpu).unwrap();
    let v = Tensor::from_vec(v, (96, 2, 32), &Device::Cpu).unwrap();
    let q = Tensor::from_vec(case.q.clone(), (70, 4, 32), &Device::Cpu).unwrap();
    let out = flash_attention_tensors(&q, &k, &v, &[one_block(96, 70, 70)]).unwrap();
    assert_eq!(out.flatten_all().unwrap().to_vec1::<f32>().unwrap(), paged);
}

#[test]
fn exp_is_within_a_few_ulp_of_libm() {
    let mut worst = 0f32;
    for i in 0..200_000 {
        let x = -87.0 * i as f32 / 200_000.0;
        let (got, want) = (exp_nonpositive(x), x.exp());
        worst = worst.max(((got - want) / want).abs());
    }
    assert!(worst < 3.0 * f32::EPSILON, "relative error {worst}");
    assert_eq!(exp_nonpositive(0.0), 1.0);
}

#[test]
fn lane_sum_adds_in_its_fixed_tree() {
    let a: [f32; LANES] = std::array::from_fn(|i| (i as f32 + 1.0) * 0.1);
    let tree = |a: &[f32]| -> f32 {
        let pairs8: Vec<f32> = (0..8).map(|i| a[i] + a[i + 8]).collect();
        let pairs4: Vec<f32> = (0..4).map(|i| pairs8[i] + pairs8[i + 4]).collect();
        let pairs2: Vec<f32> = (0..2).map(|i| pairs4[i] + pairs4[i + 2]).collect();
        pairs2[0] + pairs2[1]
    };
    assert_eq!(lane_sum(a).to_bits(), tree(&a).to_bits());
}

#[test]
fn a_decode_step_splits_its_heads_until_every_thread_has_a_task() {
    let decode = [one_block(64, 50, 1)];
    let qwen = shape(12, 2, 128);
    // (threads, tasks, query heads per task): 2 KV heads serve 2 threads; 4 threads split each
    // KV head's 6 query heads in two; past 12 threads there is nothing left to split.
    for (threads, num_tasks, heads) in [(1, 2, 6), (2, 2, 6), (4, 4, 3), (5, 6, 2), (16, 12, 1)] {
        let tasks = tasks(qwen, &decode, threads);
        assert_eq!(tasks.len(), num_tasks, "{threads} threads");
        assert!(tasks.iter().all(|t| t.num_heads == heads));
        let covered: usize = tasks.iter().map(|t| t.num_heads).sum();
        assert_eq!(covered, 12);
    }
    // A prefill of 40 tokens: 3 blocks of up to 16 tokens per KV head, the latest first.
    let prefill = [SeqKeys {
        query_len: 40,
        ..decode[0]
    }];
    let tasks = tasks(qwen, &prefill, 2);
    assert_eq!(tasks.len(), 6);
    assert_eq!((tasks[0].first_pos, tasks[0].num_tokens), (42, 8));
    assert_eq!((tasks[5].first_pos, tasks[5].num_tokens), (10, 16));
}
