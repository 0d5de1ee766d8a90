// The kernels of kernels/ compiled as C++ against the CUDA simulator, with one extern "C"
// launcher per kernel. A launcher runs the whole grid on the calling thread and returns 0, or 1
// after the simulator stopped the launch (cudasim_last_error() says why).
#include "common.cuh"
#include "entropy_window.cu"
#include "logits_reduce.cu"
#include "paged_attention.cu"
#include "prefill_attention.cu"
#include "reshape_and_cache.cu"
#include "rms_norm.cu"
#include "rope_and_cache.cu"
#include "silu_mul.cu"

/// triage_ops::launch::LaunchGeometry, as the Rust side passes it.
struct SimGeometry {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem_bytes;
};

template <typename F>
static int run(const SimGeometry* g, F body) {
    const dim3 grid(g->grid[0], g->grid[1], g->grid[2]);
    const dim3 block(g->block[0], g->block[1], g->block[2]);
    return cudasim::launch(grid, block, g->shared_mem_bytes, body).ok() ? 0 : 1;
}

#define LOGITS_REDUCE_LAUNCHER(NAME, T)                                                                  \
    extern "C" int sim_##NAME(const SimGeometry* g, const T* logits, float* out, float* part_f,          \
                              unsigned* part_u, int vocab, int k, int chunk) {                           \
        return run(g, [=] { NAME(logits, out, part_f, part_u, vocab, k, chunk); });                      \
    }
LOGITS_REDUCE_LAUNCHER(logits_reduce_f32, float)
LOGITS_REDUCE_LAUNCHER(logits_reduce_f16, __half)
LOGITS_REDUCE_LAUNCHER(logits_reduce_bf16, __nv_bfloat16)

extern "C" int sim_logits_reduce_merge_f32(const SimGeometry* g, const float* part_f, const unsigned* part_u,
                                           float* out, int splits, int k) {
    return run(g, [=] { logits_reduce_merge_f32(part_f, part_u, out, splits, k); });
}

extern "C" int sim_entropy_window_f32(const SimGeometry* g, const float* stats, int k, const float* sampled_logprobs,
                                      const unsigned* observe, double* state, int num_seqs, float tau, int window,
                                      int estimator, int unit) {
    return run(g, [=] {
        entropy_window_f32(stats, k, sampled_logprobs, observe, state, num_seqs, tau, window, estimator, unit);
    });
}

#define RESHAPE_AND_CACHE_LAUNCHER(NAME, T)                                                               \
    extern "C" int sim_##NAME(const SimGeometry* g, const T* rows, T* cache, const unsigned* slots, int row_elems) { \
        return run(g, [=] { NAME(rows, cache, slots, row_elems); });                                       \
    }
RESHAPE_AND_CACHE_LAUNCHER(reshape_and_cache_f32, float)
RESHAPE_AND_CACHE_LAUNCHER(reshape_and_cache_f16, __half)
RESHAPE_AND_CACHE_LAUNCHER(reshape_and_cache_bf16, __nv_bfloat16)

/// Buffers and sizes of one paged-attention launch (the Rust side's `PagedAttentionArgs`).
struct SimPagedAttention {
    float* out;
    float* part_out;
    float* part_max;
    float* part_sum;
    const void* q;
    const void* k_cache;
    const void* v_cache;
    const unsigned* block_tables;
    const unsigned* row_seq;
    const unsigned* row_pos;
    int num_heads;
    int kv_heads;
    int head_dim;
    int block_size;
    int max_blocks_per_seq;
    int num_partitions;
    float scale;
};

#define PAGED_ATTENTION_LAUNCHER(NAME, T)                                                                     \
    extern "C" int sim_##NAME(const SimGeometry* g, const SimPagedAttention* a) {                            \
        const SimPagedAttention args = *a;                                                                    \
        return run(g, [=] {                                                                                   \
            NAME(args.out, args.part_out, args.part_max, args.part_sum, static_cast<const T*>(args.q),      \
                 static_cast<const T*>(args.k_cache), static_cast<const T*>(args.v_cache), args.block_tables, \
                 args.row_seq, args.row_pos, args.num_heads, args.kv_heads, args.head_dim, args.block_size,  \
                 args.max_blocks_per_seq, args.num_partitions, args.scale);                                  \
        });                                                                                                   \
    }
PAGED_ATTENTION_LAUNCHER(paged_attention_f32, float)
PAGED_ATTENTION_LAUNCHER(paged_attention_f16, __half)
PAGED_ATTENTION_LAUNCHER(paged_attention_bf16, __nv_bfloat16)

/// Buffers and sizes of one prefill-attention launch (the Rust side's `SimPrefillAttention`).
struct SimPrefillAttention {
    float* out;
    float* part_out;
    float* part_max;
    float* part_sum;
    const void* q;
    const void* k_cache;
    const void* v_cache;
    const unsigned* block_tables;
    const unsigned* row_seq;
    const unsigned* row_pos;
    const unsigned* tiles;
    int num_heads;
    int kv_heads;
    int block_size;
    int max_blocks_per_seq;
    int num_partitions;
    float scale;
};

#define PREFILL_ATTENTION_LAUNCHER(NAME, T)                                                                   \
    extern "C" int sim_##NAME(const SimGeometry* g, const SimPrefillAttention* a) {                          \
        const SimPrefillAttention x = *a;                                                                     \
        return run(g, [=] {                                                                                   \
            NAME(x.out, x.part_out, x.part_max, x.part_sum, static_cast<const T*>(x.q),                      \
                 static_cast<const T*>(x.k_cache), static_cast<const T*>(x.v_cache), x.block_tables,          \
                 x.row_seq, x.row_pos, x.tiles, x.num_heads, x.kv_heads, x.block_size, x.max_blocks_per_seq, \
                 x.num_partitions, x.scale);                                                                  \
        });                                                                                                   \
    }
PREFILL_ATTENTION_LAUNCHER(prefill_attention_d64_f16, __half)
PREFILL_ATTENTION_LAUNCHER(prefill_attention_d64_bf16, __nv_bfloat16)
PREFILL_ATTENTION_LAUNCHER(prefill_attention_d128_f16, __half)
PREFILL_ATTENTION_LAUNCHER(prefill_attention_d128_bf16, __nv_bfloat16)

extern "C" int sim_paged_attention_merge_f32(const SimGeometry* g, float* out, const float* part_out,
                                             const float* part_max, const float* part_sum, const unsigned* row_pos,
                                             int num_heads, int head_dim, int num_partitions) {
    return run(g, [=] {
        paged_attention_merge_f32(out, part_out, part_max, part_sum, row_pos, num_heads, head_dim, num_partitions);
    });
}

#define SILU_MUL_LAUNCHER(NAME, T)                                                                  \
    extern "C" int sim_##NAME(const SimGeometry* g, const T* gate_up, T* out, int inter) {          \
        return run(g, [=] { NAME(gate_up, out, inter); });                                          \
    }
SILU_MUL_LAUNCHER(silu_mul_f32, float)
SILU_MUL_LAUNCHER(silu_mul_f16, __half)
SILU_MUL_LAUNCHER(silu_mul_bf16, __nv_bfloat16)

#define ADD_RMS_NORM_LAUNCHER(NAME, T)                                                                    \
    extern "C" int sim_##NAME(const SimGeometry* g, float* residual, const T* delta, const float* weight, \
                              T* out, int hidden, float eps) {                                            \
        return run(g, [=] { NAME(residual, delta, weight, out, hidden, eps); });                          \
    }
ADD_RMS_NORM_LAUNCHER(add_rms_norm_f32, float)
ADD_RMS_NORM_LAUNCHER(add_rms_norm_f16, __half)
ADD_RMS_NORM_LAUNCHER(add_rms_norm_bf16, __nv_bfloat16)

/// Buffers and sizes of one rope-and-cache launch (the Rust side's `SimRopeAndCache`).
struct SimRopeAndCache {
    const void* qkv;
    const void* bias;
    const float* cos;
    const float* sin;
    void* q_out;
    void* k_cache;
    void* v_cache;
    const unsigned* slots;
    int num_heads;
    int kv_heads;
    int head_dim;
    int neox;
};

#define ROPE_AND_CACHE_LAUNCHER(NAME, T)                                                                  \
    extern "C" int sim_##NAME(const SimGeometry* g, const SimRopeAndCache* a) {                          \
        const SimRopeAndCache x = *a;                                                                     \
        return run(g, [=] {                                                                               \
            NAME(static_cast<const T*>(x.qkv), static_cast<const T*>(x.bias), x.cos, x.sin,              \
                 static_cast<T*>(x.q_out), static_cast<T*>(x.k_cache), static_cast<T*>(x.v_cache), x.slots, \
                 x.num_heads, x.kv_heads, x.head_dim, x.neox);                                            \
        });                                                                                               \
    }
ROPE_AND_CACHE_LAUNCHER(rope_and_cache_f32, float)
ROPE_AND_CACHE_LAUNCHER(rope_and_cache_f16, __half)
ROPE_AND_CACHE_LAUNCHER(rope_and_cache_bf16, __nv_bfloat16)
