//! One host for the routing pipeline, below both the server and the `triage` façade: the config
//! file, loading models and the embedder, the corpus registry (open, check, pin, swap, unload),
//! answering, and the error kinds that the server turns into statuses and the CLI into exit
//! codes. How the models are reached (in this thread, or through engine threads) is the
//! [`ModelAccess`] the host is built over. No HTTP here.
#![forbid(unsafe_code)]

// The API is the re-exports below (and `fixtures` for tests); the modules are private.

mod config;
mod error;
mod host;
mod in_process;
mod loader;
mod object_prefixes;
mod registry;
#[cfg(test)]
mod test_models;

/// A config over tiny random-weight models for tests (the `test-support` feature).
#[cfg(feature = "test-support")]
pub mod fixtures;

pub use config::{
    read_api_key, role_name, CorpusLimits, ModelEntry, PipelineSettings, ServerSettings,
    TriageConfig,
};
pub use error::{error_kind, ErrorKind, HostError, Result};
pub use host::{Host, ModelAccess, DEFAULT_PIN_WAIT};
pub use in_process::{Engine, InProcessModels};
pub use loader::{load_embedder, load_model, load_shared};
pub use registry::{
    CorpusRegistry, CorpusSummary, DocumentSummary, DocumentsChange, PinStatus, PinTask, PrefixUse,
};
