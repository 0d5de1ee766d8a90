// One layer's stacked Q/K/V projection made ready for attention in one pass: the bias added,
// rotary embedding applied to Q and K, Q written as [rows, num_heads, head_dim] for the attention
// kernel, K and V written into their slots of the paged caches ([num_slots, kv_heads, head_dim]).
// Each row of `qkv` is [q heads | k heads | v heads], head_dim values each. Rope pairs element i
// with i + head_dim/2 (neox) or 2i with 2i+1 (interleaved), angle tables cos/sin [rows,
// head_dim/2] in f32. Arithmetic in f32, one rounding to T, as the CPU op in triage-ops.
//
// Grid: x = row, y = head of the stacked projection (num_heads + 2 · kv_heads)
// (launch::rope_and_cache). Block: a whole number of warps, at least head_dim/2 threads; thread t
// owns pair t of its head (two elements), threads past head_dim/2 do nothing. A row whose slot is
// the padding slot 0xffffffff writes no K or V (its Q is still written). Slots are validated on
// the host before the launch (a kernel cannot return an error).
#include "common.cuh"

namespace triage {
namespace rope_and_cache {

constexpr unsigned PADDING_SLOT = 0xffffffffu;

/// Where pair `t` of a head lives: elements (t, t + half) for neox, (2t, 2t + 1) interleaved.
__device__ __forceinline__ void pair_of(int t, int half, bool neox, int& a, int& b) {
    a = neox ? t : 2 * t;
    b = neox ? t + half : 2 * t + 1;
}

template <typename T>
__device__ void rope_and_cache(const T* __restrict__ qkv, const T* __restrict__ bias, const float* __restrict__ cos,
                               const float* __restrict__ sin, T* __restrict__ q_out, T* __restrict__ k_cache,
                               T* __restrict__ v_cache, const unsigned* __restrict__ slots, int num_heads,
                               int kv_heads, int head_dim, int neox) {
    const int half = head_dim / 2;
    const int t = threadIdx.x;
    if (t >= half) return;
    const int row = blockIdx.x, head = blockIdx.y;
    const int width = (num_heads + 2 * kv_heads) * head_dim;
    const int col = head * head_dim;
    int a, b;
    pair_of(t, half, neox != 0, a, b);
    float xa = to_float(qkv[static_cast<size_t>(row) * width + col + a]);
    float xb = to_float(qkv[static_cast<size_t>(row) * width + col + b]);
    if (bias != nullptr) {
        xa += to_float(bias[col + a]);
        xb += to_float(bias[col + b]);
    }
    const bool is_v = head >= num_heads + kv_heads;
    if (!is_v) {
        const float c = cos[static_cast<size_t>(row) * half + t];
        const float s = sin[static_cast<size_t>(row) * half + t];
        const float ra = xa * c - xb * s;
        const float rb = xa * s + xb * c;
        xa = ra;
        xb = rb;
    }
    T* dst;
    if (head < num_heads) {
        dst = q_out + (static_cast<size_t>(row) * num_heads + head) * head_dim;
    } else {
        const unsigned slot = slots[row];
        if (slot == PADDING_SLOT) return;
        const int kv_head = is_v ? head - num_heads - kv_heads : head - num_heads;
        T* cache = is_v ? v_cache : k_cache;
        dst = cache + (static_cast<size_t>(slot) * kv_heads + kv_head) * head_dim;
    }
    dst[a] = from_float<T>(xa);
    dst[b] = from_float<T>(xb);
}

}  // namespace rope_and_cache
}  // namespace triage

#define TRIAGE_ROPE_AND_CACHE(NAME, T)                                                                           \
    extern "C" __global__ void NAME(const T* __restrict__ qkv, const T* __restrict__ bias,                      \
                                    const float* __restrict__ cos, const float* __restrict__ sin,              \
                                    T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache,   \
                                    const unsigned* __restrict__ slots, int num_heads, int kv_heads,           \
                                    int head_dim, int neox) {                                                  \
        triage::rope_and_cache::rope_and_cache<T>(qkv, bias, cos, sin, q_out, k_cache, v_cache, slots,         \
                                                  num_heads, kv_heads, head_dim, neox);                        \
    }

TRIAGE_ROPE_AND_CACHE(rope_and_cache_f32, float)
TRIAGE_ROPE_AND_CACHE(rope_and_cache_f16, __half)
TRIAGE_ROPE_AND_CACHE(rope_and_cache_bf16, __nv_bfloat16)
