//! `rope_and_cache_<dtype>` against `triage_ops::rope_and_cache` (the CPU op) on the same values:
//! Q, and the K and V caches whose every other slot holds NaN.

use candle_core::Tensor;
use half::{bf16, f16};
use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};
use triage_kernel_sim::{rope_and_cache, RopeAndCacheBuffers};
use triage_ops::{self as ops, QkvShape, RopeInputs};
use triage_ops::{SlotMapping, PADDING_SLOT};

use crate::inputs::{close, convert, normal, tensor, Dtype};

/// Both compute the same expressions in f32 and round once; products may differ in the last
/// f32 bit (FMA contraction), which can move the rounded value by one unit of the dtype.
fn rel_tolerance<T: Dtype>() -> f32 {
    match T::DTYPE {
        candle_core::DType::F32 => 1e-6,
        candle_core::DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

fn values<T: Dtype>(t: &Tensor) -> Vec<T> {
    t.flatten_all().unwrap().to_vec1::<T>().unwrap()
}

fn run_case<T: Dtype>(rng: &mut StdRng, shape: QkvShape, rows: usize, with_bias: bool) {
    let (d, heads) = (shape.head_dim, shape.num_heads + 2 * shape.kv_heads);
    let qkv = convert::<T>(&normal(rng, rows * heads * d, 2.0), 0);
    let bias = convert::<T>(&normal(rng, heads * d, 0.5), 0);
    let angles = normal(rng, rows * d / 2, 3.0);
    let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
    let num_slots = 4 * rows;
    let mut slots: Vec<u32> = (0..num_slots as u32).collect();
    slots.shuffle(rng);
    slots.truncate(rows);
    slots[rows / 2] = PADDING_SLOT;
    let cache_len = num_slots * shape.kv_heads * d;
    let nan = vec![T::from_f32(f32::NAN); cache_len];
    let cache_shape = [num_slots, 1, shape.kv_heads, d];
    let (k_want, v_want) = (tensor(&nan, &cache_shape), tensor(&nan, &cache_shape));
    let (qkv_t, bias_t) = (
        tensor(&qkv, &[rows, heads * d]),
        tensor(&bias, &[heads * d]),
    );
    let (cos_t, sin_t) = (tensor(&cos, &[rows, d / 2]), tensor(&sin, &[rows, d / 2]));
    let x = RopeInputs {
        qkv: &qkv_t,
        bias: with_bias.then_some(&bias_t),
        cos: &cos_t,
        sin: &sin_t,
    };
    let mapping = SlotMapping::new(slots.clone(), &candle_core::Device::Cpu).unwrap();
    let q_want = ops::rope_and_cache(x, &k_want, &v_want, &mapping, shape).expect("cpu op");
    let (mut k_got, mut v_got) = (nan.clone(), nan.clone());
    let mut q_got = vec![T::from_f32(f32::NAN); rows * shape.num_heads * d];
    let context = format!("{:?} {shape:?} rows {rows} bias {with_bias}", T::DTYPE);
    rope_and_cache(
        shape,
        RopeAndCacheBuffers {
            qkv: &qkv,
            bias: with_bias.then_some(&bias[..]),
            cos: &cos,
            sin: &sin,
            q_out: &mut q_got,
            k_cache: &mut k_got,
            v_cache: &mut v_got,
            slots: &slots,
        },
    )
    .unwrap_or_else(|e| panic!("{context}: {e}"));
    for (what, got, want) in [
        ("q", q_got, values::<T>(&q_want)),
        ("k cache", k_got, values::<T>(&k_want)),
        ("v cache", v_got, values::<T>(&v_want)),
    ] {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (g, w) = (g.to_f32(), w.to_f32());
            assert!(
                close(g, w, 1e-6, rel_tolerance::<T>()),
                "{context}: {what} {i}: kernel {g}, cpu {w}"
            );
        }
    }
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for neox in [true, false] {
        // The tiny models' heads (16), the 1.5B's (128, a group of 6), an odd group.
        for (num_heads, kv_heads, head_dim, rows) in [(4, 2, 16, 3), (12, 2, 128, 2), (3, 1, 64, 4)]
        {
            let shape = QkvShape {
                num_heads,
                kv_heads,
                head_dim,
                neox,
            };
            run_case::<T>(&mut rng, shape, rows, true);
            run_case::<T>(&mut rng, shape, rows, false);
        }
    }
}

#[test]
fn f32_rope_and_cache_matches_the_cpu_op() {
    every_case::<f32>(81);
}

#[test]
fn f16_rope_and_cache_matches_the_cpu_op() {
    every_case::<f16>(82);
}

#[test]
fn bf16_rope_and_cache_matches_the_cpu_op() {
    every_case::<bf16>(83);
}
