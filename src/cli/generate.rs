//! `triage generate`: one prompt through one model, streamed or as JSON.

use std::io::Write;

use anyhow::Result;
use serde_json::json;
use triage::{ChatMessage, DeviceSpec, EntropySettings, GenerateRequest, Prompt, SamplingParams};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A default model's name, a GGUF file or a safetensors folder.
    #[arg(long)]
    pub model: String,
    /// Raw prompt text.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    pub chat: Option<String>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object with tokens, logprobs, entropies and timings.
    #[arg(long)]
    pub json: bool,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
}

/// Generate, streaming the text (or one JSON object with tokens, logprobs, entropies and
/// timings with `--json`).
pub fn run(args: GenerateArgs) -> Result<()> {
    let load_start = std::time::Instant::now();
    let model = super::load_model(&args.model, args.device)?;
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
    let prompt = match (args.prompt, args.chat) {
        (Some(text), _) => Prompt::Text(text),
        (None, Some(chat)) => Prompt::Chat(vec![ChatMessage::user(chat)]),
        (None, None) => anyhow::bail!("give --prompt or --chat"),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..Default::default()
    };
    let request = GenerateRequest {
        prompt,
        params,
        entropy: EntropySettings::default(),
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    let output = triage::generate(&model, &request, |_, piece| {
        if stream {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })?;
    if args.json {
        let tokens: Vec<_> = output
            .tokens
            .iter()
            .map(
                |t| json!({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy}),
            )
            .collect();
        let value = json!({
            "text": output.text,
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "finish_reason": output.finish_reason,
            "tokens": tokens,
            "mean_entropy": output.mean_entropy,
            "timings": output.timings,
            "load_ms": load_ms,
        });
        writeln!(stdout, "{value}")?;
    } else {
        writeln!(stdout)?;
    }
    Ok(())
}
