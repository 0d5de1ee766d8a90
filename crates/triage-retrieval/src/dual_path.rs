//! Dual-path selection (decide-then-retrieve): candidates found with the question and with a
//! pseudo-passage the model wrote are pooled and ranked by their joint relevance to both, the
//! sum of the two cosine similarities. The published code sums; the paper's text describes an
//! angle-based score. We sum: on unit vectors it is monotone in the cosine of the angle to the
//! bisector of question and passage, needs no extra parameter, and is what the results came from.

use std::collections::BTreeMap;

use crate::dense::{dot, DenseHit};

/// One pooled candidate with its place in each arm (ranks from 1).
#[derive(Debug, Clone, PartialEq)]
pub struct DualCandidate {
    pub index: usize,
    pub score: f32,
    pub question_similarity: f32,
    pub passage_similarity: f32,
    pub question_rank: Option<usize>,
    pub passage_rank: Option<usize>,
}

/// The `k` best of the two arms' candidates by `cos(question, c) + cos(passage, c)`; ties break
/// by vector index. Similarities are recomputed from `vectors` so a candidate found by one arm
/// only is still scored against both.
pub fn select_dual(
    question_arm: &[DenseHit],
    passage_arm: &[DenseHit],
    vectors: &[Vec<f32>],
    question: &[f32],
    passage: &[f32],
    k: usize,
) -> Vec<DualCandidate> {
    let mut pooled: BTreeMap<usize, (Option<usize>, Option<usize>)> = BTreeMap::new();
    for (rank, hit) in question_arm.iter().enumerate() {
        pooled
            .entry(hit.index)
            .or_default()
            .0
            .get_or_insert(rank + 1);
    }
    for (rank, hit) in passage_arm.iter().enumerate() {
        pooled
            .entry(hit.index)
            .or_default()
            .1
            .get_or_insert(rank + 1);
    }
    let mut out: Vec<DualCandidate> = pooled
        .into_iter()
        .filter_map(|(index, (question_rank, passage_rank))| {
            let v = vectors.get(index)?;
            let (qs, ps) = (dot(v, question), dot(v, passage));
            Some(DualCandidate {
                index,
                score: qs + ps,
                question_similarity: qs,
                passage_similarity: ps,
                question_rank,
                passage_rank,
            })
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.index.cmp(&b.index)));
    out.truncate(k);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = dot(v, v).sqrt();
        v.iter().map(|x| x / n).collect()
    }

    fn hits(indices: &[usize]) -> Vec<DenseHit> {
        indices
            .iter()
            .map(|&index| DenseHit { index, score: 0.0 })
            .collect()
    }

    #[test]
    fn a_chunk_close_to_both_beats_one_close_to_either() {
        let q = unit(&[1.0, 0.0, 0.0]);
        let p = unit(&[0.0, 1.0, 0.0]);
        let vectors = vec![
            unit(&[1.0, 0.05, 0.0]), // the question's best
            unit(&[0.05, 1.0, 0.0]), // the passage's best
            unit(&[1.0, 1.0, 0.2]),  // close to both
            unit(&[0.0, 0.0, 1.0]),  // close to neither, found by no arm
        ];
        let out = select_dual(&hits(&[0, 2]), &hits(&[1, 2]), &vectors, &q, &p, 3);
        let order: Vec<usize> = out.iter().map(|c| c.index).collect();
        assert_eq!(order, [2, 0, 1]);
        assert_eq!(
            (out[0].question_rank, out[0].passage_rank),
            (Some(2), Some(2))
        );
        assert_eq!((out[1].question_rank, out[1].passage_rank), (Some(1), None));
        // The one-arm candidate is still scored against the other arm's vector.
        let expected = dot(&vectors[0], &q) + dot(&vectors[0], &p);
        assert!((out[1].score - expected).abs() < 1e-6);
        assert!(out[1].passage_similarity > 0.0);
    }

    #[test]
    fn ties_break_by_index_and_k_truncates() {
        let q = unit(&[1.0, 0.0]);
        let vectors = vec![unit(&[1.0, 0.0]), unit(&[1.0, 0.0]), unit(&[0.0, 1.0])];
        let out = select_dual(&hits(&[1, 0, 2]), &hits(&[]), &vectors, &q, &q, 2);
        assert_eq!(out.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1]);
    }
}
