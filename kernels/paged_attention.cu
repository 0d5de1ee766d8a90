// Paged causal attention with grouped-query heads: each query row (a decode token, or one token
// of a prefill chunk over a cached prefix) attends to keys 0..=pos of its sequence, read through
// the sequence's block table from caches laid out [num_blocks, block_size, kv_heads, head_dim].
//
// Grid (launch::paged_attention): x = query head, y = query row, z = partition of PARTITION_SIZE
// keys. A block scores its partition's keys: warp w takes keys w, w + num_warps, ..., its lanes
// split the head dimension (consecutive lanes read consecutive elements of a key row) and a warp
// reduction gives the dot product. Scores sit in shared memory; block reductions give their max
// and the sum of exponentials; then thread i accumulates output dims i, i + blockDim, ... over
// the partition's values (again consecutive threads read consecutive elements).
// With one partition the block writes the normalised output. With several, it writes its
// unnormalised output, max and sum, and paged_attention_merge_f32 combines the partitions by
// log-sum-exp (one block per head and row, threads over head dims). Partitions past a row's
// context write max = -inf and sum = 0 and are skipped by the merge. Accumulation is f32.
#include "common.cuh"

namespace triage {
namespace paged_attention {

constexpr int PARTITION_SIZE = 512;

struct Args {
    int num_heads;
    int kv_heads;
    int head_dim;
    int block_size;
    int max_blocks_per_seq;
    int num_partitions;
    float scale;
};

/// Offset of key `pos`'s row for KV head `kv_head` in a cache, through the block table.
__device__ __forceinline__ size_t key_offset(const unsigned* block_table, int pos, int kv_head, const Args& a) {
    const size_t slot = static_cast<size_t>(block_table[pos / a.block_size]) * a.block_size + pos % a.block_size;
    return (slot * a.kv_heads + kv_head) * a.head_dim;
}

template <typename T>
__device__ void attend_partition(float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_max,
                                 float* __restrict__ part_sum, const T* __restrict__ q,
                                 const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                 const unsigned* __restrict__ block_tables, const unsigned* __restrict__ row_seq,
                                 const unsigned* __restrict__ row_pos, const Args a) {
    const int head = blockIdx.x, row = blockIdx.y, partition = blockIdx.z;
    const int context = static_cast<int>(row_pos[row]) + 1;
    const int first_key = partition * PARTITION_SIZE;
    const size_t part_idx = (static_cast<size_t>(row) * a.num_heads + head) * a.num_partitions + partition;
    if (first_key >= context) {  // the whole block leaves together, before any barrier
        if (threadIdx.x == 0 && a.num_partitions > 1) {
            part_max[part_idx] = -INFINITY;
            part_sum[part_idx] = 0.0f;
        }
        return;
    }
    const int num_keys = min(PARTITION_SIZE, context - first_key);
    const int kv_head = head / (a.num_heads / a.kv_heads);
    const unsigned* block_table = block_tables + static_cast<size_t>(row_seq[row]) * a.max_blocks_per_seq;

    TRIAGE_DYNAMIC_SHARED(float, q_row);  // [head_dim] then [PARTITION_SIZE] scores
    float* scores = q_row + a.head_dim;
    const T* q_src = q + (static_cast<size_t>(row) * a.num_heads + head) * a.head_dim;
    for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) q_row[i] = to_float(q_src[i]) * a.scale;
    __syncthreads();

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    for (int j = warp; j < num_keys; j += num_warps) {
        const T* key = k_cache + key_offset(block_table, first_key + j, kv_head, a);
        float dot = 0.0f;
        for (int i = lane; i < a.head_dim; i += WARP_SIZE) dot += q_row[i] * to_float(key[i]);
        dot = warp_reduce(dot, SumOp{});
        if (lane == 0) scores[j] = dot;
    }
    __syncthreads();

    float local_max = MaxOp::identity();
    for (int j = threadIdx.x; j < num_keys; j += blockDim.x) local_max = fmaxf(local_max, scores[j]);
    const float max = block_reduce(local_max, MaxOp{}, MaxOp::identity());
    float local_sum = SumOp::identity();
    for (int j = threadIdx.x; j < num_keys; j += blockDim.x) {
        const float p = expf(scores[j] - max);
        scores[j] = p;
        local_sum += p;
    }
    const float sum = block_reduce(local_sum, SumOp{}, SumOp::identity());  // its barriers publish `scores`

    for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < num_keys; ++j)
            acc += scores[j] * to_float(v_cache[key_offset(block_table, first_key + j, kv_head, a) + i]);
        if (a.num_partitions == 1) {
            out[(static_cast<size_t>(row) * a.num_heads + head) * a.head_dim + i] = acc / sum;
        } else {
            part_out[part_idx * a.head_dim + i] = acc;
        }
    }
    if (threadIdx.x == 0 && a.num_partitions > 1) {
        part_max[part_idx] = max;
        part_sum[part_idx] = sum;
    }
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
        triage::paged_attention::attend_partition<T>(out, part_out, part_max, part_sum, q, k_cache, v_cache,  \
                                                     block_tables, row_seq, row_pos, args);                   \
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
