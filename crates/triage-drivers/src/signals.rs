//! `triage signals`: which signals tell a wrong RAG answer, from `triage eval` runs — each alone,
//! the combined score fitted on the train runs and scored on the test runs (or corpus by corpus
//! without test runs) — and the combined score or a hidden-state probe fitted and saved.

use std::path::{Path, PathBuf};

use triage_eval::signal_study::{self, Labelled, Study};
use triage_eval::suites::Split;
use triage_eval::ResultsFile;
use triage_policy::CombinedScore;
use triage_policy::ProbeModel;

use crate::error::{bail, fit_error, Result};

/// The runs a study reads.
#[derive(Debug, Clone)]
pub struct SignalsParams {
    /// Run directories to fit on: dev splits only.
    pub train: Vec<PathBuf>,
    /// Run directories to score; none: the train answers corpus by corpus, each held out.
    pub test: Vec<PathBuf>,
    /// The share of right train answers the probe may escalate (the table of the probe as a
    /// router, made with test runs).
    pub probe_false_escalation: f64,
}

/// A study and the train answers it was fitted on.
#[derive(Debug)]
pub struct SignalsStudy {
    pub study: Study,
    pub train: Vec<Labelled>,
}

/// The monitored RAG answers of the runs in `dirs`; a run that is not on the dev split is
/// refused when it is among `train`.
fn load_answers(dirs: &[PathBuf], train: &[PathBuf]) -> Result<Vec<Labelled>> {
    let mut out = Vec::new();
    for dir in dirs {
        if !dir.join("results.jsonl").exists() {
            bail!("{} holds no results.jsonl", dir.display());
        }
        let file = ResultsFile::open(dir)?;
        if let Some(r) = file.rows().iter().find(|r| r.split != Split::Dev) {
            if train.contains(dir) {
                bail!(
                    "{} is a {} run: fit on dev runs only",
                    dir.display(),
                    r.split.as_str()
                );
            }
        }
        out.extend(signal_study::labelled(file.rows()));
    }
    Ok(out)
}

/// Study the signals: fitted on the train runs, scored on the test runs (with the probe as a
/// router before decoding), or without test runs each corpus scored by what the others fitted.
pub fn study_signals(params: &SignalsParams) -> Result<SignalsStudy> {
    let train = load_answers(&params.train, &params.train)?;
    let test = load_answers(&params.test, &params.train)?;
    if train.is_empty() || (test.is_empty() && !params.test.is_empty()) {
        bail!("no monitored RAG answers to study (run triage eval with the rag system)");
    }
    let study = if params.test.is_empty() {
        match signal_study::leave_one_corpus_out(&train).map_err(fit_error)? {
            Some(study) => study,
            None => {
                bail!("the train runs hold one corpus, so none can be held out: pass --test runs")
            }
        }
    } else {
        let mut study = signal_study::study(&train, &test).map_err(fit_error)?;
        study.probe_routing =
            signal_study::probe_routing(&train, &test, params.probe_false_escalation)
                .map_err(fit_error)?;
        study
    };
    Ok(SignalsStudy { study, train })
}

/// Fit the combined score on every train answer and save it to `path`; returns its sha256. The
/// model id is the one the train runs' monitor recorded.
pub fn save_combined_score(
    train_dirs: &[PathBuf],
    train: &[Labelled],
    path: &Path,
) -> Result<String> {
    let model_id = train_dirs
        .iter()
        .find_map(|d| {
            let file = ResultsFile::open(d).ok()?;
            let m = file
                .rows()
                .iter()
                .find_map(|r| r.decision.monitor.clone())?;
            Some(m.tau.model)
        })
        .unwrap_or_default();
    let x: Vec<Vec<f32>> = train.iter().map(|l| l.inputs.clone()).collect();
    let y: Vec<bool> = train.iter().map(|l| l.wrong).collect();
    Ok(CombinedScore::fit(&model_id, &x, &y, 0.5)?.save(path)?)
}

/// A probe fitted and saved.
#[derive(Debug)]
pub struct ProbeSaved {
    pub threshold: f64,
    /// Train answers it was fitted on.
    pub answers: usize,
    pub sha256: String,
}

/// Fit the probe at `layer` on the train runs' recorded last-prompt-token states and save it.
pub fn save_probe(
    train: &[PathBuf],
    layer: usize,
    max_false_escalation: f64,
    path: &Path,
) -> Result<ProbeSaved> {
    let mut model_id = String::new();
    let mut rows: Vec<(Vec<f32>, bool)> = Vec::new();
    for dir in train {
        let file = ResultsFile::open(dir)?;
        for r in file.rows() {
            let Some(m) = r.decision.monitor.as_ref() else {
                continue;
            };
            let Some(p) = m.probe.as_ref() else { continue };
            if let Some(at) = p.layers.iter().position(|&l| l == layer) {
                model_id.clone_from(&m.tau.model);
                rows.push((p.prompt[at].clone(), !r.score.correct));
            }
        }
    }
    if rows.is_empty() {
        bail!(
            "no train answer recorded layer {layer}: run triage eval with              [routing.monitor] probe_layers including it"
        );
    }
    let refs: Vec<(&[f32], bool)> = rows.iter().map(|(s, w)| (s.as_slice(), *w)).collect();
    let probe = ProbeModel::fit(&model_id, layer, &refs, max_false_escalation)?;
    let sha256 = probe.save(path)?;
    Ok(ProbeSaved {
        threshold: probe.threshold,
        answers: rows.len(),
        sha256,
    })
}
