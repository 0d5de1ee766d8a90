//! `triage serve`: an OpenAI-compatible HTTP server over the engine (axum + tokio). The only
//! crate that knows HTTP and OpenAI's wire types.
#![forbid(unsafe_code)]

// The API is the re-exports below: the app (`router`, `serve`), the state and engine workers it
// is built from, and the startup helpers. Handlers, wire types and metrics are private.

mod api_error;
mod app;
mod corpus_header;
mod error;
mod generation;
mod guard;
mod loads;
mod metrics;
mod responses;
mod routed;
mod routing;
mod startup;
mod wire;
mod worker;

pub use app::{router, serve, shutdown_signal, AppState};
pub use error::{Result, ServerError};
pub use routing::RoutingService;
pub use startup::{routing_service, start_workers};
pub use worker::EngineWorker;
