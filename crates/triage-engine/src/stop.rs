//! Stop strings on streamed text: how much decoded text is safe to emit, and where output ends.
//!
//! Text is emitted as soon as it cannot be the start of a stop string; a suffix that could be is
//! held back until later pieces settle it. The output ends at the first point where a stop string
//! is complete, and is cut right before that stop string, which is not emitted (as OpenAI does).
//! "First" means the match that ends earliest, the longest of those ending at the same place:
//! exactly what checking after every character would give, so the result never depends on how
//! the text was split into pieces.

use crate::{EngineError, Result};

/// What one piece of text let through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to send now; with a match, everything left before the stop string.
    pub text: String,
    /// The stop string that ended the output, if one did.
    pub matched: Option<String>,
}

/// Watches streamed text for a request's stop strings.
#[derive(Debug, Clone)]
pub struct StopChecker {
    stops: Vec<String>,
    automaton: StopAutomaton,
    /// The automaton's state after the last byte received.
    state: usize,
    /// Text received but not emitted: a suffix that is the start of some stop string.
    pending: String,
    stopped: bool,
}

impl StopChecker {
    /// A checker for `stops`; an empty stop string is an error (it would match before any text).
    pub fn new(stops: &[String]) -> Result<Self> {
        if let Some(stop_idx) = stops.iter().position(String::is_empty) {
            let message = format!("stop string {stop_idx} is empty");
            return Err(EngineError::InvalidSampling {
                param: "stop",
                message,
            });
        }
        Ok(Self {
            stops: stops.to_vec(),
            automaton: StopAutomaton::new(stops),
            state: ROOT,
            pending: String::new(),
            stopped: false,
        })
    }

    /// Takes the next decoded piece. After a match every later piece is dropped and gives an empty
    /// output. Costs O(piece) (amortised), whatever the stop strings' lengths.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        let base = self.pending.len();
        self.pending.push_str(piece);
        for (i, byte) in piece.bytes().enumerate() {
            self.state = self.automaton.next(self.state, byte);
            if let Some(stop_idx) = self.automaton.output[self.state] {
                // A stop string starts with a UTF-8 leading byte, and so does its copy here:
                // `start` is a character boundary.
                let start = base + i + 1 - self.stops[stop_idx].len();
                self.pending.truncate(start);
                self.stopped = true;
                return StopOutput {
                    text: std::mem::take(&mut self.pending),
                    matched: Some(self.stops[stop_idx].clone()),
                };
            }
        }
        // The held suffix is the state's depth: the longest suffix that begins a stop string
        // (a character boundary, as above).
        let held_start = self.pending.len() - self.automaton.depth[self.state];
        StopOutput {
            text: self.pending.drain(..held_start).collect(),
            matched: None,
        }
    }

    /// Generation ended without a stop string: the held-back text is output after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Text held back because it could be the start of a stop string.
    #[cfg(test)]
    pub fn pending(&self) -> &str {
        &self.pending
    }
}

const ROOT: usize = 0;

/// An Aho–Corasick automaton over the stop strings' bytes. Its state after each byte is the
/// longest suffix of the text so far that begins some stop string; `depth` is that suffix's
/// length (the text to hold back) and `output` the stop string that ends there first: the node's
/// own (the longest) or, failing that, the longest ending on its suffix chain. Written here
/// rather than taken from the `aho-corasick` crate because the held-back length needs the
/// state's depth, which the crate does not expose.
#[derive(Debug, Clone)]
struct StopAutomaton {
    /// Trie edges of each node, sorted by byte.
    edges: Vec<Vec<(u8, usize)>>,
    /// The longest proper suffix of a node's string that is also a node.
    fail: Vec<usize>,
    depth: Vec<usize>,
    output: Vec<Option<usize>>,
}

impl StopAutomaton {
    fn new(stops: &[String]) -> Self {
        let mut a = Self {
            edges: vec![Vec::new()],
            fail: vec![ROOT],
            depth: vec![0],
            output: vec![None],
        };
        for (stop_idx, stop) in stops.iter().enumerate() {
            let mut node = ROOT;
            for &byte in stop.as_bytes() {
                node = match a.edge(node, byte) {
                    Some(child) => child,
                    None => a.add_child(node, byte),
                };
            }
            // The first of equal stop strings is the one reported.
            a.output[node].get_or_insert(stop_idx);
        }
        a.link();
        a
    }

    fn edge(&self, node: usize, byte: u8) -> Option<usize> {
        let edges = &self.edges[node];
        edges
            .binary_search_by_key(&byte, |&(b, _)| b)
            .ok()
            .map(|i| edges[i].1)
    }

    fn add_child(&mut self, node: usize, byte: u8) -> usize {
        let child = self.edges.len();
        self.edges.push(Vec::new());
        self.fail.push(ROOT);
        self.depth.push(self.depth[node] + 1);
        self.output.push(None);
        let edges = &mut self.edges[node];
        let at = edges.partition_point(|&(b, _)| b < byte);
        edges.insert(at, (byte, child));
        child
    }

    /// Suffix links and inherited outputs, breadth first (a node's link is shallower than it).
    fn link(&mut self) {
        let mut queue = std::collections::VecDeque::from([ROOT]);
        while let Some(node) = queue.pop_front() {
            for (byte, child) in self.edges[node].clone() {
                self.fail[child] = if node == ROOT {
                    ROOT
                } else {
                    self.next(self.fail[node], byte)
                };
                if self.output[child].is_none() {
                    self.output[child] = self.output[self.fail[child]];
                }
                queue.push_back(child);
            }
        }
    }

    /// The state after `byte`.
    fn next(&self, mut node: usize, byte: u8) -> usize {
        loop {
            if let Some(child) = self.edge(node, byte) {
                return child;
            }
            if node == ROOT {
                return ROOT;
            }
            node = self.fail[node];
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn checker(stops: &[&str]) -> StopChecker {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        StopChecker::new(&stops).unwrap()
    }

    /// Pushes every piece; returns the emitted text and the match.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut c = checker(stops);
        let mut out = String::new();
        for piece in pieces {
            let step = c.push(piece);
            out.push_str(&step.text);
            if step.matched.is_some() {
                return (out, step.matched);
            }
        }
        out.push_str(&c.finish());
        (out, None)
    }

    fn output(text: &str, matched: Option<&str>) -> StopOutput {
        StopOutput {
            text: text.into(),
            matched: matched.map(str::to_string),
        }
    }

    #[test]
    fn no_stops_passes_text_through() {
        let mut c = checker(&[]);
        assert_eq!(c.push("Hello"), output("Hello", None));
        assert_eq!(c.push(", world"), output(", world", None));
        assert_eq!(c.finish(), "");
    }

    #[test]
    fn stop_split_across_pieces() {
        let mut c = checker(&["</answer>"]);
        assert_eq!(c.push("42 </an"), output("42 ", None));
        assert_eq!(c.pending(), "</an");
        assert_eq!(c.push("swer"), output("", None));
        assert_eq!(c.push("> trailing"), output("", Some("</answer>")));
        assert!(c.is_stopped());
        assert_eq!(c.push("more"), output("", None));
        assert_eq!(c.finish(), "");
    }

    #[test]
    fn held_text_is_released_when_the_stop_fails() {
        let mut c = checker(&["###"]);
        assert_eq!(c.push("a ##"), output("a ", None));
        assert_eq!(c.push("b"), output("##b", None));
        assert_eq!(c.push("#"), output("", None));
        assert_eq!(c.finish(), "#");
    }

    #[test]
    fn stop_inside_one_piece_drops_the_rest() {
        let mut c = checker(&["\n\n"]);
        assert_eq!(
            c.push("line one\n\nline two"),
            output("line one", Some("\n\n"))
        );
    }

    #[test]
    fn overlapping_candidates() {
        // "abc" could start "abcd"; it fails, but "bcx" starting inside it matches.
        assert_eq!(
            run(&["abcd", "bcx"], &["zab", "c", "x!"]),
            ("za".into(), Some("bcx".into()))
        );
        // A self-overlapping stop: the match starts one character into the held text.
        assert_eq!(
            run(&["aab"], &["xaa", "ab"]),
            ("xa".into(), Some("aab".into()))
        );
        // Both held, neither completes.
        assert_eq!(
            run(&["abcd", "bcx"], &["zab", "c", "y"]),
            ("zabcy".into(), None)
        );
    }

    #[test]
    fn earliest_ending_stop_wins_longest_on_ties() {
        // "b" completes before "abc" would.
        assert_eq!(
            run(&["abc", "b"], &["xabc"]),
            ("xa".into(), Some("b".into()))
        );
        assert_eq!(
            run(&["abc", "b"], &["xa", "bc"]),
            ("xa".into(), Some("b".into()))
        );
        // "xab" and "ab" end together: the longer one cuts more.
        assert_eq!(
            run(&["ab", "xab"], &["1xab2"]),
            ("1".into(), Some("xab".into()))
        );
    }

    #[test]
    fn unicode_stop_split_across_pieces() {
        assert_eq!(
            run(&["终止"], &["你好", "终", "止了"]),
            ("你好".into(), Some("终止".into()))
        );
        assert_eq!(
            run(&["🛑 end"], &["ok 🛑", " en", "d"]),
            ("ok ".into(), Some("🛑 end".into()))
        );
        // A multi-byte character sharing its first bytes with the stop is not held.
        let mut c = checker(&["é!"]);
        assert_eq!(c.push("café"), output("caf", None));
        assert_eq!(c.push("è"), output("éè", None));
    }

    #[test]
    fn empty_stop_string_is_error() {
        assert!(StopChecker::new(&["ok".into(), String::new()]).is_err());
    }

    /// Checking after every character, from scratch.
    fn reference(stops: &[&str], text: &str) -> (String, Option<String>) {
        let ends = text.char_indices().map(|(idx, c)| idx + c.len_utf8());
        for end in ends {
            let prefix = &text[..end];
            let longest = stops
                .iter()
                .filter(|s| prefix.ends_with(*s))
                .max_by_key(|s| s.len());
            if let Some(stop) = longest {
                return (text[..end - stop.len()].into(), Some(stop.to_string()));
            }
        }
        (text.into(), None)
    }

    #[test]
    fn random_splits_agree_with_reference() {
        let alphabet = ['a', 'b', 'c', 'é', '终', ' '];
        let stops = ["ab", "bca", "aab", "é终", "c c", "cabc", "bbbb"];
        let mut rng = StdRng::seed_from_u64(77);
        let mut num_matched = 0;
        for _ in 0..3_000 {
            let len = rng.random_range(1..24);
            let text: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let num_stops = rng.random_range(1..=stops.len());
            let chosen = &stops[..num_stops];
            let chars: Vec<char> = text.chars().collect();
            let mut pieces = Vec::new();
            let mut idx = 0;
            while idx < chars.len() {
                let piece_len = rng.random_range(1..=4).min(chars.len() - idx);
                pieces.push(chars[idx..idx + piece_len].iter().collect::<String>());
                idx += piece_len;
            }
            let piece_refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let expected = reference(chosen, &text);
            num_matched += usize::from(expected.1.is_some());
            assert_eq!(run(chosen, &piece_refs), expected, "{chosen:?} {pieces:?}");
        }
        assert!(num_matched > 1_000 && num_matched < 2_900, "{num_matched}");
    }
}
