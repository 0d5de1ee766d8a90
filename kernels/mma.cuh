// Tensor-core building blocks (sm_80+): mma.sync m16n8k16 with f32 accumulators, ldmatrix x4 and
// cp.async, as inline PTX for nvcc, or as the simulator's models (sim/warp_matrix.h, which states
// the fragment layouts) under TRIAGE_CUDA_SIM. The macros carry the call site into the
// simulator, which checks that every lane of the warp reaches the same one.
//
//   TRIAGE_MMA_16816(T, d, a, b)      d[4] += A(a[4]) * B(b[2]); T is __nv_bfloat16 or __half
//   TRIAGE_LDMATRIX_X4(r, row)        r[4] from four 8x8 matrices of 16-bit elements in shared memory
//   TRIAGE_LDMATRIX_X4_TRANS(r, row)  the same, each matrix transposed
//   cp_async_16(dst, src, src_bytes)  16 bytes global -> shared, zero-filled past src_bytes
//   cp_async_commit(), cp_async_wait<N>()
#pragma once

#include "common.cuh"

#if defined(TRIAGE_CUDA_SIM)

#define TRIAGE_MMA_16816(T, d, a, b) CUDASIM_AT.mma_m16n8k16(std::is_same_v<T, __nv_bfloat16>, d, a, b)
#define TRIAGE_LDMATRIX_X4(r, row) CUDASIM_AT.ldmatrix_x4(r, row, false)
#define TRIAGE_LDMATRIX_X4_TRANS(r, row) CUDASIM_AT.ldmatrix_x4(r, row, true)

namespace triage {
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, unsigned src_bytes) {
    ::cudasim::cp_async_16(dst, src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { ::cudasim::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    ::cudasim::cp_async_wait(N);
}
}  // namespace triage

#else

#define TRIAGE_MMA_16816(T, d, a, b) ::triage::mma_16816<T>(d, a, b)
#define TRIAGE_LDMATRIX_X4(r, row) ::triage::ldmatrix_x4(r, row)
#define TRIAGE_LDMATRIX_X4_TRANS(r, row) ::triage::ldmatrix_x4_trans(r, row)

namespace triage {

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, unsigned src_bytes) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace triage

#endif
