//! The route benchmark's conclusions on hand-made answers whose right values are known.

use super::*;
use triage_types::{AnswerSignals, MonitorRecord, MonitorVerdict, TauRecord};

fn signals(mean_entropy: f32, declined: bool) -> AnswerSignals {
    AnswerSignals {
        mean_entropy,
        span_mean_entropy: mean_entropy * 0.9,
        max_entropy: 2.0,
        mean_nll: 0.5,
        mean_top2_margin: 1.0,
        declined,
        min_token_prob: 0.5,
        span_max_entropy: 2.0,
        sample_agreement: f32::NAN,
        self_check: f32::NAN,
    }
}

fn answer(text: &str, path: RoutePath, monitored: Option<AnswerSignals>) -> RoutedAnswer {
    let mut decision = DecisionRecord::new(false);
    decision.path = path;
    decision.monitor = monitored.map(|signals| MonitorRecord {
        tau: TauRecord {
            tau: 0.6,
            model: "m".into(),
            estimator: Default::default(),
            unit: Default::default(),
            window: 30,
        },
        trace: vec![signals.mean_entropy],
        in_answer_span: vec![true],
        mean: Some(signals.span_mean_entropy),
        decided_at: Some(1),
        decision: MonitorVerdict::Accept,
        signals,
        // Grounded when calm, as a copying answer tends to be.
        grounding: Some(triage_types::GroundingFeatures {
            verbatim: f32::from(u8::from(signals.mean_entropy < 1.0)),
            chunk_rank: 1.0,
            chunk_score: 0.5,
            chunk_margin: 0.1,
            unsupported_words: 0.0,
            question_support: 1.0,
        }),
        probe: None,
        probe_score: None,
        probe_threshold: None,
        combined_p_wrong: None,
        combined_threshold: None,
        rag_answer: String::new(),
    });
    RoutedAnswer {
        text: text.into(),
        prompt_tokens: 100,
        cached_prompt_tokens: 40,
        completion_tokens: 10,
        total_ms: 50.0,
        decision,
    }
}

/// Twenty questions over ten articles; every third forced-RAG answer is wrong, with a higher
/// entropy (the separating signal), and the router's RAG answer declines exactly those.
fn rows() -> Vec<RouteRow> {
    (0..20)
        .map(|i| {
            let wrong = i % 3 == 0;
            let entropy = if wrong {
                1.5 + i as f32 * 0.01
            } else {
                0.3 + i as f32 * 0.01
            };
            let rag_text = if wrong { "no idea" } else { "in 1932" };
            RouteRow {
                article: i % 10,
                question: format!("q{i}"),
                golds: vec!["1932".into()],
                rag: answer(rag_text, RoutePath::Rag, Some(signals(entropy, false))),
                lc: answer("it opened in 1932", RoutePath::Lc, None),
                auto: answer(
                    rag_text,
                    if wrong { RoutePath::Lc } else { RoutePath::Rag },
                    Some(signals(entropy, wrong)),
                ),
            }
        })
        .collect()
}

#[test]
fn path_scores_average_each_measure_over_the_answers() {
    let rows = rows();
    let pairs: Vec<(&RoutedAnswer, &[String])> =
        rows.iter().map(|r| (&r.rag, r.golds.as_slice())).collect();
    let s = path_scores("rag", &pairs);
    assert_eq!(s.questions, 20);
    // 7 of 20 (i = 0, 3, ..., 18) are wrong.
    assert!((s.contains - 13.0 / 20.0).abs() < 1e-12, "{s:?}");
    assert_eq!(s.mean_prompt_tokens, 100.0);
    assert_eq!(s.mean_cached_prompt_tokens, 40.0);
    assert_eq!(s.lc_rate, 0.0);
    let pairs: Vec<(&RoutedAnswer, &[String])> =
        rows.iter().map(|r| (&r.auto, r.golds.as_slice())).collect();
    assert!((path_scores("auto", &pairs).lc_rate - 7.0 / 20.0).abs() < 1e-12);
    assert!((rag_error_rate(&rows) - 7.0 / 20.0).abs() < 1e-12);
}

#[test]
fn a_separating_signal_scores_one_and_declines_are_counted() {
    let rows = rows();
    let aurocs = signal_aurocs(&rows).unwrap();
    let by_name = |n: &str| {
        aurocs
            .iter()
            .find(|a| a.signal.starts_with(n))
            .and_then(|a| a.auroc)
    };
    assert_eq!(by_name("mean entropy"), Some(1.0));
    // A constant signal cannot rank: ties everywhere.
    assert_eq!(by_name("max entropy"), Some(0.5));
    let combined = by_name("combined").expect("every fold has both labels");
    assert!(combined > 0.9, "{combined}");
    assert_eq!(by_name("self-route declined"), Some(1.0));
    // The grounding features are in the table: "not verbatim" separates (the wrong answers
    // are the unsure ones, which the rows leave ungrounded), the constant chunk rank cannot.
    assert_eq!(by_name("not verbatim"), Some(1.0));
    assert_eq!(by_name("rank of the chunk"), Some(0.5));
    let (rate, precision) = declines(&rows);
    assert!((rate - 7.0 / 20.0).abs() < 1e-12);
    assert_eq!(precision, Some(1.0));
    let (x, y) = combined_training_set(&rows);
    assert_eq!((x.len(), y.iter().filter(|&&w| w).count()), (20, 7));
    assert_eq!(x[0].len(), triage_policy::COMBINED_INPUTS.len());
}

#[test]
fn rows_of_one_article_are_never_scored_by_a_model_fitted_on_them() {
    let mut rows = rows();
    rows.iter_mut().for_each(|r| r.article = 3);
    let aurocs = signal_aurocs(&rows).unwrap();
    let combined = aurocs.iter().find(|a| a.signal.starts_with("combined"));
    assert_eq!(combined.and_then(|a| a.auroc), None);
    // Without a monitored RAG answer there is nothing to score.
    assert_eq!(declines(&[]), (0.0, None));
}

#[test]
fn the_results_tables_show_every_path_and_signal() {
    let rows = rows();
    let pairs: Vec<(&RoutedAnswer, &[String])> =
        rows.iter().map(|r| (&r.rag, r.golds.as_slice())).collect();
    let bench = RouteBench {
        questions: rows.len(),
        articles: 10,
        mean_corpus_tokens: 1500.0,
        tau: 0.6,
        paths: vec![path_scores("rag", &pairs)],
        rag_error_rate: rag_error_rate(&rows),
        decline_rate: 0.35,
        decline_precision: None,
        signals: signal_aurocs(&rows).unwrap(),
    };
    let md = markdown(&bench);
    assert!(
        md.starts_with("20 SQuAD v2 dev questions over 10 articles"),
        "{md}"
    );
    assert!(md.contains("| rag | 0.000 |"), "{md}");
    assert!(md.contains("a fraction n/a had"), "{md}");
    assert!(
        md.contains("| mean entropy (first 30 tokens) | 1.000 |"),
        "{md}"
    );
    assert_eq!(
        md.matches("\n|").count(),
        2 + 1 + 2 + bench.signals.len(),
        "{md}"
    );
}
