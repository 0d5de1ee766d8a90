//! triage-eval: the evaluation and calibration harness's model-free half — suites (seeded
//! generators and data set loaders, dev/test splits), answer scoring, the results file, paired
//! bootstrap statistics, the τ sweep, `triage calibrate`'s choice of τ, the report and its
//! figures. The binary runs the models and feeds rows in.
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod combined_calibration;
pub mod combined_sweep;
pub mod datasets;
pub mod error;
pub mod plots;
pub mod probe;
pub mod report;
pub mod results;
pub mod route_analysis;
pub mod scoring;
pub mod signal_study;
pub mod stats;
pub mod suites;
pub mod sweep;
pub mod system;

pub use error::{EvalError, Result};
pub use system::System;
