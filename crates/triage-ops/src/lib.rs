//! Custom tensor ops for triage, for the CPU and (with the `cuda` feature) for CUDA.
//!
//! The layer and attention ops (`logits_reduce`, `add_rms_norm`/`rms_norm_to`, `silu_mul`,
//! `rope_and_cache`, `reshape_and_cache`, `paged_attention`) each have a CPU form, a `*_slow`
//! reference (`add_rms_norm_slow` with no delta is `rms_norm_to`'s) and, with the `cuda` feature,
//! a CUDA form behind the same API. The quantized matmuls (`q8_matmul`, `kquant_matmul`) and
//! `flash_attention` are CPU-only (on a GPU the models use candle's quantized matmul, and
//! `flash_attention` is `paged_attention`'s CPU form). `entropy_window` exists only as a CUDA
//! kernel, whose CPU form is the engine's `EntropyMonitor`.
//!
//! The API is what this file exports. Modules are private, with three namespaces kept whole:
//! `launch` (the launch geometry that the CUDA forms and the kernel simulator share; its functions
//! are named after the ops), `cuda` (opening a device, its memory) and `entropy_window` (the
//! device entropy window's settings and state layout).
#![deny(unsafe_code)]

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
mod elem;
pub mod entropy_window;
mod error;
mod flash_attention;
mod kquant_matmul;
pub mod launch;
mod logits_reduce;
mod paged_attention;
mod q8_matmul;
mod rms_norm;
mod rope_and_cache;
mod silu_mul;
mod step_graph;

pub use cpu::KernelChoice;
pub use error::{OpsError, Result};
pub use flash_attention::{
    flash_attention, flash_attention_with, AttentionKernel, AttentionShape, KvRows, SeqKeys,
};
pub use kquant_matmul::{
    kquant_matmul, kquant_matmul_quantized, kquant_matmul_slow, KQuantKernel, KQuantMatrix,
    KQuantType, Q8KRows,
};
pub use logits_reduce::{
    logits_reduce, logits_reduce_packed, logits_reduce_slow, packed_width, FusedLogitsReduce,
    LogitsStats, MAX_PACKED_VOCAB, MAX_TOP_K,
};
pub use paged_attention::{
    check_slots, paged_attention, paged_attention_planned, paged_attention_rows,
    paged_attention_slow, reshape_and_cache, reshape_and_cache_mapped, reshape_and_cache_slow,
    slot_of, DeviceRows, KernelRows, PagedAttentionMetadata, PagedAttentionPlan, PrefillTiles,
    SlotMapping, PADDING_SLOT, PREFILL_ATTENTION_ENV,
};
pub use q8_matmul::{
    q8_matmul, q8_matmul_quantized, q8_matmul_slow, GgmlBlockType, Q8Kernel, Q8Matrix, Q8Rows,
};
pub use rms_norm::{add_rms_norm, add_rms_norm_slow, rms_norm_to};
pub use rope_and_cache::{rope_and_cache, rope_and_cache_slow, QkvShape, RopeInputs};
pub use silu_mul::{silu_mul, silu_mul_slow};
pub use step_graph::{upload_u32, StepBuffer, StepGraph};
