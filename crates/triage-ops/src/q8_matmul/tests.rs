//! Kernel agreement (every kernel gives the portable loop's bits on every tile shape), batch
//! invariance per kernel, stacking, GGML's rounding and the int8 extremes.

use super::*;

fn values(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect()
}

fn weights(rows: usize, cols: usize, seed: u32) -> Q8Matrix {
    Q8Matrix::quantize(rows, cols, &values(rows, cols, seed)).unwrap()
}

fn acts(rows: usize, cols: usize, seed: u32) -> Q8Rows {
    Q8Rows::quantize(rows, cols, &values(rows, cols, seed)).unwrap()
}

/// `rows` rows of GGML `ty` blocks with pseudo-random values, scales in ±1/64 and mins in ±1/8.
fn ggml_weights(ty: GgmlBlockType, rows: usize, cols: usize, seed: u32) -> Q8Matrix {
    let n = rows * cols / QK8_0 * ty.block_bytes();
    let noise = values(1, n, seed);
    let mut bytes: Vec<u8> = noise.iter().map(|v| ((v + 0.5) * 255.0) as u8).collect();
    for (block, noise) in bytes
        .chunks_exact_mut(ty.block_bytes())
        .zip(noise.chunks_exact(ty.block_bytes()))
    {
        block[0..2].copy_from_slice(&half::f16::from_f32(noise[0] / 32.0).to_le_bytes());
        if ty.has_mins() {
            block[2..4].copy_from_slice(&half::f16::from_f32(noise[1] / 4.0).to_le_bytes());
        }
    }
    Q8Matrix::from_ggml_blocks(ty, rows, cols, &bytes).unwrap()
}

/// Each product from the blocks' values, in f64: what every kernel approximates.
fn exact(a: &Q8Rows, w: &Q8Matrix) -> Vec<f64> {
    let kb = w.cols() / QK8_0;
    let mut out = Vec::new();
    for i in 0..a.rows() {
        for r in 0..w.rows() {
            let mut sum = 0f64;
            for b in 0..kb {
                let ((da, qa), wb) = (a.block(i, b), w.block(r, b));
                let dot: i32 = qa
                    .iter()
                    .zip(&wb.quants)
                    .map(|(&x, &y)| x as i32 * y as i32)
                    .sum();
                let sum_a = a.block_sum(i, b) as f64;
                sum += da as f64 * wb.d as f64 * dot as f64 + wb.m as f64 * sum_a;
            }
            out.push(sum);
        }
    }
    out
}

#[test]
fn every_kernel_gives_the_portable_loops_bits_on_every_tile_shape() {
    // Weight rows: one short group, several groups with a padded last one (runs of 4, 3, 2 and
    // 1 groups for a lone row); activation rows: every tile height from 1 to 8, and tails.
    for (n, m) in [
        (7, 1),
        (33, 1),
        (50, 2),
        (45, 3),
        (33, 5),
        (17, 8),
        (64, 11),
        (20, 17),
    ] {
        let (w, a) = (weights(n, 96, n as u32), acts(m, 96, m as u32 + 100));
        let portable = q8_matmul_quantized(&a, &w, Q8Kernel::Portable).unwrap();
        for (p, e) in portable.iter().zip(exact(&a, &w)) {
            assert!(
                (*p as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{p} vs {e}"
            );
        }
        assert!(
            portable.iter().any(|v| v.abs() > 1e-3),
            "non-trivial products"
        );
        for &kernel in Q8Kernel::available() {
            let out = q8_matmul_quantized(&a, &w, kernel).unwrap();
            assert_eq!(out, portable, "{kernel:?}, [{m}, 96] x [{n}, 96]ᵀ");
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_as_in_a_batch_with_every_kernel() {
    // 70 rows span two row chunks (64 + 6) and a short last tile; 300 and 301 weight rows span
    // many tasks and a short tail; 896 columns are 28 blocks.
    for (n, k) in [(300, 128), (301, 896)] {
        let w = weights(n, k, 3);
        let x = values(70, k, 4);
        let a = Q8Rows::quantize(70, k, &x).unwrap();
        for &kernel in Q8Kernel::available() {
            let batch = q8_matmul_quantized(&a, &w, kernel).unwrap();
            for row in [0, 1, 7, 8, 63, 64, 69] {
                let one = Q8Rows::quantize(1, k, &x[row * k..(row + 1) * k]).unwrap();
                let alone = q8_matmul_quantized(&one, &w, kernel).unwrap();
                assert_eq!(
                    alone,
                    batch[row * n..(row + 1) * n],
                    "{kernel:?}, row {row}, [{n}, {k}]"
                );
            }
        }
    }
}

#[test]
fn every_ggml_block_type_gives_its_product_with_every_kernel_alone_and_in_a_batch() {
    // 70 activation rows (a chunk of 64 and a short tile), 90 weight rows (a short last group),
    // 160 columns (5 blocks).
    let (n, k, m) = (90, 160, 70);
    let x = values(m, k, 31);
    let a = Q8Rows::quantize(m, k, &x).unwrap();
    for ty in [
        GgmlBlockType::Q4_0,
        GgmlBlockType::Q4_1,
        GgmlBlockType::Q5_0,
        GgmlBlockType::Q5_1,
    ] {
        let w = ggml_weights(ty, n, k, 17);
        assert_eq!(w.mins.is_some(), ty.has_mins());
        let portable = q8_matmul_quantized(&a, &w, Q8Kernel::Portable).unwrap();
        for (p, e) in portable.iter().zip(exact(&a, &w)) {
            assert!(
                (*p as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{ty:?}: {p} vs {e}"
            );
        }
        for &kernel in Q8Kernel::available() {
            let batch = q8_matmul_quantized(&a, &w, kernel).unwrap();
            assert_eq!(batch, portable, "{ty:?}, {kernel:?}");
            // Alone and in twos: the rows decode steps run, where some kernels widen the
            // values in registers (`reads_narrow`) rather than a span at a time.
            for (row, rows) in [(0, 1), (8, 1), (69, 1), (20, 2), (40, 5)] {
                let few = Q8Rows::quantize(rows, k, &x[row * k..(row + rows) * k]).unwrap();
                let alone = q8_matmul_quantized(&few, &w, kernel).unwrap();
                let want = &batch[row * n..(row + rows) * n];
                assert_eq!(alone, want, "{ty:?}, {kernel:?}, rows {row}..+{rows}");
            }
        }
    }
}

#[test]
fn a_stack_of_types_with_and_without_mins_is_its_parts_side_by_side() {
    let (top, bottom) = (
        ggml_weights(GgmlBlockType::Q5_0, 21, 64, 5),
        ggml_weights(GgmlBlockType::Q4_1, 30, 64, 6),
    );
    let a = acts(9, 64, 7);
    let stacked = Q8Matrix::stack_rows(&[&top, &bottom]).unwrap();
    let kernel = Q8Kernel::best();
    let (t, b) = (
        q8_matmul_quantized(&a, &top, kernel).unwrap(),
        q8_matmul_quantized(&a, &bottom, kernel).unwrap(),
    );
    let both = q8_matmul_quantized(&a, &stacked, kernel).unwrap();
    for row in 0..9 {
        assert_eq!(both[row * 51..row * 51 + 21], t[row * 21..row * 21 + 21]);
        assert_eq!(
            both[row * 51 + 21..row * 51 + 51],
            b[row * 30..row * 30 + 30]
        );
    }
    let mut dense = stacked.dequantize();
    dense.truncate(21 * 64);
    assert_eq!(dense, top.dequantize());
}

#[test]
fn a_stacked_product_is_its_parts_side_by_side() {
    let (top, bottom, a) = (weights(21, 64, 5), weights(3, 64, 6), acts(16, 64, 7));
    let stacked = Q8Matrix::stack_rows(&[&top, &bottom]).unwrap();
    assert_eq!(stacked.rows(), 24);
    let kernel = Q8Kernel::best();
    let t = q8_matmul_quantized(&a, &top, kernel).unwrap();
    let b = q8_matmul_quantized(&a, &bottom, kernel).unwrap();
    let both = q8_matmul_quantized(&a, &stacked, kernel).unwrap();
    for row in 0..16 {
        assert_eq!(both[row * 24..row * 24 + 21], t[row * 21..row * 21 + 21]);
        assert_eq!(both[row * 24 + 21..row * 24 + 24], b[row * 3..row * 3 + 3]);
    }
    assert!(Q8Matrix::stack_rows(&[&top, &weights(2, 96, 1)]).is_err());
    assert!(Q8Matrix::stack_rows(&[]).is_err());
}

#[test]
fn rows_and_weights_of_different_widths_are_an_error() {
    let (w, a) = (weights(4, 64, 1), acts(2, 96, 2));
    assert!(q8_matmul_quantized(&a, &w, Q8Kernel::best()).is_err());
}

#[test]
fn round_half_away_is_roundf() {
    let mut x = -130.0f32;
    while x <= 130.0 {
        // Quarter steps hit every tie exactly; the neighbours straddle them.
        for v in [x, x.next_down(), x.next_up()] {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
        x += 0.25;
    }
    assert_eq!(round_half_away(-0.0), 0);
}

#[test]
fn extreme_values_do_not_saturate_any_kernel() {
    // ±127 in both operands and a stray −128 in the file (GGML's quantizer never writes one),
    // the largest partial sums the int8 paths see (AVX2's maddubs saturates at ±32,767 per
    // pair): every kernel keeps the file's values and sums them exactly.
    let cols = 64;
    let mut bytes = Vec::new();
    for row in 0..3 {
        for block in 0..cols / QK8_0 {
            bytes.extend(half::f16::from_f32(0.5).to_le_bytes());
            bytes.extend((0..QK8_0).map(|i| match (row + block + i) % 3 {
                0 => 127u8,
                1 => 0x80,
                _ => 0x81,
            }));
        }
    }
    let w = Q8Matrix::from_ggml_bytes(3, cols, &bytes).unwrap();
    assert_eq!(w.quants.iter().min(), Some(&-128));
    let x: Vec<f32> = (0..2 * cols)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let a = Q8Rows::quantize(2, cols, &x).unwrap();
    let want = exact(&a, &w);
    for &kernel in Q8Kernel::available() {
        let got = q8_matmul_quantized(&a, &w, kernel).unwrap();
        for (e, d) in want.iter().zip(&got) {
            assert!(
                (e - *d as f64).abs() <= 1e-3 * (1.0 + e.abs()),
                "{kernel:?}: {e} vs {d}"
            );
        }
    }
}

/// A kernel body's output for activation tile `tile` and `groups` weight groups from `group`
/// (`out`, rows `stride` apart) holds the portable product's values (`portable`, `n` columns),
/// bit for bit, for every weight row that exists.
#[cfg(target_arch = "x86_64")]
fn assert_tile_is_portable(
    out: &[f32],
    stride: usize,
    (tile, group, groups): (usize, usize, usize),
    a: &Q8Rows,
    portable: &[f32],
    n: usize,
) {
    for i in 0..a.tile_rows(tile) {
        for lane in 0..groups * 16 {
            let (row, col) = (tile * 8 + i, group * 16 + lane);
            if col < n {
                assert_eq!(
                    out[i * stride + lane],
                    portable[row * n + col],
                    "({row}, {col})"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_amx_kernel_body_gives_the_portable_loops_bits_on_a_model_of_the_tiles() {
    // AMX hosts run the body on their tiles through `q8_matmul_quantized` above; this runs it on
    // the software model of the same instructions, wherever AVX-512 is: runs of 4, 3, 2 and 1
    // groups (the last of them short: 90 weight rows), tiles of 8 and of 5 rows.
    let (w, a) = (weights(90, 96, 10), acts(13, 96, 11));
    let portable = q8_matmul_quantized(&a, &w, Q8Kernel::Portable).unwrap();
    for tile in 0..2 {
        for (group, groups_left) in [(0, 6), (1, 3), (2, 2), (5, 1), (4, 2)] {
            let mut out = vec![f32::NAN; 8 * 64];
            let args = cpu::TileArgs {
                w: &w,
                group,
                a: &a,
                tile,
                out: &mut out,
                out_stride: 64,
            };
            let Some(done) = amx::run_on_model(args, groups_left) else {
                eprintln!("no AVX-512 here: the AMX body is not run");
                return;
            };
            // Never past the span's end: group 1 of span 0 runs 3 groups, group 4 of span 1 2.
            assert_eq!(done, groups_left.min(4 - group % 4), "group {group}");
            assert_tile_is_portable(&out, 64, (tile, group, done), &a, &portable, 90);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx_vnni_kernel_body_gives_the_portable_loops_bits() {
    // AVX-VNNI hosts run it through `q8_matmul_quantized` above; this runs its body (in EVEX
    // encoding) on hosts with AVX-512 VNNI, tile by tile: 3 groups by 2 tiles (8 + 3 rows).
    let (w, a) = (weights(40, 96, 8), acts(11, 96, 9));
    let portable = q8_matmul_quantized(&a, &w, Q8Kernel::Portable).unwrap();
    for tile in 0..2 {
        for group in 0..3 {
            let mut out = vec![f32::NAN; 8 * 16];
            let args = cpu::TileArgs {
                w: &w,
                group,
                a: &a,
                tile,
                out: &mut out,
                out_stride: 16,
            };
            if x86::avx_vnni_body_on_avx512(args).is_none() {
                eprintln!("no AVX-512 VNNI here: the AVX-VNNI body is not run");
                return;
            }
            assert_tile_is_portable(&out, 16, (tile, group, 1), &a, &portable, 40);
        }
    }
}
