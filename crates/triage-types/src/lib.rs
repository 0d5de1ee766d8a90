//! Plain data shared by the router, the server and the evaluation: documents, route paths, model
//! roles, the decision record, the signals an answer carries. Definitions and trivially pure
//! methods only; the logic that fills them stays with the router and the engine, and the
//! policies that learn from them live in `triage-policy`. No candle, no engine: `triage-eval`
//! reads results files through these types without linking a model.
#![forbid(unsafe_code)]

mod decision;
mod document;
mod entropy;
mod error;
mod float;
mod routing;
mod signals;

pub use decision::{
    ClassifierRecord, DecisionRecord, GateRecord, ModelUsage, MonitorRecord, MonitorVerdict,
    RerankerKind, RetrievalRecord, SearchKind, Stage, StageRecord, TauRecord,
};
pub use document::Document;
pub use entropy::{EntropyEstimator, EntropyUnit};
pub use error::UnknownName;
pub use routing::{Calibration, ModelRole, Price, Prices, QueryClass, RoutePath, UNANSWERABLE};
pub use signals::{AnswerSignals, GainDecision, GroundingFeatures, ProbeStates, RetrievalFeatures};
