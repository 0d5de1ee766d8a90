// SiLU-gated product of the MLP: out[r, i] = silu(gate[r, i]) · up[r, i] over the stacked
// gate/up projection's output, laid out per row as [gate (inter) | up (inter)]; silu(g) =
// g / (1 + exp(-g)), computed in f32 and stored in the input's dtype, as the CPU op in triage-ops.
//
// Grid: x = row, y = chunk of blockDim.x columns (launch::silu_mul). Thread t of block (r, c)
// owns column c · blockDim.x + t of row r: consecutive threads read consecutive gate and up
// elements (coalesced scalar loads; the op moves a few hundred KB a step, so it is bound by its
// launch, not by vector width). Threads past the row's columns do nothing.
#include "common.cuh"

namespace triage {

template <typename T>
__device__ void silu_mul(const T* __restrict__ gate_up, T* __restrict__ out, int inter) {
    const int col = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
    if (col >= inter) return;
    const size_t row = blockIdx.x;
    const float g = to_float(gate_up[row * 2 * inter + col]);
    const float u = to_float(gate_up[row * 2 * inter + inter + col]);
    out[row * inter + col] = from_float<T>(g / (1.0f + expf(-g)) * u);
}

}  // namespace triage

#define TRIAGE_SILU_MUL(NAME, T)                                                                      \
    extern "C" __global__ void NAME(const T* __restrict__ gate_up, T* __restrict__ out, int inter) { \
        triage::silu_mul<T>(gate_up, out, inter);                                                    \
    }

TRIAGE_SILU_MUL(silu_mul_f32, float)
TRIAGE_SILU_MUL(silu_mul_f16, __half)
TRIAGE_SILU_MUL(silu_mul_bf16, __nv_bfloat16)
