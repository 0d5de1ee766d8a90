// CUDA simulator: compiles the CUDA subset used by kernels/*.cu as C++ (g++ 12) and runs it on the CPU with checked synchronisation.
//
// Usage. Include this header (kernels/common.cuh does so under TRIAGE_CUDA_SIM) and every .cu file
// in ONE translation unit. The header defines the two extern "C" functions below (not `inline`,
// so that they are always emitted for FFI), so a second translation unit fails to link.
//
//     cudasim::Status s = cudasim::launch(grid, block, dynamic_shared_bytes,
//                                          [&] { softmax_f32(x, y, n); });
//     if (!s.ok()) fprintf(stderr, "%s\n", s.error.c_str());
//
// Files. This header is what kernels see: keywords, built-in variables and types, intrinsics,
// atomics, 16-bit floats, and the launch API. It includes fiber.h (stacks and context switches),
// shared_memory.h (finding static and guarding dynamic shared memory), scheduler.h (blocks,
// barriers, warp operations and their checks) and warp_matrix.h (mma.sync, ldmatrix and
// cp.async, which kernels reach through kernels/mma.cuh).
//
// Model. Each CUDA thread is a fiber. Blocks run one after another on the calling OS thread;
// launches from several OS threads are serialised by a mutex (static __shared__ memory is a
// single global copy). Between synchronisation points each thread runs until it blocks at a
// barrier or warp operation, or exits; fibers switch only there, so plain read-modify-write is
// atomic. In the forward and reverse orders the warps of a block also run one at a time from
// one __syncthreads to the next (first warp first, or last first), so a warp that races ahead
// of another between barriers does; the random order keeps them in step.
//
// Checks (the launch stops and returns an error naming block, thread, operation and file:line):
//   - __syncthreads reached by only part of the block: other threads exited, wait at a different
//     __syncthreads, or wait at a warp operation;
//   - a warp operation whose mask leaves out the calling lane, or names a lane that does not
//     exist (partial last warp), has exited, waits elsewhere, or waits here with another mask;
//   - a shuffle that reads a lane outside its mask, or a width that is not a power of two <= 32;
//   - no possible progress (deadlock);
//   - writes into the guards around dynamic shared memory.
// Shared memory, static and dynamic, is filled with the poison byte before every block.
//
// Configuration, per OS thread: cudasim_configure(), or else the environment, read at that
// thread's first launch: CUDASIM_ORDER=forward|reverse|random:<seed> (default forward) is the
// order in which runnable threads resume (random: a new permutation every round) and in which
// blocks run; CUDASIM_POISON=<byte> (default 0xff).
//
// Stricter than the GPU, on purpose: a shuffle may not read a lane outside its mask even if the
// value is then discarded (`v += lane + d < n ? __shfl_down_sync(m, v, d) : 0` with d reaching past
// the mask is an error; use a width or offsets that stay inside), and lanes must meet at the same
// __syncwarp call site.
//
// Kernels must avoid: `extern __shared__` (use cudasim::dynamic_shared()); implicit conversions
// and arithmetic on __half / __nv_bfloat16 (convert explicitly, compute in float); including a
// standard header after this one (the __noinline__ macro breaks libstdc++'s); __CUDA_ARCH__ (not
// defined); inline PTX (kernels/mma.cuh wraps the instructions the simulator models); exceptions; assert() (aborts the process); more than ~48 KiB of locals per
// thread (fiber stacks are CUDASIM_STACK_BYTES, 64 KiB; overflow is a segfault). A failed launch
// abandons its fibers without unwinding them. The binary must keep its symbol table (see
// shared_memory.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>  // libstdc++'s wrapper also puts isnan, isinf, ... into the global namespace.
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fiber.h"
#include "shared_memory.h"

// ---- CUDA keywords ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
// Plain `inline`: forcing inlining makes g++ -O2 emit false -Warray-bounds/-Wmaybe-uninitialized
// warnings in kernels that are correct.
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One copy for all fibers. The tag lets shared_memory.h find the variable to poison it; `used`
// keeps g++ from folding reads of a never-written variable to its zero initialiser.
#define __shared__ static __attribute__((abi_tag(CUDASIM_SHARED_TAG), used))

// ---- Built-in types ---------------------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
// CUDA's alignments, so that UBSan reports misaligned vector loads as the GPU would fault.
struct alignas(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

constexpr int warpSize = 32;

// ---- 16-bit floats (bit-exact with CUDA's round-to-nearest-even conversions) -----------------
namespace cudasim::detail {
inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// CUDA's __float2half_rn: NaN becomes 0x7fff, values from 65520 up round to infinity.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f), u = x & 0x7fffffffu, sign = (x >> 16) & 0x8000u;
  if (u >= 0x7f800000u) return uint16_t(u == 0x7f800000u ? sign | 0x7c00u : 0x7fffu);
  if (u > 0x477fefffu) return uint16_t(sign | 0x7c00u);
  if (u < 0x33000001u) return uint16_t(sign);  // At most 2^-25: rounds (ties to even) to zero.
  uint32_t result, remainder;                   // remainder: the dropped bits, left-aligned.
  if (u >= 0x38800000u) {                       // Normal half.
    result = sign | ((u - 0x38000000u) >> 13);
    remainder = u << 19;
  } else {                                      // Subnormal half: shift the implicit-1 mantissa.
    const uint32_t shift = 0x7eu - (u >> 23), mantissa = (u & 0x7fffffu) | 0x800000u;
    result = sign | (mantissa >> shift);
    remainder = mantissa << (32 - shift);
  }
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u))) ++result;
  return uint16_t(result);
}

// Exact; every NaN becomes 0x7fffffff as on the GPU.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(mantissa ? 0x7fffffffu : sign | 0x7f800000u);
  if (exponent == 0) {
    const float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// CUDA's __float2bfloat16_rn: NaN becomes 0x7fff; overflow rounds to infinity.
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
}  // namespace cudasim::detail

// Storage-only, like CUDA's types but with explicit conversions: implicit ones would silently
// compute in float where CUDA computes in half.
struct __half {
  unsigned short __x;
  __half() = default;
  explicit __half(float f) : __x(cudasim::detail::float_to_half_bits(f)) {}
  explicit operator float() const { return cudasim::detail::half_bits_to_float(__x); }
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  explicit __nv_bfloat16(float f) : __x(cudasim::detail::float_to_bf16_bits(f)) {}
  explicit operator float() const { return cudasim::detail::bits_float(uint32_t(__x) << 16); }
};
static_assert(sizeof(__half) == 2 && std::is_trivially_copyable_v<__half>);
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable_v<__nv_bfloat16>);
inline float __half2float(__half h) { return float(h); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 b; b.__x = u; return b; }

// ---- Math intrinsics --------------------------------------------------------------------------
// glibc's <math.h> already declares (without exporting) __expf, __logf, ..., so these are macros
// onto our own functions rather than competing declarations.
namespace cudasim::fast {
inline float expf(float x) { return ::expf(x); }
inline float exp10f(float x) { return ::exp10f(x); }
inline float logf(float x) { return ::logf(x); }
inline float log2f(float x) { return ::log2f(x); }
inline float powf(float x, float y) { return ::powf(x, y); }
inline float sinf(float x) { return ::sinf(x); }
inline float cosf(float x) { return ::cosf(x); }
inline float tanf(float x) { return ::tanf(x); }
}  // namespace cudasim::fast
#define __expf(x) ::cudasim::fast::expf(x)
#define __exp10f(x) ::cudasim::fast::exp10f(x)
#define __logf(x) ::cudasim::fast::logf(x)
#define __log2f(x) ::cudasim::fast::log2f(x)
#define __powf(x, y) ::cudasim::fast::powf(x, y)
#define __sinf(x) ::cudasim::fast::sinf(x)
#define __cosf(x) ::cudasim::fast::cosf(x)
#define __tanf(x) ::cudasim::fast::tanf(x)

inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }  // NaN -> 0
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned u) { return cudasim::detail::bits_float(u); }
inline unsigned __float_as_uint(float f) { return cudasim::detail::float_bits(f); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline void __threadfence() {}
inline void __threadfence_block() {}

// CUDA's global min/max overloads; non-templates, so they win over std::min under `using std`.
#define CUDASIM_MIN_MAX(A, B, R)                                                   \
  inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
  inline R max(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(b) : static_cast<R>(a); }
CUDASIM_MIN_MAX(int, int, int)
CUDASIM_MIN_MAX(unsigned, unsigned, unsigned)
CUDASIM_MIN_MAX(int, unsigned, unsigned)
CUDASIM_MIN_MAX(unsigned, int, unsigned)
CUDASIM_MIN_MAX(long, long, long)
CUDASIM_MIN_MAX(unsigned long, unsigned long, unsigned long)
CUDASIM_MIN_MAX(long long, long long, long long)
CUDASIM_MIN_MAX(unsigned long long, unsigned long long, unsigned long long)
#undef CUDASIM_MIN_MAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// ---- Atomics: fibers switch only at synchronisation points, so plain code is atomic -----------
#define CUDASIM_ATOMIC(NAME, T, EXPR)              \
  inline T NAME(T* address, T val) {               \
    const T old = *address;                        \
    *address = static_cast<T>(EXPR);               \
    return old;                                    \
  }
// Integer sums wrap as on the GPU (computed unsigned: signed overflow is undefined in C++).
CUDASIM_ATOMIC(atomicAdd, int, unsigned(old) + unsigned(val))
CUDASIM_ATOMIC(atomicAdd, unsigned, old + val)
CUDASIM_ATOMIC(atomicAdd, unsigned long long, old + val)
CUDASIM_ATOMIC(atomicAdd, float, old + val)
CUDASIM_ATOMIC(atomicAdd, double, old + val)
CUDASIM_ATOMIC(atomicSub, int, unsigned(old) - unsigned(val))
CUDASIM_ATOMIC(atomicSub, unsigned, old - val)
CUDASIM_ATOMIC(atomicMax, int, old < val ? val : old)
CUDASIM_ATOMIC(atomicMax, unsigned, old < val ? val : old)
CUDASIM_ATOMIC(atomicMax, unsigned long long, old < val ? val : old)
CUDASIM_ATOMIC(atomicMin, int, val < old ? val : old)
CUDASIM_ATOMIC(atomicMin, unsigned, val < old ? val : old)
CUDASIM_ATOMIC(atomicMin, unsigned long long, val < old ? val : old)
CUDASIM_ATOMIC(atomicAnd, unsigned, old & val)
CUDASIM_ATOMIC(atomicOr, unsigned, old | val)
CUDASIM_ATOMIC(atomicXor, unsigned, old ^ val)
CUDASIM_ATOMIC(atomicExch, int, val)
CUDASIM_ATOMIC(atomicExch, unsigned, val)
CUDASIM_ATOMIC(atomicExch, unsigned long long, val)
CUDASIM_ATOMIC(atomicExch, float, val)
#undef CUDASIM_ATOMIC
#define CUDASIM_ATOMIC_CAS(T)                          \
  inline T atomicCAS(T* address, T compare, T val) {   \
    const T old = *address;                            \
    if (old == compare) *address = val;                \
    return old;                                        \
  }
CUDASIM_ATOMIC_CAS(int)
CUDASIM_ATOMIC_CAS(unsigned)
CUDASIM_ATOMIC_CAS(unsigned long long)
#undef CUDASIM_ATOMIC_CAS

// ---- Public API ------------------------------------------------------------------------------
namespace cudasim {
struct Status {
  std::string error;  // Empty when the launch succeeded.
  bool ok() const { return error.empty(); }
};
enum class Order : int { Forward = 0, Reverse = 1, Random = 2 };  // cudasim_configure's `order`

// Runs `body` (typically `[&] { my_kernel(args...); }`) once per CUDA thread.
template <class F> Status launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, F&& body);
// The running launch's dynamic shared memory: 64-byte aligned, dynamic_shared_bytes long.
void* dynamic_shared();
}  // namespace cudasim

// The calling OS thread's last launch error, "" if it succeeded; valid until its next launch.
extern "C" const char* cudasim_last_error(void);
// Sets the calling OS thread's order (0 forward, 1 reverse, 2 random with `seed`) and poison byte
// (0..255) for its later launches, overriding CUDASIM_ORDER / CUDASIM_POISON.
extern "C" void cudasim_configure(int order, unsigned long long seed, int poison_byte);

#include "scheduler.h"
#include "warp_matrix.h"

template <class F>
cudasim::Status cudasim::launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, F&& body) {
  using Body = std::remove_reference_t<F>;
  return detail::launch_erased(grid, block, dynamic_shared_bytes,
                               [](void* p) { (*static_cast<Body*>(p))(); },
                               const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}

inline void* cudasim::dynamic_shared() {
  return detail::running_launch("cudasim::dynamic_shared()").dynamic->data();
}

// Defined, not inline, so that they are always emitted for the Rust FFI (one TU, see the top).
extern "C" const char* cudasim_last_error(void) { return cudasim::detail::t_settings.last_error.c_str(); }

extern "C" void cudasim_configure(int order, unsigned long long seed, int poison_byte) {
  cudasim::detail::ThreadSettings& s = cudasim::detail::t_settings;
  s.configured = true;
  s.config = {cudasim::Order(order), seed, (unsigned char)poison_byte, ""};
  s.rng = seed;
  if (order < 0 || order > 2)
    s.config.error = cudasim::detail::strf("cudasim_configure: order %d is not 0, 1 or 2", order);
  if (poison_byte < 0 || poison_byte > 255)
    s.config.error = cudasim::detail::strf("cudasim_configure: poison %d is not a byte", poison_byte);
}

// ---- CUDA built-in variables and intrinsics ---------------------------------------------------
inline const uint3& threadIdx = cudasim::detail::g_thread_idx;
inline const uint3& blockIdx = cudasim::detail::g_block_idx;
inline const dim3& blockDim = cudasim::detail::g_block_dim;
inline const dim3& gridDim = cudasim::detail::g_grid_dim;

namespace cudasim::detail {
// The receiver of the intrinsic macros below: carries the call site.
struct At {
  Site site;
  void syncthreads() const { arrive_and_wait(site, Op::SyncThreads, 0, 0); }
  int syncthreads_count(int pred) const { return int(arrive_and_wait(site, Op::SyncThreadsCount, 0, pred != 0)); }
  int syncthreads_and(int pred) const { return int(arrive_and_wait(site, Op::SyncThreadsAnd, 0, pred != 0)); }
  int syncthreads_or(int pred) const { return int(arrive_and_wait(site, Op::SyncThreadsOr, 0, pred != 0)); }
  void syncwarp(unsigned mask = 0xffffffffu) const { arrive_and_wait(site, Op::SyncWarp, mask, 0); }
  unsigned ballot_sync(unsigned mask, int pred) const { return unsigned(arrive_and_wait(site, Op::Ballot, mask, pred != 0)); }
  int any_sync(unsigned mask, int pred) const { return int(arrive_and_wait(site, Op::Any, mask, pred != 0)); }
  int all_sync(unsigned mask, int pred) const { return int(arrive_and_wait(site, Op::All, mask, pred != 0)); }
  template <class T> T shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) const {
    return shuffle(Op::ShflIdx, mask, v, src_lane, width);
  }
  template <class T> T shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) const {
    return shuffle(Op::ShflUp, mask, v, int(delta), width);
  }
  template <class T> T shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) const {
    return shuffle(Op::ShflDown, mask, v, int(delta), width);
  }
  template <class T> T shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) const {
    return shuffle(Op::ShflXor, mask, v, lane_mask, width);
  }
  // mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: d += a * b (warp_matrix.h).
  void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) const {
    MatrixRegs& m = running_launch("mma.sync").current->matrix;
    std::memcpy(m.a, a, sizeof m.a);
    std::memcpy(m.b, b, sizeof m.b);
    std::memcpy(m.d, d, sizeof m.d);
    m.bf16 = bf16;
    arrive_and_wait(site, Op::Mma, 0xffffffffu, 0);
    std::memcpy(d, running_launch("mma.sync").current->matrix.d, sizeof m.d);
  }
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (warp_matrix.h).
  void ldmatrix_x4(uint32_t (&out)[4], const void* row, bool trans) const {
    MatrixRegs& m = running_launch("ldmatrix.sync").current->matrix;
    m.row = row;
    m.trans = trans;
    arrive_and_wait(site, Op::Ldmatrix, 0xffffffffu, 0);
    std::memcpy(out, running_launch("ldmatrix.sync").current->matrix.out, sizeof m.out);
  }

 private:
  template <class T> T shuffle(Op op, unsigned mask, T v, int arg, int width) const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = arrive_and_wait(site, op, mask, bits, arg, width);
    std::memcpy(&v, &bits, sizeof(T));
    return v;
  }
};
}  // namespace cudasim::detail

#define CUDASIM_AT (::cudasim::detail::At{{__FILE__, __LINE__}})
#define __syncthreads() CUDASIM_AT.syncthreads()
#define __syncthreads_count(pred) CUDASIM_AT.syncthreads_count(pred)
#define __syncthreads_and(pred) CUDASIM_AT.syncthreads_and(pred)
#define __syncthreads_or(pred) CUDASIM_AT.syncthreads_or(pred)
#define __syncwarp(...) CUDASIM_AT.syncwarp(__VA_ARGS__)
#define __ballot_sync(...) CUDASIM_AT.ballot_sync(__VA_ARGS__)
#define __any_sync(...) CUDASIM_AT.any_sync(__VA_ARGS__)
#define __all_sync(...) CUDASIM_AT.all_sync(__VA_ARGS__)
#define __shfl_sync(...) CUDASIM_AT.shfl_sync(__VA_ARGS__)
#define __shfl_up_sync(...) CUDASIM_AT.shfl_up_sync(__VA_ARGS__)
#define __shfl_down_sync(...) CUDASIM_AT.shfl_down_sync(__VA_ARGS__)
#define __shfl_xor_sync(...) CUDASIM_AT.shfl_xor_sync(__VA_ARGS__)
