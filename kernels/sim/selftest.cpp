// Self-test of the CUDA simulator (cuda_sim.h): correct kernels must pass, buggy ones must be caught; one line per case.
//
// Each case runs in a forked child so that a sanitizer abort (the expected outcome of some
// cases in the -fsanitize build) ends only that case. Exit status 1 when any expectation fails.
// `selftest --bench` prints speed figures instead.
//
// Standard headers come first: cuda_sim.h's keyword macros must not reach them.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_sim.h"

using cudasim::Status;

// =============================== Correct kernels ===============================================

// What kernels/common.cuh will provide: warp and block sums (full warps only).
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T> __device__ T block_sum(T v) {
  __shared__ T warp_totals[32];
  const unsigned lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  v = warp_sum(v);
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  const unsigned num_warps = blockDim.x / warpSize;
  v = warp_sum(lane < num_warps ? warp_totals[lane] : T(0));
  __syncthreads();  // warp_totals is reused by the next call.
  return v;
}

// One block per row; each thread sums a strided slice, then the block combines.
template <typename T> __global__ void row_sum(const T* __restrict__ x, T* __restrict__ out, int num_cols) {
  const T* row = x + size_t(blockIdx.x) * num_cols;
  T acc = T(0);
  for (int c = threadIdx.x; c < num_cols; c += blockDim.x) acc += row[c];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

enum ShuffleOp { kIdx, kUp, kDown, kXor };
struct ShuffleCase { int op, width, arg; };

// One warp runs every case; each lane stores what each shuffle returned.
__global__ void shuffle_cases(const ShuffleCase* cases, int num_cases, int* out_i, double* out_d,
                              unsigned long long* out_u, float* out_f) {
  const unsigned lane = threadIdx.x;
  const int vi = int(lane) * 10 + 1;
  const double vd = 1e10 + lane + 0.25;
  const unsigned long long vu = (0xabcdull << 40) | (unsigned long long)lane << 8 | lane;
  const float vf = lane * 1.5f;
  for (int k = 0; k < num_cases; ++k) {
    const ShuffleCase c = cases[k];
    const size_t o = size_t(k) * 32 + lane;
    switch (c.op) {
      case kIdx:
        out_i[o] = __shfl_sync(0xffffffffu, vi, c.arg, c.width);
        out_d[o] = __shfl_sync(0xffffffffu, vd, c.arg, c.width);
        out_u[o] = __shfl_sync(0xffffffffu, vu, c.arg, c.width);
        out_f[o] = __shfl_sync(0xffffffffu, vf, c.arg, c.width);
        break;
      case kUp:
        out_i[o] = __shfl_up_sync(0xffffffffu, vi, c.arg, c.width);
        out_d[o] = __shfl_up_sync(0xffffffffu, vd, c.arg, c.width);
        out_u[o] = __shfl_up_sync(0xffffffffu, vu, c.arg, c.width);
        out_f[o] = __shfl_up_sync(0xffffffffu, vf, c.arg, c.width);
        break;
      case kDown:
        out_i[o] = __shfl_down_sync(0xffffffffu, vi, c.arg, c.width);
        out_d[o] = __shfl_down_sync(0xffffffffu, vd, c.arg, c.width);
        out_u[o] = __shfl_down_sync(0xffffffffu, vu, c.arg, c.width);
        out_f[o] = __shfl_down_sync(0xffffffffu, vf, c.arg, c.width);
        break;
      default:
        out_i[o] = __shfl_xor_sync(0xffffffffu, vi, c.arg, c.width);
        out_d[o] = __shfl_xor_sync(0xffffffffu, vd, c.arg, c.width);
        out_u[o] = __shfl_xor_sync(0xffffffffu, vu, c.arg, c.width);
        out_f[o] = __shfl_xor_sync(0xffffffffu, vf, c.arg, c.width);
    }
  }
}

// 48 threads: warp 0 votes as two independent half-warps, warp 1 (16 lanes) as one group.
__global__ void votes(unsigned* ballots, int* any, int* all) {
  const unsigned tid = threadIdx.x, lane = tid % 32;
  const unsigned mask = tid >= 32 ? 0x0000ffffu : lane < 16 ? 0x0000ffffu : 0xffff0000u;
  ballots[tid] = __ballot_sync(mask, tid % 3 == 0);
  any[tid] = __any_sync(mask, tid == 20);
  all[tid] = __all_sync(mask, tid < 40);
}

struct Counters {
  int i, imax, imin, cas_sum, exch_i, ticket;
  unsigned u, umax, umin;
  unsigned long long ull;
  float f, exch_f;
  double d;
};

__global__ void atomics(Counters* c, int* tickets, int* exch_prev) {
  const int gtid = int(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(&c->i, 1);
  atomicAdd(&c->u, 2u);
  atomicAdd(&c->ull, 1ull << 33);
  atomicAdd(&c->f, 0.5f);
  atomicAdd(&c->d, 0.25);
  atomicMax(&c->imax, gtid - 100);
  atomicMin(&c->imin, gtid - 100);
  atomicMax(&c->umax, unsigned(gtid) * 3);
  atomicMin(&c->umin, unsigned(gtid) + 5);
  int old = c->cas_sum, assumed;
  do {
    assumed = old;
    old = atomicCAS(&c->cas_sum, assumed, assumed + 3);
  } while (old != assumed);
  tickets[gtid] = atomicAdd(&c->ticket, 1);
  exch_prev[gtid] = atomicExch(&c->exch_i, gtid);
  atomicExch(&c->exch_f, float(gtid));
}

// Reverses each block's slice through dynamic shared memory.
__global__ void reverse_blocks(const float* in, float* out, int* misaligned) {
  float* buf = static_cast<float*>(cudasim::dynamic_shared());
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (reinterpret_cast<uintptr_t>(buf) % 16 != 0) atomicAdd(misaligned, 1);
  buf[threadIdx.x] = in[i];
  __syncthreads();
  out[i] = buf[blockDim.x - 1 - threadIdx.x];
}

// blockDim 48: the second warp has 16 lanes and must use a 16-lane mask.
__global__ void partial_warp_sum(const int* x, int* sums, unsigned* ballots) {
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const unsigned lanes = min(32u, blockDim.x - warp * 32);
  const unsigned mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  int v = x[tid];
  for (unsigned offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset);
  const unsigned ballot = __ballot_sync(mask, v > 0);
  if (lane == 0) sums[warp] = v, ballots[warp] = ballot;
}

__global__ void convert_16bit(const float* in, __half* h, __nv_bfloat16* b, float* h_back, float* b_back) {
  const unsigned i = threadIdx.x;
  h[i] = __float2half_rn(in[i]);
  b[i] = __float2bfloat16(in[i]);
  h_back[i] = __half2float(h[i]);
  b_back[i] = __bfloat162float(b[i]);
}

// 16 x 8 block: a 2-D tile through static shared memory, read back rotated by 180 degrees.
__global__ void rotate_tile(int* out) {
  __shared__ int tile[8][16];
  tile[threadIdx.y][threadIdx.x] = int(threadIdx.y * 16 + threadIdx.x);
  __syncthreads();
  out[threadIdx.y * 16 + threadIdx.x] = tile[7 - threadIdx.y][15 - threadIdx.x];
}

__global__ void barrier_votes(int* out) {
  const unsigned t = threadIdx.x;
  out[0 * blockDim.x + t] = __syncthreads_count(t % 4 == 0);
  out[1 * blockDim.x + t] = __syncthreads_and(t < 1000);
  out[2 * blockDim.x + t] = __syncthreads_and(t != 7);
  out[3 * blockDim.x + t] = __syncthreads_or(t == 100);
  out[4 * blockDim.x + t] = __syncthreads_or(0);
}

// Block 0 writes its shared memory; other blocks only read it and must see the poison.
__global__ void shared_between_blocks(unsigned* out) {
  __shared__ unsigned scratch[64];
  if (blockIdx.x == 0) scratch[threadIdx.x] = 42;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = scratch[threadIdx.x];
}

// Legal divergence: the upper half-warp shuffles among itself, then the whole warp shuffles;
// the lower half waits at a barrier while the upper half finishes a shuffle.
__global__ void diverge_then_converge(int* out) {
  const unsigned lane = threadIdx.x % 32;
  int v = int(threadIdx.x), a = 0;
  if (lane >= 16) a = __shfl_xor_sync(0xffff0000u, v, 1);
  int b = __shfl_xor_sync(0xffffffffu, v + a, 16);
  if (lane >= 16) b += __shfl_down_sync(0xffff0000u, b, 1, 16);
  __syncthreads();
  out[threadIdx.x] = b;
}

__global__ void take_tickets(int* ticket, int* thread_order, int* block_order) {
  const int t = atomicAdd(ticket, 1);
  thread_order[t] = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (threadIdx.x == 0) block_order[atomicAdd(ticket + 1, 1)] = int(blockIdx.x);
}

// =============================== Buggy kernels =================================================

__global__ void early_return(float* out) {
  __shared__ float s[256];
  if (threadIdx.x >= 200) return;  // BUG: threads 200..255 never reach the barrier.
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[255 - threadIdx.x];
}

__global__ void barrier_in_branch(float* out) {
  __shared__ float s[128];
  s[threadIdx.x] = float(threadIdx.x);
  if (threadIdx.x < 64) {
    __syncthreads();  // BUG: two different barriers.
    out[threadIdx.x] = s[127 - threadIdx.x];
  } else {
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x - 64];
  }
}

__global__ void shuffle_in_branch_then_barrier(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // BUG: half the warp.
  __syncthreads();
  out[threadIdx.x] = v;
}

__global__ void shuffle_in_branch_then_exit(int* out) {
  if (threadIdx.x % 32 < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void full_mask_partial_warp(int* out) {  // blockDim 48
  out[threadIdx.x] = warp_sum(int(threadIdx.x));  // BUG: full mask, but warp 1 has 16 lanes.
}

__global__ void lane_not_in_own_mask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xfffffffeu, int(threadIdx.x), 1);  // BUG: lane 0 missing.
}

__global__ void source_outside_mask(int* out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffff0000u;
  out[threadIdx.x] = __shfl_down_sync(mask, int(threadIdx.x), 1);  // BUG: lane 15 reads lane 16.
}

__global__ void different_shuffles(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // BUG: two call sites.
  else v = __shfl_xor_sync(0xffffffffu, v, 2);
  out[threadIdx.x] = v;
}

__global__ void different_masks(int* out) {
  const unsigned mask = threadIdx.x < 16 ? 0xffffffffu : 0xffff0000u;  // BUG: masks disagree.
  out[threadIdx.x] = __shfl_xor_sync(mask, int(threadIdx.x), 16);
}

__global__ void bad_width(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, int(threadIdx.x), 1, 12);
}

__global__ void syncwarp_vs_barrier(int* out) {
  if (threadIdx.x == 0) __syncthreads();  // BUG: the rest of the warp waits at __syncwarp.
  else __syncwarp();
  out[threadIdx.x] = 1;
}

// A shared value is written by one thread and read by another without a barrier.
__global__ void race_neighbour(int* out) {
  __shared__ int s[128];
  s[threadIdx.x] = int(threadIdx.x) * 2;
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];  // BUG: no __syncthreads.
}

__global__ void race_broadcast(int* out) {
  __shared__ int total;
  if (threadIdx.x == 0) total = 1234;
  out[threadIdx.x] = total;  // BUG: no __syncthreads.
}

__global__ void read_unwritten(unsigned* out) {
  __shared__ unsigned never_written[64];
  out[threadIdx.x] = never_written[threadIdx.x];
}

template <typename T> __device__ T read_unwritten_in_template() {
  __shared__ T never_written[64];
  return never_written[threadIdx.x];
}
__global__ void read_unwritten_template(unsigned* out) { out[threadIdx.x] = read_unwritten_in_template<unsigned>(); }

__global__ void dynamic_overflow_write() {
  float* buf = static_cast<float*>(cudasim::dynamic_shared());
  buf[threadIdx.x + 1] = 1.0f;  // BUG: the last thread writes one past the end.
}

__global__ void dynamic_overflow_read(float* out) {
  const float* buf = static_cast<const float*>(cudasim::dynamic_shared());
  out[threadIdx.x] = buf[threadIdx.x + 1];  // BUG: the last thread reads one past the end.
}

__global__ void misaligned_float4(const float* in, float* out) {
  const float4 v = reinterpret_cast<const float4*>(in + 1)[threadIdx.x];  // BUG: 4-byte aligned.
  out[threadIdx.x] = v.x + v.y + v.z + v.w;
}


// --- Warp matrix instructions (warp_matrix.h) ---

// One warp: C = A·B for A 16x16 (row-major), B given two ways, through ldmatrix and mma.sync as
// tensor-core kernels use them. B as [n][k] rows (how K is stored: 16 rows of 16), read without
// .trans, and B as [k][n] rows (how V is stored: 16 rows of 16), read with .trans; C is 16x16
// (two n-tiles of 8), written from the accumulator layout. `bf16` picks the element type.
__global__ void mma_product(const uint16_t* a, const uint16_t* b_nk, const uint16_t* b_kn, float* c_nk,
                            float* c_kn, bool bf16) {
  uint16_t* s = static_cast<uint16_t*>(cudasim::dynamic_shared());  // A, B[n][k], B[k][n]: 256 each
  const unsigned lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) s[i] = a[i], s[256 + i] = b_nk[i], s[512 + i] = b_kn[i];
  __syncwarp();
  const unsigned r = lane % 16, half = lane / 16;  // lanes 0-15 name rows at column 0, 16-31 at 8
  uint32_t fa[4], fb[4], fv[4];
  CUDASIM_AT.ldmatrix_x4(fa, s + r * 16 + half * 8, false);
  // Matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  const unsigned n = (lane / 16) * 8 + lane % 8, k = (lane / 8 % 2) * 8;
  CUDASIM_AT.ldmatrix_x4(fb, s + 256 + n * 16 + k, false);
  // Transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  const unsigned kk = (lane / 8 % 2) * 8 + lane % 8, nn = (lane / 16) * 8;
  CUDASIM_AT.ldmatrix_x4(fv, s + 512 + kk * 16 + nn, true);
  for (int tile = 0; tile < 2; ++tile) {
    float d[4] = {0.5f, 0.5f, 0.5f, 0.5f}, e[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const uint32_t bk[2] = {fb[2 * tile], fb[2 * tile + 1]}, bv[2] = {fv[2 * tile], fv[2 * tile + 1]};
    CUDASIM_AT.mma_m16n8k16(bf16, d, fa, bk);
    CUDASIM_AT.mma_m16n8k16(bf16, e, fa, bv);
    for (int i = 0; i < 4; ++i) {
      const unsigned row = lane / 4 + 8 * (i / 2), col = tile * 8 + 2 * (lane % 4) + i % 2;
      c_nk[row * 16 + col] = d[i];
      c_kn[row * 16 + col] = e[i];
    }
  }
}

// BUG: each warp reads a shared slot, then overwrites it, with no __syncthreads between the
// other warp's read and this warp's write (warp operations in between, no block barrier).
__global__ void race_between_warps(int* out) {
  __shared__ int slots[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp == 0) slots[lane] = int(lane);
  __syncthreads();
  const int before = __shfl_xor_sync(0xffffffffu, int(lane), 1);
  const int v = slots[lane];
  __syncwarp();
  slots[lane] = 1000 + int(warp);
  __syncwarp();
  out[threadIdx.x] = v + (before - int(lane ^ 1));
}

// BUG: only half the warp reaches the mma.
__global__ void mma_half_warp(float* out) {
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  if (threadIdx.x < 16) CUDASIM_AT.mma_m16n8k16(true, d, a, b);
  out[threadIdx.x] = d[0];
}

// BUG: ldmatrix from global memory.
__global__ void ldmatrix_global(const uint16_t* rows, uint32_t* out) {
  uint32_t r[4];
  CUDASIM_AT.ldmatrix_x4(r, rows + threadIdx.x * 8, false);
  out[threadIdx.x] = r[0];
}

// Each thread copies 16 bytes of `in` to shared memory with cp.async (the second half of the
// block's copies zero-filled past 8 bytes), waits, and every thread reads its neighbour's copy.
// With `wait` false it reads before waiting (BUG).
__global__ void async_copy(const float* in, float* out, bool wait) {
  float* s = static_cast<float*>(cudasim::dynamic_shared());
  const unsigned t = threadIdx.x, n = blockDim.x;
  cudasim::cp_async_16(s + 4 * t, in + 4 * t, t < n / 2 ? 16 : 8);
  cudasim::cp_async_commit();
  if (wait) cudasim::cp_async_wait(0);
  __syncthreads();
  const unsigned u = (t + 1) % n;
  for (int i = 0; i < 4; ++i) out[4 * t + i] = s[4 * u + i];
}

// =============================== Host side =====================================================

enum class Kind { Correct, Wrong, LaunchError };
struct Outcome { Kind kind; std::string detail; };

Outcome correct(std::string detail = "") { return {Kind::Correct, std::move(detail)}; }
Outcome wrong(std::string detail) { return {Kind::Wrong, std::move(detail)}; }
template <class... Args> std::string fmt(const char* f, Args... args) { return cudasim::detail::strf(f, args...); }

// Turns a launch into an outcome: the launch error if any, else what `check` says.
template <class Check> Outcome after(const Status& s, Check check) {
  if (!s.ok()) return {Kind::LaunchError, s.error};
  return check();
}
template <class T> Outcome compare(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i])) return wrong(fmt("%s[%zu] is %s, expected %s", what, i,
                                               std::to_string(got[i]).c_str(), std::to_string(want[i]).c_str()));
  return correct();
}

Outcome case_block_sum() {
  const int rows = 3, cols = 151936;
  std::vector<float> xf(size_t(rows) * cols);
  std::vector<int> xi(xf.size());
  std::vector<float> want_f(rows, 0.0f), got_f(rows);
  std::vector<int> want_i(rows, 0), got_i(rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int v = (r * 7 + c) % 17 - 8;  // small integers: every float sum is exact
      xf[size_t(r) * cols + c] = float(v), xi[size_t(r) * cols + c] = v;
      want_f[r] += float(v), want_i[r] += v;
    }
  Status s = cudasim::launch(rows, 256, 0, [&] { row_sum(xf.data(), got_f.data(), cols); });
  if (!s.ok()) return {Kind::LaunchError, s.error};
  s = cudasim::launch(rows, 256, 0, [&] { row_sum(xi.data(), got_i.data(), cols); });
  return after(s, [&] {
    Outcome o = compare("float sum", got_f, want_f);
    return o.kind == Kind::Correct ? compare("int sum", got_i, want_i) : o;
  });
}

// The CUDA Programming Guide's wording, written independently of the simulator's PTX-style rule.
int reference_source(int op, int lane, int arg, int width) {
  const int segment = lane / width * width, within = lane % width;
  switch (op) {
    case kIdx: return segment + arg % width;
    case kUp: return within >= arg ? lane - arg : lane;
    case kDown: return within + arg < width ? lane + arg : lane;
    default: {  // earlier segments may be read, later ones return the lane's own value
      const int src = lane ^ arg;
      return src / width > lane / width ? lane : src;
    }
  }
}

Outcome case_shuffles() {
  std::vector<ShuffleCase> cases;
  for (int op = kIdx; op <= kXor; ++op)
    for (int width = 1; width <= 32; width *= 2)
      for (int arg = 0; arg < 32; ++arg) cases.push_back({op, width, arg});
  const size_t n = cases.size() * 32;
  std::vector<int> oi(n);
  std::vector<double> od(n);
  std::vector<unsigned long long> ou(n);
  std::vector<float> of(n);
  const Status s = cudasim::launch(1, 32, 0, [&] {
    shuffle_cases(cases.data(), int(cases.size()), oi.data(), od.data(), ou.data(), of.data());
  });
  return after(s, [&] {
    for (size_t k = 0; k < cases.size(); ++k)
      for (int lane = 0; lane < 32; ++lane) {
        const ShuffleCase& c = cases[k];
        const int src = reference_source(c.op, lane, c.arg, c.width);
        const size_t o = k * 32 + lane;
        if (oi[o] != src * 10 + 1 || od[o] != 1e10 + src + 0.25 || of[o] != src * 1.5f ||
            ou[o] != ((0xabcdull << 40) | (unsigned long long)src << 8 | unsigned(src)))
          return wrong(fmt("op %d width %d arg %d: lane %d read lane %d, expected lane %d", c.op, c.width,
                           c.arg, lane, (oi[o] - 1) / 10, src));
      }
    return correct(fmt("%zu shuffles of 4 types", cases.size()));
  });
}

Outcome case_votes() {
  std::vector<unsigned> ballots(48), want_ballots(48);
  std::vector<int> any(48), all(48), want_any(48), want_all(48);
  const Status s = cudasim::launch(1, 48, 0, [&] { votes(ballots.data(), any.data(), all.data()); });
  for (unsigned t = 0; t < 48; ++t) {
    const unsigned first = t < 16 ? 0 : t < 32 ? 16 : 32;
    for (unsigned u = first; u < first + 16; ++u) {
      if (u % 3 == 0) want_ballots[t] |= 1u << (u % 32);
      want_any[t] |= u == 20;
    }
    want_all[t] = first + 16 <= 40;
  }
  return after(s, [&] {
    Outcome o = compare("ballot", ballots, want_ballots);
    if (o.kind == Kind::Correct) o = compare("any", any, want_any);
    return o.kind == Kind::Correct ? compare("all", all, want_all) : o;
  });
}

Outcome case_atomics() {
  const int blocks = 4, threads = 64, n = blocks * threads;
  Counters c{};
  c.imin = 1 << 30, c.umin = ~0u, c.exch_i = -1;
  std::vector<int> tickets(n), prev(n);
  const Status s = cudasim::launch(blocks, threads, 0, [&] { atomics(&c, tickets.data(), prev.data()); });
  return after(s, [&] {
    std::vector<int> sorted = tickets, chain = prev;
    std::sort(sorted.begin(), sorted.end());
    chain.push_back(c.exch_i);
    std::sort(chain.begin(), chain.end());
    for (int i = 0; i < n; ++i)
      if (sorted[i] != i || chain[i + 1] != i) return wrong("tickets or exchanges are not a permutation");
    if (c.i != n || c.u != 2u * n || c.ull != (unsigned long long)n << 33 || c.f != 0.5f * n ||
        c.d != 0.25 * n || c.imax != n - 101 || c.imin != -100 || c.umax != 3u * (n - 1) || c.umin != 5 ||
        c.cas_sum != 3 * n || c.ticket != n || chain[0] != -1 || c.exch_f < 0 || c.exch_f >= n)
      return wrong(fmt("counters i=%d u=%u f=%g d=%g imax=%d imin=%d umax=%u umin=%u cas=%d", c.i, c.u,
                       double(c.f), c.d, c.imax, c.imin, c.umax, c.umin, c.cas_sum));
    return correct();
  });
}

Outcome case_dynamic_shared() {
  const int blocks = 3, threads = 100;
  std::vector<float> in(blocks * threads), out(in.size()), want(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i) * 0.5f;
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) want[b * threads + t] = in[b * threads + threads - 1 - t];
  int misaligned = 0;
  const Status s = cudasim::launch(blocks, threads, threads * sizeof(float),
                                   [&] { reverse_blocks(in.data(), out.data(), &misaligned); });
  return after(s, [&] { return misaligned ? wrong("dynamic_shared() is not 16-byte aligned") : compare("out", out, want); });
}

Outcome case_partial_warp() {
  std::vector<int> x(48), sums(2);
  std::vector<unsigned> ballots(2);
  for (int i = 0; i < 48; ++i) x[i] = i % 5 == 0 ? -i : i;
  const Status s = cudasim::launch(1, 48, 0, [&] { partial_warp_sum(x.data(), sums.data(), ballots.data()); });
  return after(s, [&] {
    const int want0 = std::accumulate(x.begin(), x.begin() + 32, 0), want1 = std::accumulate(x.begin() + 32, x.end(), 0);
    if (sums[0] != want0 || sums[1] != want1) return wrong(fmt("sums %d %d, expected %d %d", sums[0], sums[1], want0, want1));
    if (ballots[0] != (want0 > 0 ? ~0u : 0u) || ballots[1] != (want1 > 0 ? 0xffffu : 0u))
      return wrong(fmt("ballots 0x%x 0x%x", ballots[0], ballots[1]));
    return correct();
  });
}

// Independent references: scale to the target's spacing in double and round with nearbyint.
uint16_t encode_16bit(double v, bool negative, int mantissa_bits, int min_exponent, int bias) {
  uint32_t bits = 0;
  if (v != 0) {
    const int e = std::ilogb(v);
    bits = e < min_exponent ? uint32_t(std::ldexp(v, mantissa_bits - min_exponent))
                            : uint32_t(e + bias) << mantissa_bits |
                                  (uint32_t(std::ldexp(v, mantissa_bits - e)) & ((1u << mantissa_bits) - 1));
  }
  return uint16_t(bits | (negative ? 0x8000u : 0u));
}
uint16_t reference_round(float f, int mantissa_bits, int min_exponent, int bias, double overflow) {
  const bool negative = std::signbit(f);
  const uint16_t inf = uint16_t((negative ? 0x8000u : 0u) | ((2u * bias + 1) << mantissa_bits));
  if (std::isnan(f)) return 0x7fff;
  const double a = std::fabs(double(f));
  if (std::isinf(a)) return inf;
  if (a == 0) return negative ? 0x8000 : 0;
  const int e = std::max(std::ilogb(a), min_exponent);
  const double v = std::nearbyint(std::ldexp(a, mantissa_bits - e)) * std::ldexp(1.0, e - mantissa_bits);
  return v >= overflow ? inf : encode_16bit(v, negative, mantissa_bits, min_exponent, bias);
}
uint16_t reference_half(float f) { return reference_round(f, 10, -14, 15, 65536.0); }
uint16_t reference_bf16(float f) { return reference_round(f, 7, -126, 127, std::ldexp(1.0, 128)); }
double reference_half_value(uint16_t h) {  // finite h only
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e ? std::ldexp(1024.0 + m, e - 25) : std::ldexp(double(m), -24);
  return h & 0x8000 ? -mag : mag;
}

Outcome case_16bit_conversions() {
  std::vector<float> inputs;
  uint64_t state = 12345;
  for (int i = 0; i < 400000; ++i) inputs.push_back(cudasim::detail::bits_float(uint32_t(cudasim::detail::next_random(state))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every half tie and its neighbours, both signs
    const float mid = float((reference_half_value(uint16_t(h)) + reference_half_value(uint16_t(h + 1))) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) inputs.push_back(v), inputs.push_back(-v);
  }
  for (uint32_t b = 0; b < 0x10000; ++b)  // every bf16 tie and its neighbours
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) inputs.push_back(cudasim::detail::bits_float(b << 16 | low));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f,
                  0x1.000002p-25f, 0x1.8p-25f, 3.4028235e38f, 1e-45f, 0x1.fffffep-15f})
    inputs.push_back(v);
  size_t checked = 0;
  for (float f : inputs) {
    const uint16_t h = __half_as_ushort(__float2half_rn(f)), b = __bfloat16_as_ushort(__float2bfloat16(f));
    if (h != reference_half(f)) return wrong(fmt("__float2half_rn(%a) = 0x%04x, expected 0x%04x", double(f), h, reference_half(f)));
    if (b != reference_bf16(f)) return wrong(fmt("__float2bfloat16(%a) = 0x%04x, expected 0x%04x", double(f), b, reference_bf16(f)));
    ++checked;
  }
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t u = uint16_t(bits);
    const float hf = __half2float(__ushort_as_half(u)), bf = __bfloat162float(__ushort_as_bfloat16(u));
    const bool half_nan = (u & 0x7c00) == 0x7c00 && (u & 0x3ff), bf_nan = (u & 0x7f80) == 0x7f80 && (u & 0x7f);
    if (half_nan ? __float_as_uint(hf) != 0x7fffffffu
                 : ((u & 0x7c00) != 0x7c00 && double(hf) != reference_half_value(u)) || __half_as_ushort(__float2half(hf)) != u)
      return wrong(fmt("half 0x%04x -> %a does not round-trip", u, double(hf)));
    if (__float_as_uint(bf) != bits << 16 || (!bf_nan && __bfloat16_as_ushort(__float2bfloat16_rn(bf)) != u))
      return wrong(fmt("bf16 0x%04x -> %a does not round-trip", u, double(bf)));
  }
  // The same conversions inside a kernel.
  std::vector<float> in = {1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f, 70000.0f, 0x1p-140f, 1e38f};
  std::vector<__half> h(in.size());
  std::vector<__nv_bfloat16> b(in.size());
  std::vector<float> hb(in.size()), bb(in.size());
  const Status s = cudasim::launch(1, unsigned(in.size()), 0, [&] { convert_16bit(in.data(), h.data(), b.data(), hb.data(), bb.data()); });
  return after(s, [&] {
    for (size_t i = 0; i < in.size(); ++i)
      if (__half_as_ushort(h[i]) != reference_half(in[i]) || __bfloat16_as_ushort(b[i]) != reference_bf16(in[i]) ||
          hb[i] != __half2float(h[i]) || bb[i] != __bfloat162float(b[i]))
        return wrong(fmt("kernel conversion of %a", double(in[i])));
    return correct(fmt("%zu float->16-bit values, all 65536 16-bit patterns", checked));
  });
}

Outcome case_2d_block() {
  std::vector<int> out(128), want(128);
  for (int i = 0; i < 128; ++i) want[i] = 127 - i;
  const Status s = cudasim::launch(1, dim3(16, 8), 0, [&] { rotate_tile(out.data()); });
  return after(s, [&] { return compare("out", out, want); });
}

Outcome case_barrier_votes() {
  const unsigned n = 160;
  std::vector<int> out(5 * n), want(5 * n);
  for (unsigned t = 0; t < n; ++t) want[t] = 40, want[n + t] = 1, want[2 * n + t] = 0, want[3 * n + t] = 1, want[4 * n + t] = 0;
  const Status s = cudasim::launch(1, n, 0, [&] { barrier_votes(out.data()); });
  return after(s, [&] { return compare("out", out, want); });
}

Outcome case_shared_repoisoned() {
  std::vector<unsigned> out(3 * 64), want(3 * 64, 0x5a5a5a5au);
  std::fill(want.begin(), want.begin() + 64, 42u);
  for (int order = 0; order < 2; ++order) {
    cudasim_configure(order, 0, 0x5a);
    const Status s = cudasim::launch(3, 64, 0, [&] { shared_between_blocks(out.data()); });
    if (!s.ok()) return {Kind::LaunchError, s.error};
    if (Outcome o = compare("out", out, want); o.kind != Kind::Correct) return o;
  }
  return correct();
}

Outcome case_diverge_converge() {
  std::vector<int> out(64), want(64);
  int a[64], b[64];
  for (int t = 0; t < 64; ++t) a[t] = t % 32 >= 16 ? (t ^ 1) : 0;
  for (int t = 0; t < 64; ++t) b[t] = (t ^ 16) + a[t ^ 16];
  for (int t = 0; t < 64; ++t) want[t] = t % 32 < 16 ? b[t] : b[t] + (t % 16 == 15 ? b[t] : b[t + 1]);
  const Status s = cudasim::launch(1, 64, 0, [&] { diverge_then_converge(out.data()); });
  return after(s, [&] { return compare("out", out, want); });
}

Outcome case_orders() {
  const int blocks = 8, threads = 64;
  std::vector<std::vector<int>> seen;
  for (int run = 0; run < 4; ++run) {
    const int order = std::min(run, 2);
    cudasim_configure(order, 7 + run, 0xff);  // two random runs, seeds 9 and 10
    int tickets[2] = {0, 0};
    std::vector<int> thread_order(blocks * threads), block_order(blocks);
    const Status s = cudasim::launch(blocks, threads, 0, [&] { take_tickets(tickets, thread_order.data(), block_order.data()); });
    if (!s.ok()) return {Kind::LaunchError, s.error};
    for (int b = 0; b < blocks; ++b) {
      const int blk = order == 1 ? blocks - 1 - b : b;
      if (order < 2 && block_order[b] != blk) return wrong(fmt("order %d: block %d ran at position %d", order, block_order[b], b));
      for (int t = 0; t < threads && order < 2; ++t) {
        const int want = block_order[b] * threads + (order == 1 ? threads - 1 - t : t);
        if (thread_order[b * threads + t] != want) return wrong(fmt("order %d: thread %d ran at position %d", order, thread_order[b * threads + t], b * threads + t));
      }
    }
    thread_order.insert(thread_order.end(), block_order.begin(), block_order.end());
    seen.push_back(thread_order);
  }
  std::vector<int> sorted = seen[2];
  std::sort(sorted.begin(), sorted.begin() + blocks * threads);
  for (int i = 0; i < blocks * threads; ++i)
    if (sorted[i] != i) return wrong("random order is not a permutation");
  if (seen[2] == seen[0] || seen[2] == seen[1] || seen[2] == seen[3])
    return wrong("random order repeats forward, reverse or itself");
  return correct();
}

// Launches from several OS threads at once: each thread keeps its own order and poison, and the
// launches take turns (static shared memory exists once).
Outcome case_parallel_launches() {
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([k, &errors] {
      cudasim_configure(k % 3, uint64_t(k), k * 0x30);
      const int cols = 5000 + k;
      std::vector<int> x(cols, k + 1), out(1);
      for (int rep = 0; rep < 20 && errors[k].empty(); ++rep) {
        const Status s = cudasim::launch(1, 128, 0, [&] { row_sum(x.data(), out.data(), cols); });
        if (!s.ok()) errors[k] = s.error;
        else if (out[0] != cols * (k + 1)) errors[k] = fmt("thread %d: sum %d", k, out[0]);
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) return {e.find("cudasim:") == 0 ? Kind::LaunchError : Kind::Wrong, e};
  return correct();
}

Outcome case_nested_launch() {
  std::string inner;
  const Status s = cudasim::launch(1, 1, 0, [&] { inner = cudasim::launch(1, 1, 0, [] {}).error; });
  if (!s.ok()) return {Kind::LaunchError, s.error};
  return inner.empty() ? correct("inner launch succeeded") : Outcome{Kind::LaunchError, inner};
}

// --- Buggy cases ---

template <class K> Outcome launch_only(dim3 grid, dim3 block, size_t dyn, K kernel) {
  return after(cudasim::launch(grid, block, dyn, kernel), [] { return correct("launch succeeded"); });
}
std::vector<float> g_floats(4096, 1.0f);
std::vector<int> g_ints(4096);

Outcome case_early_return() { return launch_only(2, 256, 0, [] { early_return(g_floats.data()); }); }
Outcome case_barrier_in_branch() { return launch_only(1, 128, 0, [] { barrier_in_branch(g_floats.data()); }); }
Outcome case_shuffle_branch_barrier() { return launch_only(1, 64, 0, [] { shuffle_in_branch_then_barrier(g_ints.data()); }); }
Outcome case_shuffle_branch_exit() { return launch_only(1, 64, 0, [] { shuffle_in_branch_then_exit(g_ints.data()); }); }
Outcome case_full_mask_partial() { return launch_only(1, 48, 0, [] { full_mask_partial_warp(g_ints.data()); }); }
Outcome case_not_in_own_mask() { return launch_only(1, 32, 0, [] { lane_not_in_own_mask(g_ints.data()); }); }
Outcome case_source_outside_mask() { return launch_only(1, 32, 0, [] { source_outside_mask(g_ints.data()); }); }
Outcome case_different_shuffles() { return launch_only(1, 32, 0, [] { different_shuffles(g_ints.data()); }); }
Outcome case_different_masks() { return launch_only(1, 32, 0, [] { different_masks(g_ints.data()); }); }
Outcome case_bad_width() { return launch_only(1, 32, 0, [] { bad_width(g_ints.data()); }); }
Outcome case_syncwarp_vs_barrier() { return launch_only(1, 32, 0, [] { syncwarp_vs_barrier(g_ints.data()); }); }
Outcome case_block_too_big() { return launch_only(1, 1025, 0, [] {}); }
Outcome case_dynamic_overflow_write() { return launch_only(2, 64, 64 * sizeof(float), [] { dynamic_overflow_write(); }); }
Outcome case_dynamic_overflow_read() { return launch_only(1, 64, 64 * sizeof(float), [] { dynamic_overflow_read(g_floats.data()); }); }
Outcome case_misaligned_float4() { return launch_only(1, 32, 0, [] { misaligned_float4(g_floats.data(), g_floats.data() + 1024); }); }
Outcome case_bad_env() {
  setenv("CUDASIM_ORDER", "sideways", 1);
  return launch_only(1, 32, 0, [] {});
}


// Random 16-bit values of the type (no NaN or infinity) and their floats.
std::vector<uint16_t> random16(size_t n, bool bf16, uint64_t seed, std::vector<float>& as_float) {
  std::vector<uint16_t> bits(n);
  as_float.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = float(int(cudasim::detail::next_random(seed) % 2001) - 1000) / 250.0f;
    bits[i] = bf16 ? cudasim::detail::float_to_bf16_bits(x) : cudasim::detail::float_to_half_bits(x);
    as_float[i] = cudasim::detail::element16(bits[i], 0, bf16);
  }
  return bits;
}

Outcome case_mma_product() {
  for (bool bf16 : {false, true}) {
    std::vector<float> af, bf, vf;
    const std::vector<uint16_t> a = random16(256, bf16, 1, af), b_nk = random16(256, bf16, 2, bf),
                                b_kn = random16(256, bf16, 3, vf);
    std::vector<float> c_nk(256), c_kn(256);
    const Status s = cudasim::launch(1, 32, 3 * 256 * 2, [&] {
      mma_product(a.data(), b_nk.data(), b_kn.data(), c_nk.data(), c_kn.data(), bf16);
    });
    if (!s.ok()) return {Kind::LaunchError, s.error};
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 16; ++col) {
        double want_nk = 0.5, want_kn = 0.5;
        for (int k = 0; k < 16; ++k) {
          want_nk += double(af[row * 16 + k]) * bf[col * 16 + k];
          want_kn += double(af[row * 16 + k]) * vf[k * 16 + col];
        }
        const float got_nk = c_nk[row * 16 + col], got_kn = c_kn[row * 16 + col];
        if (std::fabs(got_nk - want_nk) > 1e-4 * (1 + std::fabs(want_nk)) ||
            std::fabs(got_kn - want_kn) > 1e-4 * (1 + std::fabs(want_kn)))
          return wrong(fmt("%s C[%d][%d]: %g and %g, expected %g and %g", bf16 ? "bf16" : "f16", row, col,
                           got_nk, got_kn, want_nk, want_kn));
      }
  }
  return correct();
}

Outcome case_async_copy(bool wait) {
  const int n = 64;
  std::vector<float> in(4 * n), want(4 * n);
  for (int i = 0; i < 4 * n; ++i) in[i] = float(i + 1);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < 4; ++i) {
      const int u = (t + 1) % n;
      want[4 * t + i] = u < n / 2 || i < 2 ? in[4 * u + i] : 0.0f;
    }
  std::string seen;
  for (int order : {0, 1}) {
    cudasim_configure(order, 0, 0xff);
    std::vector<float> out(4 * n);
    const Status s = cudasim::launch(1, n, 4 * n * sizeof(float), [&] { async_copy(in.data(), out.data(), wait); });
    if (!s.ok()) return {Kind::LaunchError, s.error};
    const Outcome o = compare("out", out, want);
    if (o.kind == Kind::Wrong) seen += std::string(seen.empty() ? "" : "; ") + (order ? "reverse: " : "forward: ") + o.detail;
  }
  return seen.empty() ? correct("right values under both orders") : wrong(seen);
}
Outcome case_async_copy_waited() { return case_async_copy(true); }
Outcome case_async_copy_unwaited() { return case_async_copy(false); }
Outcome case_mma_half_warp() { return launch_only(1, 32, 0, [] { mma_half_warp(g_floats.data()); }); }
Outcome case_ldmatrix_global() {
  static std::vector<uint16_t> rows(32 * 8);
  return launch_only(1, 32, 64, [] { ldmatrix_global(rows.data(), reinterpret_cast<uint32_t*>(g_ints.data())); });
}

// A race must give a wrong value under forward or reverse order.
template <class K> Outcome race(unsigned threads, const std::vector<int>& want, K kernel) {
  std::string seen;
  for (int order : {0, 1}) {
    cudasim_configure(order, 0, 0xff);
    std::vector<int> out(threads);
    const Status s = cudasim::launch(1, threads, 0, [&] { kernel(out.data()); });
    if (!s.ok()) return {Kind::LaunchError, s.error};
    const Outcome o = compare("out", out, want);
    if (o.kind == Kind::Wrong) seen += std::string(seen.empty() ? "" : "; ") + (order ? "reverse: " : "forward: ") + o.detail;
  }
  return seen.empty() ? correct("right values under both orders") : wrong(seen);
}
Outcome case_race_neighbour() {
  std::vector<int> want(128);
  for (int t = 0; t < 128; ++t) want[t] = (t + 1) % 128 * 2;
  return race(128, want, [](int* out) { race_neighbour(out); });
}
Outcome case_race_between_warps() {
  std::vector<int> want(64);
  for (int t = 0; t < 64; ++t) want[t] = t % 32;
  return race(64, want, [](int* out) { race_between_warps(out); });
}
Outcome case_race_broadcast() { return race(64, std::vector<int>(64, 1234), [](int* out) { race_broadcast(out); }); }

// Unwritten shared memory must read as the poison: different with 0xff and 0x00.
template <class K> Outcome unwritten(K kernel) {
  unsigned got[2][64];
  for (int p = 0; p < 2; ++p) {
    cudasim_configure(0, 0, p ? 0x00 : 0xff);
    const Status s = cudasim::launch(1, 64, 0, [&] { kernel(got[p]); });
    if (!s.ok()) return {Kind::LaunchError, s.error};
  }
  for (int t = 0; t < 64; ++t)
    if (got[0][t] != 0xffffffffu || got[1][t] != 0u) return correct(fmt("thread %d read 0x%08x and 0x%08x", t, got[0][t], got[1][t]));
  return wrong("reads 0xffffffff with poison 0xff and 0x00000000 with poison 0x00");
}
Outcome case_unwritten() { return unwritten([](unsigned* out) { read_unwritten(out); }); }
Outcome case_unwritten_template() { return unwritten([](unsigned* out) { read_unwritten_template(out); }); }

// =============================== Runner ========================================================

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // The script builds ASan and UBSan together.
#else
constexpr bool kSanitized = false;
#endif

enum class Expect { Correct, Wrong, LaunchError, Sanitizer, ErrorOrSanitizer };
struct Case { const char* name; Expect expect; const char* error_has; Outcome (*run)(); };

const Case kCases[] = {
    {"block sum (shuffles + template shared)", Expect::Correct, "", case_block_sum},
    {"shuffle idx/up/down/xor x widths", Expect::Correct, "", case_shuffles},
    {"ballot/any/all, half-warp groups", Expect::Correct, "", case_votes},
    {"atomics", Expect::Correct, "", case_atomics},
    {"dynamic shared memory", Expect::Correct, "", case_dynamic_shared},
    {"partial last warp (48 threads)", Expect::Correct, "", case_partial_warp},
    {"f16/bf16 conversions", Expect::Correct, "", case_16bit_conversions},
    {"2-D block", Expect::Correct, "", case_2d_block},
    {"__syncthreads_count/and/or", Expect::Correct, "", case_barrier_votes},
    {"static shared re-poisoned per block", Expect::Correct, "", case_shared_repoisoned},
    {"legal divergence then convergence", Expect::Correct, "", case_diverge_converge},
    {"thread and block orders", Expect::Correct, "", case_orders},
    {"parallel launches from 4 OS threads", Expect::Correct, "", case_parallel_launches},
    {"ldmatrix (+ .trans) and mma.sync m16n8k16", Expect::Correct, "", case_mma_product},
    {"cp.async, waited for", Expect::Correct, "", case_async_copy_waited},
    {"BUG early return before barrier", Expect::LaunchError, "has exited", case_early_return},
    {"BUG __syncthreads in divergent branch", Expect::LaunchError, "instead; every thread", case_barrier_in_branch},
    {"BUG shuffle in branch, then barrier", Expect::LaunchError, "which waits at __syncthreads", case_shuffle_branch_barrier},
    {"BUG shuffle in branch, then exit", Expect::LaunchError, "which has exited", case_shuffle_branch_exit},
    {"BUG full mask in 16-lane warp", Expect::LaunchError, "does not exist", case_full_mask_partial},
    {"BUG lane not in its own mask", Expect::LaunchError, "does not include the calling lane", case_not_in_own_mask},
    {"BUG shuffle source outside mask", Expect::LaunchError, "reads lane 16, which is not in the mask", case_source_outside_mask},
    {"BUG two shuffle call sites", Expect::LaunchError, "which waits at __shfl_xor_sync", case_different_shuffles},
    {"BUG masks disagree", Expect::LaunchError, "with mask", case_different_masks},
    {"BUG width 12", Expect::LaunchError, "not a power of two", case_bad_width},
    {"BUG __syncwarp vs __syncthreads", Expect::LaunchError, "which waits at __syncthreads", case_syncwarp_vs_barrier},
    {"BUG 1025-thread block", Expect::LaunchError, "is not 1 to 1024 threads", case_block_too_big},
    {"BUG bad CUDASIM_ORDER", Expect::LaunchError, "CUDASIM_ORDER=sideways", case_bad_env},
    {"BUG launch from inside a kernel", Expect::LaunchError, "called from inside a kernel", case_nested_launch},
    {"BUG race: neighbour without barrier", Expect::Wrong, "", case_race_neighbour},
    {"BUG race: broadcast without barrier", Expect::Wrong, "", case_race_broadcast},
    {"BUG race: warps apart between barriers", Expect::Wrong, "", case_race_between_warps},
    {"BUG read of unwritten shared", Expect::Wrong, "", case_unwritten},
    {"BUG cp.async read before its wait", Expect::Wrong, "", case_async_copy_unwaited},
    {"BUG mma.sync on half a warp", Expect::LaunchError, "which has exited", case_mma_half_warp},
    {"BUG ldmatrix from global memory", Expect::LaunchError, "outside the block's", case_ldmatrix_global},
    {"BUG read of unwritten shared (template)", Expect::Wrong, "", case_unwritten_template},
    {"BUG dynamic shared overflow write", Expect::ErrorOrSanitizer, "outside its 256 bytes of dynamic shared", case_dynamic_overflow_write},
    {"BUG dynamic shared overflow read", Expect::Sanitizer, "", case_dynamic_overflow_read},
    {"BUG misaligned float4 load", Expect::Sanitizer, "", case_misaligned_float4},
};

// What a forked child reported: its outcome, or how it died; `output` is all it wrote to stderr.
struct Observed { std::string kind, detail, output; };

Observed run_in_child(const Case& c) {
  int fds[2];
  if (pipe(fds) != 0) return {"harness error", "pipe", ""};
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);  // sanitizer reports go to stderr
    const Outcome o = c.run();
    const char* kind = o.kind == Kind::Correct ? "correct" : o.kind == Kind::Wrong ? "wrong result" : "launch error";
    const std::string line = std::string("@@") + kind + "\t" + o.detail + "\n";
    if (write(fds[1], line.data(), line.size()) != ssize_t(line.size())) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t at = text.find("@@");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && at != std::string::npos) {
    const size_t tab = text.find('\t', at), end = text.find('\n', tab);
    return {text.substr(at + 2, tab - at - 2), text.substr(tab + 1, end - tab - 1), text.substr(0, at)};
  }
  for (const char* marker : {"runtime error:", "ERROR: AddressSanitizer"}) {
    const size_t m = text.find(marker);
    if (m == std::string::npos) continue;
    const size_t start = text.rfind('\n', m) + 1;
    return {"sanitizer report", text.substr(start, text.find('\n', m) - start), text};
  }
  return {"crash", WIFSIGNALED(status) ? fmt("signal %d", WTERMSIG(status)) : fmt("exit status %d", WEXITSTATUS(status)), text};
}

bool meets(const Case& c, const Observed& o, std::string& expected) {
  const bool has = o.detail.find(c.error_has) != std::string::npos;
  switch (c.expect) {
    case Expect::Correct: expected = "correct"; return o.kind == "correct";
    case Expect::Wrong: expected = "wrong result"; return o.kind == "wrong result";
    case Expect::LaunchError: expected = std::string("launch error with \"") + c.error_has + "\""; return o.kind == "launch error" && has;
    case Expect::ErrorOrSanitizer:
      expected = std::string("launch error with \"") + c.error_has + "\"" + (kSanitized ? " or sanitizer report" : "");
      return (o.kind == "launch error" && has) || (kSanitized && o.kind == "sanitizer report");
    case Expect::Sanitizer:
      expected = kSanitized ? "sanitizer report" : "anything (sanitizer build only)";
      return !kSanitized || o.kind == "sanitizer report";
  }
  return false;
}

// =============================== Benchmarks ====================================================

__global__ void many_barriers(int rounds) {
  for (int i = 0; i < rounds; ++i) __syncthreads();
}
__global__ void scale(float* x) { x[blockIdx.x * blockDim.x + threadIdx.x] *= 2.0f; }

template <class F> double seconds(F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int bench() {
  const int rounds = 2000;
  double t = seconds([&] { (void)cudasim::launch(1, 256, 0, [&] { many_barriers(rounds); }); });
  printf("context switches: %.1f M/s (256 threads x %d barriers: %.3f s; a resume and a suspend per thread per barrier)\n",
         2.0 * 256 * (rounds + 1) / t / 1e6, rounds, t);

  const int cols = 151936, reps = 200;
  std::vector<float> row(cols, 0.5f), out(1);
  t = seconds([&] { for (int r = 0; r < reps; ++r) (void)cudasim::launch(1, 256, 0, [&] { row_sum(row.data(), out.data(), cols); }); });
  volatile float sink = 0;
  const double plain = seconds([&] { for (int r = 0; r < reps; ++r) { float acc = 0; for (float v : row) acc += v; sink = sink + acc; } });
  printf("block reduction: %.1f us per launch (256 threads over %d floats; a plain loop takes %.1f us)\n",
         t / reps * 1e6, cols, plain / reps * 1e6);

  std::vector<float> x(4096 * 256, 1.0f);
  t = seconds([&] { (void)cudasim::launch(4096, 256, 0, [&] { scale(x.data()); }); });
  printf("elementwise: %.2f us per 256-thread block (4096 blocks)\n", t / 4096 * 1e6);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
  int failures = 0;
  for (const Case& c : kCases) {
    const Observed o = run_in_child(c);
    std::string expected;
    const bool ok = meets(c, o, expected);
    failures += !ok;
    printf("%s %-42s expected: %s; observed: %s%s%s\n", ok ? "ok  " : "FAIL", c.name, expected.c_str(),
           o.kind.c_str(), o.detail.empty() ? "" : ": ", o.detail.c_str());
    if (!ok && !o.output.empty()) printf("---- its output:\n%s----\n", o.output.c_str());
  }
  printf("%d of %zu cases failed\n", failures, sizeof kCases / sizeof kCases[0]);
  return failures ? 1 : 0;
}
