//! `hotpotqa`: dev distractor questions split by id hash, packed into groups whose pooled
//! paragraphs (each question's gold and distractor paragraphs) reach the context length; the
//! supporting-fact titles are the retrieval labels. From 8,192 tokens on, corpora are built at
//! length (`at_length`): the split's questions in file order with their supporting pages as
//! gold, padded with pages of the split's other questions.

use std::collections::HashSet;

use super::at_length::{self, Asked, AT_LENGTH_FROM};
use super::{split_of, Example, Group, SuiteName, SuiteParams};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

/// HotpotQA questions read from the file at most (the dev file has 7,405).
const MAX_QUESTIONS_READ: usize = 8_000;

pub(super) fn hotpotqa(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    if params.context_tokens >= AT_LENGTH_FROM {
        return hotpotqa_at_length(params);
    }
    let path = params.data_file("hotpotqa.json")?;
    let mut groups: Vec<Group> = Vec::new();
    let mut tokens = 0;
    let mut titles = HashSet::new();
    let mut total = 0;
    for item in crate::datasets::hotpotqa_items(&path, MAX_QUESTIONS_READ)? {
        // The last group is filled to its length too, so a larger limit keeps its corpus.
        if total >= params.limit && tokens >= params.context_tokens {
            break;
        }
        if split_of(&item.example.id) != params.split {
            continue;
        }
        if groups.is_empty() || tokens >= params.context_tokens {
            groups.push(Group {
                id: format!("hotpotqa-{}", groups.len()),
                documents: Vec::new(),
                examples: Vec::new(),
            });
            tokens = 0;
            titles.clear();
        }
        let Some(group) = groups.last_mut() else {
            continue;
        };
        for d in item.documents {
            if titles.insert(d.id.clone()) {
                tokens += (params.count_tokens)(&d.text);
                group.documents.push(d);
            }
        }
        group.examples.push(example(item.example));
        total += 1;
    }
    if groups.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{} has no HotpotQA questions for this split",
            path.display()
        )));
    }
    Ok(groups)
}

fn example(e: crate::datasets::QaExample) -> Example {
    Example {
        id: e.id,
        question: e.question,
        golds: e.answers,
        scorer: Scorer::Hotpot,
        depth: None,
        gold_docs: e.gold_docs,
        kind: None,
    }
}

fn hotpotqa_at_length(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    let path = params.data_file("hotpotqa.json")?;
    let items: Vec<_> = crate::datasets::hotpotqa_items(&path, MAX_QUESTIONS_READ)?
        .into_iter()
        .filter(|item| split_of(&item.example.id) == params.split)
        .collect();
    let pool: Vec<triage_types::Document> = items
        .iter()
        .flat_map(|item| item.documents.iter().cloned())
        .collect();
    let asked = items
        .into_iter()
        .map(|item| {
            let gold = item
                .documents
                .into_iter()
                .filter(|d| item.example.gold_docs.contains(&d.id))
                .collect();
            Asked {
                example: example(item.example),
                gold,
            }
        })
        .collect();
    let prefix = format!("hotpotqa-{}k", params.context_tokens / 1024);
    at_length::corpora(
        &prefix,
        asked,
        &pool,
        params,
        &mut params.rng(SuiteName::Hotpotqa),
    )
}

#[cfg(test)]
mod tests {
    use crate::suites::test_support::params;
    use crate::suites::{build, Split, SuiteName};

    /// `questions` HotpotQA records of four 43-token pages each, whose first `supporting`
    /// pages support the answer "yes".
    fn write_hotpot(dir: &std::path::Path, questions: usize, supporting: usize) {
        let records: Vec<serde_json::Value> = (0..questions)
            .map(|q| {
                let context: Vec<serde_json::Value> = (0..4)
                    .map(|p| {
                        serde_json::json!([
                            format!("Title {q}-{p}"),
                            ["Some words here. ".repeat(10)]
                        ])
                    })
                    .collect();
                let facts: Vec<serde_json::Value> = (0..supporting)
                    .map(|p| serde_json::json!([format!("Title {q}-{p}"), 0]))
                    .collect();
                serde_json::json!({"_id": format!("q{q}"), "question": format!("Question {q}?"),
                    "answer": "yes", "supporting_facts": facts, "context": context})
            })
            .collect();
        std::fs::write(
            dir.join("hotpotqa.json"),
            serde_json::Value::from(records).to_string(),
        )
        .unwrap();
    }

    #[test]
    fn hotpotqa_packs_questions_until_the_context_is_full() {
        let dir = tempfile::tempdir().unwrap();
        write_hotpot(dir.path(), 40, 1);
        let make = |split| {
            let mut p = params(split, 10, 500);
            p.data_dir = dir.path().to_path_buf();
            build(SuiteName::Hotpotqa, &p).unwrap()
        };
        let (dev, test) = (make(Split::Dev), make(Split::Test));
        let ids = |g: &[crate::suites::Group]| -> Vec<String> {
            g.iter()
                .flat_map(|g| g.examples.iter().map(|e| e.id.clone()))
                .collect()
        };
        let (d, t) = (ids(&dev), ids(&test));
        assert_eq!((d.len(), t.len()), (10, 10));
        assert!(d.iter().all(|id| !t.contains(id)));
        for g in &dev {
            // 40 tokens a paragraph, 160 a question: a group closes once it reaches 500.
            assert!(g.examples.len() <= 4);
            for e in &g.examples {
                assert!(g.documents.iter().any(|d| d.id == e.gold_docs[0]));
                assert_eq!(e.golds, ["yes"]);
            }
        }
    }

    #[test]
    fn hotpotqa_at_length_asks_each_question_over_its_supporting_pages() {
        let dir = tempfile::tempdir().unwrap();
        write_hotpot(dir.path(), 200, 2);
        let mut p = params(Split::Dev, 45, 8_192);
        p.data_dir = dir.path().to_path_buf();
        let groups = build(SuiteName::Hotpotqa, &p).unwrap();
        // 30 questions and 60 gold pages of 43 tokens, then pages of unasked questions.
        assert_eq!(
            groups.iter().map(|g| g.examples.len()).collect::<Vec<_>>(),
            [30, 15]
        );
        for g in &groups {
            assert!(g.id.starts_with("hotpotqa-8k-"), "{}", g.id);
            let tokens: usize = g.documents.iter().map(|d| d.text.len().div_ceil(4)).sum();
            assert!(tokens <= 8_192 && tokens > 8_000, "{tokens}");
            for e in &g.examples {
                for gold in &e.gold_docs {
                    assert!(g.documents.iter().any(|d| &d.id == gold));
                }
                assert!(e.depth.is_some());
            }
        }
    }
}
