//! The commands of the `triage` binary, each driving the library: private to the binary.

pub mod args;
pub mod ask;
pub mod bench;
pub mod bench_escalate;
pub mod bench_retrieval;
pub mod bench_route;
pub mod calibrate;
pub mod eval;
pub mod retrieve;
pub mod serve;
pub mod train;

#[cfg(test)]
mod eval_tests;
