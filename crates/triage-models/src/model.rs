//! Loading a model from a path: a GGUF file or a HF safetensors folder, into a `Transformer`.

use std::path::Path;

use crate::config::{ModelConfig, RopeScaling};
use crate::transformer::{LoadOptions, Transformer};
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// The on-disk format of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

/// A transformer plus the weight source it came from (whose metadata builds the tokenizer).
#[derive(Debug)]
pub struct LoadedWeights {
    pub transformer: Transformer,
    pub source: WeightSource,
    pub format: ModelFormat,
}

/// Open `path` (a `.gguf` file or a folder with `config.json` and `*.safetensors`) and build the
/// transformer. A missing, truncated or malformed file is an error, never a panic.
pub fn load_weights(path: &Path, opts: &LoadOptions) -> Result<LoadedWeights> {
    let (mut source, config, format) = open(path)?;
    let transformer = Transformer::load(config, &mut source, opts)?;
    Ok(LoadedWeights {
        transformer,
        source,
        format,
    })
}

/// Open `path` and read its configuration, without reading any weight.
fn open(path: &Path) -> Result<(WeightSource, ModelConfig, ModelFormat)> {
    let meta = std::fs::metadata(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::InvalidModel {
                path: config_path.clone(),
                message: e.to_string(),
            })?;
        let mut config = ModelConfig::from_hf_json(&json)?;
        let source = WeightSource::open_safetensors_dir(path)?;
        if !source.contains("output.weight") {
            config.tie_embeddings = true;
        }
        return Ok((source, config, ModelFormat::Safetensors));
    }
    let mut source = WeightSource::open_gguf(path)?;
    let vocab_size = source
        .dims("token_embd.weight")
        .and_then(|d| d.first().copied())
        .ok_or_else(|| ModelError::InvalidModel {
            path: path.to_path_buf(),
            message: "no token_embd.weight tensor".into(),
        })?;
    let tie = !source.contains("output.weight");
    let md = source
        .gguf_metadata()
        .ok_or_else(|| ModelError::Invalid("gguf without metadata".into()))?;
    let mut config = ModelConfig::from_gguf(md, vocab_size, tie)?;
    if let Some(factors) = gguf_rope_freqs(&mut source, &config)? {
        config.rope_scaling = factors;
        config.validate()?;
    }
    Ok((source, config, ModelFormat::Gguf))
}

/// Llama 3's rope scaling as llama.cpp stores it: a `rope_freqs.weight` tensor of one factor
/// per rotary frequency. A file that also declares a scaling type would scale twice: refused.
fn gguf_rope_freqs(source: &mut WeightSource, config: &ModelConfig) -> Result<Option<RopeScaling>> {
    const NAME: &str = "rope_freqs.weight";
    if !source.contains(NAME) {
        return Ok(None);
    }
    if config.rope_scaling != RopeScaling::None {
        return Err(ModelError::Unsupported(format!(
            "{NAME} beside a declared rope scaling ({:?})",
            config.rope_scaling
        )));
    }
    let factors = source
        .get(NAME, &candle_core::Device::Cpu)?
        .to_dense_f32(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    if factors.len() != config.head_dim / 2 {
        return Err(ModelError::Invalid(format!(
            "{NAME} has {} factors for a head of {} dimensions",
            factors.len(),
            config.head_dim
        )));
    }
    Ok(Some(RopeScaling::FreqFactors(factors)))
}

/// A model ready to run: transformer, tokenizer, chat template and where it came from.
#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub path: std::path::PathBuf,
    pub format: ModelFormat,
    pub transformer: Transformer,
    pub tokenizer: crate::tokenizer::TextTokenizer,
    pub chat_template: crate::chat_template::ChatTemplate,
}

impl Model {
    /// Load weights, tokenizer and chat template from `path` (GGUF file or safetensors folder).
    pub fn load(name: &str, path: &Path, opts: &LoadOptions) -> Result<Self> {
        let (mut source, config, format) = open(path)?;
        let metadata = source.shared_gguf_metadata();
        // The tokenizer (a BPE over 150k tokens for Qwen2.5) builds on a thread of its own
        // while the weights load: a sixth of a cold start, on the core the loading leaves idle
        // between its parallel packing steps.
        let (transformer, tokenizer) = std::thread::scope(|scope| {
            let tokenizer = scope.spawn(|| match &metadata {
                Some(md) => crate::tokenizer::TextTokenizer::from_gguf(md),
                None => crate::tokenizer::TextTokenizer::from_tokenizer_json(
                    &path.join("tokenizer.json"),
                ),
            });
            let transformer = Transformer::load(config, &mut source, opts);
            let tokenizer = tokenizer.join().unwrap_or_else(|panic| {
                Err(ModelError::Tokenizer(format!(
                    "building the tokenizer panicked: {}",
                    panic_message(&panic)
                )))
            });
            (transformer, tokenizer)
        });
        let (transformer, tokenizer) = (transformer?, tokenizer?);
        let chat_template = match tokenizer.chat_template() {
            Some(source) => crate::chat_template::ChatTemplate::new(
                source,
                &tokenizer.bos_token().unwrap_or_default(),
                &tokenizer.eos_token().unwrap_or_default(),
            )?,
            None => crate::chat_template::ChatTemplate::chatml(),
        };
        Ok(Self {
            name: name.to_string(),
            path: path.to_path_buf(),
            format,
            transformer,
            tokenizer,
            chat_template,
        })
    }

    /// The model's context length in tokens.
    pub fn context_length(&self) -> usize {
        self.transformer.config().context_length
    }
}

/// The text of a panic's payload, where it carries one.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}
