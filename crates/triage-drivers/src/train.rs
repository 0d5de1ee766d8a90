//! `triage train classifier` and `triage train gain-policy`: fit the routing policies on labelled
//! data, report their held-out quality, and freeze them to files the `[routing]` config names.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use triage_engine::{EngineConfig, KvBudget, LlmEngine};
use triage_eval::datasets::QaExample;
use triage_fetch::DEFAULT_EMBEDDER;
use triage_host::{load_embedder, load_model};
use triage_models::DeviceSpec;
use triage_policy::{
    is_held_out, is_test_group, read_labelled, ClassifierQuality, GainExample, GainPolicy,
    GainReport, LabelledQuery, HYBRID_CALL_COST,
};
use triage_retrieval::metrics::{hit_at, unique_documents};
use triage_retrieval::{BertEmbedder, Corpus, Embedder, Hit, SearchMode, SearchOptions};
use triage_router::Retriever;
use triage_router::{
    best_threshold, evaluate, ClassifyWith, LearnedClassifier, QueryClass, ZeroShotClassifier,
};

use crate::error::{bail, fit_error, io, Result};

/// Where fitted policies go by default.
pub fn policy_dir() -> PathBuf {
    triage_models::paths::triage_home().join("policies")
}

/// Where `train classifier` saves the learned classifier by default.
pub fn default_classifier_path() -> PathBuf {
    policy_dir().join("classifier.json")
}

/// What `train classifier` measured.
#[derive(Debug, Serialize)]
pub struct ClassifierReport {
    pub path: PathBuf,
    pub sha256: String,
    pub train_rows: usize,
    pub held_out_rows: usize,
    pub held_out_groups: usize,
    pub learned: ClassifierQuality,
    /// The router model zero-shot on the same held-out rows.
    pub zero_shot: Option<ClassifierQuality>,
    /// Its threshold calibrated on the training rows, and its quality at that threshold.
    pub zero_shot_threshold: Option<f64>,
    pub zero_shot_calibrated: Option<ClassifierQuality>,
    pub zero_shot_model: Option<String>,
}

/// What `train classifier` fits on and where it saves.
#[derive(Debug, Clone)]
pub struct ClassifierParams {
    /// JSON lines of `{"query", "label": "point"|"global", "group"}`.
    pub data: PathBuf,
    /// Where to save the learned classifier (default [`default_classifier_path`]).
    pub out: Option<PathBuf>,
    /// The sentence embedder (a default model's name or a folder).
    pub embedder: String,
    /// Also measure the zero-shot classifier with this router model.
    pub zero_shot_model: Option<String>,
}

/// Fit the learned classifier on the training groups of `data`, save it, and measure it and the
/// zero-shot classifier on the held-out groups (one group in five).
pub fn train_classifier(params: &ClassifierParams) -> Result<ClassifierReport> {
    let data = &params.data;
    let rows = read_labelled(data)?;
    let (held, train): (Vec<&LabelledQuery>, Vec<&LabelledQuery>) =
        rows.iter().partition(|r| is_held_out(&r.group, 5));
    if train.is_empty() || held.is_empty() {
        bail!(
            "{} needs rows in both the training and the held-out groups",
            data.display()
        );
    }
    let embedder = load_embedder(&params.embedder)?;
    let queries: Vec<&str> = train.iter().map(|r| r.query.as_str()).collect();
    let labels: Vec<QueryClass> = train.iter().map(|r| r.label).collect();
    let started = Instant::now();
    let learned = LearnedClassifier::fit(&embedder, &queries, &labels)?;
    eprintln!(
        "fitted on {} rows in {:.1} s",
        train.len(),
        started.elapsed().as_secs_f64()
    );
    let path = params.out.clone().unwrap_or_else(default_classifier_path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", &dir))?;
    }
    let sha256 = learned.save(&path)?;
    let zero_shot_model = params.zero_shot_model.as_deref();
    let (learned_quality, zero_shot_quality) =
        measure(&learned, &train, &held, &embedder, zero_shot_model)?;
    let groups: std::collections::BTreeSet<&str> = held.iter().map(|r| r.group.as_str()).collect();
    Ok(ClassifierReport {
        path,
        sha256,
        train_rows: train.len(),
        held_out_rows: held.len(),
        held_out_groups: groups.len(),
        learned: learned_quality,
        zero_shot: zero_shot_quality.map(|z| z.0),
        zero_shot_threshold: zero_shot_quality.map(|z| z.1),
        zero_shot_calibrated: zero_shot_quality.map(|z| z.2),
        zero_shot_model: zero_shot_model.map(str::to_string),
    })
}

/// The zero-shot classifier's quality and its threshold calibrated on the training rows, with
/// its quality at that threshold.
type ZeroShotQuality = (ClassifierQuality, f64, ClassifierQuality);

/// The learned classifier's quality on the held-out rows, and with `zero_shot_model` the
/// zero-shot classifier's.
fn measure(
    learned: &LearnedClassifier,
    train: &[&LabelledQuery],
    held: &[&LabelledQuery],
    embedder: &BertEmbedder,
    zero_shot_model: Option<&str>,
) -> Result<(ClassifierQuality, Option<ZeroShotQuality>)> {
    let Some(name) = zero_shot_model else {
        return Ok((learned_only(learned, held, embedder)?, None));
    };
    let mut engine = engine(name)?;
    let mut with = ClassifyWith {
        embedder,
        generator: &mut engine,
    };
    let l = evaluate(learned, held, &mut with)?;
    let raw = ZeroShotClassifier::default();
    let z = evaluate(&raw, held, &mut with)?;
    let threshold = best_threshold(&raw, train, &mut with)?;
    let calibrated = ZeroShotClassifier { threshold };
    let zc = evaluate(&calibrated, held, &mut with)?;
    Ok((l, Some((z, threshold, zc))))
}

/// The learned classifier's quality without a generator (it needs only the embedder).
fn learned_only(
    learned: &LearnedClassifier,
    rows: &[&LabelledQuery],
    embedder: &dyn Embedder,
) -> Result<ClassifierQuality> {
    let queries: Vec<&str> = rows.iter().map(|r| r.query.as_str()).collect();
    let vectors = embedder.embed(&queries)?;
    let mut scores = Vec::with_capacity(rows.len());
    for v in &vectors {
        scores.push(learned.model.logistic.predict(v).map_err(fit_error)?);
    }
    let labels: Vec<bool> = rows.iter().map(|r| r.label == QueryClass::Global).collect();
    let correct = scores
        .iter()
        .zip(&labels)
        .filter(|(p, l)| (**p >= learned.model.threshold) == **l)
        .count();
    Ok(ClassifierQuality {
        accuracy: correct as f64 / rows.len() as f64,
        auroc: triage_policy::auroc(&scores, &labels),
    })
}

fn engine(name: &str) -> Result<LlmEngine> {
    let model = load_model(name, DeviceSpec::Cpu)?;
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(2048),
        ..EngineConfig::default()
    };
    Ok(LlmEngine::new(std::sync::Arc::new(model), config)?)
}

/// What `train gain-policy` measured.
#[derive(Debug, Serialize)]
pub struct GainPolicyReport {
    pub path: PathBuf,
    pub sha256: String,
    pub dataset: String,
    pub questions: usize,
    /// Questions whose document is in the held-out tenth (left for the evaluation).
    pub held_out_questions: usize,
    pub tau_h: f64,
    pub cross_validation: GainReport,
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn documents_of(hits: &[Hit]) -> Vec<String> {
    unique_documents(hits.iter().map(|h| h.chunk.doc_id.as_str()))
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// One dev question's features and whether dense and hybrid each find a gold document in their
/// top 10.
fn gain_example(
    corpus: &Corpus,
    embedder: &BertEmbedder,
    ex: &QaExample,
    group: String,
) -> Result<GainExample> {
    let mut retriever = Retriever {
        corpus,
        embedder,
        generator: None,
        backend: None,
    };
    let vector = embedder.embed(&[ex.question.as_str()])?.remove(0);
    let features = retriever.dense_features(&ex.question, Some(&vector))?;
    let search = |mode| {
        let options = SearchOptions {
            mode,
            k: 10,
            ..SearchOptions::default()
        };
        corpus.search(&ex.question, Some(&vector), &options)
    };
    let dense = documents_of(&search(SearchMode::Dense)?);
    let hybrid = documents_of(&search(SearchMode::Hybrid)?);
    Ok(GainExample {
        features: features.to_array(),
        hit_dense: hit_at(&as_strs(&dense), &ex.gold_docs, 10) > 0.0,
        hit_hybrid: hit_at(&as_strs(&hybrid), &ex.gold_docs, 10) > 0.0,
        group,
    })
}

/// What `train gain-policy` fits on and where it saves.
#[derive(Debug, Clone)]
pub struct GainPolicyParams {
    /// `hotpotqa` or `squad` (fetched with `models fetch --data`).
    pub dataset: String,
    pub questions: usize,
    /// Where to save the policy (default `$TRIAGE_HOME/policies/gain-policy.json`).
    pub out: Option<PathBuf>,
}

/// Fit the gain policy on a data set's dev questions: for each, the six features (reranked
/// order = dense order), and whether dense and hybrid each find a gold document in their top 10.
pub fn train_gain_policy(params: &GainPolicyParams) -> Result<GainPolicyReport> {
    let (dataset, questions) = (params.dataset.as_str(), params.questions);
    let data = crate::bench_retrieval::load_dataset(dataset, questions)?;
    let embedder = load_embedder(DEFAULT_EMBEDDER)?;
    let (corpus, _) = crate::bench_retrieval::dataset_corpus(&data, questions, &embedder)?;
    let mut examples = Vec::new();
    let mut held_out = 0;
    let started = Instant::now();
    for ex in &data.examples {
        let group = ex.gold_docs.first().cloned().unwrap_or_default();
        if is_test_group(&group) {
            held_out += 1;
            continue;
        }
        examples.push(gain_example(&corpus, &embedder, ex, group)?);
    }
    eprintln!(
        "{} dev questions searched in {:.1} s",
        examples.len(),
        started.elapsed().as_secs_f64()
    );
    let policy = GainPolicy::fit(&examples, HYBRID_CALL_COST)?;
    let path = params
        .out
        .clone()
        .unwrap_or_else(|| policy_dir().join("gain-policy.json"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", &dir))?;
    }
    let sha256 = policy.save(&path)?;
    Ok(GainPolicyReport {
        path,
        sha256,
        dataset: dataset.to_string(),
        questions: data.examples.len(),
        held_out_questions: held_out,
        tau_h: policy.model.tau_h,
        cross_validation: policy.model.report.clone(),
    })
}
