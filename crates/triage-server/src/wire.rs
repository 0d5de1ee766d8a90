//! OpenAI wire types: request bodies of `/v1/chat/completions` and `/v1/completions`, and their
//! translation into the engine's `GenerateRequest`. Fields OpenAI has and triage does not use
//! (`user`, `tools`, ...) are accepted and ignored, as vLLM does; values that change the answer
//! and cannot be honoured are refused with a 400 naming the parameter.

use serde::Deserialize;
use triage_engine::{EntropySettings, GenerateRequest, Prompt, SamplingParams, MAX_TOP_LOGPROBS};
use triage_models::chat_template::ChatMessage;

use crate::api_error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by both endpoints, plus vLLM-style extensions (`top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`, `stop_token_ids`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<StopField>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub n: Option<u32>,
    /// Read by serde only: a `user` that is not a string is refused, as OpenAI refuses it.
    #[serde(default)]
    #[allow(dead_code)]
    pub user: Option<String>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
}

/// One chat message; `content` is a string or a list of `{"type": "text", "text": ...}` parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(flatten)]
    pub common: CommonParams,
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub logprobs: bool,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// triage's extension for the routing pipeline (`{"corpus", "route", "tau"}`), read when
    /// `model` is the pipeline's alias.
    #[serde(default)]
    pub triage: Option<serde_json::Value>,
}

/// `prompt` of the legacy endpoint: text, or token ids; a list must hold exactly one prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: CommonParams,
    pub prompt: PromptField,
    /// Legacy API: the number of top logprobs per token (0..=20 here; OpenAI allows 5).
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: bool,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub best_of: Option<u32>,
}

/// The OpenAI default for `/v1/completions` when `max_tokens` is absent.
pub const LEGACY_DEFAULT_MAX_TOKENS: usize = 16;

impl CommonParams {
    /// Sampling parameters with OpenAI's defaults (temperature 1, top_p 1).
    fn sampling(&self, max_tokens: Option<u32>) -> Result<SamplingParams, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
            }
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid_param("stop", "at most 4 stop sequences"));
        }
        let defaults = SamplingParams::default();
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.map_or(0, |k| k as usize),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: self.seed.map(|s| s as u64),
            max_tokens: max_tokens.map(|n| n as usize),
            stop,
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            ..defaults
        })
    }

    /// Whether the stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

impl ChatMessageIn {
    /// The message's text (content parts joined); other part types are a 400 naming message `i`.
    pub fn text(&self, i: usize) -> Result<String, ApiError> {
        Ok(match &self.content {
            // Only an assistant turn may come without content (OpenAI's rule: it carried tool
            // calls instead).
            None if self.role == "assistant" => String::new(),
            None => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].content"),
                    format!("a {} message needs content", self.role),
                ))
            }
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                &format!("messages[{i}].content"),
                                format!("content parts of type {kind:?} are not supported"),
                            ))
                        }
                    }
                }
                text
            }
        })
    }
}

impl ChatCompletionRequest {
    /// The answer length asked for (`max_completion_tokens`, else `max_tokens`).
    pub fn max_tokens(&self) -> Option<usize> {
        self.max_completion_tokens
            .or(self.common.max_tokens)
            .map(|n| n as usize)
    }

    /// The engine request, or a 400 naming what is wrong.
    pub fn to_generate(&self) -> Result<GenerateRequest, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "at least one message is required",
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!("unknown role {:?}", m.role),
                ));
            }
            let content = m.text(i)?;
            // OpenAI's "developer" role is the newer name of "system".
            let role = if m.role == "developer" {
                "system"
            } else {
                &m.role
            };
            messages.push(ChatMessage::new(role, content));
        }
        let max_tokens = self.max_completion_tokens.or(self.common.max_tokens);
        let mut params = self.common.sampling(max_tokens)?;
        params.logprobs = self.logprobs;
        params.top_logprobs = self.top_logprobs.unwrap_or(0) as usize;
        // The engine's own checks (ranges, top_logprobs needing logprobs, empty stop strings),
        // answered here so a bad request never reaches the engine thread.
        params.validate().map_err(ApiError::from_admission)?;
        Ok(GenerateRequest {
            prompt: Prompt::Chat(messages),
            params,
            entropy: EntropySettings::default(),
        })
    }
}

impl CompletionRequest {
    /// The engine request, or a 400 naming what is wrong.
    pub fn to_generate(&self) -> Result<GenerateRequest, ApiError> {
        if self.echo {
            return Err(ApiError::invalid_param("echo", "echo is not supported"));
        }
        if self.suffix.is_some() {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid_param(
                "best_of",
                "only best_of = 1 is supported",
            ));
        }
        let one = || ApiError::invalid_param("prompt", "exactly one prompt per request");
        let prompt = match &self.prompt {
            PromptField::Text(t) => Prompt::Text(t.clone()),
            PromptField::Texts(v) if v.len() == 1 => Prompt::Text(v[0].clone()),
            PromptField::Tokens(ids) if !ids.is_empty() => Prompt::Tokens(ids.clone()),
            PromptField::TokenLists(v) if v.len() == 1 && !v[0].is_empty() => {
                Prompt::Tokens(v[0].clone())
            }
            _ => return Err(one()),
        };
        if matches!(&prompt, Prompt::Text(t) if t.is_empty()) {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        let max_tokens = Some(
            self.common
                .max_tokens
                .unwrap_or(LEGACY_DEFAULT_MAX_TOKENS as u32),
        );
        let mut params = self.common.sampling(max_tokens)?;
        // The legacy API calls top_logprobs "logprobs": check its range under that name.
        let top = self.logprobs.unwrap_or(0) as usize;
        if top > MAX_TOP_LOGPROBS {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"),
            ));
        }
        params.logprobs = self.logprobs.is_some();
        params.top_logprobs = top;
        params.validate().map_err(ApiError::from_admission)?;
        Ok(GenerateRequest {
            prompt,
            params,
            entropy: EntropySettings::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: serde_json::Value) -> Result<GenerateRequest, ApiError> {
        serde_json::from_value::<ChatCompletionRequest>(body)
            .map_err(|e| ApiError::invalid(e.to_string()))?
            .to_generate()
    }

    #[test]
    fn chat_requests_map_onto_sampling_params() {
        let r = chat(serde_json::json!({
            "model": "m",
            "messages": [{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5,
            "stop": "END", "logprobs": true, "top_logprobs": 3, "seed": 4, "user": "u1"
        }))
        .unwrap();
        assert_eq!(r.params.max_tokens, Some(7), "max_completion_tokens wins");
        assert_eq!(r.params.stop, vec!["END".to_string()]);
        assert_eq!((r.params.logprobs, r.params.top_logprobs), (true, 3));
        match r.prompt {
            Prompt::Chat(m) => assert_eq!(
                (m[0].role.as_str(), m[1].content.as_str()),
                ("system", "hi")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unsupported_values_name_their_parameter() {
        for (body, param) in [
            (
                serde_json::json!({"model": "m", "messages": [], "n": 1}),
                "messages",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}),
                "n",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}),
                "stop",
            ),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param));
        }
    }

    #[test]
    fn completions_default_to_16_tokens_and_take_token_prompts() {
        let r: CompletionRequest =
            serde_json::from_value(serde_json::json!({"model": "m", "prompt": [1, 2, 3]})).unwrap();
        let g = r.to_generate().unwrap();
        assert_eq!(g.params.max_tokens, Some(16));
        assert!(matches!(g.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        let r: CompletionRequest =
            serde_json::from_value(serde_json::json!({"model": "m", "prompt": ["a", "b"]}))
                .unwrap();
        assert_eq!(
            r.to_generate().unwrap_err().param.as_deref(),
            Some("prompt")
        );
    }
}
