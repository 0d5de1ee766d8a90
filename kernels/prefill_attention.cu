// Prefill attention on tensor cores over the paged cache: the query rows of a prefill chunk (and
// any decode rows beside them) attend causally to their sequence's keys, the cached prefix and the
// chunk alike, read through the block table from caches laid out
// [num_blocks, block_size, kv_heads, head_dim]. The chunk's K/V is in the cache already.
//
// Grid (launch::prefill_attention): x = query tile, y = KV head, z = partition of PARTITION_SIZE
// keys (one partition unless the host split a short chunk over a long context). A tile is
// `16 · warps` consecutive (row, query head) pairs of one sequence, m = local_row · group + h for
// the `group` query heads sharing the KV head: the whole group attends through one block, so each
// K/V tile is loaded once for the group (tiles[3x] = the sequence's first row, its row count and
// the tile's first m). A sequence's rows hold consecutive positions in order
// (PagedAttentionMetadata::kernel_rows), so the tile's last row has its largest position.
// Warp w owns m rows [16w, 16w + 16) of the tile and keeps their queries as mma A fragments,
// their scores, online-softmax state and output in registers (FlashAttention-2's schedule). Keys
// run in tiles of BLOCK_N = 64: the block copies a K tile and a V tile into shared memory with
// 16-byte cp.async (rows padded by 8 elements so that ldmatrix is free of bank conflicts; keys
// past the tile's context are zero-filled, never read), the V copy overlapping the QKᵀ mma and
// the next K copy overlapping the PV mma. Scores are f32 (mma.sync m16n8k16, bf16/f16 inputs,
// f32 accumulators), scaled by scale·log2(e) and exponentiated with exp2f; P is rounded to the
// input type for the PV mma, as FlashAttention does. Rows past the tile or keys past a row's
// position are masked to -inf; a row that has seen no key keeps max -inf and weight 0.
// One partition: the block writes the normalised f32 output [rows, heads, head_dim]. Several:
// it writes each row's unnormalised output, max (natural-log units) and sum per partition, laid
// out as paged_attention's, and paged_attention_merge_f32 combines them.
#include "mma.cuh"

namespace triage {
namespace prefill_attention {

constexpr int PARTITION_SIZE = 512;
constexpr int BLOCK_N = 64;
/// Elements each shared K/V row is padded by: rows 16 bytes apart in bank phase.
constexpr int PAD = 8;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

struct Args {
    int num_heads;
    int kv_heads;
    int block_size;
    int max_blocks_per_seq;
    int num_partitions;
    float scale;
};

/// Two values of `T` in one 32-bit register, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    const T a = from_float<T>(lo), b = from_float<T>(hi);
    uint16_t ua, ub;
    memcpy(&ua, &a, 2);
    memcpy(&ub, &b, 2);
    return static_cast<uint32_t>(ua) | static_cast<uint32_t>(ub) << 16;
}

/// Issues this thread's 16-byte copies of keys [first, first + BLOCK_N) of one KV head into a
/// shared tile of `D + PAD` elements a row; keys at or past `end` are zero-filled.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* cache, const unsigned* table, int first, int end,
                                          int kv_head, const Args& a) {
    constexpr int CHUNKS = D * sizeof(T) / 16;  // 16-byte chunks in a row
    for (int c = threadIdx.x; c < BLOCK_N * CHUNKS; c += blockDim.x) {
        const int key = c / CHUNKS, part = c % CHUNKS, pos = first + key;
        const T* src = cache;
        unsigned bytes = 0;
        if (pos < end) {
            const size_t slot = static_cast<size_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
            src = cache + (slot * a.kv_heads + kv_head) * D + part * (16 / sizeof(T));
            bytes = 16;
        }
        cp_async_16(tile + key * (D + PAD) + part * (16 / sizeof(T)), src, bytes);
    }
    cp_async_commit();
}

template <typename T, int D>
__device__ void attend(float* out, float* part_out, float* part_max, float* part_sum, const T* q,
                       const T* k_cache, const T* v_cache, const unsigned* block_tables, const unsigned* row_seq,
                       const unsigned* row_pos, const unsigned* tiles, const Args a) {
    constexpr int KSTEPS = D / 16;  // mma k-steps over the head dim
    constexpr int DTILES = D / 8;   // 8-wide output tiles
    const int group = a.num_heads / a.kv_heads;
    const int kv_head = blockIdx.y, partition = blockIdx.z;
    const int first_row = static_cast<int>(tiles[3 * blockIdx.x]);
    const int seq_rows = static_cast<int>(tiles[3 * blockIdx.x + 1]);
    const int m_start = static_cast<int>(tiles[3 * blockIdx.x + 2]);
    const int block_m = 16 * static_cast<int>(blockDim.x / WARP_SIZE);
    const int m_count = min(block_m, seq_rows * group - m_start);
    const int last_row = first_row + (m_start + m_count - 1) / group;
    const int key_end = static_cast<int>(row_pos[last_row]) + 1;
    const int key_begin = a.num_partitions == 1 ? 0 : partition * PARTITION_SIZE;
    const int key_stop = a.num_partitions == 1 ? key_end : min(key_end, key_begin + PARTITION_SIZE);
    // A partition past every row's context: the merge reads none of it. Uniform over the block.
    if (key_begin >= key_stop) return;
    const unsigned* table = block_tables + static_cast<size_t>(row_seq[first_row]) * a.max_blocks_per_seq;

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4;
    // This thread's two m rows (g and g + 8 of its warp): row, head and position (-1: no row).
    int row[2], head[2], pos[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int m = warp * 16 + g + 8 * r;
        const bool valid = m < m_count;
        const int mm = m_start + (valid ? m : 0);
        row[r] = first_row + mm / group;
        head[r] = kv_head * group + mm % group;
        pos[r] = valid ? static_cast<int>(row_pos[row[r]]) : -1;
    }
    // Queries as A fragments: register r holds row g + 8(r & 1), columns 2t + 8(r >> 1) + 16k.
    uint32_t qf[KSTEPS][4];
    #pragma unroll
    for (int k = 0; k < KSTEPS; ++k)
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = r & 1, col = 16 * k + 2 * t + 8 * (r >> 1);
            uint32_t v = 0;
            if (pos[i] >= 0)
                memcpy(&v, q + (static_cast<size_t>(row[i]) * a.num_heads + head[i]) * D + col, 4);
            qf[k][r] = v;
        }

    TRIAGE_DYNAMIC_SHARED(T, smem);
    T* k_tile = smem;
    T* v_tile = smem + BLOCK_N * (D + PAD);
    const float scale_log2 = a.scale * LOG2E;
    float o[DTILES][4];
    #pragma unroll
    for (int d = 0; d < DTILES; ++d)
        #pragma unroll
        for (int i = 0; i < 4; ++i) o[d][i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    const int min_pos = min(pos[0], pos[1]);  // -1 for a missing row: its tiles are all masked
    // ldmatrix row addresses: K (non-transposed) and V (transposed) tiles of 16 keys x 16 dims.
    const int k_row = (lane / 16) * 8 + lane % 8, k_col = (lane / 8 % 2) * 8;
    const int v_row = (lane / 8 % 2) * 8 + lane % 8, v_col = (lane / 16) * 8;

    load_tile<T, D>(k_tile, k_cache, table, key_begin, key_stop, kv_head, a);
    for (int first = key_begin; first < key_stop; first += BLOCK_N) {
        cp_async_wait<0>();
        __syncthreads();  // K landed for every thread; every warp is done with the last V
        load_tile<T, D>(v_tile, v_cache, table, first, key_stop, kv_head, a);

        float s[BLOCK_N / 8][4];
        #pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
            #pragma unroll
            for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
        #pragma unroll
        for (int k = 0; k < KSTEPS; ++k)
            #pragma unroll
            for (int np = 0; np < BLOCK_N / 16; ++np) {
                uint32_t kf[4];
                TRIAGE_LDMATRIX_X4(kf, k_tile + (16 * np + k_row) * (D + PAD) + 16 * k + k_col);
                const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
                TRIAGE_MMA_16816(T, s[2 * np], qf[k], b0);
                TRIAGE_MMA_16816(T, s[2 * np + 1], qf[k], b1);
            }
        // Scale, mask, and fold the tile into the online softmax of both rows.
        const bool masked = first + BLOCK_N - 1 > min_pos;
        float tile_max[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n)
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = first + 8 * n + 2 * t + (i & 1);
                float x = s[n][i] * scale_log2;
                if (masked && key > pos[i >> 1]) x = -INFINITY;
                s[n][i] = x;
                tile_max[i >> 1] = fmaxf(tile_max[i >> 1], x);
            }
        float alpha[2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(tile_max[r], __shfl_xor_sync(FULL_MASK, tile_max[r], 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const float next = fmaxf(row_max[r], mx);
            const float ref = next == -INFINITY ? 0.0f : next;  // no key yet: weights stay 0
            alpha[r] = exp2f(row_max[r] - ref);
            row_max[r] = next;
            tile_max[r] = ref;
        }
        float tile_sum[2] = {0.0f, 0.0f};
        uint32_t pf[BLOCK_N / 16][4];  // P as A fragments over the tile's 64 keys
        #pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n) {
            float p[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                p[i] = exp2f(s[n][i] - tile_max[i >> 1]);
                tile_sum[i >> 1] += p[i];
            }
            pf[n / 2][2 * (n % 2)] = pack2<T>(p[0], p[1]);
            pf[n / 2][2 * (n % 2) + 1] = pack2<T>(p[2], p[3]);
        }
        #pragma unroll
        for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + tile_sum[r];
        #pragma unroll
        for (int d = 0; d < DTILES; ++d)
            #pragma unroll
            for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i >> 1];

        cp_async_wait<0>();
        __syncthreads();  // V landed; every warp is done with this K tile
        if (first + BLOCK_N < key_stop) load_tile<T, D>(k_tile, k_cache, table, first + BLOCK_N, key_stop, kv_head, a);
        #pragma unroll
        for (int ks = 0; ks < BLOCK_N / 16; ++ks)
            #pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t vf[4];
                TRIAGE_LDMATRIX_X4_TRANS(vf, v_tile + (16 * ks + v_row) * (D + PAD) + 16 * dp + v_col);
                const uint32_t b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
                TRIAGE_MMA_16816(T, o[2 * dp], pf[ks], b0);
                TRIAGE_MMA_16816(T, o[2 * dp + 1], pf[ks], b1);
            }
    }

    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 2);
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (pos[r] < 0) continue;
        const size_t head_row = static_cast<size_t>(row[r]) * a.num_heads + head[r];
        if (a.num_partitions == 1) {
            const float inv = 1.0f / row_sum[r];
            #pragma unroll
            for (int d = 0; d < DTILES; ++d) {
                float* dst = out + head_row * D + 8 * d + 2 * t;
                dst[0] = o[d][2 * r] * inv;
                dst[1] = o[d][2 * r + 1] * inv;
            }
        } else {
            const size_t part_idx = head_row * a.num_partitions + partition;
            #pragma unroll
            for (int d = 0; d < DTILES; ++d) {
                float* dst = part_out + part_idx * D + 8 * d + 2 * t;
                dst[0] = o[d][2 * r];
                dst[1] = o[d][2 * r + 1];
            }
            if (t == 0) {
                part_max[part_idx] = row_max[r] * LN2;
                part_sum[part_idx] = row_sum[r];
            }
        }
    }
}

}  // namespace prefill_attention
}  // namespace triage

#define TRIAGE_PREFILL_ATTENTION(NAME, T, D)                                                                    \
    extern "C" __global__ void NAME(float* __restrict__ out, float* __restrict__ part_out,                     \
                                    float* __restrict__ part_max, float* __restrict__ part_sum,                \
                                    const T* __restrict__ q, const T* __restrict__ k_cache,                    \
                                    const T* __restrict__ v_cache, const unsigned* __restrict__ block_tables,  \
                                    const unsigned* __restrict__ row_seq, const unsigned* __restrict__ row_pos, \
                                    const unsigned* __restrict__ tiles, int num_heads, int kv_heads,           \
                                    int block_size, int max_blocks_per_seq, int num_partitions, float scale) { \
        const triage::prefill_attention::Args args{num_heads,          kv_heads,       block_size,             \
                                                   max_blocks_per_seq, num_partitions, scale};                 \
        triage::prefill_attention::attend<T, D>(out, part_out, part_max, part_sum, q, k_cache, v_cache,         \
                                                block_tables, row_seq, row_pos, tiles, args);                  \
    }

TRIAGE_PREFILL_ATTENTION(prefill_attention_d64_f16, __half, 64)
TRIAGE_PREFILL_ATTENTION(prefill_attention_d64_bf16, __nv_bfloat16, 64)
TRIAGE_PREFILL_ATTENTION(prefill_attention_d128_f16, __half, 128)
TRIAGE_PREFILL_ATTENTION(prefill_attention_d128_bf16, __nv_bfloat16, 128)
