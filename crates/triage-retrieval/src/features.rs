//! The six per-query retrieval features of the cost-aware retrieval study, computed from the
//! dense arm and its reranked order: how sure dense retrieval is, and whether reranking agrees.
//! The gain policy (routing issue) predicts from them whether the hybrid pass is worth its cost.

pub use triage_types::RetrievalFeatures;

use crate::chunker::ChunkKind;

/// Rank reported when the reranked top-1 is not in the dense top 10.
pub const ABSENT_RANK: f32 = 11.0;

/// Features from the dense hits (`(chunk id, cosine)`, best first) and the reranked order of the
/// same candidates (`(chunk id, kind)`, best first).
pub fn retrieval_features(
    dense: &[(String, f32)],
    reranked: &[(String, ChunkKind)],
) -> RetrievalFeatures {
    let sims: Vec<f32> = dense.iter().map(|(_, s)| *s).collect();
    let top1_dense = sims.first().copied().unwrap_or(f32::NAN);
    let top2_margin = if sims.len() >= 2 {
        sims[0] - sims[1]
    } else {
        f32::NAN
    };
    let top5 = &sims[..sims.len().min(5)];
    let mean_top5_dense = if top5.is_empty() {
        f32::NAN
    } else {
        top5.iter().sum::<f32>() / top5.len() as f32
    };
    let dense10: Vec<&str> = dense.iter().take(10).map(|(id, _)| id.as_str()).collect();
    let rerank10: Vec<&(String, ChunkKind)> = reranked.iter().take(10).collect();
    let dense_rerank_overlap = if dense10.is_empty() {
        f32::NAN
    } else {
        let shared = rerank10
            .iter()
            .filter(|(id, _)| dense10.contains(&id.as_str()))
            .count();
        shared as f32 / dense10.len() as f32
    };
    let rerank_top1_dense_rank = match reranked.first() {
        None => f32::NAN,
        Some((id, _)) => dense10
            .iter()
            .position(|d| *d == id)
            .map_or(ABSENT_RANK, |p| (p + 1) as f32),
    };
    let structural_fraction = if rerank10.is_empty() {
        f32::NAN
    } else {
        let structural = rerank10
            .iter()
            .filter(|(_, k)| *k != ChunkKind::Text)
            .count();
        structural as f32 / rerank10.len() as f32
    };
    RetrievalFeatures {
        top1_dense,
        top2_margin,
        mean_top5_dense,
        dense_rerank_overlap,
        rerank_top1_dense_rank,
        structural_fraction,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(n: usize) -> Vec<(String, f32)> {
        (0..n)
            .map(|i| (format!("c{i}"), 0.9 - 0.05 * i as f32))
            .collect()
    }

    #[test]
    fn computes_the_six_features() {
        let d = dense(12);
        // Reranked: c3 first, then a chunk dense did not find, then c0..; two headings.
        let mut r: Vec<(String, ChunkKind)> = vec![
            ("c3".into(), ChunkKind::Heading),
            ("x".into(), ChunkKind::Caption),
        ];
        r.extend((0..8).map(|i| (format!("c{i}"), ChunkKind::Text)));
        let f = retrieval_features(&d, &r);
        assert!((f.top1_dense - 0.9).abs() < 1e-6);
        assert!((f.top2_margin - 0.05).abs() < 1e-6);
        assert!((f.mean_top5_dense - 0.8).abs() < 1e-6);
        // Reranked top 10 = c3, x, c0..c7: 9 of the dense top 10 (c0..c7 and c3 once).
        assert!((f.dense_rerank_overlap - 0.9).abs() < 1e-6, "{f:?}");
        assert_eq!(f.rerank_top1_dense_rank, 4.0);
        assert!((f.structural_fraction - 0.2).abs() < 1e-6);
        let absent = retrieval_features(&d, &[("zz".into(), ChunkKind::Text)]);
        assert_eq!(absent.rerank_top1_dense_rank, ABSENT_RANK);
    }

    #[test]
    fn undefined_values_are_nan() {
        let f = retrieval_features(&dense(1), &[]);
        assert!(f.top2_margin.is_nan() && f.rerank_top1_dense_rank.is_nan());
        assert!(!f.top1_dense.is_nan());
        assert!(retrieval_features(&[], &[])
            .to_array()
            .iter()
            .all(|v| v.is_nan()));
    }
}
