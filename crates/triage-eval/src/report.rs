//! The report of one run: per system accuracy with paired-bootstrap intervals, tokens, cost,
//! latency, escalation and routing precision/recall against the per-query oracle, the headline
//! pair against long context, how well the RAG answer's entropy flags its errors (AUROC,
//! hallucination rate by entropy bin and Pearson r), the τ sweep with its accuracy–cost area,
//! and accuracy by needle depth; as a struct and as `report.md`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use triage_policy::auroc;
use triage_types::RoutePath;

use crate::combined_sweep::{combined_sweep, CombinedSweep};
use crate::probe::{probe_aurocs, ProbeAuroc};
use crate::results::ResultRow;
use crate::stats::{mean, mean_at, pearson, wilson, Estimate, PairedBootstrap, RESAMPLES};
use crate::sweep::{
    apgr, by_escalation_rate, curve_area, pgr, point, quantile_taus, rag_lc_pairs, CurveArea,
    RagLcPair, SweepPoint,
};
use crate::system::System;

/// Systems that force one path; the oracle picks among them.
pub const PATH_SYSTEMS: [&str; 4] = ["none", "rag", "hybrid", "lc"];

/// Routing against the oracle: of the queries a system sent to long context, how many needed
/// it (precision), and of those that needed it, how many went (recall).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoutingScore {
    pub precision: Option<f64>,
    pub recall: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SystemSummary {
    pub system: String,
    pub accuracy: Estimate,
    pub em: Option<f64>,
    pub f1: Option<f64>,
    /// Prompt (cached included) + completion tokens, all stages.
    pub tokens: Estimate,
    /// Prompt tokens not found in the cache + completion tokens.
    pub computed_tokens: f64,
    pub cost: f64,
    pub ms_p50: f64,
    pub ms_p95: f64,
    /// Answered by the long-context model.
    pub lc_rate: f64,
    /// A RAG answer was generated, then escalated.
    pub escalation_rate: f64,
    /// Accuracy relative to `lc`, and token reduction relative to `lc` (paired intervals).
    pub retained_vs_lc: Option<Estimate>,
    pub token_reduction_vs_lc: Option<Estimate>,
    /// Accuracy gained per 1,000 extra tokens over `rag`.
    pub gain_per_1k_tokens_vs_rag: Option<f64>,
    /// RouteLLM's performance gap recovered, from `rag`'s accuracy to `lc`'s.
    pub pgr: Option<f64>,
    pub routing: Option<RoutingScore>,
    /// Accuracy per sub-population ("unanswerable", "pairs=75", ...).
    pub by_kind: BTreeMap<String, (usize, f64)>,
}

/// Hallucination rate in one entropy bin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EntropyBin {
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
    pub wrong: usize,
    pub rate: f64,
    pub rate_lo: f64,
    pub rate_hi: f64,
}

/// How the forced-RAG answer's entropy relates to its being wrong.
#[derive(Debug, Clone, Serialize)]
pub struct SignalReport {
    pub n: usize,
    pub error_rate: f64,
    pub auroc_statistic: Option<f64>,
    /// AUROC of the statistic for "long context fixes it": the RAG answer is wrong and the
    /// long-context answer right (needs the `lc` system).
    pub auroc_lc_fixes: Option<f64>,
    pub auroc_mean_entropy: Option<f64>,
    pub bins: Vec<EntropyBin>,
    /// Pearson r of bin centre vs hallucination rate, over bins with at least `MIN_BIN` answers.
    pub pearson_r: Option<f64>,
    /// (statistic, wrong) of every RAG answer that has one.
    pub values: Vec<(f64, bool)>,
}

/// Accuracy of each system in one depth bin.
#[derive(Debug, Clone, Serialize)]
pub struct DepthRow {
    pub lo: f64,
    pub hi: f64,
    pub accuracy: BTreeMap<String, (usize, f64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub suite: String,
    pub split: String,
    /// Queries every system answered (the paired set all numbers are computed on).
    pub queries: usize,
    /// Those queries over the corpora they were asked of: the questions that share one cached
    /// corpus prefix.
    pub questions_per_corpus: f64,
    pub systems: Vec<SystemSummary>,
    pub signals: Option<SignalReport>,
    /// The sweep over the quantiles of the RAG statistic, at every 5% of escalation.
    pub sweep: Vec<SweepPoint>,
    pub area: Option<CurveArea>,
    /// The area under PGR against the escalation rate over the sweep (`sweep::apgr`).
    pub apgr: Option<f64>,
    /// r: the mean tokens of a `rag` answer over those of an `lc` answer; a cascade costs about
    /// r + e of long context's tokens, e its escalation rate.
    pub rag_lc_ratio: Option<f64>,
    /// Hidden-state probes for a wrong RAG answer, where the answers recorded their states.
    pub probes: Vec<ProbeAuroc>,
    /// The combined score, where the RAG answers recorded its P(wrong).
    pub combined: Option<CombinedSweep>,
    pub depth: Vec<DepthRow>,
}

/// Bins with fewer answers are drawn but left out of Pearson's r.
pub const MIN_BIN: usize = 5;
const ENTROPY_BINS: usize = 10;
const DEPTH_BINS: usize = 5;

/// The oracle's row for one query: the cheapest correct answer among the path systems; when
/// none is correct, the cheapest answer. `None` when no path system answered.
pub fn oracle_row(rows: &[&ResultRow]) -> Option<ResultRow> {
    let best = rows
        .iter()
        .filter(|r| System::PATHS.contains(&r.system))
        .min_by(|a, b| {
            b.score
                .correct
                .cmp(&a.score.correct)
                .then(a.cost.total_cmp(&b.cost))
        })?;
    let mut row = (*best).clone();
    row.derived_from = Some(best.system);
    row.system = System::Oracle;
    Some(row)
}

fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// `lc_right`: per RAG row (same order), whether the long-context answer is right, where known.
fn signal_report(rag: &[&ResultRow], lc_right: &[Option<bool>]) -> Option<SignalReport> {
    let values: Vec<(f64, bool)> = rag
        .iter()
        .filter_map(|r| r.rag_statistic.map(|s| (s, !r.score.correct)))
        .collect();
    if values.len() < 2 {
        return None;
    }
    let (scores, wrong): (Vec<f64>, Vec<bool>) = values.iter().copied().unzip();
    let (me, mw): (Vec<f64>, Vec<bool>) = rag
        .iter()
        .filter_map(|r| r.rag_mean_entropy.map(|s| (s, !r.score.correct)))
        .unzip();
    let (fix_scores, fixes): (Vec<f64>, Vec<bool>) = rag
        .iter()
        .zip(lc_right)
        .filter_map(|(r, lc)| Some((r.rag_statistic?, !r.score.correct && (*lc)?)))
        .unzip();
    let lo = scores.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let width = ((hi - lo) / ENTROPY_BINS as f64).max(1e-9);
    let mut bins: Vec<EntropyBin> = (0..ENTROPY_BINS)
        .map(|b| EntropyBin {
            lo: lo + b as f64 * width,
            hi: lo + (b + 1) as f64 * width,
            n: 0,
            wrong: 0,
            rate: f64::NAN,
            rate_lo: f64::NAN,
            rate_hi: f64::NAN,
        })
        .collect();
    for &(s, w) in &values {
        let b = (((s - lo) / width) as usize).min(ENTROPY_BINS - 1);
        bins[b].n += 1;
        bins[b].wrong += usize::from(w);
    }
    for b in &mut bins {
        if b.n > 0 {
            b.rate = b.wrong as f64 / b.n as f64;
            (b.rate_lo, b.rate_hi) = wilson(b.wrong, b.n);
        }
    }
    let (centres, rates): (Vec<f64>, Vec<f64>) = bins
        .iter()
        .filter(|b| b.n >= MIN_BIN)
        .map(|b| ((b.lo + b.hi) / 2.0, b.rate))
        .unzip();
    Some(SignalReport {
        n: values.len(),
        error_rate: wrong.iter().filter(|w| **w).count() as f64 / wrong.len() as f64,
        auroc_statistic: auroc(&scores, &wrong),
        auroc_lc_fixes: auroc(&fix_scores, &fixes),
        auroc_mean_entropy: auroc(&me, &mw),
        bins,
        pearson_r: pearson(&centres, &rates),
        values,
    })
}

/// Build the report from every row of one suite and split (the oracle's rows included or
/// not: they are derived here when missing).
pub fn build(rows: &[ResultRow], seed: u64) -> Report {
    let oracles = missing_oracles(rows);
    let table = by_example(rows.iter().chain(&oracles));
    let p = Paired::new(&table);
    let paired_rows: Vec<ResultRow> = rows
        .iter()
        .filter(|r| p.examples.binary_search(&r.example.as_str()).is_ok())
        .cloned()
        .collect();
    let pairs = rag_lc_pairs(&paired_rows);
    let rag_rows = if p.has("rag") {
        p.rows("rag")
    } else {
        Vec::new()
    };
    let lc_right: Vec<Option<bool>> = rag_rows
        .iter()
        .map(|r| table[r.example.as_str()].get("lc").map(|l| l.score.correct))
        .collect();
    Report {
        suite: rows.first().map(|r| r.suite.clone()).unwrap_or_default(),
        split: rows
            .first()
            .map(|r| r.split.as_str().to_string())
            .unwrap_or_default(),
        queries: p.examples.len(),
        questions_per_corpus: p.questions_per_corpus(),
        systems: system_summaries(&p, seed),
        signals: signal_report(&rag_rows, &lc_right),
        sweep: by_escalation_rate(&sweep_curve(&pairs), 20),
        area: curve_area(&pairs),
        apgr: apgr(&pairs),
        rag_lc_ratio: (p.has("rag") && p.has("lc"))
            .then(|| mean(&p.column("rag", &tokens)) / mean(&p.column("lc", &tokens)).max(1.0)),
        probes: probe_aurocs(&rag_rows),
        combined: combined_sweep(&paired_rows),
        depth: depth_rows(&p.examples, &p.systems, &table),
    }
}

/// Rows by example, then by system.
type Table<'a> = BTreeMap<&'a str, HashMap<&'a str, &'a ResultRow>>;

fn by_example<'a>(rows: impl IntoIterator<Item = &'a ResultRow>) -> Table<'a> {
    let mut table: Table<'a> = BTreeMap::new();
    for r in rows {
        table
            .entry(r.example.as_str())
            .or_default()
            .insert(r.system.as_str(), r);
    }
    table
}

/// The oracle's row of each query that has none among `rows`.
fn missing_oracles(rows: &[ResultRow]) -> Vec<ResultRow> {
    by_example(rows)
        .values()
        .filter(|by_system| !by_system.contains_key("oracle"))
        .filter_map(|by_system| {
            let answered: Vec<&ResultRow> = by_system.values().copied().collect();
            oracle_row(&answered)
        })
        .collect()
}

/// The order of the systems in the report; others follow, by name.
const SYSTEM_ORDER: [&str; 9] = [
    "none",
    "rag",
    "hybrid",
    "lc",
    "edar",
    "dtr",
    "self-route",
    "auto",
    "oracle",
];

fn value(r: &ResultRow) -> f64 {
    r.score.value
}

fn tokens(r: &ResultRow) -> f64 {
    r.total_tokens() as f64
}

/// The paired set: the queries every system answered, which every number is computed on.
struct Paired<'t, 'a> {
    table: &'t Table<'a>,
    /// In the report's order.
    systems: Vec<&'a str>,
    /// Sorted.
    examples: Vec<&'a str>,
}

impl<'t, 'a> Paired<'t, 'a> {
    fn new(table: &'t Table<'a>) -> Self {
        let systems: BTreeSet<&str> = table.values().flat_map(|t| t.keys().copied()).collect();
        let mut systems: Vec<&str> = systems.into_iter().collect();
        systems.sort_by_key(|s| {
            SYSTEM_ORDER
                .iter()
                .position(|o| o == s)
                .unwrap_or(SYSTEM_ORDER.len())
        });
        let examples: Vec<&str> = table
            .iter()
            .filter(|(_, t)| systems.iter().all(|s| t.contains_key(s)))
            .map(|(e, _)| *e)
            .collect();
        Self {
            table,
            systems,
            examples,
        }
    }

    fn has(&self, system: &str) -> bool {
        self.systems.contains(&system)
    }

    /// `system`'s row of each query (which it must have answered).
    fn rows(&self, system: &str) -> Vec<&'a ResultRow> {
        self.examples
            .iter()
            .map(|e| self.table[e][system])
            .collect()
    }

    fn column(&self, system: &str, f: &dyn Fn(&ResultRow) -> f64) -> Vec<f64> {
        self.examples
            .iter()
            .map(|e| f(self.table[e][system]))
            .collect()
    }

    /// Per query, whether the oracle took long context's answer.
    fn oracle_on_lc(&self) -> Vec<bool> {
        self.examples
            .iter()
            .map(|e| {
                self.table[e]
                    .get("oracle")
                    .is_some_and(|o| o.derived_from == Some(System::Lc))
            })
            .collect()
    }

    fn questions_per_corpus(&self) -> f64 {
        let corpora: BTreeSet<&str> = self
            .examples
            .iter()
            .filter_map(|e| self.table[e].values().next().map(|r| r.group.as_str()))
            .collect();
        self.examples.len() as f64 / corpora.len().max(1) as f64
    }
}

/// One summary per system, with paired-bootstrap intervals seeded by `seed`.
fn system_summaries(p: &Paired, seed: u64) -> Vec<SystemSummary> {
    let boot = PairedBootstrap::new(p.examples.len(), RESAMPLES, seed);
    let oracle_lc = p.oracle_on_lc();
    p.systems
        .iter()
        .map(|&s| system_summary(p, s, &boot, &oracle_lc))
        .collect()
}

fn system_summary(
    p: &Paired,
    s: &str,
    boot: &PairedBootstrap,
    oracle_lc: &[bool],
) -> SystemSummary {
    let n = p.examples.len().max(1) as f64;
    let (acc, tok) = (p.column(s, &value), p.column(s, &tokens));
    let (lc_acc, lc_tok) = if p.has("lc") {
        (p.column("lc", &value), p.column("lc", &tokens))
    } else {
        (Vec::new(), Vec::new())
    };
    let rows = p.rows(s);
    let opt_mean = |f: &dyn Fn(&ResultRow) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
        (!v.is_empty()).then(|| mean(&v))
    };
    let ms: Vec<f64> = rows.iter().map(|r| r.ms).collect();
    let on_lc: Vec<bool> = rows.iter().map(|r| r.path == RoutePath::Lc).collect();
    let routed = !PATH_SYSTEMS.contains(&s) && s != "oracle";
    SystemSummary {
        system: s.to_string(),
        accuracy: boot.mean(&acc),
        em: opt_mean(&|r| r.score.em),
        f1: opt_mean(&|r| r.score.f1),
        tokens: boot.mean(&tok),
        computed_tokens: mean(&p.column(s, &|r| r.computed_tokens() as f64)),
        cost: mean(&p.column(s, &|r| r.cost)),
        ms_p50: percentile(&ms, 0.5),
        ms_p95: percentile(&ms, 0.95),
        lc_rate: on_lc.iter().filter(|a| **a).count() as f64 / n,
        escalation_rate: rows.iter().filter(|r| r.escalated).count() as f64 / n,
        retained_vs_lc: p
            .has("lc")
            .then(|| boot.estimate(|idx| mean_at(&acc, idx) / mean_at(&lc_acc, idx))),
        token_reduction_vs_lc: p
            .has("lc")
            .then(|| boot.estimate(|idx| 1.0 - mean_at(&tok, idx) / mean_at(&lc_tok, idx))),
        gain_per_1k_tokens_vs_rag: gain_per_1k_tokens_vs_rag(p, s, &acc, &tok),
        pgr: if p.has("rag") && p.has("lc") {
            pgr(mean(&acc), mean(&p.column("rag", &value)), mean(&lc_acc))
        } else {
            None
        },
        routing: routed.then(|| routing_score(&on_lc, oracle_lc)),
        by_kind: accuracy_by_kind(&rows),
    }
}

/// Precision and recall of the queries sent to long context against the oracle's.
fn routing_score(on_lc: &[bool], oracle_lc: &[bool]) -> RoutingScore {
    let both = on_lc
        .iter()
        .zip(oracle_lc)
        .filter(|(a, b)| **a && **b)
        .count();
    let sent = on_lc.iter().filter(|a| **a).count();
    let needed = oracle_lc.iter().filter(|b| **b).count();
    RoutingScore {
        precision: (sent > 0).then(|| both as f64 / sent as f64),
        recall: (needed > 0).then(|| both as f64 / needed as f64),
    }
}

fn accuracy_by_kind(rows: &[&ResultRow]) -> BTreeMap<String, (usize, f64)> {
    let mut by_kind: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for r in rows {
        if let Some(k) = &r.kind {
            let e = by_kind.entry(k.clone()).or_default();
            e.0 += 1;
            e.1 += r.score.value;
        }
    }
    for v in by_kind.values_mut() {
        v.1 /= v.0 as f64;
    }
    by_kind
}

/// Accuracy gained per 1,000 extra tokens over `rag` (none for `rag` itself, or without it).
fn gain_per_1k_tokens_vs_rag(p: &Paired, s: &str, acc: &[f64], tok: &[f64]) -> Option<f64> {
    if !p.has("rag") || s == "rag" {
        return None;
    }
    let (ra, rt) = (
        mean(&p.column("rag", &value)),
        mean(&p.column("rag", &tokens)),
    );
    let extra = mean(tok) - rt;
    // Under one token of difference the ratio says nothing.
    (extra.abs() >= 1.0).then(|| (mean(acc) - ra) / (extra / 1_000.0))
}

/// The sweep over the quantiles of the RAG statistic.
fn sweep_curve(pairs: &[RagLcPair]) -> Vec<SweepPoint> {
    if pairs.is_empty() {
        return Vec::new();
    }
    quantile_taus(pairs)
        .into_iter()
        .map(|t| point(pairs, t))
        .collect()
}

fn depth_rows(
    examples: &[&str],
    systems: &[&str],
    table: &BTreeMap<&str, HashMap<&str, &ResultRow>>,
) -> Vec<DepthRow> {
    let mut out: Vec<DepthRow> = (0..DEPTH_BINS)
        .map(|b| DepthRow {
            lo: b as f64 / DEPTH_BINS as f64,
            hi: (b + 1) as f64 / DEPTH_BINS as f64,
            accuracy: BTreeMap::new(),
        })
        .collect();
    for e in examples {
        for s in systems {
            let r = table[e][s];
            let Some(d) = r.depth else { continue };
            let b = ((d * DEPTH_BINS as f64) as usize).min(DEPTH_BINS - 1);
            let cell = out[b].accuracy.entry(s.to_string()).or_default();
            cell.0 += 1;
            cell.1 += r.score.value;
        }
    }
    for row in &mut out {
        for cell in row.accuracy.values_mut() {
            cell.1 /= cell.0 as f64;
        }
    }
    out.retain(|r| !r.accuracy.is_empty());
    out
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.filter(|v| v.is_finite())
        .map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The APGR, or why there is none.
fn apgr_text(r: &Report) -> String {
    match r.apgr {
        Some(v) => format!("{v:.3}"),
        None => "none: long context does not score above RAG on these questions, so there is \
                 no gap to recover"
            .into(),
    }
}

/// `report.md`.
pub fn markdown(r: &Report) -> String {
    let mut s = systems_markdown(r);
    s.push_str(&kinds_markdown(r));
    s.push_str(&headline_markdown(r));
    if let Some(sig) = &r.signals {
        s.push_str(&signals_markdown(sig));
    }
    s.push_str(&probes_markdown(&r.probes));
    if let Some(a) = r.area {
        s.push_str(&sweep_markdown(r, a));
    }
    if let Some(c) = &r.combined {
        s.push_str(&combined_markdown(c));
    }
    s.push_str(&depth_markdown(r));
    s
}

/// The heading and the table of systems.
fn systems_markdown(r: &Report) -> String {
    let mut s = format!(
        "# triage eval: {} ({} split)\n\n{} queries answered by every system, {:.1} per \
         corpus; intervals are 95% paired bootstrap ({RESAMPLES} resamples, seeded). Tokens \
         are charged: every prompt token (cached included) + completion over all stages, as \
         with one document per question; \"computed\" leaves out cached prompt tokens.\n\n",
        r.suite, r.split, r.queries, r.questions_per_corpus
    );
    s.push_str(
        "| system | accuracy | EM | F1 | tokens | computed | cost | p50 ms | p95 ms | on LC | \
         escalated | retained vs LC | token reduction vs LC | Δacc per 1k tok vs RAG | routing P / R |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in &r.systems {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} [{:.0}, {:.0}] | {:.0} | {:.5} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
            m.system,
            m.accuracy,
            opt(m.em, 3),
            opt(m.f1, 3),
            m.tokens.value,
            m.tokens.lo,
            m.tokens.hi,
            m.computed_tokens,
            m.cost,
            m.ms_p50,
            m.ms_p95,
            m.lc_rate,
            m.escalation_rate,
            m.retained_vs_lc.map_or("–".into(), |e| e.to_string()),
            m.token_reduction_vs_lc.map_or("–".into(), |e| e.to_string()),
            opt(m.gain_per_1k_tokens_vs_rag, 3),
            m.routing.map_or("–".into(), |g| format!(
                "{} / {}",
                opt(g.precision, 2),
                opt(g.recall, 2)
            )),
        ));
    }
    s
}

/// Accuracy per sub-population, where the rows have one.
fn kinds_markdown(r: &Report) -> String {
    let mut s = String::new();
    let kinds: BTreeSet<&String> = r.systems.iter().flat_map(|m| m.by_kind.keys()).collect();
    if !kinds.is_empty() {
        s.push_str("\n## Accuracy by kind\n\n| system |");
        for k in &kinds {
            s.push_str(&format!(" {k} |"));
        }
        s.push_str(&format!("\n|---|{}\n", "---|".repeat(kinds.len())));
        for m in &r.systems {
            s.push_str(&format!("| {} |", m.system));
            for k in &kinds {
                s.push_str(&match m.by_kind.get(*k) {
                    Some((n, a)) => format!(" {a:.3} (n={n}) |"),
                    None => " – |".into(),
                });
            }
            s.push('\n');
        }
    }
    s
}

/// The routed systems against long context.
fn headline_markdown(r: &Report) -> String {
    let mut s = String::new();
    s.push_str("\n## Headline against long context\n\n");
    if let Some(ratio) = r.rag_lc_ratio {
        s.push_str(&format!(
            "r = {ratio:.3}: a RAG answer's tokens over a long-context answer's (every prompt \
             token charged), so a cascade escalating a share e costs about r + e of long \
             context's tokens.\n\n"
        ));
    }
    for m in r.systems.iter().filter(|m| m.routing.is_some()) {
        if let (Some(ret), Some(red)) = (m.retained_vs_lc, m.token_reduction_vs_lc) {
            s.push_str(&format!(
                "- **{}**: {:.1}% of long context's accuracy at {:.1}% of its tokens, {:.1}% \
                 escalated ({:.1}% answered by LC), PGR {}.\n",
                m.system,
                100.0 * ret.value,
                100.0 * (1.0 - red.value),
                100.0 * m.escalation_rate,
                100.0 * m.lc_rate,
                opt(m.pgr, 3)
            ));
        }
    }
    s
}

/// How the RAG answer's entropy relates to its errors.
fn signals_markdown(sig: &SignalReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "\n## Entropy of the RAG answer vs its errors\n\n{} RAG answers, {:.1}% wrong. AUROC \
         for a wrong answer: monitor statistic {}, mean entropy of the first tokens {}; \
         for \"long context fixes it\" (RAG wrong, LC right): {}. Pearson r of hallucination rate vs entropy bin (bins with ≥ {MIN_BIN} answers): {}.\n\n\
         | entropy bin | answers | wrong | hallucination rate [95% Wilson] |\n|---|---|---|---|\n",
        sig.n,
        100.0 * sig.error_rate,
        opt(sig.auroc_statistic, 3),
        opt(sig.auroc_mean_entropy, 3),
        opt(sig.auroc_lc_fixes, 3),
        opt(sig.pearson_r, 3)
    ));
    for b in sig.bins.iter().filter(|b| b.n > 0) {
        s.push_str(&format!(
            "| {:.2}–{:.2} | {} | {} | {:.2} [{:.2}, {:.2}] |\n",
            b.lo, b.hi, b.n, b.wrong, b.rate, b.rate_lo, b.rate_hi
        ));
    }
    s
}

/// The hidden-state probes, where the answers recorded their states.
fn probes_markdown(probes: &[ProbeAuroc]) -> String {
    let mut s = String::new();
    if !probes.is_empty() {
        s.push_str(
            "\n## Hidden-state probes\n\nA mass-mean probe per recorded layer of the base model, \
             at the last prompt token (before any answer token) and over the first answer \
             tokens, fitted on four folds of corpora and scored on the fifth: AUROC for a wrong \
             RAG answer.\n\n| layer | at | answers | AUROC |\n|---|---|---|---|\n",
        );
        for p in probes {
            s.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                p.layer,
                p.at,
                p.n,
                opt(p.auroc, 3)
            ));
        }
    }
    s
}

/// The τ sweep and its area.
fn sweep_markdown(r: &Report, a: CurveArea) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "\n## τ sweep (RAG escalating to LC above τ, offline)\n\nτ runs over the \
         quantiles of the RAG statistic; rows at every 5% of escalation. Area under the \
         accuracy–tokens curve (tokens scaled from RAG alone to RAG + LC for all): {:.3}; \
         routing at random: {:.3}. APGR (area under the performance gap recovered against \
         the escalation rate; random 0.5): {}.\n\n| τ | escalated | accuracy | tokens | cost |\n|---|---|---|---|---|\n",
        a.area,
        a.random,
        apgr_text(r)
    ));
    for p in &r.sweep {
        s.push_str(&format!(
            "| {:.4} | {:.2} | {:.3} | {:.0} | {:.5} |\n",
            p.tau, p.escalation_rate, p.accuracy, p.mean_tokens, p.mean_cost
        ));
    }
    s
}

/// Accuracy by needle depth, where the suite places needles.
fn depth_markdown(r: &Report) -> String {
    let mut s = String::new();
    if !r.depth.is_empty() {
        s.push_str("\n## Accuracy by needle depth\n\n| depth |");
        let names: Vec<&str> = r.systems.iter().map(|m| m.system.as_str()).collect();
        for n in &names {
            s.push_str(&format!(" {n} |"));
        }
        s.push_str(&format!("\n|---|{}\n", "---|".repeat(names.len())));
        for d in &r.depth {
            s.push_str(&format!("| {:.1}–{:.1} |", d.lo, d.hi));
            for n in &names {
                s.push_str(
                    &d.accuracy
                        .get(*n)
                        .map_or(" – |".into(), |(_, a)| format!(" {a:.2} |")),
                );
            }
            s.push('\n');
        }
    }
    s
}

/// The combined score's section.
fn combined_markdown(c: &CombinedSweep) -> String {
    let mut s = format!(
        "\n## Combined score (P(wrong) recorded with each RAG answer)\n\n{} RAG answers; \
         AUROC for a wrong answer {}, for \"long context fixes it\" {}; the run escalated at \
         P(wrong) ≥ {}. Offline sweep over its quantiles (a decline judged by the score, not \
         forced up): area under the accuracy–tokens curve {}, routing at random {}; APGR {}.\n\n\
         | P(wrong) above | escalated | accuracy | tokens | cost |\n|---|---|---|---|---|\n",
        c.n,
        opt(c.auroc_wrong, 3),
        opt(c.auroc_lc_fixes, 3),
        opt(c.threshold, 4),
        opt(c.area.map(|a| a.area), 3),
        opt(c.area.map(|a| a.random), 3),
        opt(c.apgr, 3)
    );
    for p in &c.sweep {
        s.push_str(&format!(
            "| {:.4} | {:.2} | {:.3} | {:.0} | {:.5} |\n",
            p.tau, p.escalation_rate, p.accuracy, p.mean_tokens, p.mean_cost
        ));
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::tests::row;

    fn with_stat(mut r: ResultRow, s: f64) -> ResultRow {
        r.rag_statistic = Some(s);
        r
    }

    /// Ten queries: RAG right on the first six (low entropy), LC right on all but the last;
    /// a routed system sends the four high-entropy ones to LC.
    pub(crate) fn rows() -> Vec<ResultRow> {
        let mut out = Vec::new();
        for i in 0..10 {
            let e = format!("e{i}");
            out.push(with_stat(row("rag", &e, i < 6, 100), f64::from(i) / 10.0));
            out.push(row("lc", &e, i < 9, 1_000));
            let mut routed = row("edar", &e, if i < 6 { true } else { i < 9 }, 100);
            if i >= 6 {
                routed.path = RoutePath::Lc;
                routed.escalated = true;
                routed.prompt_tokens = 1_100;
                routed.cost = 1_100.0;
            }
            out.push(routed);
        }
        out
    }

    /// `rows()` with every section of the report filled: kinds, needle depths, EM and F1,
    /// recorded probe states over five corpora, and a recorded combined score.
    fn every_section() -> Vec<ResultRow> {
        let mut out = rows();
        for (j, r) in out.iter_mut().enumerate() {
            let i: usize = r.example[1..].parse().unwrap();
            r.kind = Some(
                if i.is_multiple_of(2) {
                    "answerable"
                } else {
                    "pairs=75"
                }
                .into(),
            );
            r.depth = Some(i as f64 / 9.0);
            r.group = format!("corpus-{}", i % 5);
            r.ms = (10 * i + j) as f64;
            r.score.em = Some(if r.score.correct { 1.0 } else { 0.0 });
            r.score.f1 = Some(if r.score.correct { 1.0 } else { 0.25 });
            if r.system == System::Rag {
                let mut m = crate::calibrate::tests::monitor_record("full_softmax");
                m.combined_p_wrong = Some(i as f64 / 10.0);
                m.combined_threshold = Some(0.55);
                let wrong = !r.score.correct;
                let state = |k: usize| -> Vec<f32> {
                    (0..4)
                        .map(|d| ((i * 7 + d * 3 + k) % 5) as f32 + if wrong { 2.0 } else { 0.0 })
                        .collect()
                };
                m.probe = Some(triage_types::ProbeStates {
                    layers: vec![1, 5],
                    prompt: vec![state(0), state(1)],
                    answer: vec![state(2), state(3)],
                });
                r.decision.monitor = Some(m);
                r.rag_mean_entropy = Some(i as f64 / 20.0);
            }
        }
        out
    }

    /// The report's Markdown and JSON, pinned byte for byte (written before `build` and
    /// `markdown` were split into steps, so the split changes nothing). On a mismatch the
    /// actual text is written next to the temp dir for a diff.
    #[test]
    fn the_report_of_a_run_with_every_section_is_pinned() {
        let report = build(&every_section(), 3);
        let md = markdown(&report);
        let json = serde_json::to_string_pretty(&report).unwrap() + "\n";
        for kind in [
            "## Accuracy by kind",
            "## Entropy",
            "## Hidden-state probes",
            "## τ sweep",
            "## Combined score",
            "## Accuracy by needle depth",
        ] {
            assert!(md.contains(kind), "{kind} missing:\n{md}");
        }
        for (actual, pinned, name) in [
            (&md, include_str!("../tests/data/report.md"), "report.md"),
            (
                &json,
                include_str!("../tests/data/report.json"),
                "report.json",
            ),
        ] {
            if actual != pinned {
                let path = std::env::temp_dir().join(format!("triage-eval-actual-{name}"));
                std::fs::write(&path, actual).unwrap();
                panic!(
                    "{name} differs from the pinned one; actual in {}",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn the_oracle_takes_the_cheapest_right_answer() {
        let r = rows();
        let of = |e: &str| {
            let rs: Vec<&ResultRow> = r.iter().filter(|x| x.example == e).collect();
            oracle_row(&rs).unwrap()
        };
        assert_eq!(of("e0").derived_from.map(System::as_str), Some("rag"));
        assert_eq!(of("e7").derived_from.map(System::as_str), Some("lc"));
        // Nobody is right on e9: the cheapest path's answer.
        let o = of("e9");
        assert_eq!(
            (o.derived_from.map(System::as_str), o.score.correct),
            (Some("rag"), false)
        );
    }

    #[test]
    fn metrics_of_a_known_run() {
        let report = build(&rows(), 1);
        assert_eq!(report.queries, 10);
        // results::tests::row puts every query in one corpus.
        assert_eq!(report.questions_per_corpus, 10.0);
        let get = |s: &str| report.systems.iter().find(|m| m.system == s).unwrap();
        let (rag, lc, edar, oracle) = (get("rag"), get("lc"), get("edar"), get("oracle"));
        assert!((rag.accuracy.value - 0.6).abs() < 1e-12);
        assert!((lc.accuracy.value - 0.9).abs() < 1e-12);
        assert!((edar.accuracy.value - 0.9).abs() < 1e-12);
        assert!((oracle.accuracy.value - 0.9).abs() < 1e-12);
        // edar: 0.9 / 0.9 of LC's accuracy; (6·100 + 4·1100) / 10 = 500 tokens vs 1,000.
        assert!((edar.retained_vs_lc.unwrap().value - 1.0).abs() < 1e-12);
        assert!((edar.token_reduction_vs_lc.unwrap().value - 0.5).abs() < 1e-12);
        assert!((edar.escalation_rate - 0.4).abs() < 1e-12);
        // The oracle sends e6, e7, e8 to LC; edar sent e6..e9: precision 3/4, recall 1.
        let routing = edar.routing.unwrap();
        assert_eq!((routing.precision, routing.recall), (Some(0.75), Some(1.0)));
        // +0.3 accuracy for +400 tokens over RAG; none for RAG itself.
        assert!((edar.gain_per_1k_tokens_vs_rag.unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(rag.gain_per_1k_tokens_vs_rag, None);
        // Entropy separates RAG's errors perfectly here.
        let sig = report.signals.as_ref().unwrap();
        assert_eq!(sig.auroc_statistic, Some(1.0));
        assert!((sig.error_rate - 0.4).abs() < 1e-12);
        // The sweep: τ = 0.55 escalates e6..e9 — the routed system's accuracy.
        let p = report
            .sweep
            .iter()
            .find(|p| (p.tau - 0.55).abs() < 1e-9)
            .unwrap();
        assert!((p.accuracy - 0.9).abs() < 1e-12 && (p.escalation_rate - 0.4).abs() < 1e-12);
        // RAG 0.6, LC 0.9: edar recovers the whole gap; RAG none of it.
        assert!((edar.pgr.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(rag.pgr, Some(0.0));
        // r: 100 tokens against 1,000.
        assert!((report.rag_lc_ratio.unwrap() - 0.1).abs() < 1e-12);
        // LC fixes e6, e7, e8 (RAG wrong, LC right), the statistic's top answers but for e9,
        // which LC gets wrong too and which outranks them: 18 of 21 pairs ordered.
        assert!(
            (sig.auroc_lc_fixes.unwrap() - 6.0 / 7.0).abs() < 1e-12,
            "{sig:?}"
        );
        // The sweep escalates the wrong answers first, but e9 (which LC cannot fix) first of
        // all: PGR 0 at 0.1, 1/3, 2/3, 1 at 0.4, then flat.
        let want = 0.1 * (0.0 + 0.0) / 2.0
            + 0.1 * (0.0 + 1.0 / 3.0) / 2.0
            + 0.1 * (1.0 / 3.0 + 2.0 / 3.0) / 2.0
            + 0.1 * (2.0 / 3.0 + 1.0) / 2.0
            + 0.6;
        assert!(
            (report.apgr.unwrap() - want).abs() < 1e-9,
            "{:?}",
            report.apgr
        );
        let md = markdown(&report);
        assert!(md.contains("| edar | 0.900 ["), "{md}");
        assert!(md.contains("r = 0.100") && md.contains("PGR 1.000"), "{md}");
        assert!(md.contains("100.0% of long context's accuracy at 50.0% of its tokens"));
    }

    #[test]
    fn only_queries_every_system_answered_are_compared() {
        let mut r = rows();
        r.retain(|x| !(x.system == System::Lc && x.example == "e3"));
        assert_eq!(build(&r, 1).queries, 9);
    }
}
