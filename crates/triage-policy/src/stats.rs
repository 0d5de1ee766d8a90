//! Statistics over plain numbers that both the router's fits and the evaluation's reports use.

/// Area under the ROC curve of `scores` for the positive `labels` (ties count one half):
/// the probability that a random positive scores above a random negative. `None` when either
/// class is empty.
pub fn auroc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let pos: Vec<f64> = scores
        .iter()
        .zip(labels)
        .filter(|(_, &l)| l)
        .map(|(s, _)| *s)
        .collect();
    let neg: Vec<f64> = scores
        .iter()
        .zip(labels)
        .filter(|(_, &l)| !l)
        .map(|(s, _)| *s)
        .collect();
    if pos.is_empty() || neg.is_empty() {
        return None;
    }
    let mut wins = 0.0;
    for p in &pos {
        for n in &neg {
            wins += match p.total_cmp(n) {
                std::cmp::Ordering::Greater => 1.0,
                std::cmp::Ordering::Equal => 0.5,
                std::cmp::Ordering::Less => 0.0,
            };
        }
    }
    Some(wins / (pos.len() * neg.len()) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auroc_counts_pairs_and_ties() {
        assert_eq!(auroc(&[0.9, 0.1], &[true, false]), Some(1.0));
        assert_eq!(auroc(&[0.1, 0.9], &[true, false]), Some(0.0));
        assert_eq!(auroc(&[0.5, 0.5], &[true, false]), Some(0.5));
        assert_eq!(auroc(&[0.3, 0.8, 0.6], &[true, true, false]), Some(0.5));
        assert_eq!(auroc(&[0.3], &[true]), None);
    }
}
