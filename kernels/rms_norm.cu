// RMS normalisation with the residual add before it, as one pass per row: with `delta`,
// residual += delta (in place, f32) first; then out = residual / sqrt(mean(residual²) + eps) · w,
// computed in f32 and stored in `T` (the next GEMM's input dtype), as the CPU op in triage-ops.
// Without `delta` (null: the first layer's norm, the final one) the residual is only read.
//
// Grid: one block per row (launch::rms_norm). Block: any whole number of warps. Thread t owns
// elements t, t + blockDim, ... of its row (coalesced scalar loads): it adds the delta to them,
// sums their squares, and after the block's sum (common.cuh's block_reduce, whose barriers order
// nothing else: each thread reads back only the elements it wrote) scales the same elements.
#include "common.cuh"

namespace triage {

template <typename T>
__device__ void add_rms_norm(float* __restrict__ residual, const T* __restrict__ delta,
                             const float* __restrict__ weight, T* __restrict__ out, int hidden, float eps) {
    const size_t row = blockIdx.x;
    float* x = residual + row * hidden;
    float squares = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = x[i];
        if (delta != nullptr) {
            v += to_float(delta[row * hidden + i]);
            x[i] = v;
        }
        squares += v * v;
    }
    squares = block_reduce(squares, SumOp{}, SumOp::identity());
    const float scale = 1.0f / sqrtf(squares / static_cast<float>(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[row * hidden + i] = from_float<T>(x[i] * scale * weight[i]);
}

}  // namespace triage

#define TRIAGE_ADD_RMS_NORM(NAME, T)                                                                         \
    extern "C" __global__ void NAME(float* __restrict__ residual, const T* __restrict__ delta,                \
                                    const float* __restrict__ weight, T* __restrict__ out, int hidden,        \
                                    float eps) {                                                              \
        triage::add_rms_norm<T>(residual, delta, weight, out, hidden, eps);                                   \
    }

TRIAGE_ADD_RMS_NORM(add_rms_norm_f32, float)
TRIAGE_ADD_RMS_NORM(add_rms_norm_f16, __half)
TRIAGE_ADD_RMS_NORM(add_rms_norm_bf16, __nv_bfloat16)
