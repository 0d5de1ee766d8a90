// What every kernel shares: dtype conversion, 16-byte vector loads, and the warp and block
// reductions (with their identities). Built by nvcc for the GPU, or by g++ against the CUDA
// simulator (`-DTRIAGE_CUDA_SIM`, see sim/cuda_sim.h) for the CPU tests.
#pragma once

#if defined(TRIAGE_CUDA_SIM)
#include <cstring>

#include "sim/cuda_sim.h"
// The simulator gives each launch its own dynamic shared buffer (with guard zones).
#define TRIAGE_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::cudasim::dynamic_shared())
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#define TRIAGE_DYNAMIC_SHARED(T, name)                                  \
    extern __shared__ __align__(16) unsigned char triage_dynamic_smem[]; \
    T* name = reinterpret_cast<T*>(triage_dynamic_smem)
#endif

namespace triage {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int WARP_SIZE = 32;
/// Bytes of one vector load: `uint4`, the widest load a thread issues.
constexpr int VEC_BYTES = 16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// f32 to `T`, rounding to nearest even (what the CPU ops' `half` conversions do).
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/// Elements of `T` in one 16-byte vector.
template <typename T>
struct Vec {
    static constexpr int N = VEC_BYTES / sizeof(T);
};

/// Loads `Vec<T>::N` elements with one 16-byte load; `p` must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[Vec<T>::N]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    T elems[Vec<T>::N];
    memcpy(elems, &raw, sizeof(raw));
#pragma unroll
    for (int i = 0; i < Vec<T>::N; ++i) out[i] = to_float(elems[i]);
}

/// Elements before the first 16-byte boundary at or after `p` (0 when `p` is aligned); `p` is
/// aligned to its element size, as every pointer candle hands out is.
template <typename T>
__device__ __forceinline__ int elems_to_alignment(const T* p) {
    const unsigned misaligned_bytes = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) % VEC_BYTES);
    return misaligned_bytes == 0 ? 0 : static_cast<int>((VEC_BYTES - misaligned_bytes) / sizeof(T));
}

/// Shuffle used by the reductions; a state type overloads it to shuffle field by field.
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
    return __shfl_xor_sync(FULL_MASK, v, lane_mask);
}

struct MaxOp {
    static __device__ __forceinline__ float identity() { return -INFINITY; }
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct SumOp {
    static __device__ __forceinline__ float identity() { return 0.0f; }
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

/// Every lane of a full warp ends with the reduction of all 32 lanes (butterfly).
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
    for (int lane_mask = WARP_SIZE / 2; lane_mask > 0; lane_mask /= 2) v = op(v, shfl_xor(v, lane_mask));
    return v;
}

/// Every thread of the block ends with the reduction over all threads. The block is a whole
/// number of warps (the launch geometry guarantees it) and every thread must call this.
/// Warps reduce by shuffles, warp 0 reduces the per-warp partials; slots past the last warp
/// are never read (they hold the poison of the last launch).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
    __shared__ T warp_partials[WARP_SIZE];
    __shared__ T block_result;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    v = warp_reduce(v, op);
    if (lane == 0) warp_partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T partial = lane < num_warps ? warp_partials[lane] : identity;
        partial = warp_reduce(partial, op);
        if (lane == 0) block_result = partial;
    }
    __syncthreads();
    const T result = block_result;
    // The next call may overwrite the partials only after every thread has read its result.
    __syncthreads();
    return result;
}

}  // namespace triage
