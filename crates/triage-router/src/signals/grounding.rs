//! Grounding features of a RAG answer: whether its answer span is copied from a retrieved
//! chunk, which one, how that chunk scored against the next, how many of the answer's words
//! appear nowhere in the chunks, and whether the line or sentence it was copied from is the one
//! the question asks about. Text only, so they cost nothing next to a forward pass.

use std::collections::HashSet;

use triage_types::GroundingFeatures;

/// Lower case, every run of characters that are not letters or digits one space, trimmed: the
/// form in which an answer and a chunk are compared word by word.
pub fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut gap = false;
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        } else {
            gap = true;
        }
    }
    out
}

/// The features of `answer` (its answer span, preamble left out) to `question` against `chunks`
/// (text and retrieval score, in the order the prompt gave them).
pub fn grounding(question: &str, answer: &str, chunks: &[(&str, f32)]) -> GroundingFeatures {
    let answer = normalise(answer);
    let texts: Vec<String> = chunks.iter().map(|(t, _)| normalise(t)).collect();
    // Whole words: " a b " inside " … a b … ".
    let needle = format!(" {answer} ");
    let holder = (!answer.is_empty())
        .then(|| {
            texts
                .iter()
                .position(|t| format!(" {t} ").contains(&needle))
        })
        .flatten();
    let words: Vec<&str> = answer.split(' ').filter(|w| !w.is_empty()).collect();
    let vocabulary: HashSet<&str> = texts.iter().flat_map(|t| t.split(' ')).collect();
    let unsupported = if words.is_empty() {
        f32::NAN
    } else {
        words.iter().filter(|w| !vocabulary.contains(*w)).count() as f32 / words.len() as f32
    };
    let score = |i: usize| chunks.get(i).map_or(f32::NAN, |c| c.1);
    GroundingFeatures {
        verbatim: if answer.is_empty() {
            f32::NAN
        } else {
            f32::from(u8::from(holder.is_some()))
        },
        chunk_rank: match holder {
            Some(i) => (i + 1) as f32,
            None if answer.is_empty() => f32::NAN,
            None => (chunks.len() + 1) as f32,
        },
        chunk_score: holder.map_or(f32::NAN, score),
        chunk_margin: holder.map_or(f32::NAN, |i| score(i) - score(i + 1)),
        unsupported_words: unsupported,
        question_support: question_support(question, &answer, chunks, &vocabulary),
    }
}

/// `GroundingFeatures::question_support` of the normalised `answer`: the best share, over the
/// lines and sentences of `chunks` holding it as whole words, of the question's words in the
/// chunks' `vocabulary` that the same line or sentence holds.
fn question_support(
    question: &str,
    answer: &str,
    chunks: &[(&str, f32)],
    vocabulary: &HashSet<&str>,
) -> f32 {
    if answer.is_empty() {
        return f32::NAN;
    }
    let question = normalise(question);
    let question_words: HashSet<&str> = question.split(' ').collect();
    // An answer that only repeats the question (a key echoed back) reads nothing.
    if answer.split(' ').all(|w| question_words.contains(w)) {
        return 0.0;
    }
    let asked: Vec<&str> = question_words
        .iter()
        .copied()
        .filter(|w| !w.is_empty() && vocabulary.contains(w))
        .collect();
    if asked.is_empty() {
        return 0.0;
    }
    let needle = format!(" {answer} ");
    let mut best = 0.0f32;
    for unit in chunks.iter().flat_map(|(text, _)| units(text)) {
        let unit = format!(" {} ", normalise(unit));
        if !unit.contains(&needle) {
            continue;
        }
        let held = asked
            .iter()
            .filter(|w| unit.contains(&format!(" {w} ")))
            .count();
        best = best.max(held as f32 / asked.len() as f32);
    }
    best
}

/// The lines of `text`, each cut after every sentence end (`.`, `!` or `?` before whitespace):
/// the pieces one fact is read from, a record of a JSON object or a sentence of prose.
fn units(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut start = 0;
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
            if matches!(c, '.' | '!' | '?') && next_is_space {
                out.push(&line[start..=i]);
                start = i + 1;
            }
        }
        out.push(&line[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNKS: [(&str, f32); 3] = [
        (
            "The Normans gave their name to Normandy, a region in France.",
            0.9,
        ),
        (
            "Rollo, a Viking leader, signed a treaty with King Charles III.",
            0.7,
        ),
        (
            "In the 10th century the Normans spoke a Romance language.",
            0.4,
        ),
    ];

    const QUESTION: &str = "Who signed a treaty with the Normans?";

    #[test]
    fn an_answer_copied_from_the_second_chunk_is_found_there() {
        let g = grounding(QUESTION, "King Charles III.", &CHUNKS);
        assert_eq!((g.verbatim, g.chunk_rank), (1.0, 2.0));
        assert_eq!(g.chunk_score, 0.7);
        assert!((g.chunk_margin - 0.3).abs() < 1e-6);
        assert_eq!(g.unsupported_words, 0.0);
        // In the last chunk: no next score, no margin.
        let last = grounding(QUESTION, "10th century", &CHUNKS);
        assert_eq!(last.chunk_rank, 3.0);
        assert!(last.chunk_margin.is_nan());
    }

    #[test]
    fn a_made_up_answer_is_not_grounded() {
        let g = grounding(QUESTION, "Emperor Otto", &CHUNKS);
        assert_eq!((g.verbatim, g.chunk_rank), (0.0, 4.0));
        assert!(g.chunk_score.is_nan() && g.chunk_margin.is_nan());
        assert_eq!(g.unsupported_words, 1.0);
        // Words from the chunks, but not as a run of one of them.
        let mixed = grounding(QUESTION, "Rollo of Normandy", &CHUNKS);
        assert_eq!(mixed.verbatim, 0.0);
        assert!((mixed.unsupported_words - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn matches_are_whole_words_and_ignore_case_and_punctuation() {
        // "orman" is inside "Normans" but is not a word of it.
        assert_eq!(grounding(QUESTION, "orman", &CHUNKS).verbatim, 0.0);
        assert_eq!(grounding(QUESTION, "NORMANDY!", &CHUNKS).verbatim, 1.0);
        assert_eq!(
            normalise("  Rollo,  a Viking—leader. "),
            "rollo a viking leader"
        );
        // No answer words: nothing to say.
        let empty = grounding(QUESTION, " … ", &CHUNKS);
        assert!(empty.verbatim.is_nan() && empty.chunk_rank.is_nan());
        assert!(empty.unsupported_words.is_nan() && empty.question_support.is_nan());
    }

    #[test]
    fn a_value_read_from_the_record_asked_about_is_supported_and_a_neighbours_is_not() {
        let object = "{\n  \"a1b2-77\": \"c3d4-88\",\n\n  \"e5f6-99\": \"a7b8-00\"\n}";
        let chunks = [(object, 0.5)];
        let asked = "What is the value of the key \"e5f6-99\" in the JSON object?";
        let right = grounding(asked, "a7b8-00", &chunks);
        let neighbour = grounding(asked, "c3d4-88", &chunks);
        assert_eq!((right.verbatim, neighbour.verbatim), (1.0, 1.0));
        // The chunks hold the key's two words and nothing else of the question.
        assert_eq!(right.question_support, 1.0);
        assert_eq!(neighbour.question_support, 0.0);
        // Echoing the key back reads nothing; a value found nowhere has no line to read from.
        assert_eq!(grounding(asked, "e5f6-99", &chunks).question_support, 0.0);
        assert_eq!(grounding(asked, "a7b8-01", &chunks).question_support, 0.0);
    }

    #[test]
    fn prose_is_read_sentence_by_sentence() {
        // "Rollo" and "treaty" sit in the second chunk's sentence with the answer.
        let g = grounding(QUESTION, "Rollo", &CHUNKS);
        let asked_in_chunks = ["signed", "a", "treaty", "with", "the", "normans"];
        assert!((g.question_support - 4.0 / asked_in_chunks.len() as f32).abs() < 1e-6);
        let two = [("Rollo ruled. He signed a treaty with the Normans.", 0.5)];
        let split = grounding(QUESTION, "Rollo", &two);
        // Only "Rollo ruled." holds the answer, and it holds none of the question's words.
        assert_eq!(split.question_support, 0.0);
        assert_eq!(
            units("Rollo ruled. He signed\nv1.2 ok"),
            ["Rollo ruled.", " He signed", "v1.2 ok"]
        );
    }
}
