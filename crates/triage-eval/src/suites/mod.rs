//! Evaluation suites: seeded generators (kv-retrieval, kv-litm, passkey, niah, synth-summary)
//! and loaders (squad-v2, hotpotqa), each a list of `Group`s — one corpus and the questions
//! asked over it — for a dev or a test split that never share an example. Groups never depend on
//! `--limit`: a suite makes whole groups until it has enough questions and the limit then cuts
//! the question list, so raising the limit of a run only appends questions, and every question
//! already answered keeps its corpus. From 8,192 context tokens on, the QA suites and
//! kv-retrieval are built at length (`at_length`).

mod at_length;
mod hotpotqa;
mod kv;
mod needles;
mod squad;
mod synth_summary;

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use triage_core::fnv1a;
use triage_policy::fold_of;
use triage_types::Document;

use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

/// One question, its gold answers and how they are scored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Example {
    pub id: String,
    pub question: String,
    /// Acceptable answers; empty = unanswerable (the right answer abstains).
    pub golds: Vec<String>,
    pub scorer: Scorer,
    /// Where the evidence sits in the corpus text, 0 = start, 1 = end (needle suites).
    pub depth: Option<f64>,
    /// Documents holding the evidence (retrieval labels), when known.
    pub gold_docs: Vec<String>,
    /// A sub-population label for the report ("unanswerable", "pairs=75", ...).
    pub kind: Option<String>,
}

/// A corpus and the questions asked over it.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub id: String,
    pub documents: Vec<Document>,
    pub examples: Vec<Example>,
}

/// The suites `triage eval` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SuiteName {
    KvRetrieval,
    KvLitm,
    Passkey,
    Niah,
    SquadV2,
    Hotpotqa,
    SynthSummary,
}

impl SuiteName {
    pub const ALL: [Self; 7] = [
        Self::KvRetrieval,
        Self::KvLitm,
        Self::Passkey,
        Self::Niah,
        Self::SquadV2,
        Self::Hotpotqa,
        Self::SynthSummary,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::KvRetrieval => "kv-retrieval",
            Self::KvLitm => "kv-litm",
            Self::Passkey => "passkey",
            Self::Niah => "niah",
            Self::SquadV2 => "squad-v2",
            Self::Hotpotqa => "hotpotqa",
            Self::SynthSummary => "synth-summary",
        }
    }
}

impl std::str::FromStr for SuiteName {
    type Err = EvalError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|n| n.as_str()).collect();
                EvalError::Invalid(format!("unknown suite {s:?} (one of {})", names.join(", ")))
            })
    }
}

/// Which half of a suite: tune on dev, report on test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Dev,
    Test,
}

impl Split {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dev => "dev",
            Self::Test => "test",
        }
    }
}

impl std::str::FromStr for Split {
    type Err = EvalError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dev" => Ok(Self::Dev),
            "test" => Ok(Self::Test),
            other => Err(EvalError::Invalid(format!(
                "unknown split {other:?} (dev or test)"
            ))),
        }
    }
}

/// The split a data set item belongs to, by the hash of its key (half each: the held-out rule,
/// `triage_policy::fold_of`, at two folds).
pub fn split_of(key: &str) -> Split {
    if fold_of(key, 2) == 0 {
        Split::Dev
    } else {
        Split::Test
    }
}

/// What to build.
pub struct SuiteParams<'a> {
    pub split: Split,
    pub seed: u64,
    /// Examples in all (the suite may make fewer when its data runs out).
    pub limit: usize,
    /// The target corpus length of each group, in the model's tokens.
    pub context_tokens: usize,
    /// Counts a text's tokens with the model's tokenizer.
    pub count_tokens: &'a dyn Fn(&str) -> usize,
    /// Where `triage models fetch --data` put squad.json, hotpotqa.json and
    /// PaulGrahamEssays.json.
    pub data_dir: PathBuf,
}

impl std::fmt::Debug for SuiteParams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuiteParams")
            .field("split", &self.split)
            .field("seed", &self.seed)
            .field("limit", &self.limit)
            .field("context_tokens", &self.context_tokens)
            .finish()
    }
}

impl SuiteParams<'_> {
    /// The generators' random source: a function of the seed, the suite and the split, so dev
    /// and test never share a corpus.
    fn rng(&self, suite: SuiteName) -> StdRng {
        let split = match self.split {
            Split::Dev => 0x9e37_79b9_7f4a_7c15,
            Split::Test => 0xc2b2_ae3d_27d4_eb4f,
        };
        StdRng::seed_from_u64(self.seed ^ fnv1a(suite.as_str()) ^ split)
    }

    fn data_file(&self, name: &str) -> Result<PathBuf> {
        let path = self.data_dir.join(name);
        if !path.exists() {
            return Err(EvalError::Invalid(format!(
                "{} is missing: run `triage models fetch --data`",
                path.display()
            )));
        }
        Ok(path)
    }
}

/// Build a suite's groups.
pub fn build(name: SuiteName, params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    if params.limit == 0 {
        return Err(EvalError::Invalid(
            "the question limit must be at least 1".into(),
        ));
    }
    if params.context_tokens < 128 {
        return Err(EvalError::Invalid(
            "a suite's context length must be at least 128 tokens".into(),
        ));
    }
    let mut rng = params.rng(name);
    let groups = match name {
        SuiteName::KvRetrieval => kv::kv_retrieval(params, &mut rng)?,
        SuiteName::KvLitm => kv::kv_litm(params, &mut rng)?,
        SuiteName::Passkey => needles::passkey(params, &mut rng),
        SuiteName::Niah => needles::niah(params, &mut rng)?,
        SuiteName::SquadV2 => squad::squad_v2(params)?,
        SuiteName::Hotpotqa => hotpotqa::hotpotqa(params)?,
        SuiteName::SynthSummary => synth_summary::synth_summary(params, &mut rng),
    };
    let mut groups = groups;
    let mut left = params.limit;
    for g in &mut groups {
        g.examples.truncate(left);
        left -= g.examples.len();
    }
    groups.retain(|g| !g.examples.is_empty());
    let mut seen = std::collections::HashSet::new();
    for e in groups.iter().flat_map(|g| &g.examples) {
        if !seen.insert(e.id.as_str()) {
            return Err(EvalError::Invalid(format!(
                "suite {} made the example id {} twice",
                name.as_str(),
                e.id
            )));
        }
    }
    Ok(groups)
}

/// The ten depths 0, 1/9, ..., 1 in an order whose every prefix is spread over [0, 1], so a
/// group cut short by the limit still covers the range.
pub(crate) const SPREAD_DEPTHS: [f64; 10] = [
    0.0,
    1.0,
    4.0 / 9.0,
    2.0 / 9.0,
    7.0 / 9.0,
    5.0 / 9.0,
    1.0 / 9.0,
    8.0 / 9.0,
    3.0 / 9.0,
    6.0 / 9.0,
];

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// Roughly a subword tokenizer: one token per 4 characters.
    pub fn count(text: &str) -> usize {
        text.len().div_ceil(4)
    }

    pub fn params(split: Split, limit: usize, context_tokens: usize) -> SuiteParams<'static> {
        SuiteParams {
            split,
            seed: 7,
            limit,
            context_tokens,
            count_tokens: &count,
            data_dir: PathBuf::from("/nonexistent"),
        }
    }
}
