//! A yes/no question put to a model as one greedy step: its score is log p("yes") − log p("no")
//! at the first answer token (equal to the logit difference), with the capitalised and
//! lower-case spellings pooled. The relevance reranker and the RAG answer's self-check use it.

use triage_models::tokenizer::TextTokenizer;

use crate::generate::{EntropySettings, GenerateRequest, Prompt, TokenOutput};
use crate::sampler::SamplingParams;
use crate::{EngineError, Result};

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

/// The yes and no answer tokens of one model, and the one-step requests built with them.
#[derive(Debug, Clone)]
pub struct YesNoJudge {
    yes: Vec<u32>,
    no: Vec<u32>,
}

impl YesNoJudge {
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

    /// A single greedy step on `prompt` that reports the logprobs of the yes/no tokens.
    pub fn request(&self, prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
            prompt,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn token(scored: &[(u32, f32)]) -> TokenOutput {
        TokenOutput {
            id: 0,
            text: String::new(),
            logprob: 0.0,
            entropy: 0.0,
            top_logprobs: Vec::new(),
            scored_logprobs: scored.to_vec(),
            hidden: Vec::new(),
        }
    }

    #[test]
    fn the_score_pools_each_answers_spellings_before_taking_the_difference() {
        let judge = YesNoJudge {
            yes: vec![1, 2],
            no: vec![3],
        };
        let (a, b, c) = (0.3f32, 0.1f32, 0.2f32);
        let t = token(&[(1, a.ln()), (2, b.ln()), (3, c.ln()), (9, 0.0)]);
        // log(0.3 + 0.1) − log(0.2) = log 2, whatever an unscored id says.
        assert!((judge.score(&t) - 2f32.ln()).abs() < 1e-6);
        let request = judge.request(Prompt::Text("q".into()));
        assert_eq!(request.params.score_token_ids, [1, 2, 3]);
        assert_eq!(request.params.max_tokens, Some(1));
    }
}
