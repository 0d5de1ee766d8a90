//! Retrieval as the router runs it: dense or hybrid search over a corpus, reranked by a
//! cross-encoder or by the router model (`LlmReranker`), optionally searched with a
//! pseudo-passage the model writes (HyDE).

pub(crate) mod llm_reranker;
pub(crate) mod pseudo_passage;
pub(crate) mod retriever;
