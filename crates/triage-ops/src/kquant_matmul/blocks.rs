//! GGML's K-quant block layouts as the file stores them: Q4_K and Q6_K weight super-blocks of 256
//! values (read once, to pack them) and the Q8_K activation blocks they multiply (`ggml-common.h`,
//! `ggml-quants.c`).

/// Bytes of a Q4_K super-block: f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and mins,
/// then 128 bytes of 4-bit values.
pub(super) const Q4K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, f16 `d`.
pub(super) const Q6K_BYTES: usize = 210;
/// Offset of Q4_K's 4-bit values.
pub(super) const Q4K_QS: usize = 16;
/// Offsets of Q6_K's parts.
pub(super) const Q6K_QH: usize = 128;
pub(super) const Q6K_SCALES: usize = 192;
pub(super) const Q6K_D: usize = 208;

#[inline(always)]
pub(super) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K super-block, as 16 bytes: scales 0–7
/// then mins 0–7 (GGML's `get_scale_min_k4`, unpacked branch-free on 32-bit words as its x86
/// dot product does).
#[inline(always)]
pub(super) fn q4k_scales_mins(block: &[u8]) -> [u8; 16] {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| {
        u32::from_le_bytes([
            block[4 + 4 * i],
            block[5 + 4 * i],
            block[6 + 4 * i],
            block[7 + 4 * i],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let mut out = [0u8; 16];
    for (dst, w) in out
        .chunks_exact_mut(4)
        .zip([w0 & LOW6, scales_hi, w1 & LOW6, mins_hi])
    {
        dst.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// GGML's `nearest_int`: round half to even through the float's mantissa (valid for
/// |x| ≤ 4,194,303; activations reach 127).
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// GGML's `quantize_row_q8_K_ref` on one super-block: the value of largest magnitude maps to
/// −127 (its sign kept in `d`), the others are rounded to nearest even; `bsums` are the sums of
/// each 16 values.
pub(super) fn quantize_q8k(x: &[f32], quants: &mut [i8], bsums: &mut [i16]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        quants.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in quants.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (sum, q) in bsums.iter_mut().zip(quants.chunks_exact(16)) {
        *sum = q.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

#[cfg(test)]
mod tests {
    use super::super::QK_K;
    use super::*;

    #[test]
    fn nearest_int_rounds_halves_to_even() {
        for (x, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (126.49, 126),
            (-127.0, -127),
        ] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn q8k_maps_the_largest_magnitude_to_minus_127_and_sums_by_16() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) * 0.25).collect();
        let (mut q, mut sums) = ([0i8; QK_K], [0i16; 16]);
        let d = quantize_q8k(&x, &mut q, &mut sums);
        // The largest magnitude is 155 · 0.25 at the end, positive, so d is negative.
        assert_eq!(q[QK_K - 1], -127);
        assert!((d * -127.0 - x[QK_K - 1]).abs() < 1e-5);
        for (i, &v) in x.iter().enumerate() {
            assert!((d * q[i] as f32 - v).abs() <= d.abs() * 0.5 + 1e-6, "{i}");
        }
        for (j, &s) in sums.iter().enumerate() {
            assert_eq!(
                s,
                q[16 * j..16 * j + 16]
                    .iter()
                    .map(|&v| v as i16)
                    .sum::<i16>()
            );
        }
        let d0 = quantize_q8k(&[0.0; QK_K], &mut q, &mut sums);
        assert_eq!((d0, q.iter().any(|&v| v != 0)), (0.0, false));
    }
}
