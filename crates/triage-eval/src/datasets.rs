//! Question-answering data sets as corpora plus questions with gold documents: HotpotQA
//! (dev, distractor setting; gold = the supporting-fact paragraphs) and SQuAD v2 (dev; answerable
//! questions, gold = the question's paragraph). Both come with `triage models fetch --data`.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use triage_types::Document;

use crate::error::{io_error, EvalError, Result};

/// One question with its reference answers and the ids of the documents that hold the evidence.
#[derive(Debug, Clone)]
pub struct QaExample {
    pub id: String,
    pub question: String,
    /// Empty for an unanswerable SQuAD v2 question.
    pub answers: Vec<String>,
    pub gold_docs: Vec<String>,
}

/// A corpus and questions over it.
#[derive(Debug, Clone)]
pub struct QaDataset {
    pub name: String,
    pub documents: Vec<Document>,
    pub examples: Vec<QaExample>,
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    serde_json::from_slice(&bytes).map_err(|source| EvalError::Json {
        path: path.display().to_string(),
        source,
    })
}

#[derive(Deserialize)]
struct HotpotRecord {
    #[serde(rename = "_id")]
    id: String,
    question: String,
    answer: String,
    supporting_facts: Vec<(String, serde_json::Value)>,
    context: Vec<(String, Vec<String>)>,
}

/// One HotpotQA question with its own ten paragraphs (gold and distractors), one document per
/// title.
#[derive(Debug, Clone)]
pub struct HotpotItem {
    pub example: QaExample,
    pub documents: Vec<Document>,
}

/// The first `num_questions` HotpotQA questions of the file, each with its paragraphs.
pub fn hotpotqa_items(path: &Path, num_questions: usize) -> Result<Vec<HotpotItem>> {
    let records: Vec<HotpotRecord> = read_json(path)?;
    Ok(records
        .into_iter()
        .take(num_questions)
        .map(|r| {
            let documents = r
                .context
                .iter()
                .map(|(title, sentences)| Document {
                    id: title.clone(),
                    title: title.clone(),
                    text: sentences.concat(),
                })
                .collect();
            let gold: BTreeSet<String> = r.supporting_facts.into_iter().map(|(t, _)| t).collect();
            HotpotItem {
                example: QaExample {
                    id: r.id,
                    question: r.question,
                    answers: vec![r.answer],
                    gold_docs: gold.into_iter().collect(),
                },
                documents,
            }
        })
        .collect())
}

/// The first `num_questions` HotpotQA questions; the corpus is every paragraph of their contexts
/// (an open corpus: each question's distractors compete with everyone's), one document per
/// title.
pub fn hotpotqa(path: &Path, num_questions: usize) -> Result<QaDataset> {
    let mut seen = BTreeSet::new();
    let mut documents = Vec::new();
    let mut examples = Vec::new();
    for item in hotpotqa_items(path, num_questions)? {
        for d in item.documents {
            if seen.insert(d.id.clone()) {
                documents.push(d);
            }
        }
        examples.push(item.example);
    }
    Ok(QaDataset {
        name: "hotpotqa".into(),
        documents,
        examples,
    })
}

#[derive(Deserialize)]
struct SquadFile {
    data: Vec<SquadArticle>,
}

#[derive(Deserialize)]
struct SquadArticle {
    title: String,
    paragraphs: Vec<SquadParagraph>,
}

#[derive(Deserialize)]
struct SquadParagraph {
    context: String,
    qas: Vec<SquadQuestion>,
}

#[derive(Deserialize)]
struct SquadQuestion {
    id: String,
    question: String,
    answers: Vec<SquadAnswer>,
    #[serde(default)]
    is_impossible: bool,
}

#[derive(Deserialize)]
struct SquadAnswer {
    text: String,
}

/// The first `num_paragraphs` paragraphs of an article as documents (`<title>#<index>`) and their
/// questions (unanswerable ones only when asked for), each with its paragraph as the gold
/// document.
fn article_items(
    article: SquadArticle,
    num_paragraphs: usize,
    unanswerable: bool,
) -> (Vec<Document>, Vec<QaExample>) {
    let mut documents = Vec::new();
    let mut answerable = Vec::new();
    for (i, p) in article
        .paragraphs
        .into_iter()
        .take(num_paragraphs)
        .enumerate()
    {
        let id = format!("{}#{i}", article.title);
        for q in p
            .qas
            .into_iter()
            .filter(|q| unanswerable || !q.is_impossible)
        {
            answerable.push(QaExample {
                id: q.id,
                question: q.question,
                answers: q.answers.into_iter().map(|a| a.text).collect(),
                gold_docs: vec![id.clone()],
            });
        }
        documents.push(Document {
            id,
            title: article.title.replace('_', " "),
            text: p.context,
        });
    }
    (documents, answerable)
}

/// Every SQuAD v2 dev paragraph as a document (`<title>#<index>`) and `num_questions` answerable
/// questions spread evenly over the file (every n-th, so all articles are represented).
pub fn squad(path: &Path, num_questions: usize) -> Result<QaDataset> {
    let file: SquadFile = read_json(path)?;
    let mut documents = Vec::new();
    let mut answerable = Vec::new();
    for article in file.data {
        let (docs, examples) = article_items(article, usize::MAX, false);
        documents.extend(docs);
        answerable.extend(examples);
    }
    let step = (answerable.len() / num_questions.max(1)).max(1);
    let examples = answerable
        .into_iter()
        .step_by(step)
        .take(num_questions)
        .collect();
    Ok(QaDataset {
        name: "squad".into(),
        documents,
        examples,
    })
}

/// One SQuAD article: its paragraphs (all, or the first few) with their questions.
#[derive(Debug, Clone)]
pub struct ArticleQa {
    pub title: String,
    pub documents: Vec<Document>,
    pub examples: Vec<QaExample>,
}

/// Articles of SQuAD v2 dev in file order, each cut to its first `num_paragraphs` paragraphs
/// with at most `per_article` of their answerable questions (spread evenly), until
/// `num_questions` questions are collected.
pub fn squad_articles(
    path: &Path,
    num_paragraphs: usize,
    per_article: usize,
    num_questions: usize,
) -> Result<Vec<ArticleQa>> {
    let file: SquadFile = read_json(path)?;
    let mut out = Vec::new();
    let mut total = 0;
    for article in file.data {
        if total >= num_questions {
            break;
        }
        let title = article.title.clone();
        let (documents, answerable) = article_items(article, num_paragraphs, false);
        let take = per_article.min(num_questions - total).min(answerable.len());
        if take == 0 {
            continue;
        }
        let step = answerable.len() / take;
        let examples: Vec<QaExample> = answerable.into_iter().step_by(step).take(take).collect();
        total += examples.len();
        out.push(ArticleQa {
            title,
            documents,
            examples,
        });
    }
    Ok(out)
}

/// Every article of SQuAD v2 dev with all its paragraphs and all its questions, answerable and
/// not (an unanswerable question has no answers).
pub fn squad_v2_articles(path: &Path) -> Result<Vec<ArticleQa>> {
    let file: SquadFile = read_json(path)?;
    Ok(file
        .data
        .into_iter()
        .map(|article| {
            let title = article.title.clone();
            let (documents, examples) = article_items(article, usize::MAX, true);
            ArticleQa {
                title,
                documents,
                examples,
            }
        })
        .collect())
}
