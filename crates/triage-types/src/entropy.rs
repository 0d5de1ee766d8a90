//! How an entropy value and the threshold τ compared with it are measured: a τ only means
//! something together with its estimator and unit, so both travel with every record of it.

use serde::{Deserialize, Serialize};

/// How one step's uncertainty is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntropyEstimator {
    /// Shannon entropy of the whole softmax (`LogitsStats::entropy`).
    #[default]
    FullSoftmax,
    /// Entropy of the top-k probabilities renormalised to sum to 1: ignores the tail.
    TopKRenormalized,
    /// Entropy of the top-k probabilities plus one bucket holding the rest of the mass
    /// `1 - Σ p_topk`: a lower bound on the full entropy.
    TopKResidual,
    /// Negative logprob of the sampled token, `-(logit_tok - log_sum_exp)`: the surprise of what
    /// was actually generated (the decide-then-retrieve statistic).
    SampledNll,
}

/// The unit of entropy values and of the threshold compared with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntropyUnit {
    /// Natural logarithm.
    #[default]
    Nats,
    /// Base-2 logarithm: nats / ln 2.
    Bits,
}

impl EntropyUnit {
    /// Converts a value in nats to this unit.
    pub fn convert_nats(self, nats: f64) -> f64 {
        match self {
            Self::Nats => nats,
            Self::Bits => nats / std::f64::consts::LN_2,
        }
    }
}
