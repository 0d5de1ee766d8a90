//! `triage train classifier` and `triage train gain-policy`: fit a routing policy, save it, and
//! print its held-out quality.

use anyhow::Result;
use clap::Subcommand;
use triage_drivers::{ClassifierParams, ClassifierReport, GainPolicyParams, GainPolicyReport};

#[derive(Subcommand)]
pub enum TrainCommand {
    /// The learned query classifier (MiniLM embedding + logistic regression), from a JSON-lines
    /// file of {"query", "label": "point"|"global", "group"}; reports held-out accuracy.
    Classifier {
        #[arg(long, default_value = "data/query-classes/queries.jsonl")]
        data: std::path::PathBuf,
        /// Where to write the frozen model (default $TRIAGE_HOME/policies/classifier.json).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long, default_value = triage::DEFAULT_EMBEDDER)]
        embedder: String,
        /// Also measure the zero-shot classifier with this router model on the held-out rows.
        #[arg(long)]
        zero_shot_model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The retrieval-gain policy (ridge on the six features, τ_h by grouped cross-validation).
    GainPolicy {
        #[arg(long, default_value = "squad")]
        dataset: String,
        #[arg(long, default_value_t = 500)]
        questions: usize,
        /// Where to write the frozen policy (default $TRIAGE_HOME/policies/gain-policy.json).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Fit the policy asked for and print what it measured (as JSON with `--json`).
pub fn run(command: TrainCommand) -> Result<()> {
    match command {
        TrainCommand::Classifier {
            data,
            out,
            embedder,
            zero_shot_model,
            json,
        } => {
            let r = triage_drivers::train_classifier(&ClassifierParams {
                data,
                out,
                embedder,
                zero_shot_model,
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_classifier(&r);
            }
        }
        TrainCommand::GainPolicy {
            dataset,
            questions,
            out,
            json,
        } => {
            let r = triage_drivers::train_gain_policy(&GainPolicyParams {
                dataset,
                questions,
                out,
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_gain_policy(&r);
            }
        }
    }
    Ok(())
}

fn print_classifier(r: &ClassifierReport) {
    let auroc = |a: Option<f64>| a.map_or("n/a".into(), |a| format!("{a:.3}"));
    println!(
        "learned classifier: held-out accuracy {:.3}, AUROC {} on {} rows ({} groups); \
         trained on {} rows",
        r.learned.accuracy,
        auroc(r.learned.auroc),
        r.held_out_rows,
        r.held_out_groups,
        r.train_rows
    );
    if let (Some(z), Some(m)) = (r.zero_shot, &r.zero_shot_model) {
        println!(
            "zero-shot ({m}): held-out accuracy {:.3}, AUROC {}",
            z.accuracy,
            auroc(z.auroc)
        );
    }
    if let (Some(t), Some(z)) = (r.zero_shot_threshold, r.zero_shot_calibrated) {
        println!(
            "zero-shot with its threshold calibrated on the training rows \
             (P(global) >= {t:.4}; routing: classifier = {{ zero_shot_threshold = \
             {t:.4} }}): held-out accuracy {:.3}",
            z.accuracy
        );
    }
    println!("saved {} (sha256 {})", r.path.display(), r.sha256);
}

fn print_gain_policy(r: &GainPolicyReport) {
    let cv = &r.cross_validation;
    println!(
        "gain policy on {} {} questions ({} held out): tau_h = {:.4}",
        cv.num_examples, r.dataset, r.held_out_questions, r.tau_h
    );
    println!(
        "cross-validated Hit@10: dense {:.3}, hybrid {:.3}, policy {:.3} at a hybrid \
         rate of {:.3}; objective policy {:.3} vs always-hybrid {:.3}",
        cv.hit_dense_always,
        cv.hit_hybrid_always,
        cv.hit_policy,
        cv.hybrid_rate,
        cv.objective_policy,
        cv.objective_hybrid_always
    );
    println!("saved {} (sha256 {})", r.path.display(), r.sha256);
}
