//! `squad-v2`: SQuAD v2 dev articles split by title hash; each group is an article's first
//! paragraphs up to the context length, with its answerable and unanswerable questions.

use super::{split_of, Example, Group, SuiteParams};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

/// Questions asked over one article at most, spread over its paragraphs.
const QUESTIONS_PER_ARTICLE: usize = 12;

pub(super) fn squad_v2(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    let path = params.data_file("squad.json")?;
    let mut groups = Vec::new();
    let mut total = 0;
    for article in crate::datasets::squad_v2_articles(&path)? {
        if total >= params.limit {
            break;
        }
        if split_of(&article.title) != params.split {
            continue;
        }
        let mut tokens = 0;
        let documents: Vec<_> = article
            .documents
            .into_iter()
            .take_while(|d| {
                let next = tokens + (params.count_tokens)(&d.text);
                let fits = tokens == 0 || next <= params.context_tokens;
                tokens = next;
                fits
            })
            .collect();
        let kept: std::collections::HashSet<&str> =
            documents.iter().map(|d| d.id.as_str()).collect();
        let candidates: Vec<_> = article
            .examples
            .into_iter()
            .filter(|e| e.gold_docs.iter().all(|d| kept.contains(d.as_str())))
            .collect();
        let take = QUESTIONS_PER_ARTICLE.min(candidates.len());
        if take == 0 {
            continue;
        }
        let step = candidates.len() / take;
        let examples: Vec<Example> = candidates
            .into_iter()
            .step_by(step)
            .take(take)
            .map(|e| Example {
                kind: Some(
                    if e.answers.is_empty() {
                        "unanswerable"
                    } else {
                        "answerable"
                    }
                    .into(),
                ),
                id: e.id,
                question: e.question,
                golds: e.answers,
                scorer: Scorer::Squad,
                depth: None,
                gold_docs: e.gold_docs,
            })
            .collect();
        total += examples.len();
        groups.push(Group {
            id: format!("squad-v2-{}", article.title),
            documents,
            examples,
        });
    }
    if groups.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{} has no SQuAD v2 questions",
            path.display()
        )));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use crate::suites::test_support::params;
    use crate::suites::{build, Split, SuiteName};

    fn write_squad(dir: &std::path::Path) {
        let articles: Vec<serde_json::Value> = (0..12)
            .map(|a| {
                let paragraphs: Vec<serde_json::Value> = (0..6)
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
        write_squad(dir.path());
        let build_split = |split| {
            let mut p = params(split, 1_000, 750);
            p.data_dir = dir.path().to_path_buf();
            build(SuiteName::SquadV2, &p).unwrap()
        };
        let (dev, test) = (build_split(Split::Dev), build_split(Split::Test));
        assert_eq!(dev.len() + test.len(), 12);
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
}
