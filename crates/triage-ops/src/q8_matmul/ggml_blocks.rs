//! GGML's other blocks of 32 values, read into `Q8Matrix`'s int8 values without loss
//! (`ggml-common.h`, `dequantize_row_q4_0` … `_q5_1` in `ggml-quants.c`): Q4_0 and Q5_0 hold
//! values around an offset (`d · (q − 8)`, `d · (q − 16)`), which become signed int8 values under
//! the same scale; Q4_1 and Q5_1 add a per-block min (`d · q + m`), kept beside the scales.

use super::QK8_0;

/// A GGML block format `Q8Matrix` reads losslessly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlBlockType {
    /// f16 scale, 32 int8 values.
    Q8_0,
    /// f16 scale, 32 4-bit values around 8.
    Q4_0,
    /// f16 scale, f16 min, 32 4-bit values.
    Q4_1,
    /// f16 scale, 32 5-bit values around 16 (high bits apart).
    Q5_0,
    /// f16 scale, f16 min, 32 5-bit values (high bits apart).
    Q5_1,
}

/// One block as `Q8Matrix` holds it: GGML's value `i` is `d · quants[i] + m` (`m` is 0 for the
/// types without a min).
pub(super) struct Block {
    pub(super) d: f32,
    pub(super) m: f32,
    pub(super) quants: [i8; QK8_0],
}

impl GgmlBlockType {
    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlBlockType::Q8_0 => 2 + QK8_0,
            GgmlBlockType::Q4_0 => 2 + QK8_0 / 2,
            GgmlBlockType::Q4_1 => 4 + QK8_0 / 2,
            GgmlBlockType::Q5_0 => 6 + QK8_0 / 2,
            GgmlBlockType::Q5_1 => 8 + QK8_0 / 2,
        }
    }

    /// Whether the type stores a min per block.
    pub fn has_mins(self) -> bool {
        matches!(self, GgmlBlockType::Q4_1 | GgmlBlockType::Q5_1)
    }

    /// The block in `bytes` (`block_bytes()` long).
    #[inline]
    pub(super) fn read(self, bytes: &[u8]) -> Block {
        let d = f16_at(bytes, 0);
        match self {
            GgmlBlockType::Q8_0 => Block {
                d,
                m: 0.0,
                quants: std::array::from_fn(|i| bytes[2 + i] as i8),
            },
            GgmlBlockType::Q4_0 => Block {
                d,
                m: 0.0,
                quants: nibbles(&bytes[2..]).map(|q| q as i8 - 8),
            },
            GgmlBlockType::Q4_1 => Block {
                d,
                m: f16_at(bytes, 2),
                quants: nibbles(&bytes[4..]).map(|q| q as i8),
            },
            GgmlBlockType::Q5_0 => Block {
                d,
                m: 0.0,
                quants: five_bits(&bytes[2..]).map(|q| q as i8 - 16),
            },
            GgmlBlockType::Q5_1 => Block {
                d,
                m: f16_at(bytes, 2),
                quants: five_bits(&bytes[4..]).map(|q| q as i8),
            },
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 32 4-bit values of a block: byte `j` holds value `j` in its low nibble and value `j + 16`
/// in its high nibble.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; QK8_0] {
    let mut q = [0u8; QK8_0];
    for (j, &byte) in qs[..QK8_0 / 2].iter().enumerate() {
        q[j] = byte & 0xF;
        q[j + QK8_0 / 2] = byte >> 4;
    }
    q
}

/// The 32 5-bit values stored as 4 bytes of fifth bits (bit `i` is value `i`'s), then the low 4
/// bits as `nibbles` lays them out.
#[inline(always)]
fn five_bits(bytes: &[u8]) -> [u8; QK8_0] {
    let mut q = nibbles(&bytes[4..]);
    for (eight, &high) in q.chunks_exact_mut(8).zip(&bytes[..4]) {
        let spread =
            u64::from_le_bytes(eight.try_into().expect("8 values")) | FIFTH_BITS[high as usize];
        eight.copy_from_slice(&spread.to_le_bytes());
    }
    q
}

/// For each byte of fifth bits, the 8 values' bit 4: bit `i` of the index at bit 4 of byte `i`.
static FIFTH_BITS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut i = 0;
        while i < 8 {
            table[byte] |= ((byte as u64 >> i) & 1) << (8 * i + 4);
            i += 1;
        }
        byte += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_from_the_nibbles_and_fifth_bits_ggml_writes() {
        // Q5_0: fifth bits set for values 1 and 17; low nibbles 0x21 in byte 1 (value 1 gets 1,
        // value 17 gets 2), every other byte 0.
        let mut q5 = vec![0u8; 22];
        q5[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        q5[2..6].copy_from_slice(&((1u32 << 1) | (1 << 17)).to_le_bytes());
        q5[6 + 1] = 0x21;
        let block = GgmlBlockType::Q5_0.read(&q5);
        assert_eq!((block.d, block.m), (0.5, 0.0));
        assert_eq!((block.quants[1], block.quants[17]), (17 - 16, 18 - 16));
        assert_eq!((block.quants[0], block.quants[31]), (-16, -16));

        let mut q41 = vec![0u8; 20];
        q41[2..4].copy_from_slice(&half::f16::from_f32(-1.25).to_le_bytes());
        q41[4 + 15] = 0xF3;
        let block = GgmlBlockType::Q4_1.read(&q41);
        assert_eq!(block.m, -1.25);
        assert_eq!(
            (block.quants[15], block.quants[31], block.quants[0]),
            (3, 15, 0)
        );
    }
}
