//! Needle suites: `passkey` hides a five-digit key in repeated filler at stepped depths (one
//! key per corpus, the depths 0, 1/9, ..., 1 in turn); `niah` (RULER style) hides "special magic
//! numbers" for named keys in the Paul Graham essays, ten needles per haystack at evenly spaced
//! depths.

use rand::rngs::StdRng;
use rand::Rng;
use serde::Deserialize;
use triage_types::Document;

use super::{Example, Group, SuiteName, SuiteParams, SPREAD_DEPTHS};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

const FILLER: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and \
back again. ";

/// Needles (and questions) per `niah` haystack: one at each of the spread depths.
const NEEDLES_PER_HAYSTACK: usize = SPREAD_DEPTHS.len();

const ADJECTIVES: [&str; 16] = [
    "amber", "brisk", "candid", "dusky", "eager", "frosty", "gentle", "hollow", "ivory", "jolly",
    "lucid", "mellow", "nimble", "placid", "rustic", "silent",
];
const NOUNS: [&str; 16] = [
    "anchor", "badger", "canyon", "dahlia", "ember", "falcon", "glacier", "harbor", "island",
    "juniper", "kettle", "lantern", "meadow", "orchard", "pebble", "quarry",
];

/// Byte offsets just after each sentence end (". " / ".\n"), and the text's end.
fn sentence_ends(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut ends: Vec<usize> = (1..bytes.len())
        .filter(|&i| bytes[i - 1] == b'.' && (bytes[i] == b' ' || bytes[i] == b'\n'))
        .map(|i| i + 1)
        .collect();
    ends.push(text.len());
    ends
}

/// Insert each needle at the sentence boundary nearest its depth (fraction of the text).
fn insert_needles(text: &str, needles: &[(f64, String)]) -> String {
    let ends = sentence_ends(text);
    let mut at: Vec<(usize, &str)> = needles
        .iter()
        .map(|(depth, needle)| {
            let target = (depth * text.len() as f64) as usize;
            let pos = if *depth <= 0.0 {
                0
            } else {
                ends.iter()
                    .copied()
                    .min_by_key(|&e| e.abs_diff(target))
                    .unwrap_or(text.len())
            };
            (pos, needle.as_str())
        })
        .collect();
    at.sort_by_key(|&(p, _)| p);
    let mut out = String::with_capacity(text.len() + needles.len() * 80);
    let mut last = 0;
    for (pos, needle) in at {
        out.push_str(&text[last..pos]);
        if !out.is_empty() && !out.ends_with(' ') && !out.ends_with('\n') {
            out.push(' ');
        }
        out.push_str(needle);
        out.push(' ');
        last = pos;
    }
    out.push_str(&text[last..]);
    out
}

/// Repeat `unit` until the text has about `tokens` tokens.
fn filler(params: &SuiteParams<'_>, unit: &str, tokens: usize) -> String {
    let per_unit = (params.count_tokens)(unit).max(1);
    unit.repeat((tokens / per_unit).max(1))
}

pub(super) fn passkey(params: &SuiteParams<'_>, rng: &mut StdRng) -> Vec<Group> {
    (0..params.limit)
        .map(|i| {
            let depth = SPREAD_DEPTHS[i % SPREAD_DEPTHS.len()];
            let key = format!("{}", rng.random_range(10_000..100_000u32));
            let needle = format!("The pass key is {key}. Remember it. {key} is the pass key.");
            let budget = params
                .context_tokens
                .saturating_sub((params.count_tokens)(&needle));
            let text = insert_needles(&filler(params, FILLER, budget), &[(depth, needle)]);
            let id = format!("{}-{i}", SuiteName::Passkey.as_str());
            Group {
                documents: vec![Document {
                    id: id.clone(),
                    title: "Notes".into(),
                    text,
                }],
                examples: vec![Example {
                    id: format!("{id}-key"),
                    question: "What is the pass key?".into(),
                    golds: vec![key],
                    scorer: Scorer::FirstDigits,
                    depth: Some(depth),
                    gold_docs: vec![id.clone()],
                    kind: None,
                }],
                id,
            }
        })
        .collect()
}

#[derive(Deserialize)]
struct Essays {
    text: String,
}

/// A haystack of about `tokens` tokens from the essays, starting at a random sentence.
fn haystack(params: &SuiteParams<'_>, essays: &str, tokens: usize, rng: &mut StdRng) -> String {
    let ends = sentence_ends(essays);
    let start = ends[rng.random_range(0..ends.len() / 2)];
    // Grow by characters, then trim to whole sentences; 4 characters per token to start.
    let mut chars = tokens * 4;
    loop {
        let end = (start + chars).min(essays.len());
        let end = ends.iter().copied().rfind(|&e| e <= end).unwrap_or(end);
        let text = &essays[start.min(end)..end];
        let n = (params.count_tokens)(text);
        if n >= tokens * 95 / 100 || end == essays.len() {
            if n > tokens * 105 / 100 && chars > 64 {
                chars = chars * tokens / n;
                continue;
            }
            return text.trim().to_string();
        }
        chars = chars * tokens / n.max(1) + 64;
    }
}

pub(super) fn niah(params: &SuiteParams<'_>, rng: &mut StdRng) -> Result<Vec<Group>> {
    let path = params.data_file("PaulGrahamEssays.json")?;
    let essays: Essays = crate::datasets::read_json(&path)?;
    if essays.text.len() < params.context_tokens * 8 {
        return Err(EvalError::Invalid(format!(
            "{} is too short for {} context tokens",
            path.display(),
            params.context_tokens
        )));
    }
    let groups = params.limit.div_ceil(NEEDLES_PER_HAYSTACK);
    let mut out = Vec::new();
    for g in 0..groups {
        let id = format!("{}-{g}", SuiteName::Niah.as_str());
        let mut keys = std::collections::BTreeSet::new();
        while keys.len() < NEEDLES_PER_HAYSTACK {
            let a = ADJECTIVES[rng.random_range(0..ADJECTIVES.len())];
            let n = NOUNS[rng.random_range(0..NOUNS.len())];
            keys.insert(format!("{a}-{n}"));
        }
        // In spread order, so a haystack cut short by the limit still spans its depths.
        let needles: Vec<(f64, String, String)> = SPREAD_DEPTHS
            .into_iter()
            .zip(keys)
            .map(|(d, k)| {
                (
                    d,
                    k,
                    format!("{}", rng.random_range(1_000_000..10_000_000u32)),
                )
            })
            .collect();
        let texts: Vec<(f64, String)> = needles
            .iter()
            .map(|(d, k, v)| {
                (
                    *d,
                    format!("One of the special magic numbers for {k} is: {v}."),
                )
            })
            .collect();
        let needle_tokens: usize = texts.iter().map(|(_, t)| (params.count_tokens)(t)).sum();
        let hay = haystack(
            params,
            &essays.text,
            params.context_tokens.saturating_sub(needle_tokens).max(64),
            rng,
        );
        let examples = needles
            .iter()
            .map(|(d, k, v)| Example {
                id: format!("{id}-{k}"),
                question: format!(
                    "What is the special magic number for {k} mentioned in the provided text?"
                ),
                golds: vec![v.clone()],
                scorer: Scorer::Substring,
                depth: Some(*d),
                gold_docs: vec![id.clone()],
                kind: None,
            })
            .collect();
        out.push(Group {
            documents: vec![Document {
                id: id.clone(),
                title: "Essays".into(),
                text: insert_needles(&hay, &texts),
            }],
            examples,
            id,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suites::test_support::params;
    use crate::suites::{build, Split};

    #[test]
    fn passkey_sits_at_its_depth_and_the_text_fits() {
        let p = params(Split::Test, 12, 1_000);
        let groups = build(SuiteName::Passkey, &p).unwrap();
        assert_eq!(groups.len(), 12);
        assert_eq!(groups[1].examples[0].depth, Some(1.0));
        assert_eq!(groups[10].examples[0].depth, Some(0.0));
        for g in &groups {
            let e = &g.examples[0];
            let text = &g.documents[0].text;
            let needle = format!("The pass key is {}.", e.golds[0]);
            let at = text.find(&needle).unwrap() as f64 / text.len() as f64;
            assert!(
                (at - e.depth.unwrap()).abs() < 0.05,
                "{at} vs {:?}",
                e.depth
            );
            let tokens = (p.count_tokens)(text);
            assert!((900..=1_100).contains(&tokens), "{tokens}");
        }
    }

    #[test]
    fn niah_needles_are_in_the_haystack_in_depth_order() {
        let dir = tempfile::tempdir().unwrap();
        let essay: String = (0..4_000)
            .map(|i| format!("Essay sentence number {i} says little. "))
            .collect();
        std::fs::write(
            dir.path().join("PaulGrahamEssays.json"),
            serde_json::json!({ "text": essay }).to_string(),
        )
        .unwrap();
        let mut p = params(Split::Dev, 12, 1_500);
        p.data_dir = dir.path().to_path_buf();
        let groups = build(SuiteName::Niah, &p).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].examples.len(), 10);
        assert_eq!(groups[1].examples.len(), 2);
        for g in &groups {
            let text = &g.documents[0].text;
            let tokens = (p.count_tokens)(text);
            assert!((1_300..=1_700).contains(&tokens), "{tokens}");
            let mut by_depth: Vec<(f64, usize)> = g
                .examples
                .iter()
                .map(|e| {
                    let key = e.question.split(' ').nth(7).unwrap();
                    let needle = format!("special magic numbers for {key} is: {}.", e.golds[0]);
                    (e.depth.unwrap(), text.find(&needle).unwrap())
                })
                .collect();
            by_depth.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(by_depth.windows(2).all(|w| w[0].1 < w[1].1), "{by_depth:?}");
        }
    }
}
