//! `triage signals`: study the signals of `triage eval` runs, save the combined score or a probe
//! when asked, and print the study (Markdown or JSON).

use anyhow::Result;
use triage_drivers::SignalsParams;
use triage_eval::signal_study;

#[derive(clap::Args)]
pub struct SignalsArgs {
    /// Run directories (their results.jsonl) to fit on: dev splits, never the test runs.
    #[arg(long, required = true)]
    pub train: Vec<std::path::PathBuf>,
    /// Run directories to score. Without them the train answers are scored corpus by corpus,
    /// each held out from what scores it (for dev runs before any test run).
    #[arg(long)]
    pub test: Vec<std::path::PathBuf>,
    /// Also save the combined score fitted on every train answer, for `[routing.monitor]
    /// combined_score`.
    #[arg(long)]
    pub save_combined: Option<std::path::PathBuf>,
    /// Also save a hidden-state probe fitted on the train answers' states at --probe-layer
    /// (the last prompt token), for `[routing.monitor] probe`.
    #[arg(long, requires = "probe_layer")]
    pub save_probe: Option<std::path::PathBuf>,
    #[arg(long)]
    pub probe_layer: Option<usize>,
    /// The share of right train answers the probe may escalate (the saved probe's, and each
    /// layer's in the table of the probe as a router before decoding, printed with --test).
    #[arg(long, default_value_t = 0.05)]
    pub probe_false_escalation: f64,
    #[arg(long)]
    pub json: bool,
}

/// Study, save what was asked for, print the study.
pub fn run(args: SignalsArgs) -> Result<()> {
    let studied = triage_drivers::study_signals(&SignalsParams {
        train: args.train.clone(),
        test: args.test.clone(),
        probe_false_escalation: args.probe_false_escalation,
    })?;
    if let Some(path) = &args.save_combined {
        let hash = triage_drivers::save_combined_score(&args.train, &studied.train, path)?;
        eprintln!("combined score saved to {} (sha256 {hash})", path.display());
    }
    if let (Some(path), Some(layer)) = (&args.save_probe, args.probe_layer) {
        let probe =
            triage_drivers::save_probe(&args.train, layer, args.probe_false_escalation, path)?;
        eprintln!(
            "probe at layer {layer} saved to {} (threshold {:.4}, fitted on {} answers; sha256 {})",
            path.display(),
            probe.threshold,
            probe.answers,
            probe.sha256
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&studied.study)?);
    } else {
        print!("{}", signal_study::markdown(&studied.study));
    }
    Ok(())
}
