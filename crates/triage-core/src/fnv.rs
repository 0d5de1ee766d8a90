//! 64-bit FNV-1a, the one hash the workspace persists: block hashes of saved prefixes, data-set
//! splits, held-out groups, the hashing embedder's buckets. Unlike the std hasher it is stable
//! across runs, processes, platforms and Rust versions, so changing it invalidates saved data.

/// The FNV-1a 64-bit offset basis: the hash of no bytes.
pub const FNV1A_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV1A_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: impl AsRef<[u8]>) -> u64 {
    fnv1a_extend(FNV1A_OFFSET, bytes)
}

/// Continue the FNV-1a hash `h` over `bytes`: hashing in pieces equals hashing the whole.
pub fn fnv1a_extend(h: u64, bytes: impl AsRef<[u8]>) -> u64 {
    bytes
        .as_ref()
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV1A_PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_test_vectors() {
        // From the FNV reference test suite (Noll, test_fnv.c, FNV-1a 64-bit).
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a("chongo was here!\n"), 0x4681_0940_eff5_f915);
    }

    #[test]
    fn hashing_in_pieces_equals_hashing_the_whole() {
        assert_eq!(fnv1a_extend(fnv1a("foo"), "bar"), fnv1a("foobar"));
        assert_eq!(fnv1a_extend(FNV1A_OFFSET, b"foobar"), fnv1a(b"foobar"));
    }
}
