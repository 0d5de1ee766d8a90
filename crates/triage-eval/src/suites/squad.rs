//! `squad-v2`: SQuAD v2 dev articles split by title hash; each group is a window of an article's
//! consecutive paragraphs up to the context length, with its answerable and unanswerable questions.
//! The first windows of all articles come first, then the second windows, and so on, so a larger
//! limit only appends groups. From 8,192 tokens on, corpora are built at length (`at_length`):
//! rounds over the split's articles in a seeded order, five paragraphs of each article a round,
//! one of each paragraph's questions (at random, so about half are unanswerable, as in the data).

use rand::seq::IndexedRandom;
use rand::seq::SliceRandom;

use super::at_length::{self, Asked, AT_LENGTH_FROM};
use super::{split_of, Example, Group, SuiteName, SuiteParams};
use crate::datasets::{ArticleQa, QaExample};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;
use triage_types::Document;

/// Questions asked over one window at most, spread over its paragraphs.
const QUESTIONS_PER_WINDOW: usize = 12;

/// Paragraphs of an article asked about in one round of the at-length construction.
const PARAGRAPHS_PER_ROUND: usize = 5;

pub(super) fn squad_v2(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    if params.context_tokens >= AT_LENGTH_FROM {
        return squad_v2_at_length(params);
    }
    let path = params.data_file("squad.json")?;
    let mut articles = Vec::new();
    for article in crate::datasets::squad_v2_articles(&path)? {
        if split_of(&article.title) == params.split {
            let windows = windows(&article.documents, params);
            articles.push((article, windows));
        }
    }
    let num_windows = articles.iter().map(|(_, w)| w.len()).max().unwrap_or(0);
    let mut groups = Vec::new();
    let mut total = 0;
    'windows: for window_idx in 0..num_windows {
        for (article, windows) in &articles {
            if total >= params.limit {
                break 'windows;
            }
            let Some(documents) = windows.get(window_idx) else {
                continue;
            };
            if let Some(group) = window_group(article, window_idx, documents) {
                total += group.examples.len();
                groups.push(group);
            }
        }
    }
    if groups.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{} has no SQuAD v2 questions",
            path.display()
        )));
    }
    Ok(groups)
}

fn squad_v2_at_length(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    let path = params.data_file("squad.json")?;
    let mut rng = params.rng(SuiteName::SquadV2);
    let mut articles: Vec<ArticleQa> = crate::datasets::squad_v2_articles(&path)?
        .into_iter()
        .filter(|a| split_of(&a.title) == params.split)
        .collect();
    articles.shuffle(&mut rng);
    let pool: Vec<Document> = articles
        .iter()
        .flat_map(|a| a.documents.iter().cloned())
        .collect();
    // Each article's paragraphs that have questions, with one of them picked.
    let per_article: Vec<Vec<Asked>> = articles
        .iter()
        .map(|a| {
            a.documents
                .iter()
                .filter_map(|d| {
                    let questions: Vec<&QaExample> = a
                        .examples
                        .iter()
                        .filter(|e| e.gold_docs == [d.id.clone()])
                        .collect();
                    let e = questions.choose(&mut rng)?;
                    Some(Asked {
                        example: example(e),
                        gold: vec![d.clone()],
                    })
                })
                .collect()
        })
        .collect();
    let rounds = per_article
        .iter()
        .map(|a| a.len().div_ceil(PARAGRAPHS_PER_ROUND))
        .max()
        .unwrap_or(0);
    let mut queues: Vec<std::vec::IntoIter<Asked>> =
        per_article.into_iter().map(Vec::into_iter).collect();
    let mut asked = Vec::new();
    for _ in 0..rounds {
        for queue in &mut queues {
            asked.extend(queue.by_ref().take(PARAGRAPHS_PER_ROUND));
        }
    }
    let prefix = format!("squad-v2-{}k", params.context_tokens / 1024);
    at_length::corpora(&prefix, asked, &pool, params, &mut rng)
}

/// An article's paragraphs cut greedily into windows of at most the context length (a window
/// holds at least one paragraph). Windows after the first must hold half the context length:
/// a short tail would make long context as cheap as RAG.
fn windows(documents: &[Document], params: &SuiteParams<'_>) -> Vec<Vec<Document>> {
    let mut windows: Vec<(Vec<Document>, usize)> = Vec::new();
    let mut current: Vec<Document> = Vec::new();
    let mut tokens = 0;
    for document in documents {
        let len = (params.count_tokens)(&document.text);
        if !current.is_empty() && tokens + len > params.context_tokens {
            windows.push((std::mem::take(&mut current), tokens));
            tokens = 0;
        }
        tokens += len;
        current.push(document.clone());
    }
    if !current.is_empty() {
        windows.push((current, tokens));
    }
    windows
        .into_iter()
        .enumerate()
        .filter(|(idx, (_, tokens))| *idx == 0 || 2 * tokens >= params.context_tokens)
        .map(|(_, (window, _))| window)
        .collect()
}

/// The group of one window: up to `QUESTIONS_PER_WINDOW` of the questions whose evidence lies
/// in it, spread evenly; `None` when it has none.
fn window_group(article: &ArticleQa, window_idx: usize, documents: &[Document]) -> Option<Group> {
    let kept: std::collections::HashSet<&str> = documents.iter().map(|d| d.id.as_str()).collect();
    let candidates: Vec<&QaExample> = article
        .examples
        .iter()
        .filter(|e| e.gold_docs.iter().all(|d| kept.contains(d.as_str())))
        .collect();
    let take = QUESTIONS_PER_WINDOW.min(candidates.len());
    if take == 0 {
        return None;
    }
    let step = candidates.len() / take;
    let examples = candidates
        .into_iter()
        .step_by(step)
        .take(take)
        .map(example)
        .collect();
    // The first window keeps the article's name, so runs made before windows existed resume.
    let id = match window_idx {
        0 => format!("squad-v2-{}", article.title),
        idx => format!("squad-v2-{}-part{}", article.title, idx + 1),
    };
    Some(Group {
        id,
        documents: documents.to_vec(),
        examples,
    })
}

fn example(e: &QaExample) -> Example {
    Example {
        kind: Some(
            if e.answers.is_empty() {
                "unanswerable"
            } else {
                "answerable"
            }
            .into(),
        ),
        id: e.id.clone(),
        question: e.question.clone(),
        golds: e.answers.clone(),
        scorer: Scorer::Squad,
        depth: None,
        gold_docs: e.gold_docs.clone(),
    }
}

#[cfg(test)]
mod tests {
    use crate::suites::test_support::params;
    use crate::suites::{build, Split, SuiteName};

    fn write_squad(dir: &std::path::Path, num_paragraphs: usize) {
        let articles: Vec<serde_json::Value> = (0..12)
            .map(|a| {
                let paragraphs: Vec<serde_json::Value> = (0..num_paragraphs)
                    .map(|p| {
                        serde_json::json!({
                            "context": format!("Article {a:02} paragraph {p}. ").repeat(40),
                            "qas": [
                                {"id": format!("a{a}p{p}q0"), "question": "Which paragraph?",
                                 "answers": [{"text": format!("paragraph {p}")}],
                                 "is_impossible": false},
                                {"id": format!("a{a}p{p}q1"), "question": "Who wrote it?",
                                 "answers": [], "is_impossible": true},
                            ]
                        })
                    })
                    .collect();
                serde_json::json!({"title": format!("Article_{a}"), "paragraphs": paragraphs})
            })
            .collect();
        std::fs::write(
            dir.join("squad.json"),
            serde_json::json!({ "data": articles }).to_string(),
        )
        .unwrap();
    }

    #[test]
    fn squad_v2_splits_by_article_and_keeps_unanswerable_questions() {
        let dir = tempfile::tempdir().unwrap();
        write_squad(dir.path(), 6);
        let build_split = |split| {
            let mut p = params(split, 1_000, 750);
            p.data_dir = dir.path().to_path_buf();
            build(SuiteName::SquadV2, &p).unwrap()
        };
        let (dev, test) = (build_split(Split::Dev), build_split(Split::Test));
        // Two windows of three paragraphs an article.
        assert_eq!(dev.len() + test.len(), 24);
        let dev_ids: std::collections::HashSet<&str> = dev.iter().map(|g| g.id.as_str()).collect();
        assert!(test.iter().all(|g| !dev_ids.contains(g.id.as_str())));
        for g in dev.iter().chain(&test) {
            // 240 tokens a paragraph: three fit in 750 tokens, four do not.
            assert_eq!(
                g.documents.len(),
                3,
                "{:?}",
                g.documents.iter().map(|d| d.id.clone()).collect::<Vec<_>>()
            );
            assert_eq!(g.examples.len(), 6);
            let unanswerable = g.examples.iter().filter(|e| e.golds.is_empty()).count();
            assert_eq!(unanswerable, 3);
            assert!(g
                .examples
                .iter()
                .all(|e| g.documents.iter().any(|d| d.id == e.gold_docs[0])));
        }
    }

    #[test]
    fn squad_v2_first_windows_come_first_and_short_tails_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        // Seven paragraphs of 240 tokens in 750-token windows: 3 + 3 + a 240-token tail.
        write_squad(dir.path(), 7);
        let build_limit = |limit| {
            let mut p = params(Split::Test, limit, 750);
            p.data_dir = dir.path().to_path_buf();
            build(SuiteName::SquadV2, &p).unwrap()
        };
        let all = build_limit(1_000);
        let num_articles = all.iter().filter(|g| !g.id.contains("-part")).count();
        assert!(num_articles > 0);
        assert_eq!(all.len(), 2 * num_articles, "the tail window is dropped");
        assert!(all[..num_articles].iter().all(|g| !g.id.contains("-part")));
        assert!(all[num_articles..].iter().all(|g| g.id.ends_with("-part2")));
        for (first, second) in all[..num_articles].iter().zip(&all[num_articles..]) {
            assert_eq!(second.id, format!("{}-part2", first.id));
            assert!(first
                .documents
                .iter()
                .all(|d| !second.documents.contains(d)));
            assert!(second
                .examples
                .iter()
                .all(|e| second.documents.iter().any(|d| d.id == e.gold_docs[0])));
        }
        // A limit the first windows can meet builds exactly the groups it built before
        // windows existed: a larger limit only appends.
        let first_only = build_limit(6 * num_articles);
        assert_eq!(first_only.len(), num_articles);
        for (a, b) in first_only.iter().zip(&all) {
            assert_eq!(a.id, b.id);
            assert_eq!(a.documents, b.documents);
        }
    }

    #[test]
    fn squad_v2_at_length_pads_gold_paragraphs_with_other_articles() {
        let dir = tempfile::tempdir().unwrap();
        write_squad(dir.path(), 30);
        let build_split = |split, limit| {
            let mut p = params(split, limit, 8_192);
            p.data_dir = dir.path().to_path_buf();
            build(SuiteName::SquadV2, &p).unwrap()
        };
        let dev = build_split(Split::Dev, 40);
        let test = build_split(Split::Test, 40);
        let ids = |gs: &[crate::suites::Group]| -> Vec<String> {
            gs.iter()
                .flat_map(|g| g.examples.iter().map(|e| e.id.clone()))
                .collect()
        };
        let (d, t) = (ids(&dev), ids(&test));
        assert_eq!((d.len(), t.len()), (40, 40));
        assert!(d.iter().all(|id| !t.contains(id)));
        assert!(dev[0].id.starts_with("squad-v2-8k-"), "{}", dev[0].id);
        for g in &dev {
            // 240 tokens a paragraph: 17 gold paragraphs fill half of 8,192 tokens.
            let tokens: usize = g.documents.iter().map(|d| d.text.len().div_ceil(4)).sum();
            assert!(tokens <= 8_192 && tokens > 8_192 - 240, "{tokens}");
            let gold: Vec<&triage_types::Document> = g
                .documents
                .iter()
                .filter(|d| g.examples.iter().any(|e| e.gold_docs.contains(&d.id)))
                .collect();
            assert_eq!(gold.len(), g.examples.len());
            for doc in &g.documents {
                let is_gold = gold.iter().any(|x| x.id == doc.id);
                assert!(is_gold || gold.iter().all(|x| x.title != doc.title));
            }
        }
        // One question of each paragraph, picked at random: both kinds occur.
        let kinds: std::collections::HashSet<Option<String>> = dev
            .iter()
            .flat_map(|g| g.examples.iter().map(|e| e.kind.clone()))
            .collect();
        assert_eq!(kinds.len(), 2, "{kinds:?}");
        // A larger limit appends corpora: the first ones stay as they were.
        let more = build_split(Split::Dev, 60);
        assert_eq!(more[0].documents, dev[0].documents);
        assert_eq!(ids(&more)[..40], d[..]);
    }
}
