//! `triage::Engine`, the library API: models by role, corpora and routing settings from one TOML
//! file; `ask` runs the routing pipeline in this thread.
//!
//! ```no_run
//! use triage::{AskRequest, Engine, TriageConfig};
//!
//! let mut engine = Engine::new(TriageConfig::default())?; // the default models, fetched
//! engine.load_corpus("docs")?; // made by `triage ingest --corpus docs FILES`
//! let answer = engine.ask(&AskRequest {
//!     corpus: "docs".into(),
//!     question: "When was the bridge opened?".into(),
//!     ..AskRequest::default()
//! })?;
//! println!("{} (path: {:?})", answer.text, answer.decision.path);
//! # Ok::<(), triage::Error>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use triage_engine::llm_engine::{EngineConfig, KvBudget};
use triage_engine::EngineSet;
use triage_models::device::{parse_kv_dtype, DeviceSpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_retrieval::{BertEmbedder, Corpus, CorpusStore, Embedder};
use triage_router::long_context::{prepare_long_context, LongContextPrompt};
use triage_router::routing_config::ClassifierSetting;
use triage_router::{
    Answer, AnswerEvent, AskRequest, CorpusView, Generator, ModelRole, Pipeline, RoleEngines,
    RoutingConfig,
};

/// Errors of the library API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("config: {0}")]
    Config(String),
    #[error("loading: {0}")]
    Load(String),
    #[error("no corpus {0:?} is loaded")]
    UnknownCorpus(String),
    #[error(transparent)]
    Router(#[from] triage_router::RouterError),
    #[error(transparent)]
    Engine(#[from] triage_engine::EngineError),
    #[error(transparent)]
    Retrieval(#[from] triage_retrieval::RetrievalError),
}

impl Error {
    /// Whether the caller's input is at fault (a 400 on the server) rather than the engine.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::UnknownCorpus(_)
                | Self::Router(triage_router::RouterError::Invalid(_))
                | Self::Engine(triage_engine::EngineError::Invalid(_))
                | Self::Engine(triage_engine::EngineError::InvalidSampling { .. })
        )
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

fn load_error(e: impl std::fmt::Display) -> Error {
    Error::Load(e.to_string())
}

/// The models, by the role each plays. Roles naming the same model share one engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsConfig {
    pub router: String,
    pub base: String,
    pub long_context: String,
    pub embedder: String,
    /// KV-cache budget of each model (`"1GiB"`, `"4096blocks"`, `"0.3"`).
    pub kv_budget: String,
    /// Where the models run: `"cpu"`, `"cuda"` or `"cuda:N"`; the router, base and
    /// long-context models share one process and this one device.
    pub device: DeviceSpec,
    /// KV-cache dtype (`"bf16"`, `"f16"`, `"f32"`); default bf16 on a GPU, f32 on the CPU.
    pub kv_dtype: Option<String>,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            router: "smollm2-135m".into(),
            base: crate::retrieve::DEFAULT_BASE_MODEL.into(),
            long_context: "qwen2.5-coder-1.5b".into(),
            embedder: crate::retrieve::DEFAULT_EMBEDDER.into(),
            kv_budget: "1GiB".into(),
            device: DeviceSpec::Cpu,
            kv_dtype: None,
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TriageConfig {
    /// Corpora (made by `triage ingest`) loaded at start.
    pub corpora: Vec<String>,
    pub models: ModelsConfig,
    pub routing: RoutingConfig,
    /// Where pinned corpus prefixes are persisted; default `$TRIAGE_HOME/prefixes`.
    pub prefix_dir: Option<PathBuf>,
}

impl TriageConfig {
    pub fn from_toml_str(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(e.to_string()))
    }

    /// The file at `path` (or the defaults) with the command line's model overrides.
    pub fn load_with(
        path: Option<&Path>,
        base: Option<&str>,
        long_context: Option<&str>,
        device: Option<DeviceSpec>,
    ) -> Result<Self> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        if let Some(base) = base {
            config.models.base = base.to_string();
        }
        if let Some(lc) = long_context {
            config.models.long_context = lc.to_string();
        }
        if let Some(device) = device {
            config.models.device = device;
        }
        Ok(config)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
        Self::from_toml_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }
}

/// A loaded corpus and its long-context form.
struct LoadedCorpus {
    corpus: Corpus,
    long_context: std::result::Result<LongContextPrompt, String>,
}

/// What loading a corpus did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CorpusInfo {
    pub name: String,
    pub num_documents: usize,
    pub num_chunks: usize,
    /// Tokens of the corpus prefix in the long-context model, when it fits.
    pub prefix_tokens: Option<usize>,
    /// Tokens pinned in the cache and where their KV came from (`cache`, `disk`, `computed`).
    pub pinned_tokens: Option<usize>,
    pub pinned_from: Option<String>,
    /// Why the long-context path is unavailable for it.
    pub long_context_unavailable: Option<String>,
}

/// Models, corpora and the routing pipeline in one process.
pub struct Engine {
    models: RoleEngines,
    embedder: BertEmbedder,
    pipeline: Pipeline,
    corpora: BTreeMap<String, LoadedCorpus>,
    prefix_dir: PathBuf,
    store: CorpusStore,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("corpora", &self.corpora.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn load_model(name_or_path: &str, device: DeviceSpec) -> Result<Arc<Model>> {
    // The device first: a missing GPU (or a CPU-only build) is the error to report, not the file.
    let opts = LoadOptions::for_device(device).map_err(load_error)?;
    let (name, path) = crate::resolve::resolve_model(name_or_path).map_err(load_error)?;
    let model = Model::load(&name, &path, &opts)
        .map_err(|e| Error::Load(format!("{}: {e}", path.display())))?;
    Ok(Arc::new(model))
}

impl Engine {
    /// Load the models and the corpora the config names.
    pub fn new(config: TriageConfig) -> Result<Self> {
        let pipeline = Pipeline::new(config.routing.clone())?;
        let kv_budget: KvBudget = config.models.kv_budget.parse()?;
        let kv_dtype = match &config.models.kv_dtype {
            Some(name) => Some(parse_kv_dtype(name).map_err(|e| Error::Config(e.to_string()))?),
            None => None,
        };
        let engine_config = EngineConfig {
            kv_budget,
            kv_dtype,
            ..EngineConfig::default()
        };
        let mut set = EngineSet::new();
        let roles = [
            (ModelRole::Base, &config.models.base),
            (ModelRole::LongContext, &config.models.long_context),
            (ModelRole::Router, &config.models.router),
        ];
        let needs_router = matches!(
            config.routing.classifier,
            ClassifierSetting::ZeroShot | ClassifierSetting::ZeroShotThreshold(_)
        );
        let mut assigned = Vec::new();
        for (role, name) in roles {
            if role == ModelRole::Router && !needs_router {
                continue;
            }
            if set.get(name).is_none() {
                set.add(name, load_model(name, config.models.device)?, engine_config)?;
            }
            assigned.push((role, name.clone()));
        }
        let mut models = RoleEngines::new(set);
        for (role, name) in assigned {
            models.assign(role, &name)?;
        }
        let embedder =
            crate::retrieve::load_embedder(&config.models.embedder).map_err(load_error)?;
        let home = triage_models::paths::triage_home();
        let mut engine = Self {
            models,
            embedder,
            pipeline,
            corpora: BTreeMap::new(),
            prefix_dir: config.prefix_dir.unwrap_or_else(|| home.join("prefixes")),
            store: CorpusStore::new(&home),
        };
        for name in &config.corpora {
            engine.load_corpus(name)?;
        }
        Ok(engine)
    }

    /// Use a corpus store other than `$TRIAGE_HOME/corpora` (tests, tools).
    pub fn with_store(mut self, data_dir: &Path) -> Self {
        self.store = CorpusStore::new(data_dir);
        self
    }

    /// Open the corpus `name` and pin its prefix in the long-context model (from the cache, from
    /// the persisted file, or prefilled now and saved). A corpus too long for the model loads
    /// without the long-context path.
    pub fn load_corpus(&mut self, name: &str) -> Result<CorpusInfo> {
        let corpus = self.store.open(name)?;
        self.add_corpus(corpus)
    }

    /// Make an already opened corpus answerable.
    pub fn add_corpus(&mut self, corpus: Corpus) -> Result<CorpusInfo> {
        if corpus.embedder_id() != self.embedder.id() {
            return Err(Error::Config(format!(
                "corpus {:?} was embedded with {}, the engine's embedder is {}",
                corpus.name,
                corpus.embedder_id(),
                self.embedder.id()
            )));
        }
        if let Some(old) = self.corpora.remove(&corpus.name) {
            if let Ok(lc) = &old.long_context {
                self.models
                    .unpin_prefix(ModelRole::LongContext, &lc.prefix)?;
            }
        }
        let (long_context, pinned) = prepare_long_context(
            &mut self.models,
            &corpus,
            &self.pipeline.config,
            &self.prefix_dir,
        )?;
        let info = CorpusInfo {
            name: corpus.name.clone(),
            num_documents: corpus.num_documents(),
            num_chunks: corpus.chunks().len(),
            prefix_tokens: long_context.as_ref().ok().map(|lc| lc.prefix.len()),
            pinned_tokens: pinned.map(|p| p.num_tokens),
            pinned_from: pinned.map(|p| format!("{:?}", p.source).to_lowercase()),
            long_context_unavailable: long_context.as_ref().err().cloned(),
        };
        self.corpora.insert(
            corpus.name.clone(),
            LoadedCorpus {
                corpus,
                long_context,
            },
        );
        Ok(info)
    }

    /// Names of the loaded corpora.
    pub fn corpora(&self) -> impl Iterator<Item = &str> {
        self.corpora.keys().map(String::as_str)
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Route the next questions with other settings (the evaluation harness runs several
    /// systems over one set of loaded models). A zero-shot classifier needs the router model,
    /// which is loaded only when the engine's first settings asked for it.
    pub fn set_routing(&mut self, routing: RoutingConfig) -> Result<()> {
        let zero_shot = matches!(
            routing.classifier,
            ClassifierSetting::ZeroShot | ClassifierSetting::ZeroShotThreshold(_)
        );
        if zero_shot && self.models.model(ModelRole::Router).is_err() {
            return Err(Error::Config(
                "a zero-shot classifier needs the router model: start the engine with it".into(),
            ));
        }
        self.pipeline = Pipeline::new(routing)?;
        Ok(())
    }

    /// The number of tokens of `text` for the long-context model (what corpus lengths are
    /// measured in).
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        let model = self.models.model(ModelRole::LongContext)?;
        let ids = model
            .tokenizer
            .encode(text, false, false)
            .map_err(triage_router::RouterError::from)?;
        Ok(ids.len())
    }

    /// Answer one question.
    pub fn ask(&mut self, request: &AskRequest) -> Result<Answer> {
        self.ask_stream(request, |_| {})
    }

    /// Answer one question, passing the answer's path and text to `on_event` as they are decided
    /// and generated.
    pub fn ask_stream(
        &mut self,
        request: &AskRequest,
        mut on_event: impl FnMut(AnswerEvent),
    ) -> Result<Answer> {
        let loaded = self
            .corpora
            .get(&request.corpus)
            .ok_or_else(|| Error::UnknownCorpus(request.corpus.clone()))?;
        let view = CorpusView {
            name: &loaded.corpus.name,
            corpus: &loaded.corpus,
            backend: None,
            long_context: loaded.long_context.as_ref().map_err(Clone::clone),
        };
        Ok(self.pipeline.ask(
            &mut self.models,
            &self.embedder,
            &view,
            request,
            &mut on_event,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use triage_router::routing_config::{ClassifierSetting, RagSearch, RerankSetting};
    use triage_router::RoutePath;

    /// The `[routing]` table as the README documents it.
    #[test]
    fn the_documented_config_parses() {
        let text = r#"
corpora = ["docs"]

[models]
long_context = "qwen2.5-coder-0.5b"

[routing]
classifier = { learned = "/tmp/classifier.json" }
gate_nll = 0.2
actions = ["none", "rag", "hybrid", "lc"]
abstain = true

[routing.retrieval]
search = "dual"
rerank = "llm"
k = 4
gain_policy = "/tmp/gain.json"

[routing.monitor]
tau = 0.6
window = 30
estimator = "full_softmax"
self_route = true
combined_score = "/tmp/combined.json"

[routing.prices.long_context]
prompt = 3.0
cached_prompt = 0.75
completion = 9.0
"#;
        let c = TriageConfig::from_toml_str(text).unwrap();
        assert_eq!(c.corpora, ["docs"]);
        assert_eq!(c.models.long_context, "qwen2.5-coder-0.5b");
        assert_eq!(c.models.base, "qwen2.5-coder-0.5b");
        let r = &c.routing;
        assert_eq!(
            r.classifier,
            ClassifierSetting::Learned("/tmp/classifier.json".into())
        );
        assert_eq!(r.gate_nll, Some(0.2));
        assert_eq!(r.actions.len(), 4);
        assert!(r.abstain);
        assert_eq!(r.retrieval.search, RagSearch::Dual);
        assert_eq!(r.retrieval.rerank, RerankSetting::Llm);
        assert_eq!(r.monitor.tau, 0.6);
        assert_eq!(r.prices.long_context.cached_prompt, 0.75);
        assert!(r.allows(RoutePath::Hybrid));
        for (form, expected) in [
            ("\"zero_shot\"", ClassifierSetting::ZeroShot),
            (
                "{ zero_shot_threshold = 0.19 }",
                ClassifierSetting::ZeroShotThreshold(0.19),
            ),
            ("\"off\"", ClassifierSetting::Off),
        ] {
            let c =
                TriageConfig::from_toml_str(&format!("[routing]\nclassifier = {form}\n")).unwrap();
            assert_eq!(c.routing.classifier, expected);
        }
        assert!(TriageConfig::from_toml_str("[routing]\nclassifier = \"psychic\"\n").is_err());
        assert!(TriageConfig::from_toml_str("[models]\nbase = 3\n").is_err());
    }

    #[test]
    fn models_take_a_device_and_a_kv_dtype() {
        let c = TriageConfig::from_toml_str("[models]\ndevice = \"cuda:1\"\nkv_dtype = \"f32\"\n")
            .unwrap();
        assert_eq!(c.models.device, DeviceSpec::Cuda(1));
        assert_eq!(c.models.kv_dtype.as_deref(), Some("f32"));
        assert_eq!(TriageConfig::default().models.device, DeviceSpec::Cpu);
        let err = TriageConfig::from_toml_str("[models]\ndevice = \"tpu\"\n").unwrap_err();
        assert!(err.to_string().contains("cuda:N"), "{err}");
        // A CPU build refuses a GPU when the engine starts, before it loads anything.
        #[cfg(not(feature = "cuda"))]
        {
            let mut config = TriageConfig::default();
            config.models.device = DeviceSpec::Cuda(0);
            config.models.base = "/nonexistent/base.gguf".into();
            let err = Engine::new(config).unwrap_err().to_string();
            assert!(err.contains("without the `cuda` feature"), "{err}");
        }
    }
}
