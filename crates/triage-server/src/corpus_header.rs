//! `x-triage-corpus: NAME[@GENERATION]`, the key a gateway routes corpus questions on. A
//! `model: "triage"` request carries only the question and the corpus name, and the corpus's
//! tokens live only in the replica that pinned them, so prefix-routing gateways cannot see the
//! affinity: this header lets them hash on it. A request may carry it instead of (or beside) the
//! body's `triage.corpus`; every routed response carries the generation that answered.

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;

use crate::api_error::ApiError;

/// The header's name.
pub const CORPUS_HEADER: &str = "x-triage-corpus";

/// What a request's header names: a corpus, and optionally the generation the client (or the
/// gateway) last saw. The generation is a routing hint only: a replica answers from its live
/// generation and says which in the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorpusKey {
    pub name: String,
    pub generation: Option<u64>,
}

impl CorpusKey {
    /// `NAME` or `NAME@GENERATION` (a decimal number).
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let bad = |why: &str| {
            ApiError::invalid_param(
                CORPUS_HEADER,
                format!("{CORPUS_HEADER} must be NAME or NAME@GENERATION ({why}): {text:?}"),
            )
        };
        let (name, generation) = match text.trim().rsplit_once('@') {
            Some((name, generation)) => {
                let generation = generation
                    .parse::<u64>()
                    .map_err(|_| bad("the generation is a number"))?;
                (name, Some(generation))
            }
            None => (text.trim(), None),
        };
        if name.is_empty() {
            return Err(bad("the name is empty"));
        }
        Ok(Self {
            name: name.to_string(),
            generation,
        })
    }

    /// The request's header, if it has one.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let Some(value) = headers.get(CORPUS_HEADER) else {
            return Ok(None);
        };
        let text = value.to_str().map_err(|_| {
            ApiError::invalid_param(CORPUS_HEADER, format!("{CORPUS_HEADER} is not ASCII text"))
        })?;
        Self::parse(text).map(Some)
    }
}

/// The corpus a routed request is about: the body's `triage.corpus` or the header's name. Where
/// both are given they must agree, or the gateway routed on something other than what is asked.
pub fn corpus_name(header: Option<&CorpusKey>, body: Option<&str>) -> Result<String, ApiError> {
    match (header, body) {
        (Some(h), Some(b)) if h.name != b => Err(ApiError::invalid_param(
            CORPUS_HEADER,
            format!(
                "{CORPUS_HEADER} names corpus {:?} but the body names {b:?}",
                h.name
            ),
        )),
        (_, Some(b)) => Ok(b.to_string()),
        (Some(h), None) => Ok(h.name.clone()),
        (None, None) => Err(ApiError::invalid_param(
            "triage",
            format!(
                "the pipeline needs a corpus: a `triage` object {{\"corpus\": NAME}} or an \
                 {CORPUS_HEADER}: NAME header"
            ),
        )),
    }
}

/// `response` with the header naming the corpus generation that answered.
pub fn with_corpus(mut response: Response, name: &str, generation: Option<u64>) -> Response {
    let text = match generation {
        Some(g) => format!("{name}@{g}"),
        None => name.to_string(),
    };
    // Corpus names are checked ASCII; a value that is not a valid header is left out.
    if let Ok(value) = HeaderValue::from_str(&text) {
        response.headers_mut().insert(CORPUS_HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_name_and_an_optional_generation() {
        let key = CorpusKey::parse("wiki@12").unwrap();
        assert_eq!((key.name.as_str(), key.generation), ("wiki", Some(12)));
        assert_eq!(CorpusKey::parse(" wiki ").unwrap().generation, None);
        for bad in ["", "@3", "wiki@", "wiki@x", "wiki@-1"] {
            let err = CorpusKey::parse(bad).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(CORPUS_HEADER), "{bad:?}");
        }
    }

    #[test]
    fn header_and_body_must_name_the_same_corpus() {
        let key = CorpusKey::parse("wiki@2").unwrap();
        assert_eq!(corpus_name(Some(&key), None).unwrap(), "wiki");
        assert_eq!(corpus_name(Some(&key), Some("wiki")).unwrap(), "wiki");
        assert_eq!(corpus_name(None, Some("docs")).unwrap(), "docs");
        let err = corpus_name(Some(&key), Some("docs")).unwrap_err();
        assert!(err.message.contains("\"wiki\" but the body names \"docs\""));
        assert_eq!(
            corpus_name(None, None).unwrap_err().param.as_deref(),
            Some("triage")
        );
    }
}
