//! LLM relevance scores for reranking: the base model reads a passage and a question and is
//! asked whether the passage alone answers it; the score is log p("yes") − log p("no") at its
//! first answer token (equal to the logit difference), with the capitalised and lower-case
//! spellings pooled.
//! All passages run as one batch through the engine.

use triage_models::chat_template::ChatMessage;
use triage_models::tokenizer::TextTokenizer;

use crate::generate::{EntropySettings, GenerateRequest, Prompt, TokenOutput};
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
fn single_tokens(tokenizer: &TextTokenizer, words: &[&str]) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for w in words {
        let t = tokenizer.encode(w, false, false)?;
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

/// The yes and no answer tokens of one model, and the judge requests built with them.
#[derive(Debug, Clone)]
pub struct RelevanceJudge {
    yes: Vec<u32>,
    no: Vec<u32>,
}

impl RelevanceJudge {
    /// The judge for a model whose tokenizer is `tokenizer`; an error when its vocabulary has no
    /// single-token yes or no.
    pub fn new(tokenizer: &TextTokenizer) -> Result<Self> {
        let yes = single_tokens(tokenizer, &["yes", "Yes", " yes", " Yes"])?;
        let no = single_tokens(tokenizer, &["no", "No", " no", " No"])?;
        if yes.is_empty() || no.is_empty() {
            return Err(EngineError::Invalid(
                "the model's vocabulary has no single-token yes/no".into(),
            ));
        }
        Ok(Self { yes, no })
    }

    /// One judgement: a single greedy step that reports the logprobs of the yes/no tokens.
    pub fn request(&self, question: &str, passage: &str) -> GenerateRequest {
        GenerateRequest {
            prompt: Prompt::Chat(vec![
                ChatMessage::new("system", SYSTEM),
                ChatMessage::new("user", judgement(question, passage)),
            ]),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: Some(1),
                ignore_eos: true,
                score_token_ids: self.yes.iter().chain(&self.no).copied().collect(),
                ..SamplingParams::default()
            },
            entropy: EntropySettings::default(),
        }
    }

    /// The score of a judgement's first token: log p(yes) − log p(no).
    pub fn score(&self, token: &TokenOutput) -> f32 {
        let lp = |ids: &[u32]| {
            log_sum_exp(
                token
                    .scored_logprobs
                    .iter()
                    .filter(|(id, _)| ids.contains(id))
                    .map(|(_, lp)| *lp),
            )
        };
        lp(&self.yes) - lp(&self.no)
    }
}

/// One score per passage, higher = more relevant to `question`. Steps `engine` until it is idle,
/// so requests already queued on it finish too.
pub fn relevance_scores(
    engine: &mut LlmEngine,
    question: &str,
    passages: &[&str],
) -> Result<Vec<f32>> {
    let judge = RelevanceJudge::new(&engine.model().tokenizer)?;
    let mut receivers = Vec::with_capacity(passages.len());
    for passage in passages {
        receivers.push(engine.add_request(&judge.request(question, passage))?.1);
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
            Ok(judge.score(&token))
        })
        .collect()
}
