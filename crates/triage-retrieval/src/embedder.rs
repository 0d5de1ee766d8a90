//! `Embedder`: what the corpus needs from an embedding model. `SentenceEmbedder` (BERT through
//! candle) is the real one; tests use cheap deterministic stand-ins.

use triage_models::bert::SentenceEmbedder;

use crate::error::Result;

/// Turns texts into unit-length vectors of a fixed width.
pub trait Embedder {
    /// Identity stored with a corpus: vectors from another embedder are recomputed.
    fn id(&self) -> String;
    fn dim(&self) -> usize;
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

/// A BERT sentence embedder, identified by its folder name and width.
#[derive(Debug)]
pub struct BertEmbedder {
    pub name: String,
    pub model: SentenceEmbedder,
}

impl Embedder for BertEmbedder {
    fn id(&self) -> String {
        format!(
            "{}:{}:{}",
            self.name,
            self.model.dim(),
            self.model.max_len()
        )
    }

    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(self.model.embed(texts)?)
    }
}
