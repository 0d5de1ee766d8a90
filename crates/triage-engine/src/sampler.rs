//! Sampling parameters and the seeded [`Sampler`] that turns one step's logits into a token.
//!
//! The pipeline, in order: penalties → temperature → top-k → top-p → min-p → draw. A temperature of
//! 0 means greedy: the argmax of the penalised logits, lowest token id on ties.
//!
//! Logprobs and entropy reported to clients and to the entropy monitor are those of the RAW model
//! distribution `softmax(logits)` (before penalties, temperature and truncation), as computed by
//! `triage_ops::logits_reduce`. The sampler only decides which token is drawn; it reports no
//! probabilities, so a routing threshold never depends on a request's sampling settings.

use std::cmp::Ordering;
use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use triage_ops::LogitsStats;

use crate::{EngineError, Result};

/// The largest `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

// The fused logits reduction is what supplies the top logprobs, so it must return enough of them.
const _: () = assert!(MAX_TOP_LOGPROBS <= triage_ops::MAX_TOP_K);

/// How one request wants its tokens chosen, and when to stop. Every field has a default that
/// disables it, so `{}` deserialises to plain sampling at temperature 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0`; 0 means greedy. Default 1 (OpenAI's default).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sums to at least `top_p`,
    /// in `(0, 1]`; 1 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's, in `[0, 1]`;
    /// 0 disables.
    pub min_p: f32,
    /// llama.cpp/HF repetition penalty over tokens seen in the prompt or the output: positive
    /// logits are divided by it, negative ones multiplied. `> 0`; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty, in `[-2, 2]`: subtracted once from the logit of every token that
    /// was generated at least once (prompt tokens do not count).
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in `[-2, 2]`: subtracted from a token's logit once per time it was
    /// generated (prompt tokens do not count).
    pub frequency_penalty: f32,
    /// Seed of the sampler's random generator; `None` seeds from the operating system.
    pub seed: Option<u64>,
    /// The most tokens to generate; `None` means until a stop condition or the context is full.
    pub max_tokens: Option<usize>,
    /// Stop strings: generation ends at the first one that appears in the output, which is cut
    /// before it.
    pub stop: Vec<String>,
    /// Token ids that end generation (in addition to the model's end-of-sequence tokens).
    pub stop_token_ids: Vec<u32>,
    /// Whether to return the logprob of each generated token, under the raw model distribution
    /// (before penalties and temperature).
    pub logprobs: bool,
    /// How many of the most likely alternatives to return per token, at most
    /// [`MAX_TOP_LOGPROBS`]; needs `logprobs`.
    pub top_logprobs: usize,
    /// Keep generating past the model's end-of-sequence tokens (`stop_token_ids` still stop).
    pub ignore_eos: bool,
    /// Token ids whose raw logprob every generated token also reports, whether or not they are
    /// among the most likely (scoring: an LLM reranker reads "yes" against "no").
    pub score_token_ids: Vec<u32>,
    /// Layers (0-based) whose residual-stream state each of the first `hidden_steps` generated
    /// tokens returns, from the same forward pass: the first token's is the last prompt token's
    /// state, the next ones those of the tokens generated so far (a probe's input).
    pub hidden_layers: Vec<usize>,
    pub hidden_steps: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            logprobs: false,
            top_logprobs: 0,
            ignore_eos: false,
            score_token_ids: Vec::new(),
            hidden_layers: Vec::new(),
            hidden_steps: 0,
        }
    }
}

/// Most layers a request may ask hidden states of.
pub const MAX_HIDDEN_LAYERS: usize = 8;
/// Most generated tokens that may return hidden states.
pub const MAX_HIDDEN_STEPS: usize = 32;

/// Most token ids a request may ask logprobs of besides the sampled one.
pub const MAX_SCORE_TOKENS: usize = 64;

/// The highest temperature. Past it the logit spread of any real model is flattened to within a
/// few percent of uniform, so a larger value changes nothing but is most likely a mistake (a
/// percentage, a stray exponent).
pub const MAX_TEMPERATURE: f32 = 1000.0;

/// The repetition penalty's range. llama.cpp and HF accept any positive value and users send
/// 1–1.5 (below 1 encourages repeats); the bounds keep a penalised logit within 100 times the
/// model's, where a denormal such as `1e-45` divides a logit of 1 into `+inf` and the draw fails.
pub const REPETITION_PENALTY_RANGE: (f32, f32) = (0.01, 100.0);

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// Longest stop string, in bytes: with [`MAX_STOP_STRINGS`] this bounds the text the stop checker
/// holds back and the automaton it builds per request.
pub const MAX_STOP_BYTES: usize = 1024;

fn invalid(param: &'static str, message: String) -> EngineError {
    EngineError::InvalidSampling { param, message }
}

impl SamplingParams {
    /// Greedy parameters: temperature 0, everything else at its default.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether tokens are chosen by argmax rather than drawn.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether the penalties leave every logit as it is (repetition 1, presence and frequency 0).
    pub fn penalties_are_neutral(&self) -> bool {
        self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }

    /// Checks every parameter against its range; the error names the first one that is out of it.
    pub fn validate(&self) -> Result<()> {
        self.validate_distribution()?;
        self.validate_penalties()?;
        self.validate_output()
    }

    fn validate_distribution(&self) -> Result<()> {
        let t = self.temperature;
        if !(0.0..=MAX_TEMPERATURE).contains(&t) {
            let message = format!("must be in [0, {MAX_TEMPERATURE}] (0 means greedy), got {t}");
            return Err(invalid("temperature", message));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            let message = format!("must be in (0, 1] (1 disables it), got {}", self.top_p);
            return Err(invalid("top_p", message));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            let message = format!("must be in [0, 1] (0 disables it), got {}", self.min_p);
            return Err(invalid("min_p", message));
        }
        Ok(())
    }

    fn validate_penalties(&self) -> Result<()> {
        let r = self.repetition_penalty;
        let (low, high) = REPETITION_PENALTY_RANGE;
        if !(low..=high).contains(&r) {
            let message = format!("must be in [{low}, {high}] (1 disables it), got {r}");
            return Err(invalid("repetition_penalty", message));
        }
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(invalid(param, format!("must be in [-2, 2], got {value}")));
            }
        }
        Ok(())
    }

    fn validate_output(&self) -> Result<()> {
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            let message = format!(
                "must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            );
            return Err(invalid("top_logprobs", message));
        }
        if self.top_logprobs > 0 && !self.logprobs {
            let message = "needs logprobs to be true".to_string();
            return Err(invalid("top_logprobs", message));
        }
        if self.max_tokens == Some(0) {
            return Err(invalid("max_tokens", "must be at least 1".to_string()));
        }
        if self.score_token_ids.len() > MAX_SCORE_TOKENS {
            let message = format!(
                "at most {MAX_SCORE_TOKENS} ids, got {}",
                self.score_token_ids.len()
            );
            return Err(invalid("score_token_ids", message));
        }
        if self.hidden_layers.len() > MAX_HIDDEN_LAYERS || self.hidden_steps > MAX_HIDDEN_STEPS {
            let message = format!(
                "at most {MAX_HIDDEN_LAYERS} layers for at most {MAX_HIDDEN_STEPS} tokens, got {} \
                 for {}",
                self.hidden_layers.len(),
                self.hidden_steps
            );
            return Err(invalid("hidden_layers", message));
        }
        self.validate_stop()
    }

    fn validate_stop(&self) -> Result<()> {
        if self.stop.len() > MAX_STOP_STRINGS {
            let message = format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                self.stop.len()
            );
            return Err(invalid("stop", message));
        }
        if let Some(stop_idx) = self.stop.iter().position(String::is_empty) {
            let message = format!("stop string {stop_idx} is empty");
            return Err(invalid("stop", message));
        }
        if let Some(stop_idx) = self.stop.iter().position(|s| s.len() > MAX_STOP_BYTES) {
            let message = format!(
                "stop string {stop_idx} is {} bytes; at most {MAX_STOP_BYTES}",
                self.stop[stop_idx].len()
            );
            return Err(invalid("stop", message));
        }
        Ok(())
    }
}

/// What the penalties need to know about one token.
#[derive(Debug, Default, Clone, Copy)]
struct TokenCount {
    in_prompt: bool,
    num_generated: u32,
}

/// Chooses the tokens of one request.
///
/// Create one per request with its prompt, then call [`Sampler::sample`] once per decode step:
/// it draws a token and records it as generated, which is what the penalties count. Same seed and
/// same logits give the same tokens (for the `rand` version pinned in `Cargo.lock`).
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    counts: HashMap<u32, TokenCount>,
    num_generated: usize,
    /// `(token id, logit)` candidates, kept between steps to avoid a vocabulary-sized allocation.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// Validates `params` and seeds the generator; `prompt_ids` feed the repetition penalty.
    pub fn new(params: SamplingParams, prompt_ids: &[u32]) -> Result<Self> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let mut counts: HashMap<u32, TokenCount> = HashMap::new();
        for &token in prompt_ids {
            counts.entry(token).or_default().in_prompt = true;
        }
        Ok(Self {
            params,
            rng,
            counts,
            num_generated: 0,
            candidates: Vec::new(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// How many tokens [`Sampler::sample`] has returned.
    #[cfg(test)]
    pub fn num_generated(&self) -> usize {
        self.num_generated
    }

    /// Chooses the next token from one step's raw logits (one per vocabulary entry) and records it
    /// as generated.
    ///
    /// Logits may be `-inf` (masked tokens are never chosen); NaN, `+inf`, an empty slice or all
    /// tokens masked is an error.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        let token = if self.params.is_greedy() && self.params.penalties_are_neutral() {
            // Nothing changes a logit: argmax in place, without copying the vocabulary.
            check_logits(logits)?;
            argmax(logits)?
        } else if self.params.is_greedy() {
            self.fill_candidates(logits)?;
            greedy(&self.candidates)?
        } else {
            self.fill_candidates(logits)?;
            self.truncate_and_draw()?
        };
        let count = self.counts.entry(token).or_default();
        count.num_generated = count.num_generated.saturating_add(1);
        self.num_generated += 1;
        Ok(token)
    }

    /// Whether this sampler always chooses the row's argmax (greedy, neutral penalties): then the
    /// fused reduction's argmax is the token, and the logits row need not leave the device.
    pub fn takes_argmax(&self) -> bool {
        self.params.is_greedy() && self.params.penalties_are_neutral()
    }

    /// Records the reduction's argmax as this step's token, for a sampler that
    /// [takes the argmax](Self::takes_argmax) (an error otherwise). The reduction's ties go to the
    /// lowest id, as [`Sampler::sample`]'s; it counts a NaN logit as `-inf` where `sample` refuses
    /// the row, and a row without a finite largest logit is an error either way.
    pub fn record_argmax(&mut self, stats: &LogitsStats) -> Result<u32> {
        if !self.takes_argmax() {
            return Err(EngineError::Invalid(
                "record_argmax on a sampler that draws or penalises".into(),
            ));
        }
        if !stats.max.is_finite() {
            return Err(EngineError::Invalid(format!(
                "logits: the largest logit is {}",
                stats.max
            )));
        }
        let token = stats.argmax;
        let count = self.counts.entry(token).or_default();
        count.num_generated = count.num_generated.saturating_add(1);
        self.num_generated += 1;
        Ok(token)
    }

    /// Copies the logits into `candidates` and applies the penalties to the tokens seen so far.
    fn fill_candidates(&mut self, logits: &[f32]) -> Result<()> {
        check_logits(logits)?;
        self.candidates.clear();
        // `+ 0.0` turns -0.0 into +0.0 so that `total_cmp` ties them (lowest id wins).
        let indexed = (0u32..).zip(logits).map(|(id, &logit)| (id, logit + 0.0));
        self.candidates.extend(indexed);
        for (&token, &count) in &self.counts {
            if let Some(candidate) = self.candidates.get_mut(token as usize) {
                let penalised = penalise(&self.params, candidate.1, count);
                // A finite logit can still overflow (a logit near f32's limit divided by a
                // penalty below 1): refuse the row rather than draw from `inf - inf = NaN`.
                if penalised.is_nan() || penalised == f32::INFINITY {
                    let message = format!(
                        "the penalties turned logit {token} ({}) into {penalised}; cannot sample",
                        candidate.1
                    );
                    return Err(EngineError::Invalid(message));
                }
                candidate.1 = penalised;
            }
        }
        Ok(())
    }

    /// Temperature, top-k, top-p and min-p on `candidates`, then one draw.
    fn truncate_and_draw(&mut self) -> Result<u32> {
        let params = &self.params;
        let candidates = &mut self.candidates;
        // Temperature is monotone, so top-k on unscaled logits keeps the same tokens and scales
        // only `k` of them.
        if params.top_k > 0 && params.top_k < candidates.len() {
            candidates.select_nth_unstable_by(params.top_k - 1, by_rank);
            candidates.truncate(params.top_k);
        }
        scale(candidates, params.temperature)?;
        if params.top_p < 1.0 {
            keep_nucleus(candidates, params.top_p);
        }
        if params.min_p > 0.0 {
            // After `scale` the most likely token has logit 0, so `p >= min_p * p_max` is
            // `logit >= ln(min_p)`; the most likely token always stays.
            let cut = params.min_p.ln();
            candidates.retain(|&(_, logit)| logit >= cut);
        }
        draw(candidates, &mut self.rng).ok_or_else(all_masked)
    }
}

fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(EngineError::Invalid(
            "cannot sample from empty logits".into(),
        ));
    }
    if u32::try_from(logits.len()).is_err() {
        let message = format!("vocabulary of {} does not fit u32 ids", logits.len());
        return Err(EngineError::Invalid(message));
    }
    if let Some(idx) = logits
        .iter()
        .position(|l| l.is_nan() || *l == f32::INFINITY)
    {
        let message = format!("logit {idx} is {}; cannot sample", logits[idx]);
        return Err(EngineError::Invalid(message));
    }
    Ok(())
}

/// Repetition penalty (prompt and output), then presence and frequency (output only), in
/// llama.cpp's order.
fn penalise(params: &SamplingParams, logit: f32, count: TokenCount) -> f32 {
    let mut logit = logit;
    if count.in_prompt || count.num_generated > 0 {
        let r = params.repetition_penalty;
        logit = if logit > 0.0 { logit / r } else { logit * r };
    }
    if count.num_generated > 0 {
        logit -= params.presence_penalty;
        logit -= count.num_generated as f32 * params.frequency_penalty;
    }
    logit
}

/// Most likely first, lowest id first among equal logits. Logits are never NaN here.
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn greedy(candidates: &[(u32, f32)]) -> Result<u32> {
    match candidates.iter().min_by(|a, b| by_rank(a, b)) {
        Some(&(_, logit)) if logit == f32::NEG_INFINITY => Err(all_masked()),
        Some(&(token, _)) => Ok(token),
        None => Err(all_masked()),
    }
}

/// `greedy` over raw logits: the first of the largest (with -0.0 equal to +0.0, as
/// `fill_candidates` makes them).
fn argmax(logits: &[f32]) -> Result<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (id, &logit) in (0u32..).zip(logits) {
        let logit = logit + 0.0;
        if best.is_none_or(|(_, b)| logit.total_cmp(&b) == Ordering::Greater) {
            best = Some((id, logit));
        }
    }
    match best {
        Some((token, logit)) if logit != f32::NEG_INFINITY => Ok(token),
        _ => Err(all_masked()),
    }
}

fn all_masked() -> EngineError {
    EngineError::Invalid("every token has logit -inf; cannot sample".into())
}

/// Replaces each logit by `(logit - max) / temperature`: the most likely token gets 0, and small
/// temperatures send the others to `-inf` instead of overflowing.
fn scale(candidates: &mut [(u32, f32)], temperature: f32) -> Result<()> {
    let max = candidates
        .iter()
        .map(|&(_, logit)| logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(all_masked());
    }
    for candidate in candidates.iter_mut() {
        candidate.1 = (candidate.1 - max) / temperature;
    }
    Ok(())
}

/// Keeps the smallest prefix of most likely tokens whose probability reaches `top_p`.
fn keep_nucleus(candidates: &mut Vec<(u32, f32)>, top_p: f32) {
    candidates.sort_unstable_by(by_rank);
    let total: f64 = candidates.iter().map(|&(_, l)| f64::from(l).exp()).sum();
    let target = f64::from(top_p) * total;
    let mut cumulative = 0.0;
    let mut num_kept = candidates.len();
    for (idx, &(_, logit)) in candidates.iter().enumerate() {
        cumulative += f64::from(logit).exp();
        if cumulative >= target {
            num_kept = idx + 1;
            break;
        }
    }
    candidates.truncate(num_kept);
}

/// Draws one candidate with probability proportional to `exp(logit)`; `None` when no candidate
/// has weight.
fn draw(candidates: &[(u32, f32)], rng: &mut StdRng) -> Option<u32> {
    let total: f64 = candidates.iter().map(|&(_, l)| f64::from(l).exp()).sum();
    let target = rng.random::<f64>() * total;
    let mut cumulative = 0.0;
    let mut last_weighted = None;
    for &(token, logit) in candidates {
        let weight = f64::from(logit).exp();
        if weight > 0.0 {
            last_weighted = Some(token);
        }
        cumulative += weight;
        if cumulative > target {
            return Some(token);
        }
    }
    // Rounding can leave `cumulative` a hair below `target`; the last token with weight takes
    // that sliver.
    last_weighted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_logits(seed: u64, vocab: usize) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..vocab).map(|_| rng.random_range(-5.0f32..5.0)).collect()
    }

    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params, &[]).expect("valid params")
    }

    fn seeded(seed: u64) -> SamplingParams {
        SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        }
    }

    /// Fraction of `num_draws` draws that picked each token.
    fn frequencies(params: SamplingParams, logits: &[f32], num_draws: usize) -> Vec<f64> {
        let mut s = sampler(params);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..num_draws {
            counts[s.sample(logits).expect("sample") as usize] += 1;
        }
        counts
            .iter()
            .map(|&c| c as f64 / num_draws as f64)
            .collect()
    }

    fn assert_frequencies(actual: &[f64], expected: &[f64]) {
        for (idx, (a, e)) in actual.iter().zip(expected).enumerate() {
            if *e == 0.0 {
                assert_eq!(*a, 0.0, "token {idx} is outside the kept set but was drawn");
            } else {
                assert!((a - e).abs() < 0.02, "token {idx}: {a} vs {e} ({actual:?})");
            }
        }
    }

    #[test]
    fn greedy_is_argmax() {
        for seed in 0..20 {
            let logits = random_logits(seed, 1000);
            let argmax = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap();
            let mut s = sampler(SamplingParams::greedy());
            assert_eq!(s.sample(&logits).unwrap() as usize, argmax);
        }
    }

    #[test]
    fn the_reductions_argmax_is_the_greedy_token() {
        // Random rows with planted ties and masked tokens: the fused reduction's argmax, recorded
        // without the row, is what `sample` chooses from the row.
        for seed in 0..20u64 {
            let mut logits = random_logits(seed, 1000);
            logits[(seed * 37 % 1000) as usize] = f32::NEG_INFINITY;
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            logits[(seed * 11 % 997) as usize + 2] = top; // a tie with a higher id
            let stats = triage_ops::logits_reduce(
                &candle_core::Tensor::new(logits.as_slice(), &candle_core::Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap(),
                0,
            )
            .unwrap()
            .remove(0);
            let (mut from_row, mut from_stats) = (
                sampler(SamplingParams::greedy()),
                sampler(SamplingParams::greedy()),
            );
            assert!(from_stats.takes_argmax());
            let expected = from_row.sample(&logits).unwrap();
            assert_eq!(
                from_stats.record_argmax(&stats).unwrap(),
                expected,
                "seed {seed}"
            );
            assert_eq!(from_stats.num_generated(), 1);
        }
        let mut drawing = sampler(seeded(1));
        assert!(!drawing.takes_argmax());
        let stats = LogitsStats {
            max: 1.0,
            log_sum_exp: 2.0,
            entropy: 0.5,
            argmax: 3,
            top_k: Vec::new(),
        };
        assert!(drawing.record_argmax(&stats).is_err());
        let masked = LogitsStats {
            max: f32::NEG_INFINITY,
            ..stats
        };
        assert!(sampler(SamplingParams::greedy())
            .record_argmax(&masked)
            .is_err());
    }

    #[test]
    fn greedy_takes_lowest_id_on_ties() {
        let mut s = sampler(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.5, 2.0, -1.0, 2.0, 2.0]).unwrap(), 1);
        assert_eq!(s.sample(&[-0.0, 0.0, -3.0]).unwrap(), 0);
        assert_eq!(s.sample(&[-3.0, 0.0, -0.0]).unwrap(), 1);
    }

    #[test]
    fn greedy_argmax_in_place_matches_the_candidate_path() {
        // A penalty of 1 + ε takes the candidate path without moving the argmax on these logits
        // (all negative, so the repeated token only moves down, and it is never the best).
        for seed in 0..20 {
            let mut logits = random_logits(seed, 1000);
            logits.iter_mut().for_each(|l| *l = -l.abs() - 0.5);
            let fast = sampler(SamplingParams::greedy()).sample(&logits).unwrap();
            let params = SamplingParams {
                repetition_penalty: 1.0 + f32::EPSILON,
                ..SamplingParams::greedy()
            };
            let slow = Sampler::new(params, &[(fast + 1) % 1000])
                .unwrap()
                .sample(&logits)
                .unwrap();
            assert_eq!(fast, slow, "seed {seed}");
        }
        let mut s = sampler(SamplingParams::greedy());
        assert!(s.sample(&[f32::NEG_INFINITY; 4]).is_err());
        assert!(s.sample(&[0.0, f32::NAN]).is_err());
        assert!(s.sample(&[]).is_err());
    }

    #[test]
    fn same_seed_gives_same_sequence() {
        let logits = random_logits(7, 50);
        let mut a = sampler(seeded(42));
        let mut b = sampler(seeded(42));
        let seq_a: Vec<u32> = (0..64).map(|_| a.sample(&logits).unwrap()).collect();
        let seq_b: Vec<u32> = (0..64).map(|_| b.sample(&logits).unwrap()).collect();
        assert_eq!(seq_a, seq_b);
    }

    #[test]
    fn different_seeds_give_different_sequences() {
        let logits = random_logits(7, 50);
        let mut a = sampler(seeded(1));
        let mut b = sampler(seeded(2));
        let seq_a: Vec<u32> = (0..64).map(|_| a.sample(&logits).unwrap()).collect();
        let seq_b: Vec<u32> = (0..64).map(|_| b.sample(&logits).unwrap()).collect();
        assert_ne!(seq_a, seq_b);
    }

    #[test]
    fn unseeded_samplers_differ() {
        let logits = vec![1.5f32; 1000];
        let mut a = sampler(SamplingParams::default());
        let mut b = sampler(SamplingParams::default());
        let seq_a: Vec<u32> = (0..16).map(|_| a.sample(&logits).unwrap()).collect();
        let seq_b: Vec<u32> = (0..16).map(|_| b.sample(&logits).unwrap()).collect();
        assert_ne!(seq_a, seq_b);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        for (seed, temperature) in [(3, 0.05), (4, 0.7), (5, 1.0), (6, 5.0), (7, 1000.0)] {
            let mut logits = random_logits(seed, 500);
            logits[17] = 9.0;
            logits[400] = 9.0;
            let params = SamplingParams {
                temperature,
                top_k: 1,
                ..seeded(seed)
            };
            let mut s = sampler(params);
            for _ in 0..20 {
                assert_eq!(s.sample(&logits).unwrap(), 17, "temperature {temperature}");
            }
        }
    }

    #[test]
    fn top_k_keeps_k_most_likely() {
        let logits = logits_of(&[0.1, 0.4, 0.05, 0.3, 0.15]);
        let params = SamplingParams {
            top_k: 2,
            ..seeded(11)
        };
        let freq = frequencies(params, &logits, 20_000);
        assert_frequencies(&freq, &[0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0, 0.0]);
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        let logits = logits_of(&[0.15, 0.5, 0.1, 0.25]);
        // 0.5 < 0.7 <= 0.5 + 0.25: the nucleus is {1, 3}.
        let params = SamplingParams {
            top_p: 0.7,
            ..seeded(12)
        };
        let freq = frequencies(params, &logits, 20_000);
        assert_frequencies(&freq, &[0.0, 0.5 / 0.75, 0.0, 0.25 / 0.75]);
        // 0.75 < 0.8 <= 0.9: the next most likely token joins.
        let params = SamplingParams {
            top_p: 0.8,
            ..seeded(13)
        };
        let freq = frequencies(params, &logits, 20_000);
        assert_frequencies(&freq, &[0.15 / 0.9, 0.5 / 0.9, 0.0, 0.25 / 0.9]);
    }

    #[test]
    fn top_p_applies_after_temperature() {
        // At temperature 0.5 the probabilities are squared and renormalised: 0.6^2 / (0.6^2 +
        // 0.3^2 + 0.1^2) = 0.783 >= 0.75, so only token 0 is left.
        let logits = logits_of(&[0.6, 0.3, 0.1]);
        let params = SamplingParams {
            temperature: 0.5,
            top_p: 0.75,
            ..seeded(14)
        };
        let freq = frequencies(params, &logits, 2_000);
        assert_frequencies(&freq, &[1.0, 0.0, 0.0]);
    }

    #[test]
    fn min_p_cuts_below_fraction_of_max() {
        let logits = logits_of(&[0.12, 0.5, 0.08, 0.3]);
        // Cut at 0.2 * 0.5 = 0.1: token 2 goes.
        let params = SamplingParams {
            min_p: 0.2,
            ..seeded(15)
        };
        let freq = frequencies(params, &logits, 20_000);
        assert_frequencies(&freq, &[0.12 / 0.92, 0.5 / 0.92, 0.0, 0.3 / 0.92]);
    }

    #[test]
    fn masked_tokens_are_never_drawn() {
        let masked = f32::NEG_INFINITY;
        let logits = [0.5, 1.0, masked, 0.2, 0.8, masked, 1.1, 0.3];
        let freq = frequencies(seeded(16), &logits, 5_000);
        assert_eq!(freq[2], 0.0);
        assert_eq!(freq[5], 0.0);
        assert!(freq.iter().filter(|&&f| f > 0.0).count() == 6, "{freq:?}");
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let params = SamplingParams {
            repetition_penalty: 1.2,
            ..SamplingParams::greedy()
        };
        // 2.0 / 1.2 = 1.67 < 1.9: the prompt token loses.
        let mut s = Sampler::new(params.clone(), &[0]).unwrap();
        assert_eq!(s.sample(&[2.0, 1.9, -1.0]).unwrap(), 1);
        // -1.0 * 1.2 = -1.2 < -1.1.
        let mut s = Sampler::new(params.clone(), &[0]).unwrap();
        assert_eq!(s.sample(&[-1.0, -1.1, -3.0]).unwrap(), 1);
        // Without the token in the prompt nothing changes.
        let mut s = Sampler::new(params, &[2]).unwrap();
        assert_eq!(s.sample(&[2.0, 1.9, -1.0]).unwrap(), 0);
    }

    #[test]
    fn repetition_penalty_counts_generated_tokens() {
        let params = SamplingParams {
            repetition_penalty: 1.5,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params, &[]).unwrap();
        assert_eq!(s.sample(&[3.0, 2.5]).unwrap(), 0);
        // 3.0 / 1.5 = 2.0 < 2.5 now that token 0 was generated.
        assert_eq!(s.sample(&[3.0, 2.5]).unwrap(), 1);
        assert_eq!(s.num_generated(), 2);
    }

    #[test]
    fn frequency_penalty_grows_with_count() {
        let params = SamplingParams {
            frequency_penalty: 0.3,
            ..SamplingParams::greedy()
        };
        let logits = [2.0, 1.5, -0.5];
        let mut s = Sampler::new(params, &[0, 0, 0]).unwrap();
        // Prompt tokens do not count: 2.0, then 1.7, then 1.4 < 1.5.
        assert_eq!(s.sample(&logits).unwrap(), 0);
        assert_eq!(s.sample(&logits).unwrap(), 0);
        assert_eq!(s.sample(&logits).unwrap(), 1);
    }

    #[test]
    fn presence_penalty_applies_once_to_generated_tokens() {
        let params = SamplingParams {
            presence_penalty: 0.8,
            ..SamplingParams::greedy()
        };
        let logits = [2.0, 1.5, -0.5];
        let mut s = Sampler::new(params, &[0]).unwrap();
        assert_eq!(s.sample(&logits).unwrap(), 0);
        // 2.0 - 0.8 = 1.2 < 1.5, then 1.5 - 0.8 = 0.7 < 1.2.
        assert_eq!(s.sample(&logits).unwrap(), 1);
        assert_eq!(s.sample(&logits).unwrap(), 0);
    }

    #[test]
    fn negative_presence_penalty_encourages_repeats() {
        let params = SamplingParams {
            presence_penalty: -1.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params, &[]).unwrap();
        assert_eq!(s.sample(&[1.0, 1.2]).unwrap(), 1);
        assert_eq!(s.sample(&[1.5, 1.2]).unwrap(), 1);
    }

    #[test]
    fn bad_logits_are_errors() {
        let mut s = sampler(seeded(1));
        assert!(s.sample(&[]).is_err());
        assert!(s.sample(&[0.3, f32::NAN]).is_err());
        assert!(s.sample(&[0.3, f32::INFINITY]).is_err());
        assert!(s.sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY]).is_err());
        let mut g = sampler(SamplingParams::greedy());
        assert!(g.sample(&[f32::NEG_INFINITY; 3]).is_err());
        assert_eq!(s.num_generated() + g.num_generated(), 0);
    }

    #[test]
    fn validate_rejects_bad_values() {
        type Edit = fn(&mut SamplingParams);
        let cases: [(&str, Edit); 21] = [
            ("temperature", |p| p.temperature = -0.1),
            ("temperature", |p| p.temperature = f32::NAN),
            ("temperature", |p| p.temperature = f32::INFINITY),
            ("top_p", |p| p.top_p = 0.0),
            ("top_p", |p| p.top_p = 1.01),
            ("top_p", |p| p.top_p = f32::NAN),
            ("min_p", |p| p.min_p = -0.01),
            ("min_p", |p| p.min_p = 1.5),
            ("min_p", |p| p.min_p = f32::NAN),
            ("repetition_penalty", |p| p.repetition_penalty = 0.0),
            ("repetition_penalty", |p| p.repetition_penalty = -1.0),
            ("repetition_penalty", |p| p.repetition_penalty = f32::NAN),
            ("presence_penalty", |p| p.presence_penalty = 2.5),
            ("presence_penalty", |p| p.presence_penalty = f32::NAN),
            ("frequency_penalty", |p| p.frequency_penalty = -2.01),
            ("top_logprobs", |p| {
                p.logprobs = true;
                p.top_logprobs = 21;
            }),
            ("top_logprobs", |p| p.top_logprobs = 3),
            ("max_tokens", |p| p.max_tokens = Some(0)),
            ("stop", |p| p.stop = vec!["\n\n".into(), String::new()]),
            ("stop", |p| p.stop = vec![String::new()]),
            ("repetition_penalty", |p| {
                p.repetition_penalty = f32::INFINITY
            }),
        ];
        for (param, edit) in cases {
            let mut params = SamplingParams::default();
            edit(&mut params);
            match params.validate() {
                Err(EngineError::InvalidSampling {
                    param: got,
                    message,
                }) => {
                    assert_eq!(got, param, "{message}");
                    assert!(!message.is_empty());
                }
                other => panic!("{param}: expected InvalidSampling, got {other:?} for {params:?}"),
            }
            assert!(Sampler::new(params, &[]).is_err());
        }
    }

    /// Issue 20: a value that passes validation keeps every logit finite, and each parameter
    /// has an upper end as well as a lower one.
    #[test]
    fn validate_bounds_every_parameter() {
        type Edit = fn(&mut SamplingParams);
        let refused: [(&str, Edit); 9] = [
            ("repetition_penalty", |p| p.repetition_penalty = 1e-45),
            ("repetition_penalty", |p| p.repetition_penalty = 0.009),
            ("repetition_penalty", |p| p.repetition_penalty = 100.5),
            ("temperature", |p| p.temperature = 1000.5),
            ("temperature", |p| p.temperature = 1e30),
            ("stop", |p| p.stop = vec!["a".into(); MAX_STOP_STRINGS + 1]),
            ("stop", |p| p.stop = vec!["x".repeat(MAX_STOP_BYTES + 1)]),
            ("stop", |p| {
                p.stop = vec!["ok".into(), "é".repeat(MAX_STOP_BYTES / 2 + 1)];
            }),
            ("presence_penalty", |p| p.presence_penalty = f32::INFINITY),
        ];
        for (param, edit) in refused {
            let mut params = SamplingParams::default();
            edit(&mut params);
            match params.validate() {
                Err(EngineError::InvalidSampling { param: got, .. }) => assert_eq!(got, param),
                other => panic!("{param}: expected InvalidSampling, got {other:?}"),
            }
        }
        let accepted: [Edit; 6] = [
            |p| p.repetition_penalty = REPETITION_PENALTY_RANGE.0,
            |p| p.repetition_penalty = REPETITION_PENALTY_RANGE.1,
            |p| p.temperature = MAX_TEMPERATURE,
            |p| p.top_k = usize::MAX,
            |p| p.stop = vec!["x".repeat(MAX_STOP_BYTES); MAX_STOP_STRINGS],
            |p| p.seed = Some(u64::MAX),
        ];
        for edit in accepted {
            let mut params = SamplingParams::default();
            edit(&mut params);
            params.validate().unwrap();
        }
    }

    /// A logit near f32's limit divided by a penalty below 1 overflows: the sampler refuses the
    /// row (the engine then fails that request alone) instead of drawing from NaN or returning
    /// the `inf` token as greedy's best.
    #[test]
    fn a_penalty_that_overflows_a_logit_is_an_error() {
        let logits = [3e37f32, 1.0, -2.0];
        for temperature in [0.0, 1.0] {
            let params = SamplingParams {
                temperature,
                repetition_penalty: REPETITION_PENALTY_RANGE.0,
                ..seeded(3)
            };
            let mut s = Sampler::new(params.clone(), &[0]).unwrap();
            let error = s.sample(&logits).unwrap_err().to_string();
            assert!(error.contains("penalties"), "{error}");
            assert_eq!(s.num_generated(), 0);
            // Without the token in the prompt the same row samples.
            let mut s = Sampler::new(params, &[1]).unwrap();
            assert_eq!(s.sample(&logits).unwrap(), 0);
        }
    }

    #[test]
    fn validate_accepts_edges() {
        let params = SamplingParams {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 1.0,
            repetition_penalty: 0.5,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            max_tokens: Some(1),
            stop: vec!["x".into()],
            logprobs: true,
            top_logprobs: MAX_TOP_LOGPROBS,
            ..SamplingParams::default()
        };
        params.validate().unwrap();
        SamplingParams::default().validate().unwrap();
    }

    #[test]
    fn deserialises_with_defaults() {
        let params: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.2, "stop": ["<end>"], "seed": 9}"#).unwrap();
        let expected = SamplingParams {
            temperature: 0.2,
            stop: vec!["<end>".into()],
            seed: Some(9),
            ..SamplingParams::default()
        };
        assert_eq!(params, expected);
        let round_trip: SamplingParams =
            serde_json::from_str(&serde_json::to_string(&params).unwrap()).unwrap();
        assert_eq!(round_trip, params);
    }
}
