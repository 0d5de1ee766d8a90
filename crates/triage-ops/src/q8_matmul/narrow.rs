//! 4- and 5-bit values of a `Q8Matrix` (GGML's Q4_0, Q4_1, Q5_0, Q5_1 blocks), kept at their
//! width in the interleaved layout: the AVX-512 kernel and AVX2's decode tiles widen them in
//! registers; elsewhere (and for 16 or more activation rows) a span at a time is widened to int8
//! (`widen`). Per group block (16 rows × 32 values): 256 bytes of nibbles, two steps to a byte
//! (step 2p in the low nibble and 2p + 1 in the high, at step p's place in the int8 layout, so
//! one 64-byte run widens to two steps), then for 5-bit values 64 bytes of fifth bits (byte
//! `row · 4 + value`, bit `step`). With the f32 scales (and mins): 5 bits per weight for Q4_0, 6
//! for Q5_0 and Q4_1, 7 for Q5_1, against int8's 9 (GGML files: 4.5–6).
//!
//! The 16 is `WIDEN_ROWS` (`q8_matmul.rs`): from there, widening a span once into scratch beats
//! widening in registers again per 8 rows (prefill 555 tok/s when every row count widened in
//! registers); below it, registers beat scratch (decode 34 tok/s when every row count used
//! scratch). benches/RESULTS.md, "GGUF files as shipped".

use super::ggml_blocks::GgmlBlockType;
use super::matrix::{BLOCK_STEPS, GROUP_BLOCK_BYTES, GROUP_ROWS, LANE_VALUES};
use super::QK8_0;

/// Bytes of one step of a group block in the int8 layout: 16 rows × 4 values.
const STEP_BYTES: usize = GROUP_ROWS * LANE_VALUES;
/// Bytes of a group block's nibbles.
const NIBBLE_BYTES: usize = GROUP_BLOCK_BYTES / 2;

/// How narrow values are stored: with a fifth bit or not, and the offset that makes them the
/// int8 values the kernels multiply (`d · (q − 8)` for Q4_0, `d · (q − 16)` for Q5_0, `d · q + m`
/// for the types with mins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NarrowKind {
    fifth_bit: bool,
    offset: i8,
}

/// A matrix's narrow values, `[spans, cols / 32, 4]` group blocks of `kind.group_block_bytes()`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NarrowValues {
    pub(super) kind: NarrowKind,
    pub(super) bytes: Vec<u8>,
}

impl NarrowKind {
    /// The storage of `ty`'s values, or `None` for Q8_0 (int8 already).
    pub(super) fn of(ty: GgmlBlockType) -> Option<Self> {
        let (fifth_bit, offset) = match ty {
            GgmlBlockType::Q8_0 => return None,
            GgmlBlockType::Q4_0 => (false, -8),
            GgmlBlockType::Q4_1 => (false, 0),
            GgmlBlockType::Q5_0 => (true, -16),
            GgmlBlockType::Q5_1 => (true, 0),
        };
        Some(Self { fifth_bit, offset })
    }

    /// Whether values have a fifth bit (Q5_0, Q5_1).
    pub(super) fn fifth_bit(self) -> bool {
        self.fifth_bit
    }

    /// What a stored `q` is offset by to give the value the kernels multiply.
    pub(super) fn offset(self) -> i8 {
        self.offset
    }

    pub(super) fn group_block_bytes(self) -> usize {
        NIBBLE_BYTES + if self.fifth_bit { STEP_BYTES } else { 0 }
    }

    /// Writes row `lane` of a group block (its 32 int8 values, offset as the kernels take them)
    /// into `dst`, the group block's narrow bytes.
    #[inline]
    pub(super) fn put(self, values: &[i8; QK8_0], lane: usize, dst: &mut [u8]) {
        // A step's 4 values as one word of `q`s; a pair of steps' nibbles fill one word of the
        // row's, and each step's fifth bits go to bit `step` of the row's 4 fifth-bit bytes. Each
        // byte of `dst` is written once and never read: fresh zeroed memory read first would be
        // mapped to the zero page and copied on the write after (a fault and a TLB shootdown
        // per page, which doubled the 0.5B's load time).
        let steps: [u32; BLOCK_STEPS] = std::array::from_fn(|step| {
            let four: [i8; LANE_VALUES] = values[step * LANE_VALUES..][..LANE_VALUES]
                .try_into()
                .expect("4 values");
            u32::from_le_bytes(four.map(|v| v.wrapping_sub(self.offset) as u8))
        });
        for (pair, two) in steps.chunks_exact(2).enumerate() {
            let word = (two[0] & 0x0F0F_0F0F) | (two[1] & 0x0F0F_0F0F) << 4;
            let at = pair * STEP_BYTES + lane * LANE_VALUES;
            dst[at..at + 4].copy_from_slice(&word.to_le_bytes());
        }
        if self.fifth_bit {
            let fifths = (0..BLOCK_STEPS).fold(0u32, |bits, step| {
                bits | (steps[step] >> 4 & 0x0101_0101) << step
            });
            let at = NIBBLE_BYTES + lane * LANE_VALUES;
            dst[at..at + 4].copy_from_slice(&fifths.to_le_bytes());
        }
    }

    /// Value `i` (0..32) of row `lane` in the group block `src`.
    pub(super) fn get(self, src: &[u8], lane: usize, i: usize) -> i8 {
        let (step, j) = (i / LANE_VALUES, lane * LANE_VALUES + i % LANE_VALUES);
        let mut q = src[step / 2 * STEP_BYTES + j] >> (4 * (step % 2)) & 0xF;
        if self.fifth_bit {
            q |= (src[NIBBLE_BYTES + j] >> step & 1) << 4;
        }
        (q as i8).wrapping_add(self.offset)
    }

    /// Widens the group blocks `src` (narrow) into `dst` (int8, `GROUP_BLOCK_BYTES` each), with
    /// AVX-512 or AVX2 where the CPU has them.
    pub(super) fn widen(self, src: &[u8], dst: &mut [i8]) {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        {
            let isa = crate::cpu::Isa::get();
            if isa.avx512bw {
                // SAFETY: the CPU has AVX-512 F/BW (BW implies F).
                unsafe { super::x86::widen_avx512(self, src, dst) };
                return;
            }
            if isa.avx2 {
                // SAFETY: the CPU has AVX2.
                unsafe { super::x86::widen_avx2(self, src, dst) };
                return;
            }
        }
        self.widen_portable(src, dst);
    }

    /// `widen` in plain loops: the order of operations every SIMD path follows.
    fn widen_portable(self, src: &[u8], dst: &mut [i8]) {
        let units = src.chunks_exact(self.group_block_bytes());
        for (src, dst) in units.zip(dst.chunks_exact_mut(GROUP_BLOCK_BYTES)) {
            if self.fifth_bit {
                widen_unit::<true>(src, dst, self.offset);
            } else {
                widen_unit::<false>(src, dst, self.offset);
            }
        }
    }
}

/// One group block, in loops over 64 bytes that the compiler vectorizes.
#[inline(always)]
fn widen_unit<const FIFTH: bool>(src: &[u8], dst: &mut [i8], offset: i8) {
    let (nibbles, fifths) = src.split_at(NIBBLE_BYTES);
    for step in 0..BLOCK_STEPS {
        let (pair, shift) = (step / 2 * STEP_BYTES, 4 * (step % 2));
        let out = &mut dst[step * STEP_BYTES..][..STEP_BYTES];
        for j in 0..STEP_BYTES {
            let mut q = nibbles[pair + j] >> shift & 0xF;
            if FIFTH {
                q |= (fifths[j] >> step & 1) << 4;
            }
            out[j] = (q as i8).wrapping_add(offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_put_narrow_come_back_from_get_and_widen_on_every_path() {
        // 6 group blocks (more than one span's block of 4), every row and value distinct enough.
        const UNITS: usize = 6;
        for ty in [
            GgmlBlockType::Q4_0,
            GgmlBlockType::Q4_1,
            GgmlBlockType::Q5_0,
            GgmlBlockType::Q5_1,
        ] {
            let kind = NarrowKind::of(ty).unwrap();
            let top = if kind.fifth_bit { 32 } else { 16 };
            let value = |unit: usize, lane: usize, i: usize| {
                ((unit * 5 + lane * 7 + i * 3) % top) as i8 + kind.offset
            };
            let unit_bytes = kind.group_block_bytes();
            let mut narrow = vec![0u8; UNITS * unit_bytes];
            for (unit, dst) in narrow.chunks_exact_mut(unit_bytes).enumerate() {
                for lane in 0..GROUP_ROWS {
                    kind.put(&std::array::from_fn(|i| value(unit, lane, i)), lane, dst);
                }
            }
            let mut wide = vec![0i8; UNITS * GROUP_BLOCK_BYTES];
            kind.widen_portable(&narrow, &mut wide);
            for unit in 0..UNITS {
                let src = &narrow[unit * unit_bytes..][..unit_bytes];
                for lane in 0..GROUP_ROWS {
                    for i in 0..QK8_0 {
                        let v = value(unit, lane, i);
                        assert_eq!(kind.get(src, lane, i), v, "{ty:?}");
                        let at = unit * GROUP_BLOCK_BYTES
                            + (i / LANE_VALUES * GROUP_ROWS + lane) * LANE_VALUES
                            + i % LANE_VALUES;
                        assert_eq!(wide[at], v, "{ty:?} unit {unit} row {lane} value {i}");
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            {
                let isa = crate::cpu::Isa::get();
                let mut simd = vec![0i8; wide.len()];
                if isa.avx512bw {
                    // SAFETY: the CPU has AVX-512 F/BW.
                    unsafe { super::super::x86::widen_avx512(kind, &narrow, &mut simd) };
                    assert_eq!(simd, wide, "{ty:?}, AVX-512");
                }
                if isa.avx2 {
                    // SAFETY: the CPU has AVX2.
                    unsafe { super::super::x86::widen_avx2(kind, &narrow, &mut simd) };
                    assert_eq!(simd, wide, "{ty:?}, AVX2");
                }
            }
        }
    }
}
