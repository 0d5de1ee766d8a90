//! Row tiles: the packed K-quant layouts keep one super-block of 16 consecutive rows together,
//! row tile major (`[row tiles, super-blocks]`); this is the packing loop they share.

/// Rows per tile.
pub(super) const TILE_ROWS: usize = 16;

/// A matrix packed into tiles of `BYTES` bytes, `[row tiles, super-blocks]` row tile major; the
/// last tile's padding rows are zero and never read back.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PackedTiles<const BYTES: usize> {
    /// Super-blocks per row.
    pub(super) nb: usize,
    pub(super) bytes: Vec<u8>,
}

impl<const BYTES: usize> PackedTiles<BYTES> {
    /// `rows` GGML rows of `nb` blocks of `block_bytes` (`ggml`), each row written into its tile
    /// by `pack_row(block, row_in_tile, tile)`; row tiles are packed in parallel on the pool.
    pub(super) fn pack(
        rows: usize,
        nb: usize,
        ggml: &[u8],
        block_bytes: usize,
        pack_row: impl Fn(&[u8], usize, &mut [u8]) + Sync,
    ) -> Self {
        let bytes = pack_tiles(rows, nb, ggml, block_bytes, BYTES, pack_row);
        Self { nb, bytes }
    }

    /// The tile of row tile `t`, super-block `b`.
    pub(super) fn tile(&self, t: usize, b: usize) -> &[u8] {
        &self.bytes[(t * self.nb + b) * BYTES..][..BYTES]
    }
}

/// The 4 activation bytes at `p` as one int32, to broadcast against 4 values of every row.
///
/// # Safety
/// `p` points at 4 readable bytes.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
pub(super) unsafe fn activation_group(p: *const i8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { (p as *const i32).read_unaligned() }
}

fn pack_tiles(
    rows: usize,
    nb: usize,
    ggml: &[u8],
    block_bytes: usize,
    tile_bytes: usize,
    pack_row: impl Fn(&[u8], usize, &mut [u8]) + Sync,
) -> Vec<u8> {
    let num_tiles = rows.div_ceil(TILE_ROWS);
    let mut bytes = vec![0u8; num_tiles * nb * tile_bytes];
    crate::cpu::pool::for_each_chunk_mut(&mut bytes, nb * tile_bytes, |t, tile_row| {
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
