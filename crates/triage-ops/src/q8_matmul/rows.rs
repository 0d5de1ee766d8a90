//! `Q8Rows`: activation rows quantized to Q8_0 and laid out in tiles of 8 rows, the layout the
//! CPU kernels broadcast from: for each tile and block, step by step (4 values), each row's 4
//! values one after the other, so that a kernel reads any row's next 4 values at a fixed offset.

use super::matrix::{BLOCK_STEPS, LANE_VALUES};
use super::{check_cols, QK8_0};
use crate::{OpsError, Result};

/// Rows per tile: a kernel keeps at most this many rows' accumulators in registers.
pub(super) const TILE_ROWS: usize = 8;

/// `[rows, cols]` activations in Q8_0, in tiles of 8 rows (the last may hold fewer).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Rows {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Per tile `cols / 32 · 8 · 32` bytes: `[block, step, row, value]`, rows of that tile only.
    pub(super) quants: Vec<i8>,
    /// Per tile `cols / 32 · 8` scales: `[block, row]`.
    pub(super) scales: Vec<f32>,
    /// −128 · Σ values of each block, laid out as `scales`: what an unsigned view of the weights
    /// (offset by 128, as `vpdpbusd` takes them) adds to a dot product, subtracted up front.
    pub(super) offsets: Vec<i32>,
    /// Each block's `d · Σ values` rounded to f16, laid out as `scales`: the sum GGML's Q8_1
    /// blocks carry, which the min term of Q4_1 and Q5_1 weights multiplies (`mins`).
    pub(super) sums: Vec<f32>,
}

/// One tile's part of each of `Q8Rows`' buffers, filled on a worker of its own.
struct TileParts<'a> {
    quants: &'a mut [i8],
    scales: &'a mut [f32],
    offsets: &'a mut [i32],
    sums: &'a mut [f32],
}

impl Q8Rows {
    /// Quantize row-major f32 `values` (`[rows, cols]`) exactly as GGML's `quantize_row_q8_0`
    /// does: per block d = max |x| / 127, values rounded to nearest of x · (1/d), and d stored
    /// as f16. Matching GGML bit for bit keeps triage's products those of llama.cpp.
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        check_cols(cols)?;
        if values.len() != rows * cols {
            return Err(OpsError::InvalidArgument(format!(
                "{} values for a [{rows}, {cols}] matrix",
                values.len()
            )));
        }
        let kb = cols / QK8_0;
        let tiles = rows.div_ceil(TILE_ROWS);
        let mut quants = vec![0i8; tiles * kb * TILE_ROWS * QK8_0];
        let mut scales = vec![0f32; tiles * kb * TILE_ROWS];
        let mut offsets = vec![0i32; tiles * kb * TILE_ROWS];
        let mut sums = vec![0f32; tiles * kb * TILE_ROWS];
        let mut by_tile: Vec<TileParts> = quants
            .chunks_mut(kb * TILE_ROWS * QK8_0)
            .zip(scales.chunks_mut(kb * TILE_ROWS))
            .zip(offsets.chunks_mut(kb * TILE_ROWS))
            .zip(sums.chunks_mut(kb * TILE_ROWS))
            .map(|(((quants, scales), offsets), sums)| TileParts {
                quants,
                scales,
                offsets,
                sums,
            })
            .collect();
        let fill = |tile: usize, parts: &mut TileParts| {
            let first = tile * TILE_ROWS;
            let num = TILE_ROWS.min(rows - first);
            for i in 0..num {
                let row = &values[(first + i) * cols..][..cols];
                for (b, x) in row.chunks_exact(QK8_0).enumerate() {
                    let mut block = [0i8; QK8_0];
                    let d = super::quantize_block(x, &mut block);
                    let sum: i32 = block.iter().map(|&v| v as i32).sum();
                    parts.scales[b * num + i] = super::to_f16(d);
                    parts.offsets[b * num + i] = -128 * sum;
                    parts.sums[b * num + i] = super::to_f16(sum as f32 * d);
                    for (step, four) in block.chunks_exact(LANE_VALUES).enumerate() {
                        let at = ((b * BLOCK_STEPS + step) * num + i) * LANE_VALUES;
                        parts.quants[at..at + LANE_VALUES].copy_from_slice(four);
                    }
                }
            }
        };
        // A batch's tiles are spread over the pool (one row is too little work to hand off).
        if tiles > 1 {
            crate::cpu::pool::for_each_chunk_mut(&mut by_tile, 1, |t, tile| fill(t, &mut tile[0]));
        } else {
            by_tile
                .iter_mut()
                .enumerate()
                .for_each(|(t, tile)| fill(t, tile));
        }
        Ok(Self {
            rows,
            cols,
            quants,
            scales,
            offsets,
            sums,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rows in tile `tile`.
    pub(super) fn tile_rows(&self, tile: usize) -> usize {
        TILE_ROWS.min(self.rows - tile * TILE_ROWS)
    }

    /// Where tile `tile` starts in `quants`, and in `scales` and `offsets`.
    pub(super) fn tile_start(&self, tile: usize) -> (usize, usize) {
        let kb = self.cols / QK8_0;
        (tile * kb * TILE_ROWS * QK8_0, tile * kb * TILE_ROWS)
    }

    /// Block `b` of row `row`: its scale and 32 values.
    #[cfg(test)]
    pub(super) fn block(&self, row: usize, b: usize) -> (f32, [i8; QK8_0]) {
        let (tile, i) = (row / TILE_ROWS, row % TILE_ROWS);
        let na = self.tile_rows(tile);
        let (q0, s0) = self.tile_start(tile);
        let quants = std::array::from_fn(|k| {
            let (step, v) = (k / LANE_VALUES, k % LANE_VALUES);
            self.quants[q0 + ((b * BLOCK_STEPS + step) * na + i) * LANE_VALUES + v]
        });
        (self.scales[s0 + b * na + i], quants)
    }

    /// Block `b` of row `row`: its sum as GGML's Q8_1 rounds it.
    #[cfg(test)]
    pub(super) fn block_sum(&self, row: usize, b: usize) -> f32 {
        let (tile, i) = (row / TILE_ROWS, row % TILE_ROWS);
        let (_, s0) = self.tile_start(tile);
        self.sums[s0 + b * self.tile_rows(tile) + i]
    }
}
