/* Paged decode attention for the CPU: one query token per sequence, read straight from the
 * block-table KV cache (no gathered copy of the context), GQA-grouped, fp32 math.
 *
 * Cache layout (the torch backend's, head-major): [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous. For each (sequence, KV head) the group's query rows are scored against the context's
 * keys block by block, soft-maxed in fp32, and the values accumulated: K and V are each read once,
 * each row converted to fp32 once for the whole group. Work is split over (sequence, KV head)
 * pairs with OpenMP (torch's own libgomp, already loaded); each thread allocates its buffers once.
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

/* row[0:head_dim] = the cache row at ``offset`` as fp32; row's padding stays as it was (zero). */
static inline __attribute__((always_inline)) void load_row(float *restrict row, const void *cache, int64_t offset,
                                                           int64_t head_dim, int bf16) {
    if (bf16) {
        const uint16_t *src = (const uint16_t *)cache + offset;
        for (int64_t d = 0; d < head_dim; d++) row[d] = bf16_to_f32(src[d]);
    } else {
        memcpy(row, (const float *)cache + offset, sizeof(float) * (size_t)head_dim);
    }
}

static inline __attribute__((always_inline)) int decode_attention(
    const void *query, int64_t query_token_stride, const void *key_cache, const void *value_cache,
    const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
    float scale, int num_threads, int bf16) {
    const int64_t group = num_heads / num_kv_heads;
    if (head_dim > MAX_HEAD_DIM || group > MAX_GROUP || group * num_kv_heads != num_heads) return -1;
    const int64_t dim = padded_dim(head_dim), vectors = dim / LANES;
    int64_t max_context = 1;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (context_lens[s] < 0 || context_lens[s] > max_blocks * block_size) return -1;
        max_context = context_lens[s] > max_context ? context_lens[s] : max_context;
    }
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        /* this thread's buffers: the group's scaled queries and accumulators, one K/V row, the scores */
        float *buffer = NULL;
        const size_t floats = (size_t)(2 * group * dim + dim + group * max_context);
        if (posix_memalign((void **)&buffer, 64, floats * sizeof(float)) != 0) {
            buffer = NULL;
            #pragma omp atomic write
            failed = 1;
        } else {
            memset(buffer, 0, floats * sizeof(float));
        }
        float *q = buffer, *acc = q + group * dim, *row = acc + group * dim, *scores = row + dim;
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t s = 0; s < num_seqs; s++) {
            for (int64_t h = 0; h < num_kv_heads; h++) {
                if (buffer == NULL) continue;
                const int64_t context = context_lens[s];
                const int64_t *table = block_tables + s * max_blocks;
                for (int64_t g = 0; g < group; g++)
                    for (int64_t d = 0; d < head_dim; d++)
                        q[g * dim + d] = scale * load_elem(query, s * query_token_stride
                                                           + (h * group + g) * head_dim + d, bf16);
                const vfloat *qv = (const vfloat *)q, *rv = (const vfloat *)row;
                for (int64_t t = 0, b = 0; t < context; b++) {  /* scores, block by block */
                    const int64_t base = (h * num_blocks + table[b]) * block_size * head_dim;
                    const int64_t n = context - t < block_size ? context - t : block_size;
                    for (int64_t i = 0; i < n; i++, t++) {
                        load_row(row, key_cache, base + i * head_dim, head_dim, bf16);
                        for (int64_t g = 0; g < group; g++) {
                            vfloat dot = {0};
                            for (int64_t j = 0; j < vectors; j++) dot += qv[g * vectors + j] * rv[j];
                            scores[g * context + t] = sum_lanes(dot);
                        }
                    }
                }
                for (int64_t g = 0; g < group; g++) {  /* softmax numerators, fp32 */
                    float *sg = scores + g * context;
                    float top = -INFINITY;
                    for (int64_t t = 0; t < context; t++) top = sg[t] > top ? sg[t] : top;
                    float sum = 0.0f;
                    #pragma omp simd reduction(+:sum)
                    for (int64_t t = 0; t < context; t++) {
                        sg[t] = exp_nonpositive(sg[t] - top);
                        sum += sg[t];
                    }
                    const float inv = 1.0f / sum;
                    for (int64_t t = 0; t < context; t++) sg[t] *= inv;
                }
                memset(acc, 0, sizeof(float) * (size_t)(group * dim));
                vfloat *av = (vfloat *)acc;
                for (int64_t t = 0, b = 0; t < context; b++) {  /* values, block by block */
                    const int64_t base = (h * num_blocks + table[b]) * block_size * head_dim;
                    const int64_t n = context - t < block_size ? context - t : block_size;
                    for (int64_t i = 0; i < n; i++, t++) {
                        load_row(row, value_cache, base + i * head_dim, head_dim, bf16);
                        for (int64_t g = 0; g < group; g++) {
                            const float p = scores[g * context + t];
                            for (int64_t j = 0; j < vectors; j++) av[g * vectors + j] += p * rv[j];
                        }
                    }
                }
                for (int64_t g = 0; g < group; g++)
                    for (int64_t d = 0; d < head_dim; d++)
                        store_elem(out, (s * num_heads + h * group + g) * head_dim + d, acc[g * dim + d], bf16);
            }
        }
        free(buffer);
    }
    return failed ? -1 : 0;
}

#define DECODE_ARGS                                                                                    \
    const void *query, int64_t query_token_stride, const void *key_cache, const void *value_cache,     \
    const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs, \
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,  \
    float scale, int num_threads
#define DECODE_PASS                                                                                    \
    query, query_token_stride, key_cache, value_cache, block_tables, max_blocks, context_lens, out, num_seqs, \
    num_heads, num_kv_heads, head_dim, num_blocks, block_size, scale, num_threads

/* Return 0, or -1 when a size is beyond the kernel's fixed limits, a context exceeds its block
 * table, or a buffer cannot be allocated (the caller raises). */
int paged_decode_attention_f32(DECODE_ARGS) { return decode_attention(DECODE_PASS, 0); }
int paged_decode_attention_bf16(DECODE_ARGS) { return decode_attention(DECODE_PASS, 1); }
