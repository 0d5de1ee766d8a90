//! The CPU layer under the ops' x86 kernels: what this CPU runs (detected once), how an op picks
//! its kernel, the AMX tile primitives, and the thread pool the ops' tasks run on.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
mod isa;
mod kernel_choice;
pub(crate) mod pool;

pub(crate) use isa::Isa;
pub(crate) use kernel_choice::KernelCells;
pub use kernel_choice::KernelChoice;
