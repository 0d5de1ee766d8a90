//! `triage ask`: one question through the routing pipeline, from the command line.

use std::io::Write;

use anyhow::Result;
use serde_json::json;

use triage::{AnswerEvent, AskRequest, Engine};

use super::EngineArgs;

#[derive(clap::Args)]
pub struct AskArgs {
    /// A corpus made by `triage ingest`.
    #[arg(long)]
    pub corpus: String,
    pub question: String,
    /// auto (let the router decide), none (closed book), rag, hybrid or lc (whole corpus).
    #[arg(long, default_value = "auto")]
    pub route: String,
    /// Entropy threshold τ of this question (in the configured estimator's unit).
    #[arg(long)]
    pub tau: Option<f32>,
    #[arg(long)]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print one JSON object: answer, route (the decision record), usage, timings.
    #[arg(long)]
    pub json: bool,
}

/// Run the question; prints the answer as it streams (or one JSON object with `--json`).
pub fn run(args: AskArgs) -> Result<()> {
    let route = args.route.parse()?;
    // Only the asked corpus is loaded.
    let mut config = args.engine.load()?;
    config.pipeline.corpora = vec![args.corpus.clone()];
    let engine = Engine::new(config)?;
    let request = AskRequest {
        corpus: args.corpus,
        question: args.question,
        route,
        tau: args.tau,
        max_tokens: args.max_tokens,
    };
    let mut stdout = std::io::stdout().lock();
    let stream = !args.json;
    let answer = engine.ask_stream(&request, |event| {
        if let (true, AnswerEvent::Delta(text)) = (stream, &event) {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    if args.json {
        let out = json!({
            "answer": answer.text,
            "route": answer.decision,
            "usage": answer.usage,
            "timings": answer.timings,
        });
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "[path {} · {} · {} tokens ({} cached) · {:.1} s]",
            answer.decision.path.as_str(),
            answer.decision.reason,
            answer.usage.total_tokens,
            answer.usage.cached_prompt_tokens,
            answer.timings.total_ms / 1e3
        );
    }
    Ok(())
}
