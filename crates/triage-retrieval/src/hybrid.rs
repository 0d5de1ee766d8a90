//! Reciprocal rank fusion: a chunk's fused score is Σ 1 / (k + rank) over the arms that
//! returned it, ranks starting at 1, k = 60 by default (Cormack et al.). Ties break by chunk id,
//! so the order is deterministic.

use std::collections::HashMap;

/// The RRF constant most systems use.
pub const RRF_K: f32 = 60.0;

/// One fused result, with its rank in each arm (`None` where the arm did not return it).
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    pub id: String,
    pub score: f32,
    pub ranks: Vec<Option<usize>>,
}

/// Fuse ranked lists of ids (best first).
pub fn reciprocal_rank_fusion(arms: &[Vec<String>], k: f32) -> Vec<Fused> {
    let mut by_id: HashMap<&str, Fused> = HashMap::new();
    for (arm, ids) in arms.iter().enumerate() {
        for (i, id) in ids.iter().enumerate() {
            let entry = by_id.entry(id).or_insert_with(|| Fused {
                id: id.clone(),
                score: 0.0,
                ranks: vec![None; arms.len()],
            });
            if entry.ranks[arm].is_none() {
                entry.ranks[arm] = Some(i + 1);
                entry.score += 1.0 / (k + (i + 1) as f32);
            }
        }
    }
    let mut fused: Vec<Fused> = by_id.into_values().collect();
    fused.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fuses_by_reciprocal_rank_from_one() {
        let fused = reciprocal_rank_fusion(&[ids(&["a", "b", "c"]), ids(&["c", "a", "d"])], 60.0);
        assert_eq!(fused[0].id, "a", "1/61 + 1/62 beats 1/63 + 1/61");
        assert!((fused[0].score - (1.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-7);
        assert_eq!(fused[0].ranks, vec![Some(1), Some(2)]);
        assert_eq!(fused[1].id, "c");
        let d = fused.iter().find(|f| f.id == "d").unwrap();
        assert_eq!(d.ranks, vec![None, Some(3)]);
        // b (rank 2 in arm 0) and d (rank 3 in arm 1) differ; equal scores break by id.
        let tie = reciprocal_rank_fusion(&[ids(&["y"]), ids(&["x"])], 60.0);
        assert_eq!(
            tie.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["x", "y"]
        );
    }
}
