//! The pseudo-passage of dual-path retrieval: the base model, closed book and greedy, writes a
//! short passage that would answer the question; its embedding is the second search vector.

use triage_engine::SamplingParams;
use triage_engine::{EntropySettings, GenerateRequest, Prompt};
use triage_models::chat_template::ChatMessage;

use crate::error::{Result, RouterError};
use crate::generator::{Generator, ModelRole};

/// Length cap of a pseudo-passage: a short paragraph, like the chunks it is matched against.
pub const PSEUDO_PASSAGE_TOKENS: usize = 96;

const INSTRUCTION: &str = "Write one short encyclopedic paragraph that answers the question. \
State facts directly; do not mention the question.";

fn request(question: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Chat(vec![
            ChatMessage::new("system", INSTRUCTION),
            ChatMessage::new("user", question),
        ]),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..SamplingParams::default()
        },
        entropy: EntropySettings::default(),
    }
}

/// One pseudo-passage per question, generated as one batch by the base model.
pub fn write_pseudo_passages(
    generator: &mut dyn Generator,
    questions: &[&str],
    max_tokens: usize,
) -> Result<Vec<String>> {
    if max_tokens == 0 {
        return Err(RouterError::Invalid(
            "a pseudo-passage needs at least one token".into(),
        ));
    }
    let requests: Vec<_> = questions.iter().map(|q| request(q, max_tokens)).collect();
    let outputs = generator.generate(ModelRole::Base, &requests, &mut |_, _, _| true)?;
    Ok(outputs
        .into_iter()
        .map(|o| o.text.trim().to_string())
        .collect())
}

/// The pseudo-passage for one question.
pub fn write_pseudo_passage(
    generator: &mut dyn Generator,
    question: &str,
    max_tokens: usize,
) -> Result<String> {
    Ok(write_pseudo_passages(generator, &[question], max_tokens)?.remove(0))
}
