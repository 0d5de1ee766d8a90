//! Data-parallel loops on candle's own thread pool, so that triage's CPU ops and candle's share
//! one set of workers: a second pool (rayon) spins against candle's idle-spinning workers on a
//! small machine (on 2 cores a third busy thread took a sixth of a decode step).

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
    fn map_keeps_index_order() {
        let squares = map(517, |i| i * i);
        assert_eq!(squares, (0..517).map(|i| i * i).collect::<Vec<_>>());
    }
}
