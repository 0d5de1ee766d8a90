//! The numeric core of flash attention: one task's query rows against one tile of keys (scores,
//! the online softmax, the weighted values), in register groups of rows. Each row's arithmetic is
//! a fixed sequence of fused multiply-adds whatever the group, the task or the vector width, so
//! every kernel and every batching gives the same bits.
//!
//! Register blocks load a key or value chunk once for all the block's rows: weighted values in
//! up to 6 rows × 64 columns on AVX-512 (6 × 16 on AVX2, 4 × 16 portable), prefill scores in 6
//! rows × 32 keys (4 × 16 on AVX2 and portable). Those shapes won the measured candidates
//! (benches/RESULTS.md, "Flash attention in register blocks"); the loops had been bound by loads,
//! not FMAs. The exp is a branch-free polynomial, so the lanes vectorise; it stays within a
//! relative 3 ε of libm's (`exp_is_within_a_few_ulp_of_libm`).

/// Columns per vector chunk: a row's values are padded to a multiple of it and summed in chunks of
/// it (a 512-bit register whole, a 256-bit one in two halves); a tile's weights are summed in as
/// many lanes, then in one fixed tree.
pub(crate) const LANES: usize = 16;

/// Keys per tile: the online softmax rescales once per tile.
pub(crate) const KEY_TILE: usize = 64;

/// `a[0] + … + a[15]` added pairwise in a fixed tree.
#[inline(always)]
pub(crate) fn lane_sum(mut a: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for x in 0..width {
            a[x] += a[x + width];
        }
        width /= 2;
    }
    a[0]
}

/// `e^x` for `x ≤ 0` to about 2 ulp, branch-free so a loop of it vectorises: Cody–Waite
/// reduction by ln 2, a degree-6 polynomial (Cephes' `expf` coefficients), and the power of two
/// put into the exponent bits. Inputs below −87 give the smallest normal value, not 0; callers
/// zero masked entries themselves.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let x = x.max(-87.0);
    let shifted = x.mul_add(std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // `shifted`'s low mantissa bits hold n + 2²² (n ≥ −126 after the clamp).
    let n_bits = (shifted.to_bits() as i32) - (ROUND.to_bits() as i32);
    y * f32::from_bits(((n_bits + 127) << 23) as u32)
}

/// Query rows of a task that fit in one vector of [`rows_as_lanes_scores`].
pub(crate) const FEW_ROWS: usize = 8;

/// One task's state: its query rows (`dim` values each, zero-padded to a multiple of [`LANES`];
/// rows past the task's, which pad it to the score blocks' height, stay inactive) with their
/// running max, sum of weights, weighted values, and this tile's scores (then weights).
pub(crate) struct RowState {
    pub dim: usize,
    pub q: Vec<f32>,
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    pub out: Vec<f32>,
    pub p: Vec<f32>,
}

impl RowState {
    pub fn new(rows: usize, dim: usize) -> Self {
        Self {
            dim,
            q: vec![0.0; rows * dim],
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            out: vec![0.0; rows * dim],
            p: vec![0.0; rows * KEY_TILE],
        }
    }
}

// Both score loops compute `s[r][j] = (Σ_i q[r][i] · k[j][i]) · scale` as one chain of fused
// multiply-adds over i = 0, 1, …, d − 1: the same bits, whichever runs.

/// Scores of `ROWS` rows from `row0`, keys as vector lanes: `keys_t` holds the tile transposed
/// (`[d][KEY_TILE]`), so each step loads `C` chunks of [`LANES`] keys once and broadcasts one
/// query value of each row against them. For tasks with many rows, over which the transposition
/// is spread.
#[inline(always)]
pub(crate) fn keys_as_lanes_scores<const ROWS: usize, const C: usize>(
    state: &mut RowState,
    row0: usize,
    keys_t: &[f32],
    num_keys: usize,
    d: usize,
    scale: f32,
) {
    let dim = state.dim;
    for k0 in (0..num_keys).step_by(C * LANES) {
        let mut acc = [[[0f32; LANES]; C]; ROWS];
        for i in 0..d {
            let row = &keys_t[i * KEY_TILE + k0..i * KEY_TILE + k0 + C * LANES];
            let mut k = [[0f32; LANES]; C];
            for (q, k) in k.iter_mut().enumerate() {
                k.copy_from_slice(&row[q * LANES..(q + 1) * LANES]);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = state.q[(row0 + r) * dim + i];
                for (acc, k) in acc.iter_mut().zip(&k) {
                    *acc = fma_lanes(qv, k, acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let start = (row0 + r) * KEY_TILE + k0;
            let p = &mut state.p[start..start + C * LANES];
            for (p, &a) in p.iter_mut().zip(acc.as_flattened()) {
                *p = a * scale;
            }
        }
    }
}

/// Scores of up to [`FEW_ROWS`] rows, rows as vector lanes: `q_t` holds them transposed
/// (`[d][FEW_ROWS]`) and each step broadcasts one key value against all rows; eight keys at a
/// time keep eight independent chains. `keys` holds the tile's rows (`[KEY_TILE][dim]`). For
/// decode, whose few rows would not pay for transposing the keys.
#[inline(always)]
pub(crate) fn rows_as_lanes_scores(
    state: &mut RowState,
    q_t: &[f32],
    keys: &[f32],
    num_keys: usize,
    d: usize,
    scale: f32,
) {
    const KB: usize = 8;
    let (dim, rows) = (state.dim, state.max.len().min(FEW_ROWS));
    for k0 in (0..num_keys).step_by(KB) {
        let tile = &keys[k0 * dim..(k0 + KB) * dim];
        let mut acc = [[0f32; FEW_ROWS]; KB];
        for i in 0..d {
            let q: &[f32; FEW_ROWS] = q_t[i * FEW_ROWS..(i + 1) * FEW_ROWS]
                .try_into()
                .expect("FEW_ROWS values per query column");
            acc = std::array::from_fn(|j| fma_lanes(tile[j * dim + i], q, &acc[j]));
        }
        for (j, acc) in acc.iter().enumerate() {
            for (r, &a) in acc.iter().enumerate().take(rows) {
                state.p[r * KEY_TILE + k0 + j] = a * scale;
            }
        }
    }
}

/// `acc + a · b`, lane by lane, fused.
#[inline(always)]
fn fma_lanes<const N: usize>(a: f32, b: &[f32; N], acc: &[f32; N]) -> [f32; N] {
    std::array::from_fn(|x| a.mul_add(b[x], acc[x]))
}

/// Turns row `row`'s scores into weights for the `visible` keys it sees (the rest weigh 0) and
/// rescales its max, sum and output once for the tile. A row that sees none keeps its state and
/// weighs every key 0.
#[inline(always)]
pub(crate) fn softmax_row(state: &mut RowState, row: usize, visible: usize) {
    let p: &mut [f32; KEY_TILE] = (&mut state.p[row * KEY_TILE..(row + 1) * KEY_TILE])
        .try_into()
        .expect("KEY_TILE weights per row");
    if visible == 0 {
        *p = [0.0; KEY_TILE];
        return;
    }
    let tile_max = p[..visible]
        .iter()
        .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let old_max = state.max[row];
    let new_max = old_max.max(tile_max);
    let rescale = if old_max == f32::NEG_INFINITY {
        0.0
    } else {
        exp_nonpositive(old_max - new_max)
    };
    for (j, s) in p.iter_mut().enumerate() {
        let e = exp_nonpositive(*s - new_max);
        *s = if j < visible { e } else { 0.0 };
    }
    state.max[row] = new_max;
    state.sum[row] = state.sum[row].mul_add(rescale, tile_sum(p));
    let dim = state.dim;
    state.out[row * dim..(row + 1) * dim]
        .iter_mut()
        .for_each(|o| *o *= rescale);
}

/// The tile's weights summed 16 lanes at a time, then in the fixed tree.
#[inline(always)]
fn tile_sum(p: &[f32; KEY_TILE]) -> f32 {
    let mut lanes = [0f32; LANES];
    for chunk in p.chunks_exact(LANES) {
        for x in 0..LANES {
            lanes[x] += chunk[x];
        }
    }
    lane_sum(lanes)
}

/// `out[r] += Σ_j p[r][j] · v_j` for the `rows` rows from `row0`, over the first `num_keys` keys,
/// key by key (a row that sees fewer keys weighs the rest 0, which adds exactly nothing). Each
/// row's chain is the same whatever the blocking: in register blocks of up to `R` rows × `C`
/// chunks of [`LANES`] columns, each key's chunks are loaded once for all the block's rows.
#[inline(always)]
pub(crate) fn weighted_values<const R: usize, const C: usize>(
    state: &mut RowState,
    row0: usize,
    rows: usize,
    values: &[f32],
    num_keys: usize,
) {
    let mut r0 = row0;
    while r0 < row0 + rows {
        let n = R.min(row0 + rows - r0);
        // One monomorphised block per count: the accumulators are arrays of constant size.
        match n {
            1 => value_rows::<1, C>(state, r0, values, num_keys),
            2 => value_rows::<2, C>(state, r0, values, num_keys),
            3 => value_rows::<3, C>(state, r0, values, num_keys),
            4 => value_rows::<4, C>(state, r0, values, num_keys),
            5 => value_rows::<5, C>(state, r0, values, num_keys),
            6 => value_rows::<6, C>(state, r0, values, num_keys),
            7 => value_rows::<7, C>(state, r0, values, num_keys),
            _ => value_rows::<8, C>(state, r0, values, num_keys),
        }
        r0 += n.min(8);
    }
}

/// [`weighted_values`] for the `N` rows from `row0`, every column.
#[inline(always)]
fn value_rows<const N: usize, const C: usize>(
    state: &mut RowState,
    row0: usize,
    values: &[f32],
    num_keys: usize,
) {
    let dim = state.dim;
    let num_keys = num_keys.min(KEY_TILE);
    let p: [&[f32; KEY_TILE]; N] = std::array::from_fn(|r| {
        let start = (row0 + r) * KEY_TILE;
        (&state.p[start..start + KEY_TILE])
            .try_into()
            .expect("KEY_TILE weights per row")
    });
    let out = &mut state.out[row0 * dim..(row0 + N) * dim];
    let wide = dim / (C * LANES) * (C * LANES);
    for c in (0..wide).step_by(C * LANES) {
        value_block::<N, C>(out, &p, values, num_keys, dim, c);
    }
    for c in (wide..dim).step_by(LANES) {
        value_block::<N, 1>(out, &p, values, num_keys, dim, c);
    }
}

/// [`weighted_values`] for `N` rows × the `C · LANES` columns from `c`.
#[inline(always)]
fn value_block<const N: usize, const C: usize>(
    out: &mut [f32],
    p: &[&[f32; KEY_TILE]; N],
    values: &[f32],
    num_keys: usize,
    dim: usize,
    c: usize,
) {
    let mut acc = [[[0f32; LANES]; C]; N];
    for (r, acc) in acc.iter_mut().enumerate() {
        for (q, acc) in acc.iter_mut().enumerate() {
            let start = r * dim + c + q * LANES;
            acc.copy_from_slice(&out[start..start + LANES]);
        }
    }
    for j in 0..num_keys {
        let row = &values[j * dim + c..j * dim + c + C * LANES];
        let mut v = [[0f32; LANES]; C];
        for (q, v) in v.iter_mut().enumerate() {
            v.copy_from_slice(&row[q * LANES..(q + 1) * LANES]);
        }
        for (acc, p) in acc.iter_mut().zip(p) {
            let w = p[j];
            for (acc, v) in acc.iter_mut().zip(&v) {
                *acc = fma_lanes(w, v, acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (q, acc) in acc.iter().enumerate() {
            let start = r * dim + c + q * LANES;
            out[start..start + LANES].copy_from_slice(acc);
        }
    }
}
