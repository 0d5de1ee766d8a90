//! `triage ask`: one question through the routing pipeline, from the command line.

use std::io::Write;

use anyhow::Result;
use serde_json::json;

use triage::{AnswerEvent, AskRequest, Engine, Route, TriageConfig};

/// What `triage ask` was given.
#[derive(Debug, Clone)]
pub struct AskCommand {
    pub corpus: String,
    pub question: String,
    pub route: Route,
    pub tau: Option<f32>,
    pub max_tokens: Option<usize>,
    /// Models and routing settings (the config file with the command line's overrides).
    pub config: TriageConfig,
    pub json: bool,
}

/// Run the question; prints the answer as it streams (or one JSON object with `--json`).
pub fn ask(cmd: &AskCommand) -> Result<()> {
    // Only the asked corpus is loaded.
    let mut config = cmd.config.clone();
    config.pipeline.corpora = vec![cmd.corpus.clone()];
    let engine = Engine::new(config)?;
    let request = AskRequest {
        corpus: cmd.corpus.clone(),
        question: cmd.question.clone(),
        route: cmd.route,
        tau: cmd.tau,
        max_tokens: cmd.max_tokens,
    };
    let mut stdout = std::io::stdout().lock();
    let stream = !cmd.json;
    let answer = engine.ask_stream(&request, |event| {
        if let (true, AnswerEvent::Delta(text)) = (stream, &event) {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    if cmd.json {
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
