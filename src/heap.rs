//! The C heap's settings for CPU inference: keep freed blocks for reuse instead of giving them
//! back to the kernel after every operation. A prefill step allocates and frees tens of
//! megabytes per layer (each op's fresh output tensor); with glibc's defaults such blocks are
//! mapped and unmapped, or trimmed off the heap, and taken again, so every step pays page faults
//! and page zeroing (≈ 10 % of a 1.5B prefill's samples in kernel page handling, and 145 → 245
//! tok/s at 512 tokens once kept, `benches/RESULTS.md`). llama.cpp avoids the same cost by
//! allocating its compute buffers once.

/// Largest block served from the heap's arenas rather than a mapping of its own: the most
/// glibc's own dynamic threshold ever reaches on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`). Setting it
/// also stops glibc from adjusting it, which would otherwise move the trim threshold below.
/// Raising it to 4 GiB gave the same speed at 1.55 GB peak instead of 1.41 (the 1.5B at 512).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of a heap that is kept rather than returned to the kernel.
const TRIM_THRESHOLD: i32 = 1 << 30;

/// The environment variables by which a user tunes glibc's heap; any of them set wins over
/// [`retain_freed_memory`].
const USER_SETTINGS: [&str; 3] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "GLIBC_TUNABLES",
];

/// Set the heap to keep freed blocks (glibc on Linux; elsewhere nothing changes). Returns
/// whether the C library took both settings; false where it is not glibc or where the user set
/// the heap's tuning through the environment. Call it once, at the start of the program, before
/// any thread or model allocates.
pub fn retain_freed_memory() -> bool {
    if USER_SETTINGS.iter().any(|v| std::env::var_os(v).is_some()) {
        return false;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_thresholds() -> bool {
    // SAFETY: `mallopt` has no memory-safety preconditions: it takes the main arena's lock and
    // changes tuning parameters, which later allocations read (glibc `malloc.c`, `__libc_mallopt`).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(test)]
mod tests {
    /// Both settings are taken (`mallopt` returns 1): a value glibc refuses would leave the
    /// defaults, and prefill would lose the speed silently.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_both_settings() {
        assert!(super::set_thresholds());
    }
}
