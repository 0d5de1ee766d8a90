//! The routing vocabulary: the paths a query may take, the models that play a role in them, what
//! their tokens cost, and where a calibrated threshold came from.

use serde::{Deserialize, Serialize};

use crate::entropy::{EntropyEstimator, EntropyUnit};
use crate::error::UnknownName;

/// How a query may be answered, cheapest kind first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutePath {
    /// Closed book: the base model's own answer, no retrieval.
    None,
    /// Retrieved chunks (dense or dual-path) with the base model.
    Rag,
    /// Chunks from the dense + BM25 hybrid with the base model.
    Hybrid,
    /// The long-context model over the whole corpus.
    Lc,
}

impl RoutePath {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Rag => "rag",
            Self::Hybrid => "hybrid",
            Self::Lc => "lc",
        }
    }
}

/// What a model is used for in the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelRole {
    /// Classifies queries zero-shot.
    Router,
    /// Answers closed-book and over retrieved chunks; judges relevance; writes pseudo-passages.
    Base,
    /// Answers over the whole corpus. `long-context` is read too: the CLI spells it that way.
    #[serde(alias = "long-context")]
    LongContext,
}

impl ModelRole {
    pub const ALL: [ModelRole; 3] = [Self::Router, Self::Base, Self::LongContext];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Router => "router",
            Self::Base => "base",
            Self::LongContext => "long_context",
        }
    }
}

/// What kind of question a query is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryClass {
    Point,
    Global,
}

impl std::str::FromStr for QueryClass {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "point" => Ok(Self::Point),
            "global" => Ok(Self::Global),
            other => Err(UnknownName {
                what: "query class",
                name: other.to_string(),
                expected: "point or global",
            }),
        }
    }
}

/// What a Self-Route answer says when the context is insufficient.
pub const UNANSWERABLE: &str = "unanswerable";

/// How `triage calibrate` chose τ, and what it measured on the dev split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// The base model τ was calibrated on.
    pub model: String,
    pub estimator: EntropyEstimator,
    pub unit: EntropyUnit,
    pub window: usize,
    pub suite: String,
    pub split: String,
    pub queries: usize,
    /// SHA-256 of the dev examples (ids, questions and gold answers).
    pub data_sha256: String,
    /// How τ was picked ("elbow", "min-accuracy 0.70", ...).
    pub rule: String,
    /// Dev metrics at τ.
    pub accuracy: f64,
    pub rag_accuracy: f64,
    pub lc_accuracy: f64,
    pub escalation_rate: f64,
    pub accuracy_retained: f64,
    pub token_reduction: f64,
}

/// Price of a model's tokens, per million.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub prompt: f64,
    /// Prompt tokens found in the prefix cache: not prefilled, but still read by attention at
    /// every generated token.
    pub cached_prompt: f64,
    pub completion: f64,
}

impl Price {
    pub fn cost(&self, prompt: usize, cached: usize, completion: usize) -> f64 {
        let uncached = prompt.saturating_sub(cached);
        (uncached as f64 * self.prompt
            + cached as f64 * self.cached_prompt
            + completion as f64 * self.completion)
            / 1e6
    }
}

/// Prices per role. The defaults are relative compute, not money: the long-context model
/// (1.5B) costs three times the base model (0.5B) per token, a generated token three times a
/// prefilled one, a cached token a quarter of a prefilled one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Prices {
    pub router: Price,
    pub base: Price,
    pub long_context: Price,
}

impl Default for Prices {
    fn default() -> Self {
        let base = Price {
            prompt: 1.0,
            cached_prompt: 0.25,
            completion: 3.0,
        };
        Self {
            router: Price {
                prompt: 0.3,
                cached_prompt: 0.075,
                completion: 0.9,
            },
            base,
            long_context: Price {
                prompt: 3.0,
                cached_prompt: 0.75,
                completion: 9.0,
            },
        }
    }
}

impl Prices {
    pub fn of(&self, role: ModelRole) -> Price {
        match role {
            ModelRole::Router => self.router,
            ModelRole::Base => self.base,
            ModelRole::LongContext => self.long_context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_context_role_reads_both_spellings_and_writes_one() {
        let snake: ModelRole = serde_json::from_str("\"long_context\"").unwrap();
        let kebab: ModelRole = serde_json::from_str("\"long-context\"").unwrap();
        assert_eq!(
            (snake, kebab),
            (ModelRole::LongContext, ModelRole::LongContext)
        );
        assert_eq!(
            serde_json::to_string(&ModelRole::LongContext).unwrap(),
            "\"long_context\""
        );
        assert!(serde_json::from_str::<ModelRole>("\"longcontext\"").is_err());
        for role in ModelRole::ALL {
            let json = serde_json::to_string(&role).unwrap();
            assert_eq!(json, format!("\"{}\"", role.as_str()));
        }
    }

    #[test]
    fn route_paths_write_their_names() {
        for path in [
            RoutePath::None,
            RoutePath::Rag,
            RoutePath::Hybrid,
            RoutePath::Lc,
        ] {
            let json = serde_json::to_string(&path).unwrap();
            assert_eq!(json, format!("\"{}\"", path.as_str()));
            assert_eq!(serde_json::from_str::<RoutePath>(&json).unwrap(), path);
        }
    }

    #[test]
    fn query_classes_parse() {
        assert_eq!("global".parse::<QueryClass>(), Ok(QueryClass::Global));
        let err = "local".parse::<QueryClass>().unwrap_err().to_string();
        assert_eq!(err, "unknown query class \"local\" (point or global)");
    }
}
