//! Answer scoring of the SQuAD evaluation script: normalisation (lower case, no punctuation, no
//! articles a/an/the, single spaces), exact match and token F1 against the best gold answer, and
//! "contains" (the normalised gold answer occurs in the normalised prediction, for models that
//! answer in a sentence).

use std::collections::HashMap;

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
}
