// Fused logits reduction: one pass over each row of [rows, vocab] logits gives max, log-sum-exp,
// entropy (nats), argmax and the top-k ids with their logprobs, packed as f32
// [max, lse, entropy, argmax, k ids, k logprobs] exactly like the CPU op in triage-ops.
//
// Grid: x = row, y = split. A row is cut into gridDim.y chunks of `chunk` logits (a multiple of
// 8, so a chunk starts on the row's 16-byte phase) and each block reduces one chunk, so a batch
// of a few rows still fills the GPU; the number of splits depends on the vocabulary only
// (launch::logits_reduce_splits), so a row's result never depends on its batch. Block: any whole
// number of warps (launch::logits_reduce).
// Each thread owns a strided share of its chunk's 16-byte vectors (4 f32 or 8 f16/bf16 logits):
// thread t reads vectors t, t + blockDim, ...; the scalar elements before the chunk's first
// 16-byte boundary (rows need not be aligned) go to the first threads, the elements after the
// last whole vector to all threads in turn. So every thread sees its ids in increasing order.
// A thread keeps an online state (max m, argmax, s = Σexp(x-m), t = Σexp(x-m)(x-m)) and a sorted
// top-k list in registers; the states merge by warp shuffles then across warps in shared memory
// (common.cuh), the top-k lists by a pairwise tree in dynamic shared memory (threads·k entries).
// With one split the block writes the packed row. With several it writes its chunk's state and
// top-k list to the partial buffers, and logits_reduce_merge_f32 (one warp per row) merges them
// the same way: the states by MergeOp, the lists by the same pairwise tree.
// Rules shared with the CPU op: NaN logits count as -inf; ties go to the lowest id (argmax and
// top-k); a row without a finite logit gives lse = -inf and NaN entropy and logprobs.
#include "common.cuh"

namespace triage {
namespace logits_reduce {

/// An empty top-k slot: worse than any real entry, -inf ones included.
constexpr unsigned NO_ID = 0xffffffffu;
constexpr int MAX_TOP_K = 20;

/// Whether (value a, id a) ranks before (value b, id b): higher value, then lower id.
__device__ __forceinline__ bool ranks_before(float a, unsigned a_id, float b, unsigned b_id) {
    return a > b || (a == b && a_id < b_id);
}

/// Running statistics relative to the running maximum `m`.
struct State {
    float m;
    float s;
    float t;
    unsigned argmax;
};

__device__ __forceinline__ State empty_state() { return State{-INFINITY, 0.0f, 0.0f, NO_ID}; }

/// The sums moved to a new reference point `to >= st.m`: s' = r·s, t' = r·t + (r·s)·(m - to).
/// In f32 the product s·(m - to) overflows to -inf when the maximum jumps by ~1e38 (then
/// r·(t + s·shift) is 0·inf = NaN, which the entropy's fmaxf would turn into 0), so r is
/// applied first, and sums that r flushes to 0 are dropped outright (`shift` may be -inf).
__device__ __forceinline__ void rescale(State& st, float to) {
    if (st.s > 0.0f) {
        const float shift = st.m - to;
        const float r = expf(shift);
        if (r > 0.0f) {
            st.t = r * st.t + (r * st.s) * shift;
            st.s = r * st.s;
        } else {
            st.s = 0.0f;
            st.t = 0.0f;
        }
    }
    st.m = to;
}

struct MergeOp {
    __device__ __forceinline__ State operator()(State a, State b) const {
        const unsigned argmax = ranks_before(b.m, b.argmax, a.m, a.argmax) ? b.argmax : a.argmax;
        const float m = fmaxf(a.m, b.m);
        rescale(a, m);
        rescale(b, m);
        return State{m, a.s + b.s, a.t + b.t, argmax};
    }
};

__device__ __forceinline__ State shfl_xor(State v, int lane_mask) {
    return State{__shfl_xor_sync(FULL_MASK, v.m, lane_mask), __shfl_xor_sync(FULL_MASK, v.s, lane_mask),
                 __shfl_xor_sync(FULL_MASK, v.t, lane_mask), __shfl_xor_sync(FULL_MASK, v.argmax, lane_mask)};
}

/// A thread's k best (value, id) pairs, best first; `len` of them are filled.
struct TopK {
    float vals[MAX_TOP_K];
    unsigned ids[MAX_TOP_K];
    int len;
};

__device__ __forceinline__ void offer(TopK& top, int k, float x, unsigned id) {
    if (k == 0 || (top.len == k && !ranks_before(x, id, top.vals[k - 1], top.ids[k - 1]))) return;
    int pos = top.len < k ? top.len : k - 1;
    while (pos > 0 && ranks_before(x, id, top.vals[pos - 1], top.ids[pos - 1])) {
        top.vals[pos] = top.vals[pos - 1];
        top.ids[pos] = top.ids[pos - 1];
        --pos;
    }
    top.vals[pos] = x;
    top.ids[pos] = id;
    if (top.len < k) ++top.len;
}

/// Folds one logit into the thread's state and top-k list.
__device__ __forceinline__ void consume(State& st, TopK& top, int k, float x, unsigned id) {
    if (isnan(x)) x = -INFINITY;
    if (ranks_before(x, id, st.m, st.argmax)) {
        if (x > st.m) rescale(st, x);
        st.argmax = id;
    }
    // exp(x - m) flushes to 0 below about -104; skipping those also avoids 0·(-inf) when
    // x - m overflows (x near -3e38, m near +3e38).
    const float d = x - st.m;
    const float e = expf(d);
    if (e > 0.0f) {
        st.s += e;
        st.t += e * d;
    }
    offer(top, k, x, id);
}

/// Merges the sorted lists at `a` and `b` (k entries each, in shared memory) into `a`.
__device__ void merge_lists(float* a_vals, unsigned* a_ids, const float* b_vals, const unsigned* b_ids, int k) {
    float vals[MAX_TOP_K];
    unsigned ids[MAX_TOP_K];
    int i = 0, j = 0;
    for (int n = 0; n < k; ++n) {
        if (ranks_before(b_vals[j], b_ids[j], a_vals[i], a_ids[i])) {
            vals[n] = b_vals[j];
            ids[n] = b_ids[j++];
        } else {
            vals[n] = a_vals[i];
            ids[n] = a_ids[i++];
        }
    }
    for (int n = 0; n < k; ++n) {
        a_vals[n] = vals[n];
        a_ids[n] = ids[n];
    }
}

/// The block's top-k: each thread writes its list (padded with empty slots), then lists merge
/// pairwise, halving the number of lists per step, until list 0 holds the block's best k.
__device__ void block_top_k(const TopK& top, int k, float* shared_vals, unsigned* shared_ids) {
    float* my_vals = shared_vals + threadIdx.x * k;
    unsigned* my_ids = shared_ids + threadIdx.x * k;
    for (int n = 0; n < k; ++n) {
        my_vals[n] = n < top.len ? top.vals[n] : -INFINITY;
        my_ids[n] = n < top.len ? top.ids[n] : NO_ID;
    }
    __syncthreads();
    for (unsigned lists = blockDim.x; lists > 1;) {
        const unsigned half = (lists + 1) / 2;
        if (threadIdx.x < lists - half) {
            const unsigned other = threadIdx.x + half;
            merge_lists(my_vals, my_ids, shared_vals + other * k, shared_ids + other * k, k);
        }
        lists = half;
        __syncthreads();
    }
}

/// The packed output row from the row's merged state and its top-k list (in shared memory).
__device__ void write_row(const State& st, const float* vals, const unsigned* ids, int k, float* dst) {
    const float log_s = logf(st.s);
    dst[0] = st.m;
    dst[1] = st.m + log_s;
    dst[2] = st.s > 0.0f ? fmaxf(log_s - st.t / st.s, 0.0f) : NAN;
    dst[3] = static_cast<float>(st.argmax);
    for (int n = 0; n < k; ++n) {
        dst[4 + n] = static_cast<float>(ids[n]);
        // (x - m) - ln s rather than x - lse: near ±3e38 one ulp of lse is ~1e31.
        dst[4 + k + n] = (vals[n] - st.m) - log_s;
    }
}

/// Where one chunk's partial result lives: `3 + k` floats (m, s, t, top-k values) and `1 + k`
/// ids (argmax, top-k ids) per (row, split).
struct Partials {
    float* f;
    unsigned* u;
};

template <typename T>
__device__ void reduce_chunk(const T* __restrict__ logits, float* __restrict__ out, Partials part, int vocab,
                             int k, int chunk) {
    const int split = blockIdx.y, splits = gridDim.y;
    const int begin = min(vocab, split * chunk);
    const int len = min(vocab, begin + chunk) - begin;
    const T* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
    const T* chunk_logits = row + begin;
    State st = empty_state();
    TopK top;
    top.len = 0;
    constexpr int N = Vec<T>::N;
    const int head = min(len, elems_to_alignment(chunk_logits));
    if (static_cast<int>(threadIdx.x) < head) consume(st, top, k, to_float(chunk_logits[threadIdx.x]), begin + threadIdx.x);
    const int num_vecs = (len - head) / N;
    for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
        float xs[N];
        load_vec(chunk_logits + head + v * N, xs);
        const unsigned first_id = begin + head + v * N;
#pragma unroll
        for (int i = 0; i < N; ++i) consume(st, top, k, xs[i], first_id + i);
    }
    for (int i = head + num_vecs * N + threadIdx.x; i < len; i += blockDim.x)
        consume(st, top, k, to_float(chunk_logits[i]), begin + i);

    st = block_reduce(st, MergeOp{}, empty_state());
    TRIAGE_DYNAMIC_SHARED(float, shared_vals);
    unsigned* shared_ids = reinterpret_cast<unsigned*>(shared_vals + blockDim.x * k);
    if (k > 0) block_top_k(top, k, shared_vals, shared_ids);
    if (threadIdx.x != 0) return;
    if (splits == 1) {
        write_row(st, shared_vals, shared_ids, k, out + static_cast<size_t>(blockIdx.x) * (4 + 2 * k));
        return;
    }
    const size_t slot = static_cast<size_t>(blockIdx.x) * splits + split;
    float* f = part.f + slot * (3 + k);
    unsigned* u = part.u + slot * (1 + k);
    f[0] = st.m;
    f[1] = st.s;
    f[2] = st.t;
    u[0] = st.argmax;
    for (int n = 0; n < k; ++n) {
        f[3 + n] = shared_vals[n];
        u[1 + n] = shared_ids[n];
    }
}

/// One row's chunks merged: thread i takes split i's state and list (threads past the splits
/// hold empty ones), then the block merges them as reduce_chunk merges its threads'.
__device__ void merge_chunks(const float* __restrict__ part_f, const unsigned* __restrict__ part_u,
                             float* __restrict__ out, int splits, int k) {
    State st = empty_state();
    TopK top;
    top.len = 0;
    if (static_cast<int>(threadIdx.x) < splits) {
        const size_t slot = static_cast<size_t>(blockIdx.x) * splits + threadIdx.x;
        const float* f = part_f + slot * (3 + k);
        const unsigned* u = part_u + slot * (1 + k);
        st = State{f[0], f[1], f[2], u[0]};
        // A chunk's list is sorted and padded with empty slots past its length.
        for (int n = 0; n < k; ++n) {
            top.vals[n] = f[3 + n];
            top.ids[n] = u[1 + n];
        }
        top.len = k;
    }
    st = block_reduce(st, MergeOp{}, empty_state());
    TRIAGE_DYNAMIC_SHARED(float, shared_vals);
    unsigned* shared_ids = reinterpret_cast<unsigned*>(shared_vals + blockDim.x * k);
    if (k > 0) block_top_k(top, k, shared_vals, shared_ids);
    if (threadIdx.x == 0)
        write_row(st, shared_vals, shared_ids, k, out + static_cast<size_t>(blockIdx.x) * (4 + 2 * k));
}

}  // namespace logits_reduce
}  // namespace triage

#define TRIAGE_LOGITS_REDUCE(NAME, T)                                                                     \
    extern "C" __global__ void NAME(const T* __restrict__ logits, float* __restrict__ out,              \
                                    float* __restrict__ part_f, unsigned* __restrict__ part_u, int vocab, \
                                    int k, int chunk) {                                                 \
        triage::logits_reduce::reduce_chunk<T>(logits, out, triage::logits_reduce::Partials{part_f, part_u}, \
                                               vocab, k, chunk);                                        \
    }

TRIAGE_LOGITS_REDUCE(logits_reduce_f32, float)
TRIAGE_LOGITS_REDUCE(logits_reduce_f16, __half)
TRIAGE_LOGITS_REDUCE(logits_reduce_bf16, __nv_bfloat16)

extern "C" __global__ void logits_reduce_merge_f32(const float* __restrict__ part_f,
                                                   const unsigned* __restrict__ part_u, float* __restrict__ out,
                                                   int splits, int k) {
    triage::logits_reduce::merge_chunks(part_f, part_u, out, splits, k);
}
