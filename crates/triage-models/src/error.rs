//! The error type of `triage-models`.

/// Errors from loading or running a model, its tokenizer or its chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("ops: {0}")]
    Ops(#[from] triage_ops::OpsError),
    #[error("io error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("invalid model file {path}: {message}")]
    InvalidModel {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("unsupported architecture {0:?} (supported: qwen2, qwen3, llama)")]
    UnsupportedArchitecture(String),
    /// A config key whose value would change the model's math in a way triage does not
    /// implement: refused rather than ignored.
    #[error("unsupported model configuration: {0}")]
    Unsupported(String),
    #[error("missing metadata key {0:?}")]
    MissingMetadata(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("unsupported tokenizer model {0:?} (supported: gpt2-style BPE)")]
    UnsupportedTokenizerModel(String),
    #[error("unknown pre-tokenizer {0:?}: refusing to guess how to split text")]
    UnknownPreTokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("{0} asked for, but this triage binary was built without the `cuda` feature (build one with scripts/build-cuda)")]
    NotCompiledWithCuda(String),
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
