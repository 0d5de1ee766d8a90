//! The systems an evaluation compares: the forced paths, the routed baselines, the oracle and
//! the configuration as given. A row names the system that answered it.

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};

/// The systems `triage eval` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// Closed book.
    None,
    /// Top-k dense RAG.
    Rag,
    /// Dense + BM25 hybrid RAG.
    Hybrid,
    /// The long-context model over the whole corpus.
    Lc,
    /// EDAR: the query classifier, then RAG escalating to LC on entropy above τ.
    Edar,
    /// Decide-then-retrieve: the closed-book gate, then dual-path RAG; no long context.
    Dtr,
    /// Self-Route: a RAG prompt that may answer "unanswerable", then long context.
    SelfRoute,
    /// Per query, the cheapest path system that was right.
    Oracle,
    /// The routing settings as configured (`--config`), unchanged: how your own setup does.
    Auto,
}

impl System {
    pub const ALL: [Self; 9] = [
        Self::None,
        Self::Rag,
        Self::Hybrid,
        Self::Lc,
        Self::Edar,
        Self::Dtr,
        Self::SelfRoute,
        Self::Oracle,
        Self::Auto,
    ];

    /// Systems that force one path; the oracle picks among them.
    pub const PATHS: [Self; 4] = [Self::None, Self::Rag, Self::Hybrid, Self::Lc];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Rag => "rag",
            Self::Hybrid => "hybrid",
            Self::Lc => "lc",
            Self::Edar => "edar",
            Self::Dtr => "dtr",
            Self::SelfRoute => "self-route",
            Self::Oracle => "oracle",
            Self::Auto => "auto",
        }
    }
}

impl std::str::FromStr for System {
    type Err = EvalError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|x| x.as_str()).collect();
                EvalError::Invalid(format!(
                    "unknown system {s:?} (one of {})",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_are_what_serde_writes() {
        for system in System::ALL {
            assert_eq!(system.as_str().parse::<System>().unwrap(), system);
            let json = serde_json::to_string(&system).unwrap();
            assert_eq!(json, format!("\"{}\"", system.as_str()));
        }
        let err = "psychic".parse::<System>().unwrap_err().to_string();
        assert!(
            err.starts_with("unknown system \"psychic\" (one of none, rag,"),
            "{err}"
        );
    }
}
