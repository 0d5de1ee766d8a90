//! Data-parallel loops on candle's own thread pool, so that triage's CPU ops and candle's share
//! one set of workers: a second pool (rayon) spins against candle's idle-spinning workers on a
//! small machine (on 2 cores a third busy thread took a sixth of a decode step; 305841b).

use std::sync::Mutex;

/// Calls `f(index, chunk)` for every `chunk_len`-sized chunk of `out` (the last may be shorter),
/// spread over the pool.
pub(crate) fn for_each_chunk_mut<T, F>(out: &mut [T], chunk_len: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let chunks: Vec<Mutex<&mut [T]>> = out.chunks_mut(chunk_len.max(1)).map(Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(chunks.len(), |range| {
        for index in range {
            // Each index comes once, so the lock is never contended; a panic in `f` would
            // poison only its own chunk, which nobody locks again.
            if let Ok(mut chunk) = chunks[index].lock() {
                f(index, &mut chunk);
            }
        }
    });
}

/// `(0..n).map(f)` computed over the pool, in index order.
pub(crate) fn map<R, F>(n: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync,
{
    let mut slots: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for_each_chunk_mut(&mut slots, 1, |index, slot| slot[0] = Some(f(index)));
    // Every index ran (a panic in `f` would have propagated), so every slot holds its value.
    slots.into_iter().flatten().collect()
}

/// How a column task's kernel writes its tile (see `column_tasks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileLayout {
    /// `[num_c, num_r]`: the shape of kernels whose registers hold one weight row's outputs
    /// for several activation rows.
    ColumnMajor,
    /// `[num_r, task_cols]`, the first `num_c` columns of each row kept: kernels whose registers
    /// hold one activation row's outputs for several weight rows.
    RowMajor,
}

/// A row-major `[m, n]` output computed by column tasks on the pool: task `i` owns columns
/// `i · task_cols..` (at most `task_cols`) of every row, and fills them chunk of rows by chunk of
/// rows: `fill(c0, num_c, r0, num_r, tile)` writes `tile` in `layout`, which lands in its place
/// in the output. Used by the int8 matmuls, whose tasks are weight rows (output columns).
pub(crate) fn column_tasks<F>(
    m: usize,
    n: usize,
    task_cols: usize,
    row_chunk: usize,
    layout: TileLayout,
    fill: F,
) -> Vec<f32>
where
    F: Fn(usize, usize, usize, usize, &mut [f32]) + Sync,
{
    let mut out = vec![0f32; m * n];
    let shared = SharedOut(out.as_mut_ptr());
    candle_core::utils::barrier_pool().execute_chunked(n.div_ceil(task_cols), |range| {
        // A decode step (one row) needs one row of tile, not `row_chunk`.
        let mut tile = vec![0f32; task_cols * row_chunk.min(m)];
        for task in range {
            let c0 = task * task_cols;
            let num_c = task_cols.min(n - c0);
            for r0 in (0..m).step_by(row_chunk) {
                let num_r = row_chunk.min(m - r0);
                fill(c0, num_c, r0, num_r, &mut tile);
                for (i, row) in (r0..r0 + num_r).enumerate() {
                    let dst = shared.at(row * n + c0);
                    // SAFETY: `row < m` and `c0 + num_c <= n`, so the row's `num_c` values are
                    // inside `out` (`m * n` values), which outlives the pool call; each task
                    // index comes once, so no other thread writes columns `c0..c0 + num_c`, and
                    // `tile` is this thread's own buffer, so the ranges do not overlap.
                    #[allow(unsafe_code)]
                    unsafe {
                        match layout {
                            TileLayout::ColumnMajor => {
                                for c in 0..num_c {
                                    *dst.add(c) = tile[c * num_r + i];
                                }
                            }
                            TileLayout::RowMajor => {
                                let src = &tile[i * task_cols..][..num_c];
                                std::ptr::copy_nonoverlapping(src.as_ptr(), dst, num_c);
                            }
                        }
                    };
                }
            }
        }
    });
    out
}

/// The output buffer, written by the pool's tasks at disjoint columns.
struct SharedOut(*mut f32);

// SAFETY: the pointer is only dereferenced at indices a single task owns (see the write above).
#[allow(unsafe_code)]
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Taking `&self` (not the field) makes closures capture the `Sync` wrapper.
    fn at(&self, index: usize) -> *mut f32 {
        self.0.wrapping_add(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once_with_its_index() {
        let mut out = vec![0usize; 1003];
        for_each_chunk_mut(&mut out, 10, |index, chunk| {
            chunk.iter_mut().for_each(|v| *v += index + 1)
        });
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, i / 10 + 1, "element {i}");
        }
    }

    #[test]
    fn column_tasks_put_each_tile_in_its_place() {
        // 37 columns in tasks of 16 (a short last one), 70 rows in chunks of 64.
        let out = column_tasks(
            70,
            37,
            16,
            64,
            TileLayout::ColumnMajor,
            |c0, num_c, r0, num_r, tile| {
                for c in 0..num_c {
                    for r in 0..num_r {
                        tile[c * num_r + r] = ((r0 + r) * 1000 + c0 + c) as f32;
                    }
                }
            },
        );
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, ((i / 37) * 1000 + i % 37) as f32, "element {i}");
        }
    }

    #[test]
    fn row_major_column_tasks_put_each_tile_in_its_place() {
        // 37 columns in tasks of 16 (a short last one), 70 rows in chunks of 64.
        let out = column_tasks(
            70,
            37,
            16,
            64,
            TileLayout::RowMajor,
            |c0, num_c, r0, num_r, tile| {
                for r in 0..num_r {
                    for c in 0..16 {
                        // Columns past `num_c` are scratch the copy must leave out.
                        let value = if c < num_c {
                            (r0 + r) * 1000 + c0 + c
                        } else {
                            999_999
                        };
                        tile[r * 16 + c] = value as f32;
                    }
                }
            },
        );
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, ((i / 37) * 1000 + i % 37) as f32, "element {i}");
        }
    }

    #[test]
    fn map_keeps_index_order() {
        let squares = map(517, |i| i * i);
        assert_eq!(squares, (0..517).map(|i| i * i).collect::<Vec<_>>());
    }
}
