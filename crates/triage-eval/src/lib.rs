//! triage-eval: the evaluation and calibration harness's model-free half — suites (seeded
//! generators and data set loaders, dev/test splits), answer scoring, the results file, paired
//! bootstrap statistics, the τ sweep, `triage calibrate`'s choice of τ, the report and its
//! figures. The binary runs the models and feeds rows in; the policies it fits and measures are
//! `triage-policy`'s.
//!
//! The public modules are the namespaces the binary's commands call into (`report::build`,
//! `suites::build`, `calibrate::calibrate`, `signal_study::markdown`, ...); the rest is private,
//! and what callers name from it is re-exported here.
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod combined_calibration;
pub mod datasets;
pub mod plots;
pub mod report;
pub mod route_analysis;
pub mod signal_study;
pub mod suites;

mod combined_sweep;
mod error;
mod probe;
mod results;
mod scoring;
mod stats;
mod sweep;
mod system;

pub use combined_sweep::CombinedSweep;
pub use error::{EvalError, Result};
pub use probe::ProbeAuroc;
pub use results::{AnswerParts, ResultRow, ResultsFile, RowContext, StageTokens};
pub use scoring::{
    abstains, contains_answer, exact_match, f1, normalize_answer, rouge_l_summary, Score, Scorer,
    ROUGE_L_CORRECT,
};
pub use stats::{Estimate, PairedBootstrap};
pub use sweep::{by_escalation_rate, CurveArea, RagLcPair, SweepPoint};
pub use system::System;
