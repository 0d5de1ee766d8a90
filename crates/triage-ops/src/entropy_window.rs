//! Settings and state layout of the `entropy_window_f32` kernel: the engine's `EntropyMonitor`
//! (its CPU form) advanced on the device, one f64 `[sum, num_steps, decision, at_step]` row per
//! sequence. Shared by the CUDA launch (`cuda.rs` beside this file, `entropy_window_cuda`) and
//! the simulator tests.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
use crate::cuda::entropy_window as cuda;

pub use cuda::entropy_window_cuda;

/// Settings of one `entropy_window_f32` step (the engine's entropy threshold, flattened).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyWindowParams {
    /// Escalate once the window's sum exceeds `tau · window`.
    pub tau: f32,
    /// Values the window covers; it accepts after this many.
    pub window: usize,
    /// 0 full softmax, 1 top-k renormalised, 2 top-k residual, 3 sampled NLL.
    pub estimator: u32,
    /// 0 nats, 1 bits.
    pub unit: u32,
}

/// Columns of a sequence's state row.
pub const STATE_WIDTH: usize = 4;

/// The `decision` column: still deciding.
pub const DECISION_CONTINUE: f64 = 0.0;
/// The `decision` column: the mean stayed at or below τ over the window.
pub const DECISION_ACCEPT: f64 = 1.0;
/// The `decision` column: the sum passed `τ · window`; `at_step` says when.
pub const DECISION_ESCALATE: f64 = 2.0;
/// The `decision` column: a value the monitor would refuse (a NaN statistic, or a top-k
/// estimator without top-k columns).
pub const DECISION_INVALID: f64 = 3.0;
