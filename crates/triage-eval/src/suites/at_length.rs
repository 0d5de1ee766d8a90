//! Suites at length (`--context-tokens` from 8,192), built RULER-style: a corpus holds the gold
//! paragraphs of up to 30 questions and is padded to the length with distractor paragraphs drawn
//! at random from the same split, never one that shares a title (a SQuAD article, a HotpotQA
//! page) with a gold paragraph of the corpus; its documents are in a seeded order, and each
//! question is asked over one corpus only. Shorter lengths keep each suite's own construction,
//! so the 2k runs stay comparable with earlier ones.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use triage_types::Document;

use super::{Example, Group, SuiteParams};
use crate::error::{EvalError, Result};

/// From this many context tokens on, suites are built at length.
pub(crate) const AT_LENGTH_FROM: usize = 8_192;
/// Questions asked over one corpus at most.
pub(crate) const QUESTIONS_PER_CORPUS: usize = 30;

/// A question and the paragraphs holding its evidence.
pub(super) struct Asked {
    pub example: Example,
    pub gold: Vec<Document>,
}

/// Corpora named `{prefix}-{index}`, each asking the next questions of `asked` (in order) while
/// their gold paragraphs fill at most half the length, then padded with `pool` paragraphs; made
/// until `params.limit` questions are asked or `asked` runs out.
pub(super) fn corpora(
    prefix: &str,
    asked: Vec<Asked>,
    pool: &[Document],
    params: &SuiteParams<'_>,
    rng: &mut StdRng,
) -> Result<Vec<Group>> {
    let count = params.count_tokens;
    let mut groups = Vec::new();
    let mut asked = asked.into_iter().peekable();
    let mut total = 0;
    while total < params.limit && asked.peek().is_some() {
        let mut gold: Vec<Document> = Vec::new();
        let mut gold_tokens = 0;
        let mut examples: Vec<Example> = Vec::new();
        while examples.len() < QUESTIONS_PER_CORPUS {
            let Some(next) = asked.peek() else { break };
            let new: Vec<&Document> = next
                .gold
                .iter()
                .filter(|d| !gold.iter().any(|g| g.id == d.id))
                .collect();
            let tokens: usize = new.iter().map(|d| count(&d.text)).sum();
            // A corpus takes at least one question, however long its evidence.
            if !examples.is_empty() && 2 * (gold_tokens + tokens) > params.context_tokens {
                break;
            }
            gold_tokens += tokens;
            gold.extend(new.into_iter().cloned());
            if let Some(a) = asked.next() {
                examples.push(a.example);
            }
        }
        total += examples.len();
        let budget = params.context_tokens.saturating_sub(gold_tokens);
        let distractors = distractors(pool, &gold, budget, count, rng);
        let mut documents = gold;
        documents.extend(distractors);
        documents.shuffle(rng);
        set_depths(&mut examples, &documents, count);
        groups.push(Group {
            id: format!("{prefix}-{}", groups.len()),
            documents,
            examples,
        });
    }
    if groups.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{prefix}: no questions to ask at {} tokens",
            params.context_tokens
        )));
    }
    Ok(groups)
}

/// Paragraphs of `pool` in a random order, kept while they fit in `budget` tokens, none sharing
/// an id or a title with a `gold` paragraph.
fn distractors(
    pool: &[Document],
    gold: &[Document],
    budget: usize,
    count: &dyn Fn(&str) -> usize,
    rng: &mut StdRng,
) -> Vec<Document> {
    let ids: HashSet<&str> = gold.iter().map(|d| d.id.as_str()).collect();
    let titles: HashSet<&str> = gold.iter().map(|d| d.title.as_str()).collect();
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut left = budget;
    for i in order {
        let d = &pool[i];
        if ids.contains(d.id.as_str()) || titles.contains(d.title.as_str()) || !seen.insert(&d.id) {
            continue;
        }
        let tokens = count(&d.text);
        if tokens <= left {
            left -= tokens;
            out.push(d.clone());
        }
        // Paragraphs run to a few hundred tokens: below that, nothing more fits.
        if left < 16 {
            break;
        }
    }
    out
}

/// Each example's depth: where its gold paragraphs start in the corpus text (the mean over
/// them), 0 = first token, 1 = last.
fn set_depths(examples: &mut [Example], documents: &[Document], count: &dyn Fn(&str) -> usize) {
    let mut starts = Vec::with_capacity(documents.len());
    let mut at = 0;
    for d in documents {
        starts.push((d.id.as_str(), at));
        at += count(&d.text);
    }
    let total = at.max(1) as f64;
    for e in examples {
        let depths: Vec<f64> = e
            .gold_docs
            .iter()
            .filter_map(|g| starts.iter().find(|(id, _)| id == g))
            .map(|(_, start)| *start as f64 / total)
            .collect();
        if !depths.is_empty() {
            e.depth = Some(depths.iter().sum::<f64>() / depths.len() as f64);
        }
    }
}

/// `n` evenly spaced depths from 0 to 1 in an order whose every prefix is spread over [0, 1]
/// (both ends, then midpoints of the widest gaps), so a corpus cut short by the limit still
/// covers the range.
pub(super) fn spread_depths(n: usize) -> Vec<f64> {
    if n <= 1 {
        return vec![0.0; n];
    }
    let last = n - 1;
    let mut order = vec![0, last];
    let mut gaps = std::collections::VecDeque::from([(0, last)]);
    while let Some((lo, hi)) = gaps.pop_front() {
        if hi - lo < 2 {
            continue;
        }
        let mid = lo + (hi - lo) / 2;
        order.push(mid);
        gaps.push_back((lo, mid));
        gaps.push_back((mid, hi));
    }
    order.into_iter().map(|i| i as f64 / last as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoring::Scorer;
    use crate::suites::test_support::params;
    use crate::suites::Split;
    use rand::SeedableRng;

    fn doc(id: &str, title: &str, tokens: usize) -> Document {
        Document {
            id: id.into(),
            title: title.into(),
            // test_support::count: a token per 4 characters.
            text: "abcd".repeat(tokens),
        }
    }

    fn asked(i: usize, article: usize) -> Asked {
        let gold = doc(
            &format!("a{article}p{i}"),
            &format!("Article {article}"),
            100,
        );
        Asked {
            example: Example {
                id: format!("q{i}"),
                question: format!("Question {i}?"),
                golds: vec!["x".into()],
                scorer: Scorer::Squad,
                depth: None,
                gold_docs: vec![gold.id.clone()],
                kind: None,
            },
            gold: vec![gold],
        }
    }

    #[test]
    fn a_corpus_holds_its_questions_gold_padded_to_the_length_without_their_articles() {
        // 100 questions over 7 articles; a pool of 400 paragraphs of 100 tokens over 20 articles.
        let questions: Vec<Asked> = (0..100).map(|i| asked(i, i % 7)).collect();
        let pool: Vec<Document> = (0..400)
            .map(|i| {
                doc(
                    &format!("a{}p{}", i % 20, 1000 + i),
                    &format!("Article {}", i % 20),
                    100,
                )
            })
            .collect();
        let p = params(Split::Dev, 65, 8_192);
        let mut rng = StdRng::seed_from_u64(3);
        let groups = corpora("squad-v2-at-length", questions, &pool, &p, &mut rng).unwrap();
        // 30 questions a corpus (3,000 gold tokens, under half of 8,192), until 65 are asked.
        let sizes: Vec<usize> = groups.iter().map(|g| g.examples.len()).collect();
        assert_eq!(sizes, vec![30, 30, 30]);
        let mut asked_ids = HashSet::new();
        for g in &groups {
            let tokens: usize = g.documents.iter().map(|d| d.text.len() / 4).sum();
            assert!(tokens <= 8_192 && tokens > 8_192 - 100, "{tokens}");
            let gold_titles: HashSet<&str> = g
                .documents
                .iter()
                .filter(|d| g.examples.iter().any(|e| e.gold_docs.contains(&d.id)))
                .map(|d| d.title.as_str())
                .collect();
            for d in &g.documents {
                let is_gold = g.examples.iter().any(|e| e.gold_docs.contains(&d.id));
                assert!(
                    is_gold || !gold_titles.contains(d.title.as_str()),
                    "{}",
                    d.id
                );
            }
            for e in &g.examples {
                assert!(asked_ids.insert(e.id.clone()), "{} asked twice", e.id);
                assert!(g.documents.iter().any(|d| d.id == e.gold_docs[0]));
                let depth = e.depth.unwrap();
                assert!((0.0..1.0).contains(&depth));
            }
            // Seeded order: the gold paragraphs are spread through the corpus.
            let depths: Vec<f64> = g.examples.iter().filter_map(|e| e.depth).collect();
            assert!(depths.iter().any(|&d| d > 0.5) && depths.iter().any(|&d| d < 0.5));
        }
        // The same seed builds the same corpora.
        let again = corpora(
            "squad-v2-at-length",
            (0..100).map(|i| asked(i, i % 7)).collect(),
            &pool,
            &p,
            &mut StdRng::seed_from_u64(3),
        )
        .unwrap();
        let ids = |gs: &[Group]| -> Vec<String> {
            gs.iter()
                .flat_map(|g| g.documents.iter().map(|d| d.id.clone()))
                .collect()
        };
        assert_eq!(ids(&groups), ids(&again));
    }

    #[test]
    fn gold_fills_at_most_half_the_length() {
        let questions: Vec<Asked> = (0..40).map(|i| asked(i, i)).collect();
        let pool: Vec<Document> = (0..300)
            .map(|i| doc(&format!("d{i}"), &format!("Other {i}"), 100))
            .collect();
        let p = params(Split::Dev, 40, 4_000);
        let groups = corpora("x", questions, &pool, &p, &mut StdRng::seed_from_u64(1)).unwrap();
        // 100 tokens of gold each: 20 questions fill half of 4,000.
        assert_eq!(groups[0].examples.len(), 20);
        assert_eq!(groups.len(), 2);
        // The questions run out before the limit: the last corpus asks what is left.
        let few: Vec<Asked> = (0..12).map(|i| asked(i, i)).collect();
        let p = params(Split::Dev, 40, 8_192);
        let groups = corpora("x", few, &pool, &p, &mut StdRng::seed_from_u64(1)).unwrap();
        assert_eq!(
            groups.iter().map(|g| g.examples.len()).collect::<Vec<_>>(),
            [12]
        );
        assert!(corpora("x", Vec::new(), &pool, &p, &mut StdRng::seed_from_u64(1)).is_err());
    }

    #[test]
    fn spread_depths_cover_the_range_in_every_prefix() {
        let d = spread_depths(30);
        assert_eq!(d.len(), 30);
        let mut sorted = d.clone();
        sorted.sort_by(f64::total_cmp);
        for (i, x) in sorted.iter().enumerate() {
            assert!((x - i as f64 / 29.0).abs() < 1e-12, "{sorted:?}");
        }
        assert_eq!(&d[..3], &[0.0, 1.0, 14.0 / 29.0]);
        assert_eq!(spread_depths(1), vec![0.0]);
    }
}
