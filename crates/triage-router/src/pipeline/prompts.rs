//! The prompt text of each stage (gate, RAG, long context) and how a declining answer is recognised.

use triage_retrieval::Hit;

use crate::UNANSWERABLE;

pub(super) const GATE_SYSTEM: &str = "Answer the question with the answer only, in a few words.";
pub(super) const RAG_SYSTEM: &str =
    "Answer the question using only the context. Reply with the answer \
only, in a few words.";

/// The self-check's question, asked after the RAG answer in the same chat.
pub(super) const SELF_CHECK: &str =
    "Is your answer correct according to the context? Reply yes or no.";

/// The decline instructions of the RAG and the long-context prompts.
const RAG_DECLINE: &str = "If the context does not contain the answer, reply exactly:";
pub(super) const LC_DECLINE: &str = "If the documents do not contain the answer, reply exactly:";

/// Whether a Self-Route answer declines.
pub(super) fn declines(text: &str) -> bool {
    let t: String = text
        .trim()
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .collect::<String>()
        .to_lowercase();
    t.starts_with(UNANSWERABLE)
}

/// The question, with the instruction to decline when `decline` is set.
pub(super) fn question_text(question: &str, decline: bool, instruction: &str) -> String {
    if decline {
        format!("{}\n{instruction} {UNANSWERABLE}", question.trim())
    } else {
        question.trim().to_string()
    }
}

/// The RAG prompt's user turn: the retrieved chunks, best first, then the question.
pub(super) fn rag_user(question: &str, hits: &[Hit], decline: bool) -> String {
    let mut context = String::new();
    for (i, h) in hits.iter().enumerate() {
        context.push_str(&format!(
            "[{}] {}\n{}\n\n",
            i + 1,
            h.chunk.title,
            h.chunk.text.trim()
        ));
    }
    format!(
        "Context:\n\n{context}Question: {}",
        question_text(question, decline, RAG_DECLINE)
    )
}
