//! `triage calibrate`: answer the dev questions with forced RAG and long context (resumable),
//! choose τ or the combined score's threshold on them, and write the routing file. With
//! `--choose-self-route`, forced RAG also answers with Self-Route's decline offer the other way,
//! and the setting whose operating point is better is the one written.

use std::path::{Path, PathBuf};

use triage_eval::calibrate::{self, Chosen, Rule};
use triage_eval::combined_calibration::{self, CombinedCalibration};
use triage_eval::suites::Split;
use triage_eval::SweepPoint;
use triage_eval::{ResultRow, ResultsFile};
use triage_policy::{CombinedScore, CombinedScoreModel, COMBINED_INPUTS};
use triage_router::Calibration;
use triage_router::RoutingConfig;

use crate::calibrated_file::{calibrated_toml, Escalation};
use crate::error::{bail, io, other, Result};
use crate::eval::{evaluate, EvalConfig, System};

/// The combined score `triage calibrate --combined-fit` saved.
#[derive(Debug)]
pub struct CombinedSaved {
    pub path: PathBuf,
    pub sha256: String,
    pub threshold: f64,
    /// Dev answers it was fitted on, and those left out as calibration questions.
    pub fit_answers: usize,
    pub left_out: usize,
}

/// The setting `--choose-self-route` did not write, and how it did: its operating point, or why
/// none could be chosen for it.
#[derive(Debug)]
pub struct OtherSetting {
    pub self_route: bool,
    pub point: std::result::Result<SweepPoint, String>,
}

/// What `triage calibrate` chose and wrote.
#[derive(Debug)]
pub struct Calibrated {
    pub chosen: Chosen,
    pub calibration: Calibration,
    pub combined: Option<CombinedSaved>,
    /// Whether the written RAG prompt offers the decline.
    pub self_route: bool,
    /// With `--choose-self-route`, the setting left out.
    pub other: Option<OtherSetting>,
}

/// A calibration made but not yet written.
struct Candidate {
    self_route: bool,
    chosen: Chosen,
    calibration: Calibration,
    combined: Option<CombinedCalibration>,
}

/// How `triage calibrate` chooses.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    pub rule: Rule,
    /// Fit runs of the combined score; none: τ decides.
    pub combined_fit: Vec<PathBuf>,
    /// Fit the combined score's answers and declines apart.
    pub combined_apart: bool,
    /// Calibrate with and without the decline offer and write the better.
    pub choose_self_route: bool,
}

impl CalibrateOptions {
    /// τ chosen by `rule`, nothing else.
    pub fn tau(rule: Rule) -> Self {
        Self {
            rule,
            combined_fit: Vec::new(),
            combined_apart: false,
            choose_self_route: false,
        }
    }
}

/// `triage calibrate`: run rag and lc on the dev split (resumable, in `config.out`), choose τ
/// (or, with `combined_fit` runs, the combined score's threshold), write `out`. With
/// `choose_self_route`, forced RAG answers again with the decline offer the other way (in a
/// run directory beside `config.out`, long context's answers shared) and the better setting
/// (`calibrate::beats`) is written.
pub fn calibrate(
    config: &EvalConfig,
    out: &Path,
    options: &CalibrateOptions,
) -> Result<Calibrated> {
    let CalibrateOptions {
        rule,
        ref combined_fit,
        combined_apart: apart,
        choose_self_route,
    } = *options;
    if config.split != Split::Dev {
        bail!("τ is calibrated on the dev split only (--split dev); test is for reporting");
    }
    let mut run_config = config.clone();
    run_config.systems = vec![System::Rag, System::Lc];
    let done = evaluate(&run_config)?;
    let routing = &config.config.routing;
    let asked = routing.monitor.self_route;
    if !choose_self_route {
        let mine = candidate(
            &done.rows,
            rule,
            &fit_rows(combined_fit, None)?,
            apart,
            asked,
        )?;
        return write(mine, None, out, routing);
    }
    choose_self_route_and_write(config, &run_config, &done.rows, out, options)
}

/// `--choose-self-route`: forced RAG answers again with the decline offer the other way (long
/// context's answers in `rows` shared), each setting is calibrated, and the better one written.
fn choose_self_route_and_write(
    config: &EvalConfig,
    run_config: &EvalConfig,
    rows: &[ResultRow],
    out: &Path,
    options: &CalibrateOptions,
) -> Result<Calibrated> {
    let CalibrateOptions {
        rule,
        ref combined_fit,
        combined_apart: apart,
        ..
    } = *options;
    let routing = &config.config.routing;
    let asked = routing.monitor.self_route;
    if combined_calibration::abstention_allowed(rows) {
        bail!(
            "this suite has unanswerable questions, so every RAG prompt offers the decline \
             (abstention): there is no setting of self_route to choose"
        );
    }
    let mut other_config = run_config.clone();
    other_config.systems = vec![System::Rag];
    other_config.config.routing.monitor.self_route = !asked;
    other_config.out = offer_run_dir(&config.out, !asked);
    let other_rag = evaluate(&other_config)?.rows;
    let lc = rows.iter().filter(|r| r.system == System::Lc).cloned();
    let other_rows: Vec<ResultRow> = other_rag.into_iter().chain(lc).collect();
    // Without the offer there are no declines to fit apart.
    let mine = candidate(
        rows,
        rule,
        &fit_rows(combined_fit, Some(asked))?,
        apart && asked,
        asked,
    );
    let theirs = candidate(
        &other_rows,
        rule,
        &fit_rows(combined_fit, Some(!asked))?,
        apart && !asked,
        !asked,
    );
    let (winner, loser) = better(mine, theirs, rule)?;
    let other = OtherSetting {
        self_route: !winner.self_route,
        point: loser.map(|c| c.chosen.at).map_err(|e| e.with_sources()),
    };
    write(winner, Some(other), out, routing)
}

/// The better of two settings' calibrations, and the other (or why it has none): where both
/// have one, the one `calibrate::beats` prefers, ours on a tie; where neither, our failure.
fn better(
    mine: Result<Candidate>,
    theirs: Result<Candidate>,
    rule: Rule,
) -> Result<(Candidate, Result<Candidate>)> {
    Ok(match (mine, theirs) {
        (Ok(m), Ok(t)) => {
            let floor = rule.floor_accuracy(m.chosen.lc_accuracy);
            if calibrate::beats(&t.chosen.at, &m.chosen.at, floor) {
                (t, Ok(m))
            } else {
                (m, Ok(t))
            }
        }
        (Ok(m), Err(e)) => (m, Err(e)),
        (Err(e), Ok(t)) => (t, Err(e)),
        (Err(e), Err(_)) => return Err(e),
    })
}

/// Where forced RAG's answers with the decline offer `self_route` go, beside `runs`.
pub fn offer_run_dir(runs: &Path, self_route: bool) -> PathBuf {
    let name = runs
        .file_name()
        .map_or("calibrate".into(), |n| n.to_string_lossy());
    let setting = if self_route { "on" } else { "off" };
    runs.with_file_name(format!("{name}-self-route-{setting}"))
}

/// The rows of the `--combined-fit` runs; with `self_route`, only those of runs whose RAG
/// prompt made the offer that way (their `run.json` says), since a score fitted on answers to one
/// prompt does not judge answers to the other.
fn fit_rows(dirs: &[PathBuf], self_route: Option<bool>) -> Result<Vec<ResultRow>> {
    let mut rows = Vec::new();
    let mut read = 0;
    for dir in dirs {
        if let Some(wanted) = self_route {
            if offered_decline(dir)? != wanted {
                continue;
            }
        }
        rows.extend_from_slice(ResultsFile::open(dir)?.rows());
        read += 1;
    }
    if let (Some(wanted), false, 0) = (self_route, dirs.is_empty(), read) {
        bail!(
            "none of the --combined-fit runs asked {} the decline offer: --choose-self-route \
             fits a score for each setting, so it needs fit runs of both",
            if wanted { "with" } else { "without" }
        );
    }
    Ok(rows)
}

/// Whether the run in `dir` asked forced RAG with the decline offer (`routing.monitor.self_route`
/// or `routing.abstain` in its `run.json`).
fn offered_decline(dir: &Path) -> Result<bool> {
    let path = dir.join("run.json");
    let text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
    let manifest: serde_json::Value =
        serde_json::from_str(&text).map_err(other(format!("parsing {}", path.display())))?;
    let flag = |pointer: &str| manifest.pointer(pointer).and_then(|v| v.as_bool());
    match (
        flag("/routing/monitor/self_route"),
        flag("/routing/abstain"),
    ) {
        (Some(self_route), Some(abstain)) => Ok(self_route || abstain),
        _ => bail!(
            "{} does not say whether forced RAG offered the decline",
            path.display()
        ),
    }
}

/// τ (or, with `fit_rows`, the combined score, its declines fitted `apart` or not) chosen on
/// `rows` by `rule`, for answers asked with the decline offer `self_route`.
fn candidate(
    rows: &[ResultRow],
    rule: Rule,
    fit_rows: &[ResultRow],
    apart: bool,
    self_route: bool,
) -> Result<Candidate> {
    if fit_rows.is_empty() {
        let (chosen, calibration) = calibrate::calibrate(rows, rule)?;
        return Ok(Candidate {
            self_route,
            chosen,
            calibration,
            combined: None,
        });
    }
    let c = combined_calibration::calibrate_combined(rows, fit_rows, rule, apart)?;
    Ok(Candidate {
        self_route,
        chosen: c.chosen.clone(),
        calibration: c.calibration.clone(),
        combined: Some(c),
    })
}

/// Writes the routing file (and the combined score beside it) for `c`.
fn write(
    c: Candidate,
    other: Option<OtherSetting>,
    out: &Path,
    routing: &RoutingConfig,
) -> Result<Calibrated> {
    let mut routing = routing.clone();
    routing.monitor.self_route = c.self_route;
    let (escalation, combined) = match &c.combined {
        None => (Escalation::Tau(c.chosen.tau), None),
        Some(fitted) => {
            let saved = save_combined(fitted, out)?;
            (Escalation::Combined(saved.path.clone()), Some(saved))
        }
    };
    let text = calibrated_toml(escalation, &c.calibration, &routing)?;
    std::fs::write(out, text).map_err(io("writing", &out))?;
    Ok(Calibrated {
        chosen: c.chosen,
        calibration: c.calibration,
        combined,
        self_route: c.self_route,
        other,
    })
}

/// The fitted combined score, saved beside `out`.
fn save_combined(c: &CombinedCalibration, out: &Path) -> Result<CombinedSaved> {
    let score = CombinedScore {
        model: CombinedScoreModel {
            model_id: c.calibration.model.clone(),
            inputs: COMBINED_INPUTS.iter().map(|s| s.to_string()).collect(),
            logistic: c.logistic.clone(),
            declines: c.declines.clone(),
            threshold: c.threshold,
        },
    };
    let path =
        std::path::absolute(out.with_extension("combined.json")).map_err(io("resolving", &out))?;
    let sha256 = score.save(&path)?;
    Ok(CombinedSaved {
        path,
        sha256,
        threshold: c.threshold,
        fit_answers: c.fit_answers,
        left_out: c.left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run directory whose `run.json` says how its forced RAG was asked.
    fn fit_run(dir: &Path, name: &str, self_route: bool, abstain: bool) -> PathBuf {
        let run = dir.join(name);
        std::fs::create_dir_all(&run).unwrap();
        let manifest = serde_json::json!({
            "routing": {"abstain": abstain, "monitor": {"self_route": self_route}}
        });
        std::fs::write(run.join("run.json"), manifest.to_string()).unwrap();
        run
    }

    #[test]
    fn each_setting_is_fitted_on_the_runs_asked_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let off = fit_run(dir.path(), "off", false, false);
        // Abstention offers the decline whatever self_route says.
        let abstaining = fit_run(dir.path(), "abstain", false, true);
        assert!(!offered_decline(&off).unwrap());
        assert!(offered_decline(&abstaining).unwrap());
        assert!(fit_rows(std::slice::from_ref(&off), Some(false)).is_ok());
        let err = fit_rows(std::slice::from_ref(&off), Some(true))
            .unwrap_err()
            .to_string();
        assert!(err.contains("with the decline offer"), "{err}");
        // Without a choice every run is read, and no fit runs is no combined score.
        assert!(fit_rows(&[off, abstaining], None).is_ok());
        assert!(fit_rows(&[], Some(true)).unwrap().is_empty());
        let bare = fit_run(dir.path(), "bare", false, false);
        std::fs::write(bare.join("run.json"), "{}").unwrap();
        let err = offered_decline(&bare).unwrap_err().to_string();
        assert!(err.contains("does not say"), "{err}");
        assert_eq!(
            offer_run_dir(Path::new("/x/cal-dev"), false),
            Path::new("/x/cal-dev-self-route-off")
        );
    }
}
