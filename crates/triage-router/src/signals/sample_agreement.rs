//! Sample agreement: short answers sampled from the RAG prompt (cached after the greedy answer)
//! are compared with the greedy answer word by word; a model that knows the answer says it again,
//! one that guesses wanders (SelfCheckGPT's idea, on the answer span only).

use std::collections::HashMap;

use crate::signals::grounding::normalise;

/// One sampled answer span, and whether it was cut at its token limit (then only the greedy
/// answer's first as many words are compared).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub span: String,
    pub truncated: bool,
}

/// Mean word F1 of the samples against the greedy answer span; NaN without samples.
pub fn agreement(greedy: &str, samples: &[Sample]) -> f32 {
    if samples.is_empty() {
        return f32::NAN;
    }
    let greedy = normalise(greedy);
    let greedy: Vec<&str> = greedy.split(' ').filter(|w| !w.is_empty()).collect();
    let total: f32 = samples
        .iter()
        .map(|s| {
            let text = normalise(&s.span);
            let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
            let reference = if s.truncated {
                &greedy[..greedy.len().min(words.len())]
            } else {
                &greedy[..]
            };
            word_f1(&words, reference)
        })
        .sum();
    total / samples.len() as f32
}

/// F1 of the multiset overlap of two word lists (1 when both are empty).
fn word_f1(a: &[&str], b: &[&str]) -> f32 {
    if a.is_empty() || b.is_empty() {
        return f32::from(u8::from(a.is_empty() && b.is_empty()));
    }
    let mut counts: HashMap<&str, i32> = HashMap::new();
    for w in b {
        *counts.entry(w).or_default() += 1;
    }
    let mut common = 0;
    for w in a {
        if let Some(c) = counts.get_mut(w) {
            if *c > 0 {
                *c -= 1;
                common += 1;
            }
        }
    }
    if common == 0 {
        return 0.0;
    }
    let (p, r) = (
        common as f32 / a.len() as f32,
        common as f32 / b.len() as f32,
    );
    2.0 * p * r / (p + r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(span: &str, truncated: bool) -> Sample {
        Sample {
            span: span.into(),
            truncated,
        }
    }

    #[test]
    fn samples_that_repeat_the_answer_agree_and_guesses_do_not() {
        let greedy = "King Charles III of France.";
        let same = [
            sample("king charles iii of france", false),
            sample("King Charles III", true),
        ];
        assert_eq!(agreement(greedy, &same), 1.0);
        // A sample that stopped early is compared with the whole answer: 3 of 5 words.
        let short = [sample("King Charles III.", false)];
        assert!((agreement(greedy, &short) - 0.75).abs() < 1e-6);
        let guesses = [sample("Otto the Great", false), sample("Louis IV", false)];
        assert_eq!(agreement(greedy, &guesses), 0.0);
        let mixed = [sample("Charles III", true), sample("Louis IV", false)];
        // "charles iii" against "king charles": F1 0.5; then 0.
        assert!((agreement(greedy, &mixed) - 0.25).abs() < 1e-6);
        assert!(agreement(greedy, &[]).is_nan());
        assert_eq!(agreement("", &[sample(" .", false)]), 1.0);
    }
}
