//! Which signals tell a wrong RAG answer, measured on `triage eval` runs (`triage signals`):
//! each signal alone, the combined score (logistic over all of them) fitted on the train runs'
//! answers and scored on the test runs', the same with each group of signals left out, and,
//! where the runs hold several suites, each test suite scored by a combined score fitted on the
//! other suites only (leave one suite out: probes and scores are known to transfer poorly).

use serde::Serialize;
use triage_policy::{
    auroc, combined_inputs, is_decline, model_for, LogisticModel, MassMeanProbe, PolicyError,
    COMBINED_INPUTS, COMBINED_L2,
};
use triage_types::{ProbeStates, UNANSWERABLE};

use crate::results::ResultRow;
use crate::scoring::abstains;
use crate::system::System;

/// One forced-RAG answer's combined-score inputs and whether it was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Labelled {
    pub suite: String,
    /// The corpus the question was asked over (the run's group), the unit held out together.
    pub corpus: String,
    /// The example's sub-population ("answerable", "unanswerable", ...), when the suite has one.
    pub kind: Option<String>,
    pub inputs: Vec<f32>,
    pub wrong: bool,
    /// The residual stream the answer recorded, if any.
    pub states: Option<ProbeStates>,
    /// Tokens the base model decoded for it (the answer and its samples): what a router that
    /// escalates before decoding does not spend.
    pub decode_tokens: usize,
}

/// The `rag` rows that carry a monitor record.
pub fn labelled<'a>(rows: impl IntoIterator<Item = &'a ResultRow>) -> Vec<Labelled> {
    rows.into_iter()
        .filter(|r| r.system == System::Rag)
        .filter_map(|r| {
            let m = r.decision.monitor.as_ref()?;
            let features = r.decision.retrieval.as_ref().and_then(|x| x.features);
            // Forced RAG answers recorded before their decline was flagged (squad-v2's were
            // asked with it offered) say it in their text.
            let mut signals = m.signals;
            signals.declined |= abstains(&r.answer, UNANSWERABLE);
            Some(Labelled {
                suite: r.suite.clone(),
                corpus: r.group.clone(),
                kind: r.kind.clone(),
                inputs: combined_inputs(&signals, m.mean, features.as_ref(), m.grounding.as_ref()),
                wrong: !r.score.correct,
                states: m.probe.clone(),
                decode_tokens: r
                    .stages
                    .iter()
                    .filter(|s| matches!(s.stage.as_str(), "rag" | "samples" | "self_check"))
                    .map(|s| s.completion)
                    .sum(),
            })
        })
        .collect()
}

/// Groups of inputs (indices into `COMBINED_INPUTS`) left out together in the ablations.
pub const GROUPS: [(&str, &[usize]); 6] = [
    ("token uncertainty", &[0, 1, 2, 3, 4, 6, 13, 14]),
    ("self-route decline", &[5]),
    ("retrieval features", &[7, 8, 9, 10, 11, 12]),
    ("grounding", &[15, 16, 17, 18, 19, 21]),
    ("sample agreement", &[20]),
    ("self-check", &[22]),
];

/// An AUROC with what it is of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Named {
    pub name: String,
    pub auroc: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Study {
    /// 0 for a study of test runs; else the corpora held out in turn (`leave_one_corpus_out`),
    /// whose AUROCs are averaged.
    pub folds: usize,
    pub train_answers: usize,
    pub test_answers: usize,
    pub test_error_rate: f64,
    /// Each input alone on the test answers (larger means more likely wrong).
    pub each: Vec<Named>,
    /// The combined score fitted on train, scored on test.
    pub combined: Option<f64>,
    /// The combined score without each group.
    pub without: Vec<Named>,
    /// Per test suite, fitted on the train answers of the other suites only.
    pub leave_one_suite_out: Vec<Named>,
    /// The combined score on each kind of test answer (SQuAD's answerable and unanswerable).
    pub by_kind: Vec<Named>,
    /// A mass-mean probe per recorded layer, at the last prompt token and over the first
    /// answer tokens, fitted on the train answers' states and scored on the test answers'.
    pub probes: Vec<Named>,
    /// Each layer's probe at the last prompt token used as a router on the test answers
    /// ([`probe_routing`]); empty until asked for, and for dev-only studies.
    pub probe_routing: Vec<ProbeRouting>,
}

/// A probe at the last prompt token routing before any answer token: fitted on the train
/// answers with the threshold that escalates at most `max_false_escalation` of their right
/// ones, then applied to the test answers. What it catches and what it costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeRouting {
    pub layer: usize,
    pub max_false_escalation: f64,
    pub threshold: f64,
    /// Test answers with a state at the layer.
    pub answers: usize,
    /// The share of them the probe sends to long context before decoding.
    pub escalated: f64,
    /// Of those, the share that were wrong (the rest cost a long-context answer for nothing).
    pub precision: Option<f64>,
    /// The share of the wrong answers it escalates.
    pub recall: Option<f64>,
    /// The share of the right answers it escalates (the train rate, measured on test).
    pub false_escalation: Option<f64>,
    /// The base model's decode tokens (answer and samples) of the escalated answers, as a
    /// share of all the test answers' decode tokens: what deciding before decoding saves.
    pub decode_tokens_saved: f64,
}

/// The study of `test` with combined scores fitted on `train` (never on `test`).
pub fn study(train: &[Labelled], test: &[Labelled]) -> Result<Study, PolicyError> {
    let labels: Vec<bool> = test.iter().map(|l| l.wrong).collect();
    // Each input alone over the answers that have it: a missing value says nothing of the
    // signal (a decline is never self-checked), and ranking it lowest would credit the signal
    // with what the missing values' answers have in common.
    let each = COMBINED_INPUTS
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let (scores, labels): (Vec<f64>, Vec<bool>) = test
                .iter()
                .filter(|l| l.inputs[j].is_finite())
                .map(|l| (f64::from(l.inputs[j]), l.wrong))
                .unzip();
            Named {
                name: name.to_string(),
                auroc: auroc(&scores, &labels),
            }
        })
        .collect();
    let all: Vec<usize> = (0..COMBINED_INPUTS.len()).collect();
    let combined = fitted_auroc(train, test, &all)?;
    let mut without: Vec<Named> = GROUPS
        .iter()
        .map(|(name, group)| {
            let kept: Vec<usize> = all.iter().copied().filter(|j| !group.contains(j)).collect();
            Ok(Named {
                name: format!("without {name}"),
                auroc: fitted_auroc(train, test, &kept)?,
            })
        })
        .collect::<Result<_, PolicyError>>()?;
    without.push(Named {
        name: "answers and declines fitted apart".into(),
        auroc: fitted_apart_auroc(train, test, &all)?,
    });
    let mut suites: Vec<&str> = test.iter().map(|l| l.suite.as_str()).collect();
    suites.sort_unstable();
    suites.dedup();
    let leave_one_suite_out = if suites.len() > 1 {
        suites
            .iter()
            .map(|s| {
                let others: Vec<Labelled> =
                    train.iter().filter(|l| l.suite != *s).cloned().collect();
                let own: Vec<Labelled> = test.iter().filter(|l| l.suite == *s).cloned().collect();
                Ok(Named {
                    name: (*s).to_string(),
                    auroc: fitted_auroc(&others, &own, &all)?,
                })
            })
            .collect::<Result<_, PolicyError>>()?
    } else {
        Vec::new()
    };
    let probes = probe_aurocs(train, test);
    let mut kinds: Vec<&str> = test.iter().filter_map(|l| l.kind.as_deref()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let by_kind = if kinds.len() > 1 {
        kinds
            .iter()
            .map(|k| {
                let own: Vec<Labelled> = test
                    .iter()
                    .filter(|l| l.kind.as_deref() == Some(*k))
                    .cloned()
                    .collect();
                Ok(Named {
                    name: (*k).to_string(),
                    auroc: fitted_auroc(train, &own, &all)?,
                })
            })
            .collect::<Result<_, PolicyError>>()?
    } else {
        Vec::new()
    };
    Ok(Study {
        folds: 0,
        train_answers: train.len(),
        test_answers: test.len(),
        test_error_rate: labels.iter().filter(|w| **w).count() as f64 / labels.len().max(1) as f64,
        each,
        combined,
        without,
        leave_one_suite_out,
        by_kind,
        probes,
        probe_routing: Vec::new(),
    })
}

/// The study of dev answers alone, before any test run: each corpus held out in turn and scored
/// by scores fitted on the other corpora's answers (questions over one corpus share its
/// distractors, so they are never split), every AUROC the mean over the corpora where it
/// exists. `None` with fewer than two corpora.
pub fn leave_one_corpus_out(rows: &[Labelled]) -> Result<Option<Study>, PolicyError> {
    let mut corpora: Vec<&str> = rows.iter().map(|l| l.corpus.as_str()).collect();
    corpora.sort_unstable();
    corpora.dedup();
    if corpora.len() < 2 {
        return Ok(None);
    }
    let folds = corpora
        .iter()
        .map(|c| {
            let (own, rest): (Vec<Labelled>, Vec<Labelled>) =
                rows.iter().cloned().partition(|l| l.corpus == *c);
            study(&rest, &own)
        })
        .collect::<Result<Vec<Study>, PolicyError>>()?;
    let mean = |values: Vec<Option<f64>>| -> Option<f64> {
        let present: Vec<f64> = values.into_iter().flatten().collect();
        (!present.is_empty()).then(|| present.iter().sum::<f64>() / present.len() as f64)
    };
    // Names in first-seen order; a fold may lack a suite or a kind.
    let by_name = |part: fn(&Study) -> &Vec<Named>| -> Vec<Named> {
        let mut names: Vec<String> = Vec::new();
        for f in &folds {
            for n in part(f) {
                if !names.contains(&n.name) {
                    names.push(n.name.clone());
                }
            }
        }
        names
            .into_iter()
            .map(|name| Named {
                auroc: mean(
                    folds
                        .iter()
                        .map(|f| {
                            part(f)
                                .iter()
                                .find(|n| n.name == name)
                                .and_then(|n| n.auroc)
                        })
                        .collect(),
                ),
                name,
            })
            .collect()
    };
    let wrong = rows.iter().filter(|l| l.wrong).count();
    Ok(Some(Study {
        folds: folds.len(),
        train_answers: rows.len(),
        test_answers: rows.len(),
        test_error_rate: wrong as f64 / rows.len() as f64,
        each: by_name(|s| &s.each),
        combined: mean(folds.iter().map(|f| f.combined).collect()),
        without: by_name(|s| &s.without),
        leave_one_suite_out: by_name(|s| &s.leave_one_suite_out),
        by_kind: by_name(|s| &s.by_kind),
        probes: by_name(|s| &s.probes),
        probe_routing: Vec::new(),
    }))
}

/// Each recorded layer's probe at the last prompt token as a router before decoding: fitted on
/// `train` with the threshold that escalates at most `max_false_escalation` of its right
/// answers, applied to `test`. Layers where train lacks a label are left out.
pub fn probe_routing(
    train: &[Labelled],
    test: &[Labelled],
    max_false_escalation: f64,
) -> Result<Vec<ProbeRouting>, PolicyError> {
    let Some(layers) = recorded_layers(train) else {
        return Ok(Vec::new());
    };
    let share = |n: usize, of: usize| (of > 0).then(|| n as f64 / of as f64);
    let mut out = Vec::new();
    for (at, &layer) in layers.iter().enumerate() {
        let fit: Vec<(&[f32], bool)> = train
            .iter()
            .filter_map(|l| Some((layer_state(l, &layers, at, true)?, l.wrong)))
            .collect();
        let Some(probe) = MassMeanProbe::fit(&fit) else {
            continue;
        };
        let Some(threshold) = probe.threshold(&fit, max_false_escalation)? else {
            continue;
        };
        let scored: Vec<(&Labelled, bool)> = test
            .iter()
            .filter_map(|l| {
                let score = probe.score(layer_state(l, &layers, at, true)?).ok()?;
                Some((l, score > threshold))
            })
            .collect();
        let count = |f: &dyn Fn(&(&Labelled, bool)) -> bool| scored.iter().filter(|x| f(x)).count();
        let escalated = count(&|(_, e)| *e);
        let wrong = count(&|(l, _)| l.wrong);
        let caught = count(&|(l, e)| *e && l.wrong);
        let right_escalated = escalated - caught;
        let all_decode: usize = scored.iter().map(|(l, _)| l.decode_tokens).sum();
        let saved: usize = scored
            .iter()
            .filter(|(_, e)| *e)
            .map(|(l, _)| l.decode_tokens)
            .sum();
        out.push(ProbeRouting {
            layer,
            max_false_escalation,
            threshold,
            answers: scored.len(),
            escalated: share(escalated, scored.len()).unwrap_or(0.0),
            precision: share(caught, escalated),
            recall: share(caught, wrong),
            false_escalation: share(right_escalated, scored.len() - wrong),
            decode_tokens_saved: share(saved, all_decode).unwrap_or(0.0),
        });
    }
    Ok(out)
}

/// Per layer the train answers recorded, and per place (last prompt token, first answer
/// tokens): the probe fitted on train, its AUROC on test.
fn probe_aurocs(train: &[Labelled], test: &[Labelled]) -> Vec<Named> {
    let Some(layers) = recorded_layers(train) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (at, &layer) in layers.iter().enumerate() {
        for place in ["prompt", "answer"] {
            let at_prompt = place == "prompt";
            let state = |l| layer_state(l, &layers, at, at_prompt);
            let fit: Vec<(&[f32], bool)> = train
                .iter()
                .filter_map(|l| Some((state(l)?, l.wrong)))
                .collect();
            let auroc = MassMeanProbe::fit(&fit).and_then(|probe| {
                let (scores, labels): (Vec<f64>, Vec<bool>) = test
                    .iter()
                    .filter_map(|l| Some((probe.score(state(l)?).ok()?, l.wrong)))
                    .unzip();
                auroc(&scores, &labels)
            });
            out.push(Named {
                name: format!("layer {layer}, {place}"),
                auroc,
            });
        }
    }
    out
}

/// An answer's `columns` of the combined inputs.
fn pick(l: &Labelled, columns: &[usize]) -> Vec<f32> {
    columns.iter().map(|&j| l.inputs[j]).collect()
}

/// A logistic on `train`'s `columns`; `None` when train holds one label only.
pub(crate) fn fit_on<'a>(
    train: impl IntoIterator<Item = &'a Labelled>,
    columns: &[usize],
) -> Result<Option<LogisticModel>, PolicyError> {
    let (x, y): (Vec<Vec<f32>>, Vec<bool>) = train
        .into_iter()
        .map(|l| (pick(l, columns), l.wrong))
        .unzip();
    if !y.contains(&true) || !y.contains(&false) {
        return Ok(None);
    }
    LogisticModel::fit(&x, &y, COMBINED_L2).map(Some)
}

/// AUROC on `test` of each answer's P(wrong) from the model `model_of` picks for it.
fn scored_auroc<'m>(
    test: &[Labelled],
    columns: &[usize],
    model_of: impl Fn(&Labelled) -> &'m LogisticModel,
) -> Result<Option<f64>, PolicyError> {
    let scores = test
        .iter()
        .map(|l| model_of(l).predict(&pick(l, columns)))
        .collect::<Result<Vec<f64>, PolicyError>>()?;
    let labels: Vec<bool> = test.iter().map(|l| l.wrong).collect();
    Ok(auroc(&scores, &labels))
}

/// AUROC on `test` of a logistic fitted on `train`'s `columns`; `None` when train holds one
/// label only.
fn fitted_auroc(
    train: &[Labelled],
    test: &[Labelled],
    columns: &[usize],
) -> Result<Option<f64>, PolicyError> {
    match fit_on(train, columns)? {
        Some(model) if !test.is_empty() => scored_auroc(test, columns, |_| &model),
        _ => Ok(None),
    }
}

/// The combined score as two models, one fitted on the answers and one on the declines (a
/// linear score shares every slope between them, while a signal may mean the opposite for a
/// decline), each test answer scored by its own; AUROC over all of them. None where either
/// kind lacks a label in training.
fn fitted_apart_auroc(
    train: &[Labelled],
    test: &[Labelled],
    columns: &[usize],
) -> Result<Option<f64>, PolicyError> {
    let is_decline = |l: &Labelled| is_decline(&l.inputs);
    let fit_kind = |kind: bool| fit_on(train.iter().filter(|l| is_decline(l) == kind), columns);
    match (fit_kind(false)?, fit_kind(true)?) {
        (Some(answers), Some(declines)) => scored_auroc(test, columns, |l| {
            model_for(&l.inputs, &answers, Some(&declines))
        }),
        _ => Ok(None),
    }
}

/// The layers whose states the train answers recorded (the first record's).
fn recorded_layers(train: &[Labelled]) -> Option<Vec<usize>> {
    train
        .iter()
        .find_map(|l| l.states.as_ref())
        .map(|s| s.layers.clone())
}

/// An answer's state at the `at`-th of `layers` (which its record must hold), at the last prompt
/// token or over the first answer tokens.
fn layer_state<'a>(
    l: &'a Labelled,
    layers: &[usize],
    at: usize,
    at_prompt: bool,
) -> Option<&'a [f32]> {
    let s = l.states.as_ref().filter(|s| s.layers == layers)?;
    let states = if at_prompt { &s.prompt } else { &s.answer };
    states.get(at).map(Vec::as_slice)
}

/// The study as Markdown tables.
pub fn markdown(s: &Study) -> String {
    let how = if s.folds == 0 {
        format!(
            "{} test answers ({:.1}% wrong), combined score fitted on {} train answers",
            s.test_answers,
            100.0 * s.test_error_rate,
            s.train_answers
        )
    } else {
        format!(
            "{} dev answers ({:.1}% wrong), no test run: each of {} corpora held out in turn \
             and scored by what was fitted on the others; AUROCs are means over the corpora",
            s.test_answers,
            100.0 * s.test_error_rate,
            s.folds
        )
    };
    let mut out = format!(
        "{how}.\n\n**Combined score: AUROC {}** for a wrong RAG answer.\n",
        auroc_text(s.combined)
    );
    for (header, rows) in [
        ("signal alone (over the answers that have it)", &s.each),
        ("combined score", &s.without),
        ("combined score, by kind of answer", &s.by_kind),
        ("hidden-state probe (mass-mean)", &s.probes),
        ("suite (fitted on the others)", &s.leave_one_suite_out),
    ] {
        if rows.is_empty() {
            continue;
        }
        out.push_str(&format!("\n| {header} | AUROC |\n|---|---|\n"));
        for n in rows {
            out.push_str(&format!("| {} | {} |\n", n.name, auroc_text(n.auroc)));
        }
    }
    if let Some(first) = s.probe_routing.first() {
        out.push_str(&format!(
            "\n**The probe as a router before decoding**: fitted on the train answers' last \
             prompt token, with the threshold that escalates at most {:.0}% of their right \
             answers; applied to the test answers.\n\n\
             | layer | answers | escalated | precision | recall | right escalated | decode \
             tokens not spent |\n|---|---|---|---|---|---|---|\n",
            100.0 * first.max_false_escalation
        ));
        let pct = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{:.1}%", 100.0 * x));
        for r in &s.probe_routing {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                r.layer,
                r.answers,
                pct(Some(r.escalated)),
                pct(r.precision),
                pct(r.recall),
                pct(r.false_escalation),
                pct(Some(r.decode_tokens_saved)),
            ));
        }
    }
    out
}

fn auroc_text(a: Option<f64>) -> String {
    a.map_or("–".to_string(), |a| format!("{a:.3}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers of `suite` whose grounding ("not verbatim", input 15) is 1 for wrong answers
    /// (`relation` 1), for right ones (−1) or noise (0); the other inputs are noise.
    fn answers(suite: &str, n: usize, relation: i8, seed: u64) -> Vec<Labelled> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let wrong = i % 3 == 0;
                let mut inputs: Vec<f32> = (0..COMBINED_INPUTS.len())
                    .map(|_| rng.random_range(0.0..1.0))
                    .collect();
                let flag = |b: bool| f32::from(u8::from(b));
                match relation {
                    1 => inputs[15] = flag(wrong) + rng.random_range(-0.2..0.2),
                    -1 => inputs[15] = flag(!wrong) + rng.random_range(-0.2..0.2),
                    _ => {}
                }
                // Layer 4's prompt state carries the label; its answer state does not.
                let states = ProbeStates {
                    layers: vec![4],
                    prompt: vec![vec![flag(wrong) + rng.random_range(-0.3..0.3); 3]],
                    answer: vec![vec![rng.random_range(-1.0..1.0); 3]],
                };
                Labelled {
                    suite: suite.into(),
                    corpus: format!("{suite}-{}", i % 4),
                    kind: Some(
                        if i % 2 == 0 {
                            "answerable"
                        } else {
                            "unanswerable"
                        }
                        .into(),
                    ),
                    inputs,
                    wrong,
                    states: Some(states),
                    // A wrong answer decodes 40 tokens, a right one 10.
                    decode_tokens: if wrong { 40 } else { 10 },
                }
            })
            .collect()
    }

    #[test]
    fn a_forced_answer_that_declines_counts_as_a_decline_even_unflagged() {
        let answered = |answer: &str, flagged: bool| {
            let mut r = crate::results::tests::row("rag", "q", false, 10);
            let mut m = crate::calibrate::tests::monitor_record("full_softmax");
            m.signals.declined = flagged;
            r.decision.monitor = Some(m);
            r.answer = answer.into();
            labelled([&r])[0].inputs[5]
        };
        let declined = COMBINED_INPUTS.iter().position(|&n| n == "declined");
        assert_eq!(declined, Some(5));
        // Recorded before forced RAG flagged its declines: the text says it.
        assert_eq!(answered("Unanswerable.", false), 1.0);
        assert_eq!(answered("unanswerable", true), 1.0);
        assert_eq!(answered("Paris", false), 0.0);
    }

    #[test]
    fn a_signal_that_means_the_opposite_for_a_decline_needs_the_two_fitted_apart() {
        // Half the answers decline; the self-check says "wrong" when high for an answer and
        // when low for a decline: one linear score cannot read both, two can.
        let index = |name: &str| COMBINED_INPUTS.iter().position(|n| *n == name).unwrap();
        let (declined, check) = (index("declined"), index("neg_self_check"));
        let flip = |mut ls: Vec<Labelled>| {
            for (i, l) in ls.iter_mut().enumerate() {
                let decline = i % 2 == 1;
                let wrong = f32::from(u8::from(l.wrong));
                l.inputs[declined] = f32::from(u8::from(decline));
                l.inputs[check] = if decline { 1.0 - wrong } else { wrong } + l.inputs[check] * 0.2;
            }
            ls
        };
        let train = flip(answers("squad-v2", 240, 0, 1));
        let test = flip(answers("squad-v2", 120, 0, 2));
        let s = study(&train, &test).unwrap();
        let row = |name: &str| {
            s.without
                .iter()
                .find(|n| n.name == name)
                .unwrap()
                .auroc
                .unwrap()
        };
        assert!(row("answers and declines fitted apart") > 0.95, "{s:?}");
        assert!(s.combined.unwrap() < 0.8, "{s:?}");
    }

    #[test]
    fn a_signal_alone_is_judged_over_the_answers_that_have_it() {
        let train = answers("squad-v2", 120, 1, 1);
        let mut test = answers("squad-v2", 300, 1, 2);
        // The self-check is noise where it was asked, and missing (a decline) on half of the
        // right answers: ranked lowest, the missing values alone would make it look useful.
        let self_check = COMBINED_INPUTS
            .iter()
            .position(|n| *n == "neg_self_check")
            .unwrap();
        for (i, l) in test.iter_mut().enumerate() {
            if !l.wrong && i % 2 == 0 {
                l.inputs[self_check] = f32::NAN;
            }
        }
        let s = study(&train, &test).unwrap();
        let alone = s.each.iter().find(|n| n.name == "neg_self_check").unwrap();
        let auroc = alone.auroc.unwrap();
        assert!((0.4..0.6).contains(&auroc), "{auroc}");
    }

    #[test]
    fn the_signal_that_carries_the_label_stands_out_and_its_ablation_shows() {
        let train = answers("squad-v2", 120, 1, 1);
        let test = answers("squad-v2", 60, 1, 2);
        let s = study(&train, &test).unwrap();
        let alone = |name: &str| {
            s.each
                .iter()
                .find(|n| n.name == name)
                .unwrap()
                .auroc
                .unwrap()
        };
        assert_eq!(alone("not_verbatim"), 1.0);
        assert!((0.2..0.8).contains(&alone("mean_entropy")));
        assert!(s.combined.unwrap() > 0.95, "{s:?}");
        let without = |g: &str| {
            s.without
                .iter()
                .find(|n| n.name == format!("without {g}"))
                .unwrap()
                .auroc
                .unwrap()
        };
        assert!(without("grounding") < 0.8, "{s:?}");
        assert!(without("sample agreement") > 0.95);
        assert!(s.leave_one_suite_out.is_empty());
        // Grounding tells both kinds apart, so the score does on each.
        assert_eq!(s.by_kind.len(), 2);
        assert!(s.by_kind.iter().all(|n| n.auroc.unwrap() > 0.95), "{s:?}");
        assert!(markdown(&s).contains("| unanswerable |"));
        let probe = |name: &str| {
            s.probes
                .iter()
                .find(|n| n.name == name)
                .unwrap()
                .auroc
                .unwrap()
        };
        assert!(probe("layer 4, prompt") > 0.95, "{s:?}");
        assert!((0.2..0.8).contains(&probe("layer 4, answer")), "{s:?}");
        assert!(markdown(&s).contains("| not_verbatim | 1.000 |"));
    }

    /// Layer 4's prompt state tells wrong from right: as a router before decoding it escalates
    /// every wrong answer and few right ones (the train rate, 5%, give or take on test), and the
    /// tokens it saves are the escalated answers' decodes.
    #[test]
    fn a_probe_that_separates_routes_the_wrong_answers_before_decoding() {
        let train = answers("squad-v2", 120, 0, 7);
        let test = answers("squad-v2", 90, 0, 8);
        let routes = probe_routing(&train, &test, 0.05).unwrap();
        assert_eq!(routes.len(), 1);
        let r = &routes[0];
        assert_eq!((r.layer, r.answers), (4, 90));
        assert_eq!(r.recall, Some(1.0), "{r:?}");
        let false_escalation = r.false_escalation.unwrap();
        assert!(false_escalation <= 0.15, "{r:?}");
        let escalated_right = (false_escalation * 60.0).round();
        assert!(
            (r.escalated - (30.0 + escalated_right) / 90.0).abs() < 1e-9,
            "{r:?}"
        );
        // 30 wrong answers × 40 tokens and the escalated right ones × 10, of 30 × 40 + 60 × 10.
        let saved = (30.0 * 40.0 + escalated_right * 10.0) / 1800.0;
        assert!((r.decode_tokens_saved - saved).abs() < 1e-9, "{r:?}");
        let mut s = study(&train, &test).unwrap();
        s.probe_routing = routes.clone();
        assert!(markdown(&s).contains("| 4 | 90 |"), "{}", markdown(&s));
        // A strict threshold escalates no right train answer; nothing fits one label alone.
        let strict = probe_routing(&train, &test, 0.0).unwrap();
        assert!(strict[0].threshold >= r.threshold);
        let right_only: Vec<Labelled> = train.iter().filter(|l| !l.wrong).cloned().collect();
        assert!(probe_routing(&right_only, &test, 0.05).unwrap().is_empty());
    }

    #[test]
    fn a_suite_is_scored_by_a_model_fitted_on_the_others_only() {
        // Grounding flags kv-retrieval's wrong answers and hotpotqa's right ones: a score
        // fitted on one suite alone ranks the other's answers backwards.
        let mut train = answers("kv-retrieval", 90, 1, 3);
        train.extend(answers("hotpotqa", 90, -1, 4));
        let mut test = answers("kv-retrieval", 60, 1, 5);
        test.extend(answers("hotpotqa", 60, -1, 6));
        let s = study(&train, &test).unwrap();
        let lo = |suite: &str| {
            s.leave_one_suite_out
                .iter()
                .find(|n| n.name == suite)
                .unwrap()
                .auroc
                .unwrap()
        };
        assert!(lo("kv-retrieval") < 0.3, "{s:?}");
        assert!(lo("hotpotqa") < 0.3, "{s:?}");
        assert_eq!(s.leave_one_suite_out.len(), 2);
    }

    #[test]
    fn dev_answers_alone_are_scored_corpus_by_corpus() {
        let rows = answers("squad-v2", 160, 1, 3);
        let s = leave_one_corpus_out(&rows).unwrap().unwrap();
        assert_eq!((s.folds, s.test_answers), (4, 160));
        assert!(s.combined.unwrap() > 0.95, "{s:?}");
        let without_grounding = s
            .without
            .iter()
            .find(|n| n.name == "without grounding")
            .unwrap();
        assert!(without_grounding.auroc.unwrap() < 0.8, "{s:?}");
        assert!(markdown(&s).contains("each of 4 corpora held out in turn"));
        // Noise stays noise out of fold: nothing is scored on what it was fitted on.
        let noise = leave_one_corpus_out(&answers("squad-v2", 160, 0, 4))
            .unwrap()
            .unwrap();
        assert!(noise.combined.unwrap() < 0.75, "{noise:?}");
        // One corpus cannot be held out.
        let one: Vec<Labelled> = rows
            .iter()
            .filter(|l| l.corpus == "squad-v2-0")
            .cloned()
            .collect();
        assert!(leave_one_corpus_out(&one).unwrap().is_none());
    }
}
