//! Key-value retrieval suites: a JSON object of random UUID4 keys and values, one pair per
//! line, with questions asking for the value of a key at a known position. `kv-retrieval`
//! (∞Bench Retrieve.KV) asks ten questions per object at depths 0, 1/9, ..., 1, so the gold
//! position sweeps linearly across examples; `kv-litm` (lost in the middle) puts it at five
//! chosen positions in objects of 75, 140 and 300 pairs, taken in turn.

use rand::rngs::StdRng;
use rand::Rng;
use triage_types::Document;

use super::at_length::{spread_depths, AT_LENGTH_FROM, QUESTIONS_PER_CORPUS};
use super::{Example, Group, SuiteName, SuiteParams, SPREAD_DEPTHS};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

/// The gold positions of `kv-litm`, as depths.
const LITM_DEPTHS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];
/// The object sizes of `kv-litm`.
const LITM_PAIRS: [usize; 3] = [75, 140, 300];

/// A random UUID version 4 in its canonical text form.
pub(crate) fn uuid4(rng: &mut StdRng) -> String {
    let mut b: [u8; 16] = rng.random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The object, one pair per line; at length (`at_length`) a blank line between pairs, still
/// JSON, makes each pair a block of its own, so retrieval chunks end at record boundaries
/// instead of inside a key or a value.
fn object_text(pairs: &[(String, String)], at_length: bool) -> String {
    let lines: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("  \"{k}\": \"{v}\""))
        .collect();
    let separator = if at_length { ",\n\n" } else { ",\n" };
    format!("{{\n{}\n}}", lines.join(separator))
}

/// How many pairs fit `context_tokens`, measured on sample pairs with the model's tokenizer.
fn pairs_that_fit(params: &SuiteParams<'_>, rng: &mut StdRng) -> usize {
    let sample: Vec<(String, String)> = (0..16).map(|_| (uuid4(rng), uuid4(rng))).collect();
    let text = object_text(&sample, params.context_tokens >= AT_LENGTH_FROM);
    let per_pair = (params.count_tokens)(&text) as f64 / sample.len() as f64;
    ((params.context_tokens as f64 / per_pair.max(1.0)) as usize).max(2)
}

fn question(key: &str) -> String {
    format!("What is the value of the key \"{key}\" in the JSON object?")
}

/// One object of `num_pairs` pairs, named `id`, with a question for the pair at each depth.
fn object_group(
    id: String,
    num_pairs: usize,
    depths: &[f64],
    scorer: Scorer,
    kind: Option<String>,
    at_length: bool,
    rng: &mut StdRng,
) -> Group {
    let pairs: Vec<(String, String)> = (0..num_pairs).map(|_| (uuid4(rng), uuid4(rng))).collect();
    let mut used = std::collections::HashSet::new();
    let examples = depths
        .iter()
        .filter_map(|&d| {
            let at = (d * (num_pairs - 1) as f64).round() as usize;
            // Two depths rounding to one pair would ask the same question twice.
            used.insert(at).then(|| {
                let (key, value) = &pairs[at];
                Example {
                    id: format!("{id}-pair{at}"),
                    question: question(key),
                    golds: vec![value.clone()],
                    scorer,
                    depth: Some(at as f64 / (num_pairs - 1) as f64),
                    gold_docs: vec![id.clone()],
                    kind: kind.clone(),
                }
            })
        })
        .collect();
    Group {
        documents: vec![Document {
            id: id.clone(),
            title: "JSON object".into(),
            text: object_text(&pairs, at_length),
        }],
        id,
        examples,
    }
}

pub(super) fn kv_retrieval(params: &SuiteParams<'_>, rng: &mut StdRng) -> Result<Vec<Group>> {
    let num_pairs = pairs_that_fit(params, rng);
    let at_length = params.context_tokens >= AT_LENGTH_FROM;
    // At length, 30 keys asked per object, as the at-length QA corpora ask 30 questions.
    let depths = if at_length {
        spread_depths(QUESTIONS_PER_CORPUS)
    } else {
        SPREAD_DEPTHS.to_vec()
    };
    Ok((0..params.limit.div_ceil(depths.len()))
        .map(|g| {
            object_group(
                format!("{}-{g}", SuiteName::KvRetrieval.as_str()),
                num_pairs,
                &depths,
                Scorer::WholeWord,
                None,
                at_length,
                rng,
            )
        })
        .collect())
}

pub(super) fn kv_litm(params: &SuiteParams<'_>, rng: &mut StdRng) -> Result<Vec<Group>> {
    let fit = pairs_that_fit(params, rng);
    let sizes: Vec<usize> = LITM_PAIRS.iter().copied().filter(|&p| p <= fit).collect();
    if sizes.is_empty() {
        return Err(EvalError::Invalid(format!(
            "kv-litm needs objects of {LITM_PAIRS:?} pairs; {} context tokens hold {fit}: \
             raise the context length",
            params.context_tokens
        )));
    }
    Ok((0..params.limit.div_ceil(LITM_DEPTHS.len()))
        .map(|o| {
            let size = sizes[o % sizes.len()];
            object_group(
                format!("{}-{o}", SuiteName::KvLitm.as_str()),
                size,
                &LITM_DEPTHS,
                Scorer::Substring,
                Some(format!("pairs={size}")),
                params.context_tokens >= AT_LENGTH_FROM,
                rng,
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suites::test_support::params;
    use crate::suites::{build, Split};

    #[test]
    fn kv_retrieval_sweeps_positions_and_fits_the_context() {
        let p = params(Split::Dev, 25, 2_000);
        let groups = build(SuiteName::KvRetrieval, &p).unwrap();
        assert_eq!(groups.len(), 3);
        let examples: Vec<&Example> = groups.iter().flat_map(|g| &g.examples).collect();
        assert_eq!(examples.len(), 25);
        // The last object, cut to five questions, still spans the object.
        let last: Vec<f64> = groups[2]
            .examples
            .iter()
            .map(|e| e.depth.unwrap())
            .collect();
        assert_eq!(last.len(), 5);
        assert!(last.contains(&0.0) && last.contains(&1.0), "{last:?}");
        assert!(last.iter().any(|d| (0.3..0.7).contains(d)), "{last:?}");
        for g in &groups {
            let tokens = (p.count_tokens)(&g.documents[0].text);
            assert!((1_700..=2_300).contains(&tokens), "{tokens}");
            let object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&g.documents[0].text).unwrap();
            for e in &g.examples {
                let key = e.question.split('"').nth(1).unwrap();
                assert_eq!(object[key], e.golds[0].as_str());
            }
        }
    }

    #[test]
    fn a_larger_limit_only_appends_questions() {
        let small = build(SuiteName::KvRetrieval, &params(Split::Dev, 13, 500)).unwrap();
        let large = build(SuiteName::KvRetrieval, &params(Split::Dev, 40, 500)).unwrap();
        for (a, b) in small.iter().zip(&large) {
            assert_eq!(a.documents[0].text, b.documents[0].text);
            let ids = |g: &Group| g.examples.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
            assert_eq!(ids(a), ids(b)[..a.examples.len()]);
        }
    }

    #[test]
    fn splits_and_seeds_make_different_objects() {
        let dev = build(SuiteName::KvRetrieval, &params(Split::Dev, 5, 500)).unwrap();
        let dev2 = build(SuiteName::KvRetrieval, &params(Split::Dev, 5, 500)).unwrap();
        let test = build(SuiteName::KvRetrieval, &params(Split::Test, 5, 500)).unwrap();
        assert_eq!(dev[0].documents[0].text, dev2[0].documents[0].text);
        assert_ne!(dev[0].documents[0].text, test[0].documents[0].text);
    }

    #[test]
    fn uuids_are_version_4() {
        let mut rng = rand::SeedableRng::seed_from_u64(1);
        let u = uuid4(&mut rng);
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
    }

    #[test]
    fn kv_litm_uses_the_sizes_that_fit() {
        // 75 pairs of two UUIDs (~85 characters, ~22 tokens at 4 characters) fit 2,000
        // tokens; 140 do not.
        let p = params(Split::Dev, 10, 2_000);
        let groups = build(SuiteName::KvLitm, &p).unwrap();
        assert_eq!(groups.len(), 2);
        assert!(groups
            .iter()
            .flat_map(|g| &g.examples)
            .all(|e| e.kind.as_deref() == Some("pairs=75")));
        assert_eq!(groups.iter().map(|g| g.examples.len()).sum::<usize>(), 10);
        assert!(build(SuiteName::KvLitm, &params(Split::Dev, 10, 300)).is_err());
    }

    #[test]
    fn kv_retrieval_at_length_asks_thirty_keys_with_records_apart() {
        let p = params(Split::Test, 45, 8_192);
        let groups = build(SuiteName::KvRetrieval, &p).unwrap();
        assert_eq!(
            groups.iter().map(|g| g.examples.len()).collect::<Vec<_>>(),
            [30, 15]
        );
        let text = &groups[0].documents[0].text;
        let tokens = text.len().div_ceil(4);
        assert!(tokens <= 8_192 && tokens > 7_500, "{tokens}");
        // Still one JSON object, a blank line between records (retrieval's block boundary).
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).unwrap();
        assert_eq!(text.matches(",\n\n").count(), object.len() - 1);
        let depths: Vec<f64> = groups[0].examples.iter().filter_map(|e| e.depth).collect();
        assert_eq!(depths.len(), 30);
        assert!(depths.contains(&0.0) && depths.contains(&1.0));
        // The 2k construction is unchanged: one record a line.
        let short = build(SuiteName::KvRetrieval, &params(Split::Test, 10, 2_000)).unwrap();
        assert!(!short[0].documents[0].text.contains(",\n\n"));
        assert_eq!(short[0].examples.len(), 10);
    }
}
