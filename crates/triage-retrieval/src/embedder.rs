//! `Embedder`: what the corpus needs from an embedding model. `SentenceEmbedder` (BERT through
//! candle) is the real one; `HashingEmbedder` (hashed bag of words) is a model-free baseline
//! that tests and benchmarks use where the embedding model is not the point.

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

/// Hashed bag of words, L2-normalised: texts that share words are close. No model, no state.
#[derive(Debug, Clone, Copy)]
pub struct HashingEmbedder {
    pub dim: usize,
}

impl HashingEmbedder {
    /// The vector of one text (all zeros only for a text without words).
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let dim = self.dim.max(1);
        let mut v = vec![0f32; dim];
        for word in text.split_whitespace() {
            let word = word
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            // FNV-1a: stable across runs and platforms.
            let h = triage_core::fnv1a(&word);
            v[(h % dim as u64) as usize] += 1.0;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        v.iter().map(|x| x / norm).collect()
    }
}

impl Embedder for HashingEmbedder {
    fn id(&self) -> String {
        format!("hashing:{}", self.dim)
    }

    fn dim(&self) -> usize {
        self.dim.max(1)
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(texts.iter().map(|t| self.vector(t)).collect())
    }
}
