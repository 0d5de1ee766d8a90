//! Answer scoring: the SQuAD script's normalisation (lower case, no punctuation, no articles
//! a/an/the, single spaces), exact match and token F1 against the best gold answer (with
//! HotpotQA's yes/no rule and SQuAD v2's abstention), "contains" (for models that answer in a
//! sentence), the long-context suites' matches (whole word, substring, first digits) and
//! summary-level ROUGE-L. `Scorer` says which one an example uses.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The SQuAD normalisation.
pub fn normalize_answer(text: &str) -> String {
    let lower = text.to_lowercase();
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    no_punct
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn f1_one(prediction: &str, gold: &str) -> f64 {
    let p: Vec<String> = normalize_answer(prediction)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let g: Vec<String> = normalize_answer(gold)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if p.is_empty() || g.is_empty() {
        return f64::from(u8::from(p == g));
    }
    let mut counts: HashMap<&str, i32> = HashMap::new();
    for w in &g {
        *counts.entry(w).or_default() += 1;
    }
    let mut common = 0;
    for w in &p {
        if let Some(c) = counts.get_mut(w.as_str()) {
            if *c > 0 {
                *c -= 1;
                common += 1;
            }
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = f64::from(common) / p.len() as f64;
    let recall = f64::from(common) / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Exact match against any gold answer.
pub fn exact_match(prediction: &str, golds: &[String]) -> bool {
    let p = normalize_answer(prediction);
    golds.iter().any(|g| normalize_answer(g) == p)
}

/// Best token F1 against the gold answers.
pub fn f1(prediction: &str, golds: &[String]) -> f64 {
    golds
        .iter()
        .map(|g| f1_one(prediction, g))
        .fold(0.0, f64::max)
}

/// Whether a normalised gold answer occurs in the normalised prediction (word-aligned).
pub fn contains_answer(prediction: &str, golds: &[String]) -> bool {
    let p = format!(" {} ", normalize_answer(prediction));
    golds.iter().any(|g| {
        let g = normalize_answer(g);
        !g.is_empty() && p.contains(&format!(" {g} "))
    })
}

/// The HotpotQA rule: a yes/no/noanswer prediction or gold answer scores only when both agree.
fn yes_no_mismatch(prediction: &str, gold: &str) -> bool {
    let special = |t: &str| matches!(t, "yes" | "no" | "noanswer");
    let (p, g) = (normalize_answer(prediction), normalize_answer(gold));
    (special(&p) || special(&g)) && p != g
}

/// Whether an answer abstains: it starts with the abstention string (case and punctuation
/// ignored).
pub fn abstains(prediction: &str, abstention: &str) -> bool {
    let words = |t: &str| normalize_answer(t);
    let (p, a) = (words(prediction), words(abstention));
    !a.is_empty() && (p == a || p.starts_with(&format!("{a} ")))
}

/// ∞Bench's Retrieve.KV rule: some whitespace-separated word of the prediction, with the
/// punctuation at its ends stripped, equals the gold value.
pub fn whole_word_match(prediction: &str, gold: &str) -> bool {
    prediction
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| c.is_ascii_punctuation()))
        .any(|w| w == gold)
}

/// Lost-in-the-middle's rule: the normalised gold occurs in the normalised prediction.
pub fn substring_match(prediction: &str, gold: &str) -> bool {
    let g = normalize_answer(gold);
    !g.is_empty() && normalize_answer(prediction).contains(&g)
}

/// The passkey rule: the prediction's first run of digits equals the key.
pub fn first_digits_match(prediction: &str, key: &str) -> bool {
    let digits: String = prediction
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    !digits.is_empty() && digits == key
}

fn rouge_words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn sentences(text: &str) -> Vec<Vec<String>> {
    text.split(['.', '!', '?', '\n'])
        .map(rouge_words)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Positions of `a` on one longest common subsequence of `a` and `b`.
fn lcs_positions(a: &[String], b: &[String]) -> Vec<usize> {
    let mut table = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            table[i][j] = if a[i] == b[j] {
                table[i + 1][j + 1] + 1
            } else {
                table[i + 1][j].max(table[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out.push(i);
            i += 1;
            j += 1;
        } else if table[i + 1][j] >= table[i][j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Summary-level ROUGE-L F1 (Lin 2004, β = 1): for each reference sentence, the union of its
/// longest common subsequences with every candidate sentence, summed over the reference and
/// divided by the reference's (recall) and the candidate's (precision) word counts.
pub fn rouge_l_summary(candidate: &str, reference: &str) -> f64 {
    let (cand, refs) = (sentences(candidate), sentences(reference));
    let cand_words: usize = cand.iter().map(Vec::len).sum();
    let ref_words: usize = refs.iter().map(Vec::len).sum();
    if cand_words == 0 || ref_words == 0 {
        return 0.0;
    }
    let hits: usize = refs
        .iter()
        .map(|r| {
            let mut union = std::collections::BTreeSet::new();
            for c in &cand {
                union.extend(lcs_positions(r, c));
            }
            union.len()
        })
        .sum();
    let recall = hits as f64 / ref_words as f64;
    let precision = (hits as f64 / cand_words as f64).min(1.0);
    if hits == 0 {
        return 0.0;
    }
    2.0 * precision * recall / (precision + recall)
}

/// How an example's answer is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scorer {
    /// ∞Bench Retrieve.KV: whole-word match after stripping punctuation.
    WholeWord,
    /// Lost in the middle and RULER: normalised substring match.
    Substring,
    /// Passkey: the first run of digits equals the key.
    FirstDigits,
    /// SQuAD v2: EM and F1 against every gold answer; an unanswerable question (no gold answer)
    /// is right only when the answer abstains. Correct = the gold occurs in the answer.
    Squad,
    /// HotpotQA: as SQuAD, with the yes/no rule.
    Hotpot,
    /// Summary-level ROUGE-L F1 against the reference; correct when it reaches
    /// `ROUGE_L_CORRECT`.
    RougeL,
}

/// The ROUGE-L F1 at which a summary counts as correct (for error labels and the oracle).
pub const ROUGE_L_CORRECT: f64 = 0.3;

/// One answer's score: `value` is what accuracy averages (1/0, or ROUGE-L), `correct` the label
/// for error analyses; EM and F1 for the QA scorers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    pub value: f64,
    pub correct: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub em: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
}

impl Score {
    fn binary(correct: bool) -> Self {
        Self {
            value: f64::from(u8::from(correct)),
            correct,
            em: None,
            f1: None,
        }
    }
}

impl Scorer {
    /// Score `prediction` against `golds` (several acceptable answers; empty = unanswerable,
    /// judged against `abstention`).
    pub fn score(self, prediction: &str, golds: &[String], abstention: &str) -> Score {
        let any = |f: fn(&str, &str) -> bool| golds.iter().any(|g| f(prediction, g));
        match self {
            Self::WholeWord => Score::binary(any(whole_word_match)),
            Self::Substring => Score::binary(any(substring_match)),
            Self::FirstDigits => Score::binary(any(first_digits_match)),
            Self::Squad | Self::Hotpot if golds.is_empty() => {
                let right = abstains(prediction, abstention);
                let v = f64::from(u8::from(right));
                Score {
                    value: v,
                    correct: right,
                    em: Some(v),
                    f1: Some(v),
                }
            }
            Self::Squad | Self::Hotpot => {
                let declined = abstains(prediction, abstention);
                let hotpot = self == Self::Hotpot;
                let f = if declined {
                    0.0
                } else {
                    golds
                        .iter()
                        .filter(|g| !(hotpot && yes_no_mismatch(prediction, g)))
                        .map(|g| f1_one(prediction, g))
                        .fold(0.0, f64::max)
                };
                let right = !declined && contains_answer(prediction, golds);
                Score {
                    value: f64::from(u8::from(right)),
                    correct: right,
                    em: Some(f64::from(u8::from(
                        !declined && exact_match(prediction, golds),
                    ))),
                    f1: Some(f),
                }
            }
            Self::RougeL => {
                let v = golds
                    .iter()
                    .map(|g| rouge_l_summary(prediction, g))
                    .fold(0.0, f64::max);
                Score {
                    value: v,
                    correct: v >= ROUGE_L_CORRECT,
                    em: None,
                    f1: None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn squad_normalisation_and_scores() {
        assert_eq!(normalize_answer("The  Seljuk Turks!"), "seljuk turks");
        assert!(exact_match("the Seljuk Turks.", &golds(&["Seljuk Turks"])));
        assert!(!exact_match("Turks", &golds(&["Seljuk Turks"])));
        assert!((f1("Turks", &golds(&["Seljuk Turks"])) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(f1("Rome", &golds(&["Seljuk Turks", "Pechenegs"])), 0.0);
        assert!(contains_answer("It was Rollo, in 911.", &golds(&["Rollo"])));
        assert!(!contains_answer("Rollons", &golds(&["Rollo"])));
    }

    #[test]
    fn long_context_suite_matches() {
        let key = "a1b2c3d4-0000-4000-8000-000000000001";
        assert!(whole_word_match(&format!("The value is \"{key}\"."), key));
        assert!(!whole_word_match(&format!("{key}x"), key));
        assert!(substring_match("I think it is Paris, France", "paris"));
        assert!(!substring_match("", "paris"));
        assert!(first_digits_match(
            "The pass key is 48213. Remember",
            "48213"
        ));
        assert!(!first_digits_match("The pass key is 482130", "48213"));
        assert!(!first_digits_match("no digits", "48213"));
    }

    #[test]
    fn abstention_and_the_yes_no_rule() {
        let none: Vec<String> = Vec::new();
        let s = Scorer::Squad.score("Unanswerable.", &none, "unanswerable");
        assert!(s.correct && s.em == Some(1.0));
        assert!(
            !Scorer::Squad
                .score("It was 1066", &none, "unanswerable")
                .correct
        );
        // An abstention on an answerable question scores nothing, even if the word appears.
        let s = Scorer::Squad.score("unanswerable", &golds(&["unanswerable"]), "unanswerable");
        assert!(!s.correct && s.f1 == Some(0.0));
        // HotpotQA: "no" against "yes" is 0 F1 even though the lengths match.
        let s = Scorer::Hotpot.score("no", &golds(&["yes"]), "unanswerable");
        assert_eq!(s.f1, Some(0.0));
        let s = Scorer::Hotpot.score("yes", &golds(&["yes"]), "unanswerable");
        assert_eq!((s.em, s.f1, s.correct), (Some(1.0), Some(1.0), true));
        let s = Scorer::Squad.score("no", &golds(&["yes"]), "unanswerable");
        assert_eq!(s.f1, Some(0.0));
    }

    #[test]
    fn rouge_l_summary_level() {
        let reference = "the cat sat on the mat. the dog ran.";
        assert!((rouge_l_summary(reference, reference) - 1.0).abs() < 1e-12);
        assert_eq!(rouge_l_summary("zebra", reference), 0.0);
        // Hand-worked: reference sentences r1 = [the cat sat on the mat] (6 words), r2 = [the
        // dog ran] (3); candidate c1 = [the cat ran]. LCS(r1, c1) = "the cat" (2),
        // LCS(r2, c1) = "the ran" (2). Recall 4/9, precision 4/3 capped at 1.
        let f = rouge_l_summary("the cat ran", reference);
        let (r, p) = (4.0 / 9.0, 1.0);
        assert!((f - 2.0 * p * r / (p + r)).abs() < 1e-12, "{f}");
        // Two candidate sentences: the union over them counts each reference word once.
        let f = rouge_l_summary("the cat sat. on the mat.", "the cat sat on the mat.");
        assert!((f - 1.0).abs() < 1e-12, "{f}");
    }
}
