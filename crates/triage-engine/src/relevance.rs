//! LLM relevance scores for reranking: the base model reads a passage and a question and is
//! asked whether the passage alone answers it; the score is log p("yes") − log p("no") at its
//! first answer token (equal to the logit difference), with the capitalised and lower-case
//! spellings pooled.
//! All passages run as one batch through the engine.

use triage_models::chat_template::ChatMessage;

use crate::generate::{EntropySettings, GenerateRequest, Prompt};
use crate::llm_engine::{LlmEngine, StreamEvent};
use crate::sampler::SamplingParams;
use crate::{EngineError, Result};

/// The judge's prompt: passage first, question last, "answered from the passage alone". Chosen
/// on a one-off probe (not kept in the repo) of six SQuAD questions against 25 paragraphs of one
/// article, where it put the gold paragraph first for 4 and the question-first "does it help"
/// wording did worse than chance. At scale `triage bench retrieval --llm-questions N` measures
/// it; with the 0.5B it still lowers MRR there (benches/RESULTS.md).
const SYSTEM: &str = "You are a search relevance judge.";

fn judgement(question: &str, passage: &str) -> String {
    format!(
        "Passage: {passage}\n\nQuestion: {question}\n\nCan the question be answered from the \
         passage alone? Answer only yes or no."
    )
}

/// Token ids of the single-token spellings of `words` (multi-token spellings are skipped).
fn single_tokens(engine: &LlmEngine, words: &[&str]) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for w in words {
        let t = engine.model().tokenizer.encode(w, false, false)?;
        if t.len() == 1 && !ids.contains(&t[0]) {
            ids.push(t[0]);
        }
    }
    Ok(ids)
}

fn log_sum_exp(values: impl Iterator<Item = f32>) -> f32 {
    let v: Vec<f32> = values.collect();
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    max + v.iter().map(|x| (x - max).exp()).sum::<f32>().ln()
}

/// One score per passage, higher = more relevant to `question`. Steps `engine` until it is idle,
/// so requests already queued on it finish too.
pub fn relevance_scores(
    engine: &mut LlmEngine,
    question: &str,
    passages: &[&str],
) -> Result<Vec<f32>> {
    let yes = single_tokens(engine, &["yes", "Yes", " yes", " Yes"])?;
    let no = single_tokens(engine, &["no", "No", " no", " No"])?;
    if yes.is_empty() || no.is_empty() {
        return Err(EngineError::Invalid(
            "the model's vocabulary has no single-token yes/no".into(),
        ));
    }
    let scored: Vec<u32> = yes.iter().chain(&no).copied().collect();
    let mut receivers = Vec::with_capacity(passages.len());
    for passage in passages {
        let request = GenerateRequest {
            prompt: Prompt::Chat(vec![
                ChatMessage::new("system", SYSTEM),
                ChatMessage::new("user", judgement(question, passage)),
            ]),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: Some(1),
                ignore_eos: true,
                score_token_ids: scored.clone(),
                ..SamplingParams::default()
            },
            entropy: EntropySettings::default(),
        };
        receivers.push(engine.add_request(&request)?.1);
    }
    while engine.has_unfinished() {
        engine.step()?;
    }
    receivers
        .into_iter()
        .map(|rx| {
            let token = rx
                .try_iter()
                .find_map(|e| match e {
                    StreamEvent::Token(t, _) => Some(t),
                    _ => None,
                })
                .ok_or_else(|| {
                    EngineError::Invalid("a scoring request produced no token".into())
                })?;
            let lp = |ids: &[u32]| {
                log_sum_exp(
                    token
                        .scored_logprobs
                        .iter()
                        .filter(|(id, _)| ids.contains(id))
                        .map(|(_, lp)| *lp),
                )
            };
            Ok(lp(&yes) - lp(&no))
        })
        .collect()
}
