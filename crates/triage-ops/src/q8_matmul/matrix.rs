//! `Q8Matrix`: Q8_0 weights interleaved in groups of 16 rows, the layout the CPU kernels stream:
//! for each group and block, the 16 rows' first 4 values, then their next 4, and so on (so one
//! 64-byte load feeds `vpdpbusd` 16 rows' worth of 4-value dot products). Spans of 4 groups (64
//! rows, a parallel task) are interleaved block by block, so that a decode step, which runs a
//! span's 4 groups at once, reads its weights as one linear stream. GGML's 4- and 5-bit blocks of
//! 32 are held the same way, losslessly (`ggml_blocks`), with their mins beside the scales.
//!
//! The x86 kernels prefetch that stream 4 blocks ahead into L2 (`PREFETCH_BLOCKS`): the 0.5B
//! decoded at 41.6–42.1 tok/s, against 28–32 with no prefetch and 23–33 with one into L1
//! (benches/RESULTS.md, "Q8_0 prefill with interleaved weights").

use super::ggml_blocks::{Block, GgmlBlockType};
use super::narrow::{NarrowKind, NarrowValues};
use super::{check_cols, QK8_0};
use crate::{OpsError, Result};

/// Weight rows interleaved together: one 512-bit register of int32 lanes.
pub(super) const GROUP_ROWS: usize = 16;
/// Values each lane takes per step (`vpdpbusd` multiplies 4 byte pairs into one int32 lane).
pub(super) const LANE_VALUES: usize = 4;
/// Steps per block.
pub(super) const BLOCK_STEPS: usize = QK8_0 / LANE_VALUES;
/// Bytes of one group's block: 16 rows × 32 values.
pub(super) const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * QK8_0;
/// Groups interleaved block by block.
pub(super) const SPAN_GROUPS: usize = 4;
/// Rows of a span.
pub(super) const SPAN_ROWS: usize = SPAN_GROUPS * GROUP_ROWS;

/// A row-major `[rows, cols]` matrix in Q8_0 (int8 values, one f32 scale per 32 of them), stored
/// interleaved in groups of 16 rows and spans of 4 groups. A last span that is short is padded
/// with zero rows of scale 0, whose products are never read.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Matrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// `[spans, cols / 32, 4, 16]`: span, block, group, row.
    pub(super) scales: Vec<f32>,
    /// `[spans, cols / 32, 4, 8, 16, 4]`: span, block, group, step, row, value.
    pub(super) quants: Vec<i8>,
    /// Each block's min, laid out as `scales`, for types whose values are `d · q + m` (Q4_1,
    /// Q5_1); `None` where every min is 0.
    pub(super) mins: Option<Vec<f32>>,
    /// The values at their width for GGML's 4- and 5-bit types, `quants` then being empty: the
    /// kernels run on int8 matrices only, so `q8_matmul_quantized` widens such a matrix a span
    /// at a time (`widen_span`).
    pub(super) narrow: Option<NarrowValues>,
}

impl Q8Matrix {
    /// From GGML's Q8_0 bytes (`rows * cols / 32` blocks of 34 bytes), e.g. a GGUF tensor.
    pub fn from_ggml_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        Self::from_ggml_blocks(GgmlBlockType::Q8_0, rows, cols, bytes)
    }

    /// From GGML's bytes of `ty` (`rows * cols / 32` blocks), e.g. a GGUF tensor. Every type is
    /// held without loss, so products and dequantized values are those of the file's weights.
    pub fn from_ggml_blocks(
        ty: GgmlBlockType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        check_cols(cols)?;
        let (kb, block_bytes) = (cols / QK8_0, ty.block_bytes());
        let needed = rows * kb * block_bytes;
        if bytes.len() != needed {
            return Err(OpsError::InvalidArgument(format!(
                "{ty:?} [{rows}, {cols}] needs {needed} bytes, got {}",
                bytes.len()
            )));
        }
        let row_bytes = kb * block_bytes;
        let narrow = NarrowKind::of(ty);
        Ok(Self::pack(rows, cols, narrow, ty.has_mins(), |row, b| {
            ty.read(&bytes[row * row_bytes + b * block_bytes..][..block_bytes])
        }))
    }

    /// Quantize row-major f32 `values` (`[rows, cols]`) exactly as GGML's `quantize_row_q8_0`
    /// does (see `Q8Rows::quantize`).
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        check_cols(cols)?;
        if values.len() != rows * cols {
            return Err(OpsError::InvalidArgument(format!(
                "{} values for a [{rows}, {cols}] matrix",
                values.len()
            )));
        }
        Ok(Self::pack(rows, cols, None, false, |row, b| {
            let mut quants = [0i8; QK8_0];
            let x = &values[row * cols + b * QK8_0..][..QK8_0];
            let d = super::to_f16(super::quantize_block(x, &mut quants));
            Block { d, m: 0.0, quants }
        }))
    }

    /// The rows of `parts`, one matrix after the other (e.g. Q, K and V projections run as one
    /// product). Each output element keeps its own accumulator, so the stacked product gives
    /// every part's bits. Parts may mix types: one without mins has mins of 0 in the stack, and
    /// the values stay narrow only where every part's are narrow the same way.
    pub fn stack_rows(parts: &[&Q8Matrix]) -> Result<Self> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if let Some(bad) = parts.iter().find(|p| p.cols != cols) {
            return Err(OpsError::InvalidArgument(format!(
                "stacking Q8_0 matrices of {cols} and {} columns",
                bad.cols
            )));
        }
        check_cols(cols)?;
        let owners: Vec<(&Q8Matrix, usize)> = parts
            .iter()
            .flat_map(|p| (0..p.rows).map(move |r| (*p, r)))
            .collect();
        let with_mins = parts.iter().any(|p| p.mins.is_some());
        let kinds: Vec<Option<NarrowKind>> = parts
            .iter()
            .map(|p| p.narrow.as_ref().map(|n| n.kind))
            .collect();
        let narrow = kinds[0].filter(|_| kinds.iter().all(|k| *k == kinds[0]));
        Ok(Self::pack(
            owners.len(),
            cols,
            narrow,
            with_mins,
            |row, b| {
                let (part, r) = owners[row];
                part.block(r, b)
            },
        ))
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The matrix as f32 (scale times value, plus the min where the type has one), as GGML
    /// dequantizes its blocks.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, values) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(row, values);
        }
        out
    }

    /// Row `row` (< `rows`) as f32 into `out` (`cols` values), as `dequantize` writes it: an
    /// embedding lookup in a table kept in Q8_0.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        for (b, out) in out.chunks_exact_mut(QK8_0).enumerate() {
            let Block { d, m, quants } = self.block(row, b);
            for (o, &v) in out.iter_mut().zip(&quants) {
                *o = d * v as f32;
                if self.mins.is_some() {
                    *o += m;
                }
            }
        }
    }

    /// Block `b` of row `row`: its scale, min and 32 values.
    pub(super) fn block(&self, row: usize, b: usize) -> Block {
        let (group, lane) = (row / GROUP_ROWS, row % GROUP_ROWS);
        let unit = self.group_block(group, b);
        let at = unit * GROUP_BLOCK_BYTES + lane * LANE_VALUES;
        let quants = match &self.narrow {
            None => std::array::from_fn(|i| {
                let (step, k) = (i / LANE_VALUES, i % LANE_VALUES);
                self.quants[at + step * GROUP_ROWS * LANE_VALUES + k]
            }),
            Some(narrow) => {
                let unit_bytes = narrow.kind.group_block_bytes();
                let src = &narrow.bytes[unit * unit_bytes..][..unit_bytes];
                std::array::from_fn(|i| narrow.kind.get(src, lane, i))
            }
        };
        let at = unit * GROUP_ROWS + lane;
        let m = self.mins.as_ref().map_or(0.0, |mins| mins[at]);
        Block {
            d: self.scales[at],
            m,
            quants,
        }
    }

    /// Where block `b` of group `group` starts, in group blocks: its values at
    /// `GROUP_BLOCK_BYTES` times this in `quants`, its scales at 16 times this in `scales`. The
    /// next group of a span is one group block on, the next block `SPAN_GROUPS` on.
    pub(super) fn group_block(&self, group: usize, b: usize) -> usize {
        let kb = self.cols / QK8_0;
        (group / SPAN_GROUPS * kb + b) * SPAN_GROUPS + group % SPAN_GROUPS
    }

    /// Lays out `rows` rows whose block `b` of row `row` is `block(row, b)` (`cols` checked),
    /// their values as int8 or, with `narrow`, at their width; keeps the mins if `with_mins`.
    fn pack<F>(
        rows: usize,
        cols: usize,
        narrow: Option<NarrowKind>,
        with_mins: bool,
        block: F,
    ) -> Self
    where
        F: Fn(usize, usize) -> Block + Sync,
    {
        let (scales, quants, mins, narrow) = match narrow {
            None => {
                let put = |values: &[i8; QK8_0], lane: usize, unit: &mut [i8]| {
                    for (step, four) in values.chunks_exact(LANE_VALUES).enumerate() {
                        let at = (step * GROUP_ROWS + lane) * LANE_VALUES;
                        unit[at..at + LANE_VALUES].copy_from_slice(four);
                    }
                };
                let (scales, quants, mins) =
                    pack_units(rows, cols, GROUP_BLOCK_BYTES, with_mins, &block, put);
                (scales, quants, mins, None)
            }
            Some(kind) => {
                let put = |values: &[i8; QK8_0], lane: usize, unit: &mut [u8]| {
                    kind.put(values, lane, unit)
                };
                let unit_bytes = kind.group_block_bytes();
                let (scales, bytes, mins) =
                    pack_units(rows, cols, unit_bytes, with_mins, &block, put);
                (scales, Vec::new(), mins, Some(NarrowValues { kind, bytes }))
            }
        };
        Self {
            rows,
            cols,
            scales,
            quants,
            mins,
            narrow,
        }
    }

    /// Span `span` as an int8 matrix of its own (one span: the same layout) in `into`, reusing
    /// its buffers: what the kernels multiply where this matrix's values are narrow.
    pub(super) fn widen_span(&self, span: usize, into: &mut Q8Matrix) {
        let narrow = self
            .narrow
            .as_ref()
            .expect("only a matrix of narrow values is widened");
        let span_blocks = self.cols / QK8_0 * SPAN_GROUPS;
        let scales = &self.scales[span * span_blocks * GROUP_ROWS..][..span_blocks * GROUP_ROWS];
        let unit_bytes = narrow.kind.group_block_bytes();
        let bytes = &narrow.bytes[span * span_blocks * unit_bytes..][..span_blocks * unit_bytes];
        into.rows = SPAN_ROWS.min(self.rows - span * SPAN_ROWS);
        into.cols = self.cols;
        into.narrow = None;
        into.scales.clear();
        into.scales.extend_from_slice(scales);
        into.quants.resize(span_blocks * GROUP_BLOCK_BYTES, 0);
        narrow.kind.widen(bytes, &mut into.quants);
        match &self.mins {
            Some(mins) => {
                let into_mins = into.mins.get_or_insert_with(Vec::new);
                into_mins.clear();
                into_mins
                    .extend_from_slice(&mins[span * span_blocks * GROUP_ROWS..][..scales.len()]);
            }
            None => into.mins = None,
        }
    }

    /// An empty matrix, for `widen_span` to fill.
    pub(super) fn scratch() -> Self {
        Self {
            rows: 0,
            cols: QK8_0,
            scales: Vec::new(),
            quants: Vec::new(),
            mins: None,
            narrow: None,
        }
    }
}

/// `pack`'s walk: `rows` rows of `cols` values in group blocks of `unit_len` values of `T`, spans
/// spread over the pool (loading a model is mostly this and the page faults of its fresh memory);
/// each row's block goes to `put(values, lane, unit)`. Returns the scales, the values and, with
/// `with_mins`, the mins.
fn pack_units<T, F, P>(
    rows: usize,
    cols: usize,
    unit_len: usize,
    with_mins: bool,
    block: &F,
    put: P,
) -> (Vec<f32>, Vec<T>, Option<Vec<f32>>)
where
    T: Copy + Default + Send,
    F: Fn(usize, usize) -> Block + Sync,
    P: Fn(&[i8; QK8_0], usize, &mut [T]) + Sync,
{
    let kb = cols / QK8_0;
    let span_blocks = kb * SPAN_GROUPS;
    let units = rows.div_ceil(SPAN_ROWS) * span_blocks;
    let mut scales = vec![0f32; units * GROUP_ROWS];
    let mut values = vec![T::default(); units * unit_len];
    let mut mins = vec![0f32; if with_mins { scales.len() } else { 0 }];
    // Each span's part of `mins`; empty for every span without them.
    let mut span_mins: Vec<&mut [f32]> = mins.chunks_mut(span_blocks * GROUP_ROWS).collect();
    span_mins.resize_with(units / span_blocks, Default::default);
    let mut spans: Vec<(&mut [f32], &mut [T], &mut [f32])> = scales
        .chunks_mut(span_blocks * GROUP_ROWS)
        .zip(values.chunks_mut(span_blocks * unit_len))
        .zip(span_mins)
        .map(|((s, v), m)| (s, v, m))
        .collect();
    crate::cpu::pool::for_each_chunk_mut(&mut spans, 1, |span, chunk| {
        let (scales, values, mins) = &mut chunk[0];
        let group_blocks = scales
            .chunks_exact_mut(GROUP_ROWS)
            .zip(values.chunks_exact_mut(unit_len));
        for (unit, (scales, values)) in group_blocks.enumerate() {
            let (b, group) = (unit / SPAN_GROUPS, span * SPAN_GROUPS + unit % SPAN_GROUPS);
            let first = group * GROUP_ROWS;
            let present = GROUP_ROWS.min(rows.saturating_sub(first));
            for (lane, scale) in scales.iter_mut().enumerate().take(present) {
                let Block { d, m, quants } = block(first + lane, b);
                *scale = d;
                if let Some(min) = mins.get_mut(unit * GROUP_ROWS + lane) {
                    *min = m;
                }
                put(&quants, lane, values);
            }
        }
    });
    (scales, values, with_mins.then_some(mins))
}
