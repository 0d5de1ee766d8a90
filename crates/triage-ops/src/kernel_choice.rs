//! Picking a CPU kernel at run time: the fastest this CPU runs, or the one an environment
//! variable names (all kernels of an op give the same bits, so the choice only changes speed;
//! benchmarks compare kernels with it).

/// The kernel among `available` whose name (`name_of`) is `name`.
pub(crate) fn named<K: Copy>(
    available: &[K],
    name: &str,
    name_of: impl Fn(K) -> &'static str,
) -> Option<K> {
    available
        .iter()
        .copied()
        .find(|&k| name_of(k) == name.trim())
}

/// The kernel the variable `env` names when this CPU runs it, else the fastest (`available`
/// lists them slowest first).
pub(crate) fn chosen<K: Copy>(
    env: &str,
    available: &[K],
    name_of: impl Fn(K) -> &'static str,
) -> Option<K> {
    std::env::var(env)
        .ok()
        .and_then(|name| named(available, &name, &name_of))
        .or_else(|| available.last().copied())
}
