//! The drivers as functions on tiny random-weight models (a Qwen2 GGUF in every role, a tiny
//! BERT embedder): evaluation, calibration, training and the routing benchmark, each called
//! directly rather than through the command line. One test binary: one link.

mod bench_route;
mod calibrate;
mod eval;
mod ingest;
mod train;

use std::path::Path;

use triage_drivers::{EvalConfig, System};
use triage_eval::suites::{Split, SuiteName};
use triage_router::ClassifierSetting;

/// A run of three kv-retrieval dev questions by rag, lc, edar and the oracle into `out`, over
/// the tiny models written into `dir`.
fn config(dir: &Path, out: &Path) -> EvalConfig {
    EvalConfig {
        suite: SuiteName::KvRetrieval,
        systems: vec![System::Rag, System::Lc, System::Edar, System::Oracle],
        out: out.to_path_buf(),
        limit: 3,
        seed: 1,
        split: Split::Dev,
        context_tokens: 1_200,
        config: triage_host::fixtures::tiny_config(dir).unwrap(),
        edar_classifier: ClassifierSetting::Off,
        quiet: true,
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
