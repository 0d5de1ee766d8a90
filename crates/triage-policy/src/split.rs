//! The held-out split rule, once: a key (a group, a corpus, a data set item) goes to fold
//! `fnv1a(key) % num_folds`, stable across runs and platforms (unlike the std hasher), so the
//! classifier's held-out fifth, the gain policy's test tenth, the probes' folds and the suites'
//! dev/test halves are all the same rule at different counts.

/// The fold of `key` among `num_folds` (at least one).
pub fn fold_of(key: &str, num_folds: u64) -> u64 {
    triage_core::fnv1a(key) % num_folds.max(1)
}

/// Whether a group is held out: fold zero of `every`, one group in `1/every`.
pub fn is_held_out(group: &str, every: u64) -> bool {
    fold_of(group, every) == 0
}

/// One group in this many is the gain policy's test group.
pub const TEST_GROUP_EVERY: u64 = 10;

/// Whether a dev example's group belongs to the held-out tenth (kept out of `train gain-policy`
/// so the evaluation issue can test on it).
pub fn is_test_group(group: &str) -> bool {
    is_held_out(group, TEST_GROUP_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_groups_are_a_stable_fifth() {
        let held: Vec<bool> = (0..1000)
            .map(|i| is_held_out(&format!("g{i}"), 5))
            .collect();
        let n = held.iter().filter(|&&h| h).count();
        assert!((150..250).contains(&n), "{n} of 1000 held out");
        assert_eq!(
            held,
            (0..1000)
                .map(|i| is_held_out(&format!("g{i}"), 5))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_rule_is_the_hash_modulo_the_count() {
        for key in ["", "a", "corpus-3", "doc17"] {
            let h = triage_core::fnv1a(key);
            assert_eq!(fold_of(key, 5), h % 5);
            assert_eq!(is_held_out(key, 10), h.is_multiple_of(10));
            assert_eq!(fold_of(key, 2) == 0, h.is_multiple_of(2));
        }
        assert_eq!(fold_of("x", 0), 0);
    }
}
