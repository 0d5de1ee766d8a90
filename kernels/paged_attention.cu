// Paged causal attention with grouped-query heads: each query row (a decode token, or one token
// of a prefill chunk over a cached prefix) attends to keys 0..=pos of its sequence, read through
// the sequence's block table from caches laid out [num_blocks, block_size, kv_heads, head_dim].
//
// Grid (launch::paged_attention): x = (KV head, chunk of the query heads that share it), y = query
// row, z = partition of PARTITION_SIZE keys. A block serves up to MAX_GROUP query heads of one
// KV head, so each key and value row is read once for the whole group, not once per query head.
// The block first copies its partition's block-table entries into shared memory (one global
// lookup per cache block, none per key). Its threads form thread groups of `lanes` threads; a
// thread group owns one key at a time (keys g, g + num_groups, ...), and its lanes split the row
// into 16-byte vectors (lane l reads vectors l, l + lanes, ..., so consecutive lanes read
// consecutive bytes). Per key, the group's lanes reduce the dot products of every query head by
// shuffles and then fold the value row into a running max, sum and output (an online softmax:
// one pass over the keys, K and V each read once). Thread groups merge their states by shuffles
// within a warp, then warps merge theirs through shared memory, and thread i writes output
// dims i, i + blockDim, ... of the block's heads. Queries live in registers, scaled, in f32;
// accumulation is f32.
// With one partition the block writes the normalised output. With several, it writes its
// unnormalised output, max and sum per head, and paged_attention_merge_f32 combines the partitions
// by log-sum-exp (one block per head and row, threads over head dims). Partitions past a row's
// context write max = -inf and sum = 0 and are skipped by the merge; their block leaves before
// any barrier. Caches that are not 16-byte aligned are read element by element instead.
#include "common.cuh"

namespace triage {
namespace paged_attention {

constexpr int PARTITION_SIZE = 512;
/// Query heads one block serves (launch::PAGED_ATTENTION_MAX_GROUP): larger groups split over
/// several blocks along x.
constexpr int MAX_GROUP = 8;

struct Args {
    int num_heads;
    int kv_heads;
    int head_dim;
    int block_size;
    int max_blocks_per_seq;
    int num_partitions;
    float scale;
};

/// The online-softmax state of one thread for `MAX_GROUP` heads over `VECS` vectors of a row.
template <typename T, int VECS>
struct State {
    static constexpr int N = Vec<T>::N;
    float max[MAX_GROUP];
    float sum[MAX_GROUP];
    float out[MAX_GROUP][VECS][N];
};

/// `e^(from - to)`, or 0 for a state that has seen no key (`from` = -inf).
__device__ __forceinline__ float rescale(float from, float to) {
    return from == -INFINITY ? 0.0f : expf(from - to);
}

/// Loads this lane's vectors of one row (vector `lane + v * lanes` into `dst[v]`, zeros past the
/// row), 16 bytes at a time when the row is aligned.
template <typename T, int VECS>
__device__ __forceinline__ void load_row(const T* row, int lane, int lanes, int num_vecs, bool aligned,
                                         float (&dst)[VECS][Vec<T>::N]) {
    constexpr int N = Vec<T>::N;
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int vec = lane + v * lanes;
        if (vec >= num_vecs) {
#pragma unroll
            for (int i = 0; i < N; ++i) dst[v][i] = 0.0f;
        } else if (aligned) {
            load_vec(row + vec * N, dst[v]);
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) dst[v][i] = to_float(row[vec * N + i]);
        }
    }
}

/// Merges the state of the lane `lane_mask` away into this one, for `heads` heads.
template <typename T, int VECS>
__device__ __forceinline__ void merge_from_lane(State<T, VECS>& s, int lane_mask, int heads) {
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        if (h >= heads) break;
        const float other_max = shfl_xor(s.max[h], lane_mask);
        const float other_sum = shfl_xor(s.sum[h], lane_mask);
        const float max = fmaxf(s.max[h], other_max);
        const float mine = rescale(s.max[h], max), theirs = rescale(other_max, max);
        s.sum[h] = s.sum[h] * mine + other_sum * theirs;
#pragma unroll
        for (int v = 0; v < VECS; ++v) {
#pragma unroll
            for (int i = 0; i < State<T, VECS>::N; ++i) {
                const float other = shfl_xor(s.out[h][v][i], lane_mask);
                s.out[h][v][i] = s.out[h][v][i] * mine + other * theirs;
            }
        }
        s.max[h] = max;
    }
}

template <typename T, int VECS>
__device__ void attend_partition(float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_max,
                                 float* __restrict__ part_sum, const T* __restrict__ q,
                                 const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                 const unsigned* __restrict__ block_tables, const unsigned* __restrict__ row_seq,
                                 const unsigned* __restrict__ row_pos, const Args a) {
    constexpr int N = Vec<T>::N;
    const int group = a.num_heads / a.kv_heads;
    const int chunks = static_cast<int>(gridDim.x) / a.kv_heads;
    const int heads_per_block = (group + chunks - 1) / chunks;
    const int kv_head = static_cast<int>(blockIdx.x) / chunks;
    const int chunk = static_cast<int>(blockIdx.x) % chunks;
    const int first_head = kv_head * group + chunk * heads_per_block;
    const int heads = min(heads_per_block, group - chunk * heads_per_block);
    const int row = blockIdx.y, partition = blockIdx.z;
    const int context = static_cast<int>(row_pos[row]) + 1;
    const int first_key = partition * PARTITION_SIZE;
    if (first_key >= context) {  // the whole block leaves together, before any barrier
        if (threadIdx.x == 0 && a.num_partitions > 1) {
            for (int h = 0; h < heads; ++h) {
                const size_t part_idx =
                    (static_cast<size_t>(row) * a.num_heads + first_head + h) * a.num_partitions + partition;
                part_max[part_idx] = -INFINITY;
                part_sum[part_idx] = 0.0f;
            }
        }
        return;
    }
    const int num_keys = min(PARTITION_SIZE, context - first_key);

    // The partition's block-table entries, read from global memory once.
    __shared__ unsigned blocks[PARTITION_SIZE + 1];
    const unsigned* block_table = block_tables + static_cast<size_t>(row_seq[row]) * a.max_blocks_per_seq;
    const int first_block = first_key / a.block_size;
    const int num_blocks = (first_key + num_keys - 1) / a.block_size - first_block + 1;
    for (int b = threadIdx.x; b < num_blocks; b += blockDim.x) blocks[b] = block_table[first_block + b];
    __syncthreads();

    const int num_vecs = a.head_dim / N;
    const int lanes = min(WARP_SIZE, num_vecs & -num_vecs);  // a power of two that divides 32
    const int lane = threadIdx.x % lanes;
    const int thread_group = threadIdx.x / lanes;
    const int num_groups = blockDim.x / lanes;
    const size_t row_stride = static_cast<size_t>(a.kv_heads) * a.head_dim;
    const bool aligned = elems_to_alignment(k_cache) == 0 && elems_to_alignment(v_cache) == 0 &&
                         (a.head_dim * sizeof(T)) % VEC_BYTES == 0;

    float qs[MAX_GROUP][VECS][N];
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        if (h >= heads) break;
        const T* q_row = q + (static_cast<size_t>(row) * a.num_heads + first_head + h) * a.head_dim;
        load_row<T, VECS>(q_row, lane, lanes, num_vecs, false, qs[h]);
#pragma unroll
        for (int v = 0; v < VECS; ++v)
#pragma unroll
            for (int i = 0; i < N; ++i) qs[h][v][i] *= a.scale;
    }
    State<T, VECS> s;
#pragma unroll
    for (int h = 0; h < MAX_GROUP; ++h) {
        s.max[h] = -INFINITY;
        s.sum[h] = 0.0f;
#pragma unroll
        for (int v = 0; v < VECS; ++v)
#pragma unroll
            for (int i = 0; i < N; ++i) s.out[h][v][i] = 0.0f;
    }

    // Every lane of a warp runs the same number of rounds (its shuffles need all 32 lanes); a
    // thread group past the last key runs the round without a key.
    for (int base = 0; base < num_keys; base += num_groups) {
        const int j = base + thread_group;
        const bool has_key = j < num_keys;
        size_t offset = 0;
        float kv[VECS][N];
        if (has_key) {
            const int pos = first_key + j;
            const size_t slot = static_cast<size_t>(blocks[pos / a.block_size - first_block]) * a.block_size +
                                pos % a.block_size;
            offset = slot * row_stride + static_cast<size_t>(kv_head) * a.head_dim;
            load_row<T, VECS>(k_cache + offset, lane, lanes, num_vecs, aligned, kv);
        }
        float scores[MAX_GROUP];
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h) {
            if (h >= heads) break;
            float dot = 0.0f;
            if (has_key) {
#pragma unroll
                for (int v = 0; v < VECS; ++v)
#pragma unroll
                    for (int i = 0; i < N; ++i) dot += qs[h][v][i] * kv[v][i];
            }
            for (int lane_mask = lanes / 2; lane_mask > 0; lane_mask /= 2) dot += shfl_xor(dot, lane_mask);
            scores[h] = dot;
        }
        if (!has_key) continue;
        load_row<T, VECS>(v_cache + offset, lane, lanes, num_vecs, aligned, kv);
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h) {
            if (h >= heads) break;
            const float max = fmaxf(s.max[h], scores[h]);
            const float old = rescale(s.max[h], max), p = expf(scores[h] - max);
            s.sum[h] = s.sum[h] * old + p;
#pragma unroll
            for (int v = 0; v < VECS; ++v)
#pragma unroll
                for (int i = 0; i < N; ++i) s.out[h][v][i] = s.out[h][v][i] * old + p * kv[v][i];
            s.max[h] = max;
        }
    }

    // Thread groups of a warp merge by shuffles; then each warp's first group publishes its state.
    for (int lane_mask = lanes; lane_mask < WARP_SIZE; lane_mask *= 2) merge_from_lane(s, lane_mask, heads);
    TRIAGE_DYNAMIC_SHARED(float, warp_states);  // [num_warps][heads_per_block][head_dim + 2]
    const int warp = threadIdx.x / WARP_SIZE, num_warps = blockDim.x / WARP_SIZE;
    const int state_len = a.head_dim + 2;
    if (static_cast<int>(threadIdx.x % WARP_SIZE) < lanes) {
#pragma unroll
        for (int h = 0; h < MAX_GROUP; ++h) {
            if (h >= heads) break;
            float* dst = warp_states + (static_cast<size_t>(warp) * heads_per_block + h) * state_len;
#pragma unroll
            for (int v = 0; v < VECS; ++v) {
                const int vec = lane + v * lanes;
                if (vec < num_vecs)
#pragma unroll
                    for (int i = 0; i < N; ++i) dst[vec * N + i] = s.out[h][v][i];
            }
            if (lane == 0) {
                dst[a.head_dim] = s.max[h];
                dst[a.head_dim + 1] = s.sum[h];
            }
        }
    }
    __syncthreads();

    for (int e = threadIdx.x; e < heads * a.head_dim; e += blockDim.x) {
        const int h = e / a.head_dim, d = e % a.head_dim;
        float max = -INFINITY;
        for (int w = 0; w < num_warps; ++w)
            max = fmaxf(max, warp_states[(static_cast<size_t>(w) * heads_per_block + h) * state_len + a.head_dim]);
        float sum = 0.0f, acc = 0.0f;
        for (int w = 0; w < num_warps; ++w) {
            const float* src = warp_states + (static_cast<size_t>(w) * heads_per_block + h) * state_len;
            const float weight = rescale(src[a.head_dim], max);
            sum += src[a.head_dim + 1] * weight;
            acc += src[d] * weight;
        }
        const size_t head_row = static_cast<size_t>(row) * a.num_heads + first_head + h;
        if (a.num_partitions == 1) {
            out[head_row * a.head_dim + d] = acc / sum;
        } else {
            const size_t part_idx = head_row * a.num_partitions + partition;
            part_out[part_idx * a.head_dim + d] = acc;
            if (d == 0) {
                part_max[part_idx] = max;
                part_sum[part_idx] = sum;
            }
        }
    }
}

/// The kernel for the vectors a lane holds of a row: `head_dim / Vec<T>::N` vectors over at most
/// 32 lanes (launch::paged_attention refuses head dims that need more than 4 per lane).
template <typename T>
__device__ void attend(float* out, float* part_out, float* part_max, float* part_sum, const T* q, const T* k_cache,
                       const T* v_cache, const unsigned* block_tables, const unsigned* row_seq,
                       const unsigned* row_pos, const Args a) {
    const int num_vecs = a.head_dim / Vec<T>::N;
    const int lanes = min(WARP_SIZE, num_vecs & -num_vecs);
    const int per_lane = (num_vecs + lanes - 1) / lanes;
    if (per_lane <= 1)
        attend_partition<T, 1>(out, part_out, part_max, part_sum, q, k_cache, v_cache, block_tables, row_seq, row_pos, a);
    else if (per_lane <= 2)
        attend_partition<T, 2>(out, part_out, part_max, part_sum, q, k_cache, v_cache, block_tables, row_seq, row_pos, a);
    else
        attend_partition<T, 4>(out, part_out, part_max, part_sum, q, k_cache, v_cache, block_tables, row_seq, row_pos, a);
}

}  // namespace paged_attention
}  // namespace triage

#define TRIAGE_PAGED_ATTENTION(NAME, T)                                                                        \
    extern "C" __global__ void NAME(float* __restrict__ out, float* __restrict__ part_out,                    \
                                    float* __restrict__ part_max, float* __restrict__ part_sum,               \
                                    const T* __restrict__ q, const T* __restrict__ k_cache,                   \
                                    const T* __restrict__ v_cache, const unsigned* __restrict__ block_tables, \
                                    const unsigned* __restrict__ row_seq, const unsigned* __restrict__ row_pos, \
                                    int num_heads, int kv_heads, int head_dim, int block_size,                \
                                    int max_blocks_per_seq, int num_partitions, float scale) {                \
        const triage::paged_attention::Args args{num_heads,          kv_heads,       head_dim, block_size,     \
                                                 max_blocks_per_seq, num_partitions, scale};                   \
        triage::paged_attention::attend<T>(out, part_out, part_max, part_sum, q, k_cache, v_cache,            \
                                           block_tables, row_seq, row_pos, args);                             \
    }

TRIAGE_PAGED_ATTENTION(paged_attention_f32, float)
TRIAGE_PAGED_ATTENTION(paged_attention_f16, __half)
TRIAGE_PAGED_ATTENTION(paged_attention_bf16, __nv_bfloat16)

/// Combines a row's partitions: with M = max_p m_p and w_p = exp(m_p - M),
/// out = Σ_p w_p·o_p / Σ_p w_p·s_p over the partitions that hold keys of the row.
extern "C" __global__ void paged_attention_merge_f32(float* __restrict__ out, const float* __restrict__ part_out,
                                                     const float* __restrict__ part_max,
                                                     const float* __restrict__ part_sum,
                                                     const unsigned* __restrict__ row_pos, int num_heads,
                                                     int head_dim, int num_partitions) {
    const int head = blockIdx.x, row = blockIdx.y;
    const int used = (static_cast<int>(row_pos[row]) + triage::paged_attention::PARTITION_SIZE) /
                     triage::paged_attention::PARTITION_SIZE;
    const size_t first = (static_cast<size_t>(row) * num_heads + head) * num_partitions;
    float max = -INFINITY;
    for (int p = 0; p < used; ++p) max = fmaxf(max, part_max[first + p]);
    float total = 0.0f;
    for (int p = 0; p < used; ++p) total += part_sum[first + p] * expf(part_max[first + p] - max);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < used; ++p) acc += part_out[(first + p) * head_dim + i] * expf(part_max[first + p] - max);
        out[(static_cast<size_t>(row) * num_heads + head) * head_dim + i] = acc / total;
    }
}
