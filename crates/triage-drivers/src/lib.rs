//! The drivers behind the `triage` command line, as functions: evaluate a suite, calibrate the
//! escalation threshold, fit the routing policies, study the signals, and the benchmarks
//! (prefix cache, decode, escalation, retrieval, routing), with ingest and retrieve over the
//! corpora under `$TRIAGE_HOME`. Each takes a plain parameters struct and returns its result;
//! what the command line prints is the binary's. What a driver writes is a file it was asked
//! for (a run directory, a routing TOML, a saved policy) and progress on stderr (a bar or a
//! line per stage), never its result.
#![forbid(unsafe_code)]

mod bench;
mod bench_escalate;
mod bench_retrieval;
mod bench_route;
mod calibrate;
mod calibrated_file;
mod error;
mod eval;
mod retrieve;
mod signals;
mod train;

pub use bench::{bench_decode, bench_prefix, DecodeResult, FirstToken, PrefixBench};
pub use bench_escalate::{bench_escalate, EscalateBench, EscalateBenchConfig};
pub use bench_retrieval::{
    bench_retrieval, ArmScores, Latency, RetrievalBench, RetrievalBenchConfig, KS,
};
pub use bench_route::{bench_route, RouteBenchConfig};
pub use calibrate::{
    calibrate, offer_run_dir, CalibrateOptions, Calibrated, CombinedSaved, OtherSetting,
};
pub use error::{DriverError, Result};
pub use eval::{
    default_edar_classifier, evaluate, export_suite, EvalConfig, EvalRun, System,
    DEFAULT_CONTEXT_TOKENS, DTR_GATE_NLL,
};
pub use retrieve::{ingest, retrieve, sync_milvus, IngestParams, RetrieveQuery};
pub use signals::{
    save_combined_score, save_probe, study_signals, ProbeSaved, SignalsParams, SignalsStudy,
};
pub use train::{
    default_classifier_path, policy_dir, train_classifier, train_gain_policy, ClassifierParams,
    ClassifierReport, GainPolicyParams, GainPolicyReport,
};
