//! `triage eval`: the suite's flags into an evaluation run, then the report printed (Markdown or
//! JSON), or with `--export` the suite's corpora and questions written for another engine.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use triage_drivers::{EvalConfig, System};

use super::EngineArgs;

/// What both `eval` and `calibrate` take.
#[derive(clap::Args)]
pub struct SuiteArgs {
    /// kv-retrieval, kv-litm, passkey, niah, squad-v2, hotpotqa or synth-summary.
    #[arg(long)]
    pub suite: String,
    /// Queries in all.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Target corpus length of each group, in the long-context model's tokens.
    #[arg(long, default_value_t = triage_drivers::DEFAULT_CONTEXT_TOKENS)]
    pub context_tokens: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub suite: SuiteArgs,
    /// Comma-separated: none, rag, hybrid, lc, edar, dtr, self-route, oracle, and auto (the
    /// --config routing settings as they are).
    #[arg(long, default_value = "none,rag,hybrid,lc,edar,dtr,self-route,oracle")]
    pub systems: String,
    /// Run directory (results.jsonl, report.md, report.json, figures); a rerun resumes it.
    #[arg(long, required_unless_present = "export")]
    pub out: Option<std::path::PathBuf>,
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Answer nothing: write the suite's corpora and questions to this file (JSON lines, one
    /// corpus and its questions a line), to run the same suite on another engine.
    #[arg(long, conflicts_with = "out")]
    pub export: Option<std::path::PathBuf>,
}

/// Parse `none,rag,...`.
pub fn parse_systems(list: &str) -> Result<Vec<System>> {
    let mut out: Vec<System> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let s: System = name.parse()?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    if out.is_empty() {
        bail!("--systems names no system");
    }
    if out == [System::Oracle] {
        bail!("the oracle picks among none, rag, hybrid and lc: name some of them too");
    }
    Ok(out)
}

/// The run `eval` and `calibrate` ask for: the suite's flags, the engine's config with its
/// overrides, `split` and the run directory `out`.
pub fn eval_config(
    args: SuiteArgs,
    split: &str,
    out: PathBuf,
    systems: Vec<System>,
) -> Result<EvalConfig> {
    let config = args.engine.load()?;
    Ok(EvalConfig {
        suite: args.suite.parse()?,
        systems,
        out,
        limit: args.limit,
        seed: args.seed,
        split: split.parse()?,
        context_tokens: args.context_tokens,
        edar_classifier: triage_drivers::default_edar_classifier(&config.routing),
        config,
        quiet: args.quiet || !super::stderr_is_terminal(),
    })
}

/// Export the suite, or run (resume) the evaluation and print its report.
pub fn run(args: EvalArgs) -> Result<()> {
    let systems = parse_systems(&args.systems)?;
    if let Some(file) = args.export {
        let config = eval_config(args.suite, &args.split, file.clone(), systems)?;
        let questions = triage_drivers::export_suite(&config, &file)?;
        eprintln!("{questions} questions written to {}", file.display());
        return Ok(());
    }
    let out = args.out.context("--out names the run directory")?;
    let config = eval_config(args.suite, &args.split, out, systems)?;
    let report = triage_drivers::evaluate(&config)?.report;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", triage_eval::report::markdown(&report));
        eprintln!("written to {}", config.out.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_parse() {
        assert_eq!(
            parse_systems("rag, lc,rag,oracle").unwrap(),
            [System::Rag, System::Lc, System::Oracle]
        );
        assert!(parse_systems("rag,psychic").is_err());
        assert!(parse_systems("oracle").is_err());
        assert!(parse_systems(",").is_err());
    }
}
