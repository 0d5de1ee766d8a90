//! The CUDA kernels of `kernels/`, run on the CPU by the simulator, against the CPU ops of
//! `triage-ops` (and the engine's `EntropyMonitor`): fresh random inputs, outputs poisoned before
//! each launch, ids exact, values within each dtype's tolerance, at the shipped block size and at
//! the smallest one. CI runs this binary under several thread orders and poison bytes, and once
//! built with ASan and UBSan (`scripts/kernel-sim-tests`).

mod entropy_window;
mod inputs;
mod logits_reduce;
mod paged_attention;
mod prefill_attention;
mod reshape_and_cache;
mod rms_norm;
mod rope_and_cache;
mod silu_mul;
