//! `triage ask`: one question through the routing pipeline, from the command line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use crate::engine::{Engine, TriageConfig};
use crate::{AnswerEvent, AskRequest, Route};

/// What `triage ask` was given.
#[derive(Debug, Clone)]
pub struct AskCommand {
    pub corpus: String,
    pub question: String,
    pub route: Route,
    pub tau: Option<f32>,
    pub max_tokens: Option<usize>,
    pub config: Option<PathBuf>,
    /// Model overrides (name or path) of the config's roles.
    pub base: Option<String>,
    pub long_context: Option<String>,
    pub json: bool,
}

/// The engine config of `cmd`: its file (or the defaults) with the overrides applied, loading
/// only the asked corpus.
pub fn config_for(cmd: &AskCommand) -> Result<TriageConfig> {
    let mut config = TriageConfig::load_with(
        cmd.config.as_deref(),
        cmd.base.as_deref(),
        cmd.long_context.as_deref(),
    )?;
    config.corpora = vec![cmd.corpus.clone()];
    Ok(config)
}

/// Run the question; prints the answer as it streams (or one JSON object with `--json`).
pub fn ask(cmd: &AskCommand) -> Result<()> {
    let mut engine = Engine::new(config_for(cmd)?)?;
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
