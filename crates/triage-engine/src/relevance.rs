//! LLM relevance scores for reranking: the base model reads a passage and a question and is
//! asked whether the passage alone answers it, a `YesNoJudge` question (log p("yes") −
//! log p("no")). All passages run as one batch through the engine.

use triage_models::chat_template::ChatMessage;
use triage_models::tokenizer::TextTokenizer;

use crate::generate::{GenerateRequest, Prompt, TokenOutput};
use crate::llm_engine::{LlmEngine, StreamEvent};
use crate::yes_no::YesNoJudge;
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

/// The relevance judge: the yes/no judge asked the relevance question.
#[derive(Debug, Clone)]
pub struct RelevanceJudge {
    judge: YesNoJudge,
}

impl RelevanceJudge {
    /// The judge for a model whose tokenizer is `tokenizer`; an error when its vocabulary has no
    /// single-token yes or no.
    pub fn new(tokenizer: &TextTokenizer) -> Result<Self> {
        Ok(Self {
            judge: YesNoJudge::new(tokenizer)?,
        })
    }

    /// One judgement: a single greedy step that reports the logprobs of the yes/no tokens.
    pub fn request(&self, question: &str, passage: &str) -> GenerateRequest {
        self.judge.request(Prompt::Chat(vec![
            ChatMessage::new("system", SYSTEM),
            ChatMessage::new("user", judgement(question, passage)),
        ]))
    }

    /// The score of a judgement's first token: log p(yes) − log p(no).
    pub fn score(&self, token: &TokenOutput) -> f32 {
        self.judge.score(token)
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
