// Writes new K or V rows into their slots of a paged cache laid out as
// [num_blocks, block_size, kv_heads, head_dim], i.e. [num_slots, row_elems] with
// slot = block · block_size + offset, as PagedKvCache and the CPU op in triage-ops use it.
//
// Grid: one block per new token row (launch::reshape_and_cache). Threads copy the row's 16-byte
// vectors in turn when source row, destination row and row length are all 16-byte aligned, and
// element by element otherwise. The padding slot 0xffffffff writes nothing. Slots are validated
// on the host before the launch (a kernel cannot return an error), so every other slot is in range.
#include "common.cuh"

namespace triage {

constexpr unsigned PADDING_SLOT = 0xffffffffu;

template <typename T>
__device__ void reshape_and_cache(const T* __restrict__ rows, T* __restrict__ cache,
                                  const unsigned* __restrict__ slots, int row_elems) {
    const unsigned slot = slots[blockIdx.x];
    if (slot == PADDING_SLOT) return;
    const T* src = rows + static_cast<size_t>(blockIdx.x) * row_elems;
    T* dst = cache + static_cast<size_t>(slot) * row_elems;
    const bool vectorised = elems_to_alignment(src) == 0 && elems_to_alignment(dst) == 0 &&
                            (row_elems * sizeof(T)) % VEC_BYTES == 0;
    if (vectorised) {
        const int num_vecs = row_elems / Vec<T>::N;
        for (int v = threadIdx.x; v < num_vecs; v += blockDim.x)
            reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    } else {
        for (int i = threadIdx.x; i < row_elems; i += blockDim.x) dst[i] = src[i];
    }
}

}  // namespace triage

#define TRIAGE_RESHAPE_AND_CACHE(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* __restrict__ rows, T* __restrict__ cache,                  \
                                    const unsigned* __restrict__ slots, int row_elems) {                \
        triage::reshape_and_cache<T>(rows, cache, slots, row_elems);                                     \
    }

TRIAGE_RESHAPE_AND_CACHE(reshape_and_cache_f32, float)
TRIAGE_RESHAPE_AND_CACHE(reshape_and_cache_f16, __half)
TRIAGE_RESHAPE_AND_CACHE(reshape_and_cache_bf16, __nv_bfloat16)
