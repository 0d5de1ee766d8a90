//! Plain data shared by the router, the server and the evaluation: documents, route paths, model
//! roles, the decision record. Definitions and trivially pure methods only; the logic that fills
//! them stays with the router and the engine. No candle, no engine: `triage-eval` reads results
//! files through these types without linking a model.
#![forbid(unsafe_code)]

pub mod decision;
pub mod document;
pub mod entropy;
pub mod error;
mod float;
pub mod linear;
pub mod routing;
pub mod signals;
pub mod stats;

pub use decision::{
    ClassifierRecord, DecisionRecord, GateRecord, ModelUsage, MonitorRecord, MonitorVerdict,
    RerankerKind, RetrievalRecord, SearchKind, Stage, StageRecord, TauRecord,
};
pub use document::Document;
pub use entropy::{EntropyEstimator, EntropyUnit};
pub use error::UnknownName;
pub use routing::{Calibration, ModelRole, Price, Prices, QueryClass, RoutePath, UNANSWERABLE};
pub use signals::{AnswerSignals, GainDecision, GroundingFeatures, ProbeStates, RetrievalFeatures};
pub use stats::auroc;
