//! The min term of weights whose values are `d · q + m` (Q4_1, Q5_1): per output, the kernels'
//! product of the `d · q` part, plus `Σ_b m_b · s_b` with `s_b = d_a · Σ q_a` the activation
//! block's quantized sum rounded to f16 (what GGML's Q8_1 blocks carry, and llama.cpp's
//! `vec_dot_q4_1_q8_1` also adds apart from the integer sums), summed from block 0 as f32
//! multiplies and adds, never fused. Every path (the plain loop, AVX-512) does exactly those
//! operations per output, whatever the kernel and for a row alone or in a batch, so
//! `q8_matmul`'s bit-for-bit agreements hold for these types too.

use super::matrix::{GROUP_ROWS, SPAN_GROUPS};
use super::rows::TILE_ROWS;
use super::{Q8Matrix, Q8Rows, QK8_0};

/// Adds the min term to `out` (`[num_a, out_stride]`, as `cpu::tiles` filled it for weight rows
/// `w0..w0 + num_w` by activation rows `a0..a0 + num_a`); `mins` is `w`'s, laid out as its scales.
#[allow(clippy::too_many_arguments)]
pub(super) fn add(
    w: &Q8Matrix,
    mins: &[f32],
    w0: usize,
    num_w: usize,
    a: &Q8Rows,
    a0: usize,
    num_a: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let kb = w.cols / QK8_0;
    let groups = w0 / GROUP_ROWS..(w0 + num_w).div_ceil(GROUP_ROWS);
    #[cfg(target_arch = "x86_64")]
    let avx512 = crate::cpu::Isa::get().avx512f;
    for row in a0..a0 + num_a {
        let (tile, i) = (row / TILE_ROWS, row % TILE_ROWS);
        let (na, (_, s0)) = (a.tile_rows(tile), a.tile_start(tile));
        let sum = |b: usize| a.sums[s0 + b * na + i];
        for g in groups.clone() {
            // A group's blocks are `SPAN_GROUPS` group blocks apart (`group_block`).
            let first = &mins[w.group_block(g, 0) * GROUP_ROWS..];
            let block_mins = |b: usize| &first[b * SPAN_GROUPS * GROUP_ROWS..][..GROUP_ROWS];
            let at = (row - a0) * out_stride + (g - groups.start) * GROUP_ROWS;
            let out = &mut out[at..at + GROUP_ROWS];
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                // SAFETY: the CPU has AVX-512 F.
                #[allow(unsafe_code)]
                unsafe {
                    group_avx512(kb, &block_mins, &sum, out)
                };
                continue;
            }
            group_plain(kb, &block_mins, &sum, out);
        }
    }
}

/// One group's 16 outputs: `out[l] += Σ_b mins_b[l] · s_b`, summed from block 0.
fn group_plain<'m>(
    kb: usize,
    block_mins: &impl Fn(usize) -> &'m [f32],
    sum: &impl Fn(usize) -> f32,
    out: &mut [f32],
) {
    let mut acc = [0f32; GROUP_ROWS];
    for b in 0..kb {
        let s = sum(b);
        for (acc, &m) in acc.iter_mut().zip(block_mins(b)) {
            *acc += m * s;
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o += acc;
    }
}

/// One group's 16 outputs with AVX-512: the plain loop's multiplies and adds, 16 at a time.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn group_avx512<'m>(
    kb: usize,
    block_mins: &impl Fn(usize) -> &'m [f32],
    sum: &impl Fn(usize) -> f32,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let mut acc = _mm512_setzero_ps();
    for b in 0..kb {
        // SAFETY: `block_mins` gives 16 values; `out` holds 16.
        let m = unsafe { _mm512_loadu_ps(block_mins(b).as_ptr()) };
        acc = _mm512_add_ps(acc, _mm512_mul_ps(m, _mm512_set1_ps(sum(b))));
    }
    // SAFETY: as above.
    unsafe {
        let o = _mm512_loadu_ps(out.as_ptr());
        _mm512_storeu_ps(out.as_mut_ptr(), _mm512_add_ps(o, acc));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_path_gives_the_plain_loops_bits() {
        if !crate::cpu::Isa::get().avx512f {
            eprintln!("no AVX-512 here: its path is not run");
            return;
        }
        let kb = 37;
        let noise = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 1e6 - 8.0;
        let mins: Vec<f32> = (0..kb * GROUP_ROWS).map(noise).collect();
        let block_mins = |b: usize| &mins[b * GROUP_ROWS..][..GROUP_ROWS];
        let sum = |b: usize| noise(b + 7_000) * 3.0;
        let start: Vec<f32> = (0..GROUP_ROWS).map(|l| noise(l + 9_000)).collect();
        let (mut plain, mut simd) = (start.clone(), start);
        group_plain(kb, &block_mins, &sum, &mut plain);
        // SAFETY: the CPU has AVX-512 F (checked above).
        #[allow(unsafe_code)]
        unsafe {
            group_avx512(kb, &block_mins, &sum, &mut simd)
        };
        assert_eq!(plain, simd);
        assert!(plain
            .iter()
            .zip(&simd)
            .all(|(p, s)| p.to_bits() == s.to_bits()));
    }
}
