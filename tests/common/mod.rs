//! What several integration tests share: an engine config over a tiny random Qwen2 model (for
//! every role) and a tiny BERT embedder, written into a test's folder.

use std::path::Path;

use candle_core::quantized::GgmlDType;
use triage::TriageConfig;
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};

/// Models for every role in `dir`, with a context long enough for a small corpus plus a
/// question, persisted prefixes under `dir/prefixes`, short answers, and prices under which RAG
/// looks cheaper than reading the corpus whole (so the router tries it first).
pub fn tiny_config(dir: &Path) -> TriageConfig {
    let model = dir.join("tiny.gguf");
    let spec = TinySpec {
        context_length: 4096,
        ..TinySpec::new(Architecture::Qwen2)
    };
    write_tiny_gguf(&model, &spec, GgmlDType::F32).unwrap();
    let bert = dir.join("tiny-bert");
    triage_models::bert_fixtures::write_tiny_bert(&bert, false, 7).unwrap();
    let mut config = TriageConfig::default();
    let path = |p: &Path| p.to_string_lossy().into_owned();
    config.models.base = path(&model);
    config.models.long_context = path(&model);
    config.models.embedder = path(&bert);
    config.models.kv_budget = "512blocks".into();
    config.prefix_dir = Some(dir.join("prefixes"));
    config.routing.rag_max_tokens = 8;
    config.routing.lc_max_tokens = 4;
    config.routing.retrieval.k = 2;
    config.routing.prices.long_context.cached_prompt = 100.0;
    config
}
