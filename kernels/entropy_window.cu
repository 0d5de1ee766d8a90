// Entropy window: the per-sequence state of the engine's EntropyMonitor, advanced on the device
// from the fused reduction's packed stats, so a decode step copies back only the sampled token
// and this state (four doubles per sequence), never the logits.
//
// Grid: one thread per sequence (launch::entropy_window); no shared memory, no barriers.
// State per sequence, f64 [sum, num_steps, decision, at_step] with decision 0 = continue,
// 1 = accept, 2 = escalate, 3 = invalid value (the monitor's Err: a NaN statistic, or a top-k
// estimator with k = 0). The rules are EntropyMonitor::observe_step's, step for step: the value
// is computed in f64 from the raw statistics, clamped at 0, converted to the unit, rounded to f32,
// added to the f64 sum; escalate as soon as sum > tau·window, accept after `window` values.
#include "common.cuh"

namespace triage {
namespace entropy_window {

enum Estimator { FULL_SOFTMAX = 0, TOP_K_RENORMALIZED = 1, TOP_K_RESIDUAL = 2, SAMPLED_NLL = 3 };
enum Decision { CONTINUE = 0, ACCEPT = 1, ESCALATE = 2, INVALID = 3 };
constexpr double LN_2 = 0.693147180559945309417232121458176568;

/// H(q) with q_i = p_i / Σp over the top-k logprobs, as ln Σp - Σ q_i ln p_i.
__device__ double top_k_renormalized(const float* logprobs, int k) {
    double max = -INFINITY;
    for (int i = 0; i < k; ++i) max = fmax(max, static_cast<double>(logprobs[i]));
    if (max == -INFINITY) return 0.0;
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += exp(static_cast<double>(logprobs[i]) - max);
    const double log_z = max + log(sum);
    double cross = 0.0;
    for (int i = 0; i < k; ++i) {
        const double lp = logprobs[i];
        const double q = exp(lp - log_z);
        if (q > 0.0) cross += q * lp;
    }
    return log_z - cross;
}

/// -Σ p_i ln p_i - r ln r over the top-k, with the residual mass r = 1 - Σ p_i.
__device__ double top_k_residual(const float* logprobs, int k) {
    double mass = 0.0, head = 0.0;
    for (int i = 0; i < k; ++i) {
        const double lp = logprobs[i];
        const double p = exp(lp);
        if (p > 0.0) {
            mass += p;
            head -= p * lp;
        }
    }
    const double residual = fmax(1.0 - mass, 0.0);
    return residual > 0.0 ? head - residual * log(residual) : head;
}

/// One step's value in nats, or NaN when the monitor would return an error.
__device__ double step_nats(const float* stats, int k, float sampled_logprob, int estimator) {
    const float* logprobs = stats + 4 + k;
    switch (estimator) {
        case FULL_SOFTMAX:
            return stats[2];
        case SAMPLED_NLL:
            return -static_cast<double>(sampled_logprob);
        default:
            break;
    }
    if (k == 0) return NAN;
    for (int i = 0; i < k; ++i)
        if (isnan(logprobs[i])) return NAN;
    return estimator == TOP_K_RENORMALIZED ? top_k_renormalized(logprobs, k) : top_k_residual(logprobs, k);
}

__device__ void observe(double* state, const float* stats, int k, float sampled_logprob, float tau, int window,
                        int estimator, int unit) {
    if (state[2] != CONTINUE) return;
    const double nats = step_nats(stats, k, sampled_logprob, estimator);
    if (isnan(nats)) {
        state[2] = INVALID;
        return;
    }
    const double clamped = fmax(nats, 0.0);
    const float value = static_cast<float>(unit == 1 ? clamped / LN_2 : clamped);
    state[0] += static_cast<double>(value);
    state[1] += 1.0;
    if (state[0] > static_cast<double>(tau) * window) {
        state[2] = ESCALATE;
        state[3] = state[1];
    } else if (state[1] == window) {
        state[2] = ACCEPT;
    }
}

}  // namespace entropy_window
}  // namespace triage

/// Sequences whose `observe` flag is 0 (the step that sampled EOS, or a finished sequence) keep
/// their state; `unit` is 0 for nats and 1 for bits.
extern "C" __global__ void entropy_window_f32(const float* __restrict__ stats, int k,
                                              const float* __restrict__ sampled_logprobs,
                                              const unsigned* __restrict__ observe, double* __restrict__ state,
                                              int num_seqs, float tau, int window, int estimator, int unit) {
    const int seq = blockIdx.x * blockDim.x + threadIdx.x;
    if (seq >= num_seqs || observe[seq] == 0) return;
    triage::entropy_window::observe(state + 4 * seq, stats + static_cast<size_t>(seq) * (4 + 2 * k), k,
                                    sampled_logprobs[seq], tau, window, estimator, unit);
}
