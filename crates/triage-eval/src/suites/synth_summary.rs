//! `synth-summary`: a templated global-synthesis task. Each corpus is a set of team status
//! reports padded with routine notes; the questions ask for a summary across every report
//! (each team's main risk, each team's delivery), whose reference is built from the same
//! template. Scored with summary-level ROUGE-L; it exercises the classifier's global route.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use triage_types::Document;

use super::{Example, Group, SuiteName, SuiteParams};
use crate::scoring::Scorer;

const TEAMS: [&str; 12] = [
    "Aurora", "Basalt", "Cobalt", "Delta", "Ember", "Fjord", "Granite", "Harbor", "Indigo",
    "Juniper", "Kestrel", "Lumen",
];
const RISKS: [&str; 12] = [
    "supplier delays",
    "staff turnover",
    "a security audit finding",
    "rising cloud costs",
    "an unstable test suite",
    "a missed regulatory deadline",
    "a key customer leaving",
    "hardware shortages",
    "unclear requirements",
    "a database migration",
    "a pending lawsuit",
    "slow code reviews",
];
const DELIVERIES: [&str; 12] = [
    "the billing dashboard",
    "a mobile checkout",
    "the search rewrite",
    "an audit log",
    "the onboarding flow",
    "a data export tool",
    "the pricing page",
    "a fraud detector",
    "the status page",
    "an offline mode",
    "the partner API",
    "a recommendation widget",
];
const ROUTINE: &str = "The weekly meeting covered staffing, travel and the office move. Nothing \
else needs a decision this quarter. ";

/// Teams per corpus.
const TEAMS_PER_CORPUS: usize = 6;

pub(super) fn synth_summary(params: &SuiteParams<'_>, rng: &mut StdRng) -> Vec<Group> {
    let per_group = 2;
    let groups = params.limit.div_ceil(per_group);
    (0..groups)
        .map(|g| {
            let id = format!("{}-{g}", SuiteName::SynthSummary.as_str());
            let mut order: Vec<usize> = (0..TEAMS.len()).collect();
            order.shuffle(rng);
            let mut risks: Vec<usize> = (0..RISKS.len()).collect();
            risks.shuffle(rng);
            let mut deliveries: Vec<usize> = (0..DELIVERIES.len()).collect();
            deliveries.shuffle(rng);
            let teams: Vec<(&str, &str, &str)> = (0..TEAMS_PER_CORPUS)
                .map(|i| (TEAMS[order[i]], RISKS[risks[i]], DELIVERIES[deliveries[i]]))
                .collect();
            let report = |(team, risk, delivery): &(&str, &str, &str)| {
                format!(
                    "Team {team} delivered {delivery}. The main risk for team {team} is {risk}. "
                )
            };
            let core: usize = teams
                .iter()
                .map(|t| (params.count_tokens)(&report(t)))
                .sum();
            let routine_tokens = (params.count_tokens)(ROUTINE).max(1);
            let padding =
                params.context_tokens.saturating_sub(core) / routine_tokens / TEAMS_PER_CORPUS;
            let documents = teams
                .iter()
                .map(|t| Document {
                    id: format!("{id}-{}", t.0.to_lowercase()),
                    title: format!("Team {} status report", t.0),
                    text: format!("{}{}", report(t), ROUTINE.repeat(padding)),
                })
                .collect();
            let all_docs: Vec<String> = teams
                .iter()
                .map(|t| format!("{id}-{}", t.0.to_lowercase()))
                .collect();
            let reference = |f: &dyn Fn(&(&str, &str, &str)) -> String| {
                teams.iter().map(f).collect::<Vec<_>>().join(" ")
            };
            let asks = [
                (
                    "risks",
                    "Summarize the main risk of every team across all the status reports.",
                    reference(&|(t, r, _)| format!("Team {t}: {r}.")),
                ),
                (
                    "deliveries",
                    "Summarize what every team delivered, across all the status reports.",
                    reference(&|(t, _, d)| format!("Team {t}: {d}.")),
                ),
            ];
            Group {
                examples: asks
                    .into_iter()
                    .map(|(name, question, summary)| Example {
                        id: format!("{id}-{name}"),
                        question: question.into(),
                        golds: vec![summary],
                        scorer: Scorer::RougeL,
                        depth: None,
                        gold_docs: all_docs.clone(),
                        kind: Some("global".into()),
                    })
                    .collect(),
                documents,
                id,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoring::rouge_l_summary;
    use crate::suites::test_support::params;
    use crate::suites::{build, Split};

    #[test]
    fn the_reference_summarises_every_report() {
        let p = params(Split::Dev, 3, 1_200);
        let groups = build(SuiteName::SynthSummary, &p).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[1].examples.len(), 1);
        let g = &groups[0];
        let tokens: usize = g.documents.iter().map(|d| (p.count_tokens)(&d.text)).sum();
        assert!((1_000..=1_250).contains(&tokens), "{tokens}");
        let risks = &g.examples[0].golds[0];
        for d in &g.documents {
            let team = d.title.split(' ').nth(1).unwrap();
            let risk = d
                .text
                .split(" is ")
                .nth(1)
                .unwrap()
                .split('.')
                .next()
                .unwrap();
            assert!(risks.contains(&format!("Team {team}: {risk}.")), "{risks}");
        }
        // A summary naming half the teams scores about half.
        let half: String = risks.split(". ").take(3).collect::<Vec<_>>().join(". ");
        let f = rouge_l_summary(&half, risks);
        assert!((0.5..0.8).contains(&f), "{f}");
    }
}
