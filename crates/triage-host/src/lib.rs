//! One host for the routing pipeline, below both the server and the `triage` façade: the config
//! file, loading models and the embedder, the corpus registry (open, check, pin, swap, unload),
//! answering, and the error kinds that the server turns into statuses and the CLI into exit
//! codes. How the models are reached (in this thread, or through engine threads) is the
//! [`ModelAccess`] the host is built over. No HTTP here.
#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod fixtures;
pub mod host;
pub mod in_process;
pub mod loader;
pub mod object_prefixes;
pub mod registry;

pub use config::{ModelEntry, PipelineSettings, ServerSettings, TriageConfig};
pub use error::{error_kind, ErrorKind, HostError, Result};
pub use host::{Host, ModelAccess};
pub use in_process::{Engine, InProcessModels};
pub use registry::{CorpusRegistry, CorpusSummary, DocumentSummary, DocumentsChange, PrefixUse};
