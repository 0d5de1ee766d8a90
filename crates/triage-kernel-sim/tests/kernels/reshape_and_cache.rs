//! `reshape_and_cache_<dtype>` against `triage_ops::reshape_and_cache`.

use half::{bf16, f16};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use triage_kernel_sim::reshape_and_cache;
use triage_ops::launch::{self, MIN_THREADS, RESHAPE_AND_CACHE_THREADS};
use triage_ops::{self as ops, PADDING_SLOT};

use crate::inputs::{convert, normal, tensor, Dtype};

/// `[num_blocks, block_size, kv_heads, head_dim]`; head_dim 3 makes rows that are not whole
/// 16-byte vectors (the element-wise path).
const SHAPES: [[usize; 4]; 3] = [[8, 16, 2, 64], [5, 16, 7, 3], [3, 3, 1, 128]];

fn run_case<T: Dtype>(
    rng: &mut StdRng,
    shape: [usize; 4],
    num_tokens: usize,
    threads: u32,
    offset: usize,
) {
    let [num_blocks, block_size, kv_heads, head_dim] = shape;
    let (num_slots, row_elems) = (num_blocks * block_size, kv_heads * head_dim);
    let mut slots: Vec<u32> = (0..num_slots as u32).collect();
    slots.shuffle(rng);
    slots.truncate(num_tokens);
    for slot in slots.iter_mut() {
        if rng.random_bool(0.15) {
            *slot = PADDING_SLOT;
        }
    }
    let rows = convert::<T>(&normal(rng, num_tokens * row_elems, 1.0), offset);
    let rows = &rows[offset..];
    let cache_before = convert::<T>(&normal(rng, num_slots * row_elems, 1.0), 0);

    let want = tensor(&cache_before, &shape);
    ops::reshape_and_cache(
        &want,
        &tensor(rows, &[num_tokens, kv_heads, head_dim]),
        &tensor(&slots, &[num_tokens]),
    )
    .expect("cpu op");
    let want: Vec<T> = want.flatten_all().and_then(|t| t.to_vec1()).expect("cache");

    let mut got = cache_before.clone();
    let g = launch::reshape_and_cache(num_tokens, threads).expect("geometry");
    reshape_and_cache(&g, rows, &mut got, &slots, row_elems).expect("launch");
    let bits = |xs: &[T]| xs.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got),
        bits(&want),
        "{:?} shape {shape:?} tokens {num_tokens} threads {threads} offset {offset}",
        T::DTYPE
    );
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for shape in SHAPES {
        let num_slots = shape[0] * shape[1];
        for num_tokens in [1, 16, 64].into_iter().filter(|&n| n <= num_slots) {
            for threads in [MIN_THREADS, RESHAPE_AND_CACHE_THREADS] {
                for offset in [0, 1] {
                    run_case::<T>(&mut rng, shape, num_tokens, threads, offset);
                }
            }
        }
    }
}

#[test]
fn f32_rows_land_in_their_slots() {
    every_case::<f32>(31);
}

#[test]
fn f16_rows_land_in_their_slots() {
    every_case::<f16>(32);
}

#[test]
fn bf16_rows_land_in_their_slots() {
    every_case::<bf16>(33);
}

/// A slot past the cache is an error before anything is written, on the CPU op and before the
/// kernel's launch alike.
#[test]
fn out_of_range_slots_are_errors_and_write_nothing() {
    let mut rng = StdRng::seed_from_u64(34);
    let [num_blocks, block_size, kv_heads, head_dim] = SHAPES[0];
    let row_elems = kv_heads * head_dim;
    let num_slots = num_blocks * block_size;
    let rows = normal(&mut rng, 2 * row_elems, 1.0);
    let slots = [3, num_slots as u32];
    let cache = normal(&mut rng, num_slots * row_elems, 1.0);

    let mut got = cache.clone();
    let g = launch::reshape_and_cache(2, RESHAPE_AND_CACHE_THREADS).expect("geometry");
    assert!(reshape_and_cache(&g, &rows, &mut got, &slots, row_elems).is_err());
    assert_eq!(got, cache);

    let cpu = tensor(&cache, &SHAPES[0]);
    let result = ops::reshape_and_cache(
        &cpu,
        &tensor(&rows, &[2, kv_heads, head_dim]),
        &tensor(&slots, &[2]),
    );
    assert!(result.is_err());
    assert_eq!(
        cpu.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("cache"),
        cache
    );
}
