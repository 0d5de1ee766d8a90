//! `results.jsonl`: one `ResultRow` per query and system, appended as each answer is scored, so
//! an interrupted run resumes where it stopped.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use triage_types::{DecisionRecord, RoutePath};

use crate::error::{io_error, EvalError, Result};
use crate::scoring::Score;
use crate::suites::{Example, Split};
use crate::system::System;

/// Tokens one stage (or a whole answer) used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTokens {
    pub stage: String,
    /// The model role, absent for stages without a model (retrieval).
    pub model: Option<String>,
    pub prompt: usize,
    pub cached: usize,
    pub completion: usize,
    pub ms: f64,
}

/// One system's answer to one query, scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    pub suite: String,
    pub split: Split,
    pub system: System,
    pub group: String,
    pub example: String,
    pub question: String,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub depth: Option<f64>,
    pub golds: Vec<String>,
    pub answer: String,
    pub score: Score,
    /// The path that produced the answer.
    pub path: RoutePath,
    /// A RAG answer was generated and then escalated to the long-context model.
    pub escalated: bool,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub stages: Vec<StageTokens>,
    /// In the router's price units.
    pub cost: f64,
    pub ms: f64,
    /// The monitor's statistic over the RAG answer (what τ is compared with), when one ran.
    #[serde(default)]
    pub rag_statistic: Option<f64>,
    /// Mean entropy of the RAG answer's first tokens, preamble included.
    #[serde(default)]
    pub rag_mean_entropy: Option<f64>,
    /// The oracle's row: which system's answer it took.
    #[serde(default)]
    pub derived_from: Option<System>,
    /// The routing decision record as the engine wrote it.
    pub decision: DecisionRecord,
}

/// Which suite and split a row belongs to.
#[derive(Debug, Clone)]
pub struct RowContext<'a> {
    pub suite: &'a str,
    pub split: Split,
    pub group: &'a str,
}

/// What the router returned for one query, in the parts a row keeps.
#[derive(Debug, Clone, Copy)]
pub struct AnswerParts<'a> {
    pub text: &'a str,
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_ms: f64,
    pub decision: &'a DecisionRecord,
}

fn finite(x: f32) -> Option<f64> {
    x.is_finite().then_some(f64::from(x))
}

impl ResultRow {
    /// The row for `system`'s `answer` to `example`.
    pub fn from_answer(
        at: &RowContext<'_>,
        system: System,
        example: &Example,
        answer: AnswerParts<'_>,
        score: Score,
    ) -> Self {
        let d = answer.decision;
        let monitor = d.monitor.as_ref();
        Self {
            suite: at.suite.to_string(),
            split: at.split,
            system,
            group: at.group.to_string(),
            example: example.id.clone(),
            question: example.question.clone(),
            kind: example.kind.clone(),
            depth: example.depth,
            golds: example.golds.clone(),
            answer: answer.text.to_string(),
            score,
            path: d.path,
            escalated: d.path == RoutePath::Lc && monitor.is_some(),
            prompt_tokens: answer.prompt_tokens,
            cached_tokens: answer.cached_prompt_tokens,
            completion_tokens: answer.completion_tokens,
            stages: d
                .stages
                .iter()
                .map(|s| StageTokens {
                    stage: s.stage.as_str().to_string(),
                    model: s.model.map(|m| m.as_str().to_string()),
                    prompt: s.prompt_tokens,
                    cached: s.cached_prompt_tokens,
                    completion: s.completion_tokens,
                    ms: s.ms,
                })
                .collect(),
            cost: d.cost,
            ms: answer.total_ms,
            rag_statistic: monitor.and_then(|m| m.mean).and_then(finite),
            rag_mean_entropy: monitor.and_then(|m| finite(m.signals.mean_entropy)),
            derived_from: None,
            decision: d.clone(),
        }
    }

    /// Every token the answer cost, cached prompt tokens included.
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }

    /// The tokens that were computed: prompt tokens not found in the cache, and the completion.
    pub fn computed_tokens(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.cached_tokens) + self.completion_tokens
    }
}

/// The results file of one run directory, with what it already holds.
#[derive(Debug)]
pub struct ResultsFile {
    path: PathBuf,
    rows: Vec<ResultRow>,
    done: HashSet<(String, String)>,
}

impl ResultsFile {
    /// Open (or start) `dir/results.jsonl`. A last line cut short by an interrupted write is
    /// dropped; any other unreadable line is an error, so no result is silently lost.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let path = dir.join("results.jsonl");
        let mut rows = Vec::new();
        if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            for (i, line) in lines.iter().enumerate() {
                match serde_json::from_str::<ResultRow>(line) {
                    Ok(row) => rows.push(row),
                    Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                        // Rewrite the file without the torn line.
                        let keep: String = lines[..i].iter().map(|l| format!("{l}\n")).collect();
                        std::fs::write(&path, keep).map_err(io_error(&path))?;
                    }
                    Err(source) => {
                        return Err(EvalError::Json {
                            path: format!("{} line {}", path.display(), i + 1),
                            source,
                        })
                    }
                }
            }
        }
        let done = rows
            .iter()
            .map(|r| (r.system.as_str().to_string(), r.example.clone()))
            .collect();
        Ok(Self { path, rows, done })
    }

    pub fn is_done(&self, system: &str, example: &str) -> bool {
        self.done
            .contains(&(system.to_string(), example.to_string()))
    }

    /// Append a row and flush it to disk before returning.
    pub fn append(&mut self, row: ResultRow) -> Result<()> {
        let line = serde_json::to_string(&row).map_err(|source| EvalError::Json {
            path: self.path.display().to_string(),
            source,
        })?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(io_error(&self.path))?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .map_err(io_error(&self.path))?;
        self.done
            .insert((row.system.as_str().to_string(), row.example.clone()));
        self.rows.push(row);
        Ok(())
    }

    pub fn rows(&self) -> &[ResultRow] {
        &self.rows
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row with the fields the metrics read; a path system's row took its path, any other
    /// system's row RAG.
    pub fn row(system: &str, example: &str, correct: bool, tokens: usize) -> ResultRow {
        let system: System = system.parse().unwrap();
        let path = match system {
            System::None => RoutePath::None,
            System::Hybrid => RoutePath::Hybrid,
            System::Lc => RoutePath::Lc,
            _ => RoutePath::Rag,
        };
        let mut decision = DecisionRecord::new(false);
        decision.path = path;
        ResultRow {
            suite: "kv-retrieval".into(),
            split: Split::Dev,
            system,
            group: "g".into(),
            example: example.into(),
            question: "q".into(),
            kind: None,
            depth: None,
            golds: vec!["a".into()],
            answer: "a".into(),
            score: Score {
                value: f64::from(u8::from(correct)),
                correct,
                em: None,
                f1: None,
            },
            path,
            escalated: false,
            prompt_tokens: tokens,
            cached_tokens: 0,
            completion_tokens: 0,
            stages: Vec::new(),
            cost: tokens as f64,
            ms: 1.0,
            rag_statistic: None,
            rag_mean_entropy: None,
            derived_from: None,
            decision,
        }
    }

    /// A line of `results.jsonl` as `triage eval` wrote it before rows were typed (the decision
    /// record a JSON value with sorted keys, its f32s widened, NaN and ∞ as `null`).
    const UNTYPED_ROW: &str = r#"{"suite":"squad-v2","split":"dev","system":"edar","group":"g0","example":"ex-7","question":"What is the capital of France?","kind":"answerable","depth":null,"golds":["Paris"],"answer":"Paris","score":{"value":1.0,"correct":true,"em":1.0,"f1":1.0},"path":"lc","escalated":true,"prompt_tokens":2350,"cached_tokens":1910,"completion_tokens":24,"stages":[{"stage":"rag","model":"base","prompt":300,"cached":0,"completion":12,"ms":80.0},{"stage":"retrieve","model":null,"prompt":0,"cached":0,"completion":0,"ms":3.0}],"cost":0.0021875,"ms":255.0,"rag_statistic":0.8125,"rag_mean_entropy":0.625,"derived_from":null,"decision":{"classifier":{"classifier":"zero_shot","label":"point","p_global":0.125},"cost":0.0021875,"estimated_costs":{"lc":0.0025,"none":0.00005,"rag":0.00015},"forced":false,"gate":{"answer":"Paris","answered":false,"mean_nll":0.75,"threshold":null},"monitor":{"combined_p_wrong":null,"combined_threshold":null,"decided_at":3,"decision":"escalate","in_answer_span":[false,true,true],"mean":0.8125,"rag_answer":"Lyon","signals":{"declined":false,"max_entropy":1.5,"mean_entropy":0.625,"mean_nll":0.5,"mean_top2_margin":null,"span_mean_entropy":0.8125},"tau":{"estimator":"full_softmax","model":"qwen2.5-0.5b","tau":0.6000000238418579,"unit":"nats","window":30},"trace":[0.25,1.5,0.125]},"path":"lc","reason":"entropy above tau","retrieval":{"chunk_ids":["doc-1#0","doc-2#3"],"features":{"dense_rerank_overlap":0.699999988079071,"mean_top5_dense":0.5,"rerank_top1_dense_rank":11.0,"structural_fraction":0.10000000149011612,"top1_dense":0.8125,"top2_margin":null},"gain_policy":{"predicted_delta":-0.03,"run_hybrid":false,"tau_h":0.02},"reranker":"llm","search":"dense"},"stages":[{"cached_prompt_tokens":0,"completion_tokens":0,"cost":0.0,"model":"router","ms":1.25,"prompt_tokens":0,"stage":"classify"},{"cached_prompt_tokens":10,"completion_tokens":4,"cost":0.0000545,"model":"base","ms":20.5,"prompt_tokens":50,"stage":"gate"},{"cached_prompt_tokens":0,"completion_tokens":0,"cost":0.0,"model":null,"ms":3.0,"prompt_tokens":0,"stage":"retrieve"},{"cached_prompt_tokens":0,"completion_tokens":12,"cost":0.000336,"model":"base","ms":80.0,"prompt_tokens":300,"stage":"rag"},{"cached_prompt_tokens":1900,"completion_tokens":8,"cost":0.001797,"model":"long_context","ms":150.0,"prompt_tokens":2000,"stage":"lc"}]}}"#;

    #[test]
    fn a_row_written_before_the_types_reads_back_whole() {
        let row: ResultRow = serde_json::from_str(UNTYPED_ROW).unwrap();
        assert_eq!(
            (row.system, row.split, row.path),
            (System::Edar, Split::Dev, RoutePath::Lc)
        );
        let d = &row.decision;
        assert_eq!(d.path, RoutePath::Lc);
        let monitor = d.monitor.as_ref().unwrap();
        assert_eq!(monitor.tau.tau, 0.6);
        assert!(monitor.signals.mean_top2_margin.is_nan());
        assert!(d.gate.as_ref().unwrap().threshold.is_nan());
        assert_eq!(d.stages.len(), 5);
        // Nothing is lost: the typed row is the same JSON.
        let old: serde_json::Value = serde_json::from_str(UNTYPED_ROW).unwrap();
        assert_eq!(serde_json::to_value(&row).unwrap(), old);
        // And it resumes from a file.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("results.jsonl"), format!("{UNTYPED_ROW}\n")).unwrap();
        let f = ResultsFile::open(dir.path()).unwrap();
        assert!(f.is_done("edar", "ex-7"));
    }

    #[test]
    fn a_run_resumes_and_a_torn_last_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = ResultsFile::open(dir.path()).unwrap();
        f.append(row("rag", "e1", true, 10)).unwrap();
        f.append(row("lc", "e1", false, 20)).unwrap();
        // An interrupted write leaves half a line.
        let path = dir.path().join("results.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"suite\": \"kv-ret");
        std::fs::write(&path, &text).unwrap();
        let mut f = ResultsFile::open(dir.path()).unwrap();
        assert_eq!(f.rows().len(), 2);
        assert!(f.is_done("rag", "e1") && f.is_done("lc", "e1"));
        assert!(!f.is_done("rag", "e2"));
        f.append(row("rag", "e2", true, 10)).unwrap();
        let f = ResultsFile::open(dir.path()).unwrap();
        assert_eq!(f.rows().len(), 3);
        assert_eq!(f.rows()[2], row("rag", "e2", true, 10));
    }

    #[test]
    fn a_corrupt_line_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let good = serde_json::to_string(&row("rag", "e1", true, 1)).unwrap();
        std::fs::write(
            dir.path().join("results.jsonl"),
            format!("{good}\nnot json\n{good}\n"),
        )
        .unwrap();
        let err = ResultsFile::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
