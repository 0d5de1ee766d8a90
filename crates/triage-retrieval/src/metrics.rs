//! Retrieval quality of one ranked list of documents against gold documents: Hit@k (any gold in
//! the top k), Recall@k (the share of gold in the top k) and the reciprocal rank of the first gold.

/// Document ids in first-seen order, each once (several chunks of a document count as one).
pub fn unique_documents<'a>(ranked: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for d in ranked {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// 1 when a gold document is among the first `k`, else 0.
pub fn hit_at(ranked: &[&str], gold: &[String], k: usize) -> f64 {
    let top = &ranked[..ranked.len().min(k)];
    f64::from(u8::from(top.iter().any(|d| gold.iter().any(|g| g == d))))
}

/// The share of gold documents among the first `k` (0 when there is no gold).
pub fn recall_at(ranked: &[&str], gold: &[String], k: usize) -> f64 {
    if gold.is_empty() {
        return 0.0;
    }
    let top = &ranked[..ranked.len().min(k)];
    let found = gold.iter().filter(|g| top.contains(&g.as_str())).count();
    found as f64 / gold.len() as f64
}

/// 1 / rank of the first gold document (ranks from 1), 0 when none is ranked.
pub fn reciprocal_rank(ranked: &[&str], gold: &[String]) -> f64 {
    ranked
        .iter()
        .position(|d| gold.iter().any(|g| g == d))
        .map_or(0.0, |i| 1.0 / (i + 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_on_a_hand_ranked_list() {
        let ranked = unique_documents(["a", "b", "a", "c", "d"]);
        assert_eq!(ranked, ["a", "b", "c", "d"]);
        let gold = vec!["c".to_string(), "z".to_string()];
        assert_eq!(hit_at(&ranked, &gold, 2), 0.0);
        assert_eq!(hit_at(&ranked, &gold, 3), 1.0);
        assert_eq!(recall_at(&ranked, &gold, 10), 0.5);
        assert_eq!(recall_at(&ranked, &gold, 2), 0.0);
        assert!((reciprocal_rank(&ranked, &gold) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(reciprocal_rank(&ranked, &["q".to_string()]), 0.0);
        assert_eq!(recall_at(&ranked, &[], 5), 0.0);
    }
}
