//! `triage serve`: an OpenAI-compatible HTTP server over the engine (axum + tokio). The only
//! crate that knows HTTP and OpenAI's wire types.
#![forbid(unsafe_code)]

pub mod api_error;
pub mod app;
pub mod corpus_header;
pub mod error;
pub mod generation;
pub mod guard;
pub mod loads;
pub mod metrics;
pub mod responses;
pub mod routed;
pub mod routing;
pub mod startup;
pub mod wire;
pub mod worker;

pub use app::{router, serve, shutdown_signal, AppState};
pub use error::{Result, ServerError};
pub use worker::EngineWorker;
