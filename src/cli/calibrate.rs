//! `triage calibrate`: the floor and rule from the flags, the calibration run on the dev split,
//! then the τ sweep and the operating point written to the routing file printed.

use anyhow::Result;
use triage_drivers::{CalibrateOptions, Calibrated};
use triage_eval::calibrate::{Floor, Rule};

use super::eval::{eval_config, SuiteArgs};

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub suite: SuiteArgs,
    /// Only dev: τ is never tuned on test.
    #[arg(long, default_value = "dev")]
    pub split: String,
    /// The routing TOML to write.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Run directory for the rag and lc answers (default $TRIAGE_HOME/eval/calibrate-SUITE-...).
    #[arg(long)]
    pub runs: Option<std::path::PathBuf>,
    /// Pick the cheapest τ with at least this accuracy when the elbow falls short of it.
    #[arg(long, conflicts_with = "min_retained")]
    pub min_accuracy: Option<f64>,
    /// The same, as a fraction of long context's accuracy.
    #[arg(long)]
    pub min_retained: Option<f64>,
    /// Take the cheapest τ meeting the floor (--min-accuracy or --min-retained) even where the
    /// elbow is above it: the frozen operating point of a "≥ x % of LC's accuracy" headline.
    #[arg(long, conflicts_with = "escalation_rate")]
    pub cheapest: bool,
    /// Instead of the elbow, the τ escalating at most this share of the dev answers (the
    /// statistic's quantile at one minus it).
    #[arg(long, conflicts_with_all = ["min_accuracy", "min_retained"])]
    pub escalation_rate: Option<f64>,
    /// Calibrate the combined score instead of τ: fit it on these dev runs' RAG answers
    /// (leaving out the questions the calibration asks), choose its P(wrong) threshold on the
    /// rag and lc answers by the same rule, save it beside --out (`.combined.json`) and point
    /// the routing file at it. A decline is then judged by the score like any answer.
    #[arg(long)]
    pub combined_fit: Vec<std::path::PathBuf>,
    /// Fit the combined score as two models, one on the answers and one on the declines (a
    /// signal may mean the opposite for a decline); each answer is then scored by its kind's.
    /// Needs right and wrong declines among the fit answers (a suite that allows abstaining);
    /// with --choose-self-route it applies to the setting that offers the decline.
    #[arg(long, requires = "combined_fit")]
    pub combined_apart: bool,
    /// Also answer the dev questions with forced RAG offering Self-Route's decline the other way
    /// (in a run directory beside --runs, `…-self-route-on|off`), calibrate both settings and
    /// write the better: where both reach the floor the cheaper, otherwise the more accurate.
    /// With --combined-fit, give fit runs of both settings (each run's `run.json` says which).
    #[arg(long)]
    pub choose_self_route: bool,
}

/// Calibrate and write the routing file, then print the sweep and what was chosen.
pub fn run(args: CalibrateArgs) -> Result<()> {
    let runs = args.runs.clone().unwrap_or_else(|| {
        triage_models::paths::triage_home()
            .join("eval")
            .join(format!(
                "calibrate-{}-s{}-c{}",
                args.suite.suite, args.suite.seed, args.suite.context_tokens
            ))
    });
    let rule = rule(&args);
    let config = eval_config(args.suite, &args.split, runs, Vec::new())?;
    let options = CalibrateOptions {
        combined_fit: args.combined_fit.clone(),
        combined_apart: args.combined_apart,
        choose_self_route: args.choose_self_route,
        ..CalibrateOptions::tau(rule)
    };
    let calibrated = triage_drivers::calibrate(&config, &args.out, &options)?;
    print_sweep(&calibrated);
    print_chosen(&calibrated, &args.out);
    print_other_setting(&calibrated);
    Ok(())
}

/// How τ is chosen: at an escalation rate, or the elbow (or the cheapest τ) above a floor.
fn rule(args: &CalibrateArgs) -> Rule {
    let floor = match (args.min_accuracy, args.min_retained) {
        (Some(a), _) => Floor::Accuracy(a),
        (None, Some(f)) => Floor::Retained(f),
        (None, None) => Floor::None,
    };
    match (args.escalation_rate, args.cheapest) {
        (Some(rate), _) => Rule::EscalationRate(rate),
        (None, true) => Rule::Cheapest(floor),
        (None, false) => Rule::Elbow(floor),
    }
}

/// The sweep on dev, every 5 % of escalation, as a Markdown table.
fn print_sweep(calibrated: &Calibrated) {
    let chosen = &calibrated.chosen;
    let statistic = if calibrated.combined.is_some() {
        "P(wrong) thresholds"
    } else {
        "τs"
    };
    println!(
        "{} quantile {statistic} on dev; every 5% of escalation:\n\n| threshold | escalated | accuracy | tokens | cost |\n|---|---|---|---|---|",
        chosen.curve.len()
    );
    for p in &triage_eval::by_escalation_rate(&chosen.curve, 20) {
        println!(
            "| {:.4} | {:.2} | {:.3} | {:.0} | {:.5} |",
            p.tau, p.escalation_rate, p.accuracy, p.mean_tokens, p.mean_cost
        );
    }
}

/// What decides escalation now, and its operating point on dev.
fn print_chosen(calibrated: &Calibrated, out: &std::path::Path) {
    let (chosen, calibration) = (&calibrated.chosen, &calibrated.calibration);
    let decides = match &calibrated.combined {
        Some(c) => format!(
            "the combined score (fitted on {} dev answers, {} left out as calibration \
             questions; sha256 {}) escalates at P(wrong) ≥ {:.4}; saved to {}",
            c.fit_answers,
            c.left_out,
            c.sha256,
            c.threshold,
            c.path.display()
        ),
        None => format!("τ = {}", chosen.tau),
    };
    println!(
        "\n{decides} ({}): accuracy {:.3} (rag {:.3}, lc {:.3}), {:.1}% escalated, {:.1}% of LC's \
         accuracy at {:.1}% of its tokens; written to {}",
        calibration.rule,
        calibration.accuracy,
        calibration.rag_accuracy,
        calibration.lc_accuracy,
        100.0 * calibration.escalation_rate,
        100.0 * calibration.accuracy_retained,
        100.0 * (1.0 - calibration.token_reduction),
        out.display()
    );
}

/// With `--choose-self-route`, how the setting left out did.
fn print_other_setting(calibrated: &Calibrated) {
    let Some(other) = &calibrated.other else {
        return;
    };
    let offer = |on: bool| if on { "with" } else { "without" };
    let how = match &other.point {
        Ok(p) => format!(
            "accuracy {:.3} at {:.0} mean tokens, {:.1}% escalated",
            p.accuracy,
            p.mean_tokens,
            100.0 * p.escalation_rate
        ),
        Err(e) => format!("no operating point ({e})"),
    };
    println!(
        "self_route = {}: forced RAG {} the decline offer did better than {} it ({how})",
        calibrated.self_route,
        offer(calibrated.self_route),
        offer(other.self_route)
    );
}
