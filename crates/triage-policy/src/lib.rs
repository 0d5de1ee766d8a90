//! The learned routing policies, model-free: the small linear solvers (logistic, ridge,
//! mass-mean), the combined escalation score and its inputs, the hidden-state probe, the
//! retrieval-gain policy, the query classifier's fit and score, the one held-out split rule,
//! AUROC, and fitted models frozen to files with their hash. No candle, no engine, no tokio: the
//! router scores with these and the evaluation fits and measures them with the same code.
#![forbid(unsafe_code)]

mod classifier;
mod combined;
mod error;
mod frozen;
mod gain;
mod linear;
mod probe;
mod split;
mod stats;

pub use classifier::{
    best_threshold_of, read_labelled, Classification, ClassifierQuality, LabelledQuery,
    LearnedClassifierModel,
};
pub use combined::{
    combined_inputs, is_decline, model_for, out_of_fold_p_wrong, CombinedScore, CombinedScoreModel,
    COMBINED_INPUTS, COMBINED_L2,
};
pub use error::{PolicyError, Result};
pub use frozen::{freeze, thaw, Frozen};
pub use gain::{
    GainExample, GainPolicy, GainPolicyModel, GainReport, HYBRID_CALL_COST, RIDGE_PENALTY,
};
pub use linear::{LogisticModel, MassMeanProbe, RidgeModel, Standardizer};
pub use probe::{out_of_fold_scores, ProbeModel};
pub use split::{fold_of, is_held_out, is_test_group, TEST_GROUP_EVERY};
pub use stats::auroc;
