/* Paged decode attention for the CPU: one query token per sequence, read straight from the
 * block-table KV cache (no gathered copy of the context), GQA-grouped, fp32 math.
 *
 * Cache layout (the torch backend's, head-major): [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous. For each (sequence, KV head) the group's query rows are scored against the context's
 * keys block by block, soft-maxed in fp32, and the values accumulated: K and V are each read once.
 * Work is split over (sequence, KV head) pairs with OpenMP (torch's own libgomp, already loaded).
 *
 * Built at first use by hetero_core/model/cpu_kernels.py with the system C compiler
 * (-O3 -march=native, reassociation allowed so the dot products vectorise; NaN/Inf kept).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_math.h"

#define MAX_HEAD_DIM 512
#define MAX_GROUP 64

/* Returns 0, or -1 when a size is beyond the kernel's fixed limits or a buffer cannot be allocated
 * (the caller then uses its torch path). */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                            \
int NAME(const T *query, int64_t query_token_stride, const T *key_cache, const T *value_cache,        \
         const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, T *out,         \
         int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,                 \
         int64_t num_blocks, int64_t block_size, float scale, int num_threads) {                      \
    const int64_t group = num_heads / num_kv_heads;                                                   \
    if (head_dim > MAX_HEAD_DIM || group > MAX_GROUP || group * num_kv_heads != num_heads) return -1; \
    int failed = 0;                                                                                   \
    _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)")            \
    for (int64_t s = 0; s < num_seqs; s++) {                                                          \
        for (int64_t h = 0; h < num_kv_heads; h++) {                                                  \
            const int64_t context = context_lens[s];                                                  \
            float row[MAX_HEAD_DIM] __attribute__((aligned(64)));                                     \
            float inv_sum[MAX_GROUP];                                                                 \
            /* one heap buffer per task: the group's scaled queries, accumulators and scores */       \
            float *q = malloc(sizeof(float) * (size_t)(group * (2 * head_dim + (context > 0 ? context : 1)))); \
            if (q == NULL) {                                                                          \
                _Pragma("omp atomic write")                                                           \
                failed = 1;                                                                           \
                continue;                                                                             \
            }                                                                                         \
            float *acc = q + group * head_dim, *scores = acc + group * head_dim;                      \
            for (int64_t g = 0; g < group; g++)                                                       \
                for (int64_t d = 0; d < head_dim; d++)                                                \
                    q[g * head_dim + d] = scale * LOAD(query, s * query_token_stride                 \
                                                       + (h * group + g) * head_dim + d);            \
            const int64_t *table = block_tables + s * max_blocks;                                     \
            for (int64_t t = 0; t < context; t++) {                                                   \
                const int64_t i = t % block_size;                                                     \
                const int64_t base = ((h * num_blocks + table[t / block_size]) * block_size + i)     \
                                     * head_dim;                                                      \
                for (int64_t d = 0; d < head_dim; d++) row[d] = LOAD(key_cache, base + d);           \
                for (int64_t g = 0; g < group; g++) {                                                 \
                    const float *qg = q + g * head_dim;                                               \
                    float dot = 0.0f;                                                                 \
                    for (int64_t d = 0; d < head_dim; d++) dot += qg[d] * row[d];                     \
                    scores[g * context + t] = dot;                                                    \
                }                                                                                     \
            }                                                                                         \
            for (int64_t g = 0; g < group; g++) {                                                     \
                float *sg = scores + g * context;                                                     \
                float top = -INFINITY;                                                                \
                for (int64_t t = 0; t < context; t++) top = sg[t] > top ? sg[t] : top;                \
                float sum = 0.0f;                                                                     \
                _Pragma("omp simd reduction(+:sum)")                                                  \
                for (int64_t t = 0; t < context; t++) { sg[t] = exp_nonpositive(sg[t] - top); sum += sg[t]; }    \
                inv_sum[g] = 1.0f / sum;                                                              \
            }                                                                                         \
            memset(acc, 0, sizeof(float) * (size_t)(group * head_dim));                               \
            for (int64_t t = 0; t < context; t++) {                                                   \
                const int64_t base = ((h * num_blocks + table[t / block_size]) * block_size          \
                                      + t % block_size) * head_dim;                                   \
                for (int64_t d = 0; d < head_dim; d++) row[d] = LOAD(value_cache, base + d);         \
                for (int64_t g = 0; g < group; g++) {                                                 \
                    const float p = scores[g * context + t];                                          \
                    float *ag = acc + g * head_dim;                                                   \
                    for (int64_t d = 0; d < head_dim; d++) ag[d] += p * row[d];                       \
                }                                                                                     \
            }                                                                                         \
            for (int64_t g = 0; g < group; g++)                                                       \
                for (int64_t d = 0; d < head_dim; d++)                                                \
                    STORE(out, (s * num_heads + h * group + g) * head_dim + d,                        \
                          acc[g * head_dim + d] * inv_sum[g]);                                        \
            free(q);                                                                                  \
        }                                                                                             \
    }                                                                                                 \
    return failed ? -1 : 0;                                                                           \
}

DEFINE_KERNEL(paged_decode_attention_f32, float, load_f32, store_f32)
DEFINE_KERNEL(paged_decode_attention_bf16, uint16_t, load_bf16, store_bf16)
