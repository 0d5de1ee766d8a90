//! Picking a CPU kernel at run time: the fastest this CPU runs, or the one an environment
//! variable names (all kernels of an op give the same bits, so the choice only changes speed;
//! benchmarks compare kernels with it). The AMX kernels (`Q8Kernel::Amx`, `KQuantKernel::Amx`)
//! are never picked by default, only when their variable names them: no AMX host has measured
//! them yet.

use std::sync::OnceLock;

/// What a kernel enum found, kept for the process: the kernels this CPU runs and the one
/// chosen. Each enum has one in a `static` (`KernelChoice::cells`).
pub struct KernelCells<K> {
    available: OnceLock<Vec<K>>,
    best: OnceLock<K>,
}

impl<K> KernelCells<K> {
    pub(crate) const fn new() -> Self {
        Self {
            available: OnceLock::new(),
            best: OnceLock::new(),
        }
    }
}

/// The compiled forms of one CPU op, of which one runs: `available` lists those this CPU runs,
/// `best` picks one once per process, `from_name` finds one by the name the environment variable
/// `ENV` takes. Implemented by `Q8Kernel`, `KQuantKernel` and `AttentionKernel`; only this crate
/// can implement it (it keeps the cells).
pub trait KernelChoice: Copy + PartialEq + Send + Sync + 'static {
    /// The variable that names the kernel `best` takes (`TRIAGE_Q8_KERNEL`, ...).
    const ENV: &'static str;
    /// The kernel every CPU runs; `detect` lists it first.
    const PORTABLE: Self;

    /// The kernel's name, as `ENV` takes it.
    fn name(self) -> &'static str;

    /// The kernels this CPU runs, slowest first (called once; see `available`).
    fn detect() -> Vec<Self>;

    /// Whether `best` takes this kernel without `ENV` naming it: `false` for a kernel not yet
    /// measured against the others on a host that runs it.
    fn measured(self) -> bool {
        true
    }

    /// Where the enum keeps what `available` and `best` found.
    fn cells() -> &'static KernelCells<Self>;

    /// The kernels this CPU runs, slowest first (detected once).
    fn available() -> &'static [Self] {
        Self::cells().available.get_or_init(Self::detect)
    }

    /// The kernel of this `name` (see `name`), if this CPU runs it.
    fn from_name(name: &str) -> Option<Self> {
        Self::available()
            .iter()
            .copied()
            .find(|k| k.name() == name.trim())
    }

    /// The kernel `ENV` names when this CPU runs it, else the fastest measured one. Read once.
    fn best() -> Self {
        *Self::cells().best.get_or_init(|| {
            std::env::var(Self::ENV)
                .ok()
                .and_then(|name| Self::from_name(&name))
                .or_else(|| {
                    Self::available()
                        .iter()
                        .rev()
                        .copied()
                        .find(|k| k.measured())
                })
                .unwrap_or(Self::PORTABLE)
        })
    }
}
