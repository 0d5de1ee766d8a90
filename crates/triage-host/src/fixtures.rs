//! A config over tiny random-weight models for tests: a Qwen2 GGUF playing every role and a
//! tiny BERT embedder, written into the test's folder.

use std::path::Path;

use candle_core::quantized::GgmlDType;
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_router::ModelRole;

use crate::config::TriageConfig;
use crate::error::Result;

/// Models for every role in `dir`, with a context long enough for a small corpus plus a
/// question, persisted prefixes under `dir/prefixes`, short answers, and prices under which RAG
/// looks cheaper than reading the corpus whole (so the router tries it first).
pub fn tiny_config(dir: &Path) -> Result<TriageConfig> {
    let model = dir.join("tiny.gguf");
    let spec = TinySpec {
        context_length: 4096,
        ..TinySpec::new(Architecture::Qwen2)
    };
    write_tiny_gguf(&model, &spec, GgmlDType::F32)?;
    let bert = dir.join("tiny-bert");
    triage_models::bert_fixtures::write_tiny_bert(&bert, false, 7)?;
    let mut config = TriageConfig::default();
    let path = |p: &Path| p.to_string_lossy().into_owned();
    config.set_model(ModelRole::Base, &path(&model))?;
    config.set_model(ModelRole::LongContext, &path(&model))?;
    config.pipeline.embedder = path(&bert);
    config.set_kv_budget("512blocks");
    config.pipeline.prefix_dir = Some(dir.join("prefixes"));
    config.routing.rag_max_tokens = 8;
    config.routing.lc_max_tokens = 4;
    config.routing.retrieval.k = 2;
    config.routing.prices.long_context.cached_prompt = 100.0;
    Ok(config)
}
