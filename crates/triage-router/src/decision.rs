//! The decision record every answer carries: what each stage saw and decided, why the final path
//! was taken, and tokens, time and cost per stage and per model. Plain data, defined in
//! `triage-types` so the evaluation reads it without the router; re-exported here.

pub use triage_types::decision::{
    ClassifierRecord, DecisionRecord, GateRecord, ModelUsage, MonitorRecord, MonitorVerdict,
    RerankerKind, RetrievalRecord, SearchKind, Stage, StageRecord, TauRecord,
};
