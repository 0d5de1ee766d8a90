//! Grounding features of a RAG answer: whether its answer span is copied from a retrieved
//! chunk, which one, how that chunk scored against the next, and how many of the answer's words
//! appear nowhere in the chunks. Text only, so they cost nothing next to a forward pass.

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

/// The features of `answer` (its answer span, preamble left out) against `chunks` (text and
/// retrieval score, in the order the prompt gave them).
pub fn grounding(answer: &str, chunks: &[(&str, f32)]) -> GroundingFeatures {
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
    let vocabulary: std::collections::HashSet<&str> =
        texts.iter().flat_map(|t| t.split(' ')).collect();
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
    }
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

    #[test]
    fn an_answer_copied_from_the_second_chunk_is_found_there() {
        let g = grounding("King Charles III.", &CHUNKS);
        assert_eq!((g.verbatim, g.chunk_rank), (1.0, 2.0));
        assert_eq!(g.chunk_score, 0.7);
        assert!((g.chunk_margin - 0.3).abs() < 1e-6);
        assert_eq!(g.unsupported_words, 0.0);
        // In the last chunk: no next score, no margin.
        let last = grounding("10th century", &CHUNKS);
        assert_eq!(last.chunk_rank, 3.0);
        assert!(last.chunk_margin.is_nan());
    }

    #[test]
    fn a_made_up_answer_is_not_grounded() {
        let g = grounding("Emperor Otto", &CHUNKS);
        assert_eq!((g.verbatim, g.chunk_rank), (0.0, 4.0));
        assert!(g.chunk_score.is_nan() && g.chunk_margin.is_nan());
        assert_eq!(g.unsupported_words, 1.0);
        // Words from the chunks, but not as a run of one of them.
        let mixed = grounding("Rollo of Normandy", &CHUNKS);
        assert_eq!(mixed.verbatim, 0.0);
        assert!((mixed.unsupported_words - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn matches_are_whole_words_and_ignore_case_and_punctuation() {
        // "orman" is inside "Normans" but is not a word of it.
        assert_eq!(grounding("orman", &CHUNKS).verbatim, 0.0);
        assert_eq!(grounding("NORMANDY!", &CHUNKS).verbatim, 1.0);
        assert_eq!(
            normalise("  Rollo,  a Viking—leader. "),
            "rollo a viking leader"
        );
        // No answer words: nothing to say.
        let empty = grounding(" … ", &CHUNKS);
        assert!(empty.verbatim.is_nan() && empty.chunk_rank.is_nan());
        assert!(empty.unsupported_words.is_nan());
    }
}
