//! Custom tensor ops for triage: each has a CPU implementation, a `*_slow` reference and (with the
//! `cuda` feature) a CUDA implementation behind the same API.
#![deny(unsafe_code)]

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
mod elem;
pub mod entropy_window;
pub mod error;
pub mod flash_attention;
pub mod kquant_matmul;
pub mod launch;
pub mod logits_reduce;
pub mod paged_attention;
pub mod q8_matmul;
pub mod rms_norm;
pub mod rope_and_cache;
pub mod silu_mul;
pub mod step_graph;

pub use cpu::KernelChoice;
pub use error::{OpsError, Result};
pub use kquant_matmul::{
    kquant_matmul, kquant_matmul_quantized, kquant_matmul_slow, KQuantKernel, KQuantMatrix,
    KQuantType, Q8KRows,
};
pub use logits_reduce::{
    logits_reduce, logits_reduce_packed, logits_reduce_slow, packed_width, FusedLogitsReduce,
    LogitsStats, MAX_PACKED_VOCAB, MAX_TOP_K,
};
pub use q8_matmul::{
    q8_matmul, q8_matmul_quantized, q8_matmul_slow, GgmlBlockType, Q8Kernel, Q8Matrix, Q8Rows,
};
