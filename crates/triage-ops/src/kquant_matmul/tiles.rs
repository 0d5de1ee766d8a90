//! Row tiles: the packed K-quant layouts keep one super-block of 16 consecutive rows together,
//! row tile major (`[row tiles, super-blocks]`); this is the packing loop they share.

/// Rows per tile.
pub(super) const TILE_ROWS: usize = 16;

/// `rows` GGML rows of `nb` blocks of `block_bytes` (`ggml`) into tiles of `tile_bytes`, each
/// row written by `pack_row(block, row_in_tile, tile)`; row tiles are packed in parallel on the
/// pool. Rows past the matrix (the last tile's padding) stay zero.
pub(super) fn pack_tiles(
    rows: usize,
    nb: usize,
    ggml: &[u8],
    block_bytes: usize,
    tile_bytes: usize,
    pack_row: impl Fn(&[u8], usize, &mut [u8]) + Sync,
) -> Vec<u8> {
    let num_tiles = rows.div_ceil(TILE_ROWS);
    let mut bytes = vec![0u8; num_tiles * nb * tile_bytes];
    crate::pool::for_each_chunk_mut(&mut bytes, nb * tile_bytes, |t, tile_row| {
        for (b, tile) in tile_row.chunks_exact_mut(tile_bytes).enumerate() {
            for r in 0..TILE_ROWS.min(rows - t * TILE_ROWS) {
                let row = t * TILE_ROWS + r;
                pack_row(
                    &ggml[(row * nb + b) * block_bytes..][..block_bytes],
                    r,
                    tile,
                );
            }
        }
    });
    bytes
}
