//! `hotpotqa`: dev distractor questions split by id hash, packed into groups whose pooled
//! paragraphs (each question's gold and distractor paragraphs) reach the context length; the
//! supporting-fact titles are the retrieval labels.

use std::collections::HashSet;

use super::{split_of, Example, Group, SuiteParams};
use crate::error::{EvalError, Result};
use crate::scoring::Scorer;

/// HotpotQA questions read from the file at most (the dev file has 7,405).
const MAX_QUESTIONS_READ: usize = 8_000;

pub(super) fn hotpotqa(params: &SuiteParams<'_>) -> Result<Vec<Group>> {
    let path = params.data_file("hotpotqa.json")?;
    let mut groups: Vec<Group> = Vec::new();
    let mut tokens = 0;
    let mut titles = HashSet::new();
    let mut total = 0;
    for item in crate::datasets::hotpotqa_items(&path, MAX_QUESTIONS_READ)? {
        if total >= params.limit {
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
        let e = item.example;
        group.examples.push(Example {
            id: e.id,
            question: e.question,
            golds: e.answers,
            scorer: Scorer::Hotpot,
            depth: None,
            gold_docs: e.gold_docs,
            kind: None,
        });
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
