/* Paged decode attention for the CPU: one query token per sequence, read straight from the
 * block-table KV cache (no gathered copy of the context), GQA-grouped, fp32 math.
 *
 * Cache layout (the torch backend's, head-major): [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous. Work is split over (sequence, KV head) tasks with OpenMP (torch's own libgomp); each
 * thread allocates its buffers once. A task:
 *
 * 1. optionally writes the step's new K/V row of its (sequence, head) into its slot (fusing the
 *    cache write into this call: the row is read back at once, while it is in cache);
 * 2. scores the group's query rows against the context, 16 keys at a time: each key row is
 *    converted to fp32 once, in registers, and multiplied with every query row of the group; the
 *    LANES partial-sum vectors of a query row are then reduced together (a transposing tree of
 *    shuffles and adds) into one vector of LANES scores, instead of LANES horizontal sums;
 * 3. soft-maxes each row in fp32;
 * 4. accumulates the values with the group's accumulators in registers, each value row converted
 *    once.
 *
 * Blocks lie anywhere in the cache, so no hardware prefetcher can guess the next row: step 2 asks
 * for each key row and its value row PREFETCH_KEYS keys ahead, and step 4 finds the values in cache
 * (24 rows ahead with the values: 23 % less time than 16 ahead without them, SmolLM2's shapes on a
 * Zen 5 EPYC, in both dtypes and with AVX2 code).
 *
 * head_dim 64 and 128 get code with the row sizes fixed at compile time (rows live in registers);
 * other multiples of LANES run the same code with runtime sizes; the caller checks the rest.
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
#define MAX_VECTORS (MAX_HEAD_DIM / LANES)
#define KEYS LANES /* keys scored together: one vector of scores per query row */

#if LANES == 16
/* One vector whose lane i is the sum of the lanes of p[i] (i < 16). */
static inline vfloat reduce_lanes(const vfloat *p) {
    const vint lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vint hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vint lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const vint hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const vint lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const vint hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const vint even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const vint odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    vfloat r8[8], r4[4], r2[2];
    for (int i = 0; i < 8; i++)  /* lanes 0-7: 8 partial sums of key 2i, lanes 8-15: of key 2i+1 */
        r8[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], lo8) + __builtin_shuffle(p[2 * i], p[2 * i + 1], hi8);
    for (int i = 0; i < 4; i++)  /* 4 lanes per key, keys 4i .. 4i+3 */
        r4[i] = __builtin_shuffle(r8[2 * i], r8[2 * i + 1], lo4) + __builtin_shuffle(r8[2 * i], r8[2 * i + 1], hi4);
    for (int i = 0; i < 2; i++)  /* 2 lanes per key, keys 8i .. 8i+7 */
        r2[i] = __builtin_shuffle(r4[2 * i], r4[2 * i + 1], lo2) + __builtin_shuffle(r4[2 * i], r4[2 * i + 1], hi2);
    return __builtin_shuffle(r2[0], r2[1], even) + __builtin_shuffle(r2[0], r2[1], odd);
}
#elif LANES == 4
/* One vector whose lane i is the sum of the lanes of p[i] (i < 4). */
static inline vfloat reduce_lanes(const vfloat *p) {
    const vint lo2 = {0, 1, 4, 5}, hi2 = {2, 3, 6, 7}, even = {0, 2, 4, 6}, odd = {1, 3, 5, 7};
    const vfloat r0 = __builtin_shuffle(p[0], p[1], lo2) + __builtin_shuffle(p[0], p[1], hi2);
    const vfloat r1 = __builtin_shuffle(p[2], p[3], lo2) + __builtin_shuffle(p[2], p[3], hi2);
    return __builtin_shuffle(r0, r1, even) + __builtin_shuffle(r0, r1, odd);
}
#else
/* One vector whose lane i is the sum of the lanes of p[i] (i < 8). */
static inline vfloat reduce_lanes(const vfloat *p) {
    const vint lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    const vint lo2 = {0, 1, 4, 5, 8, 9, 12, 13}, hi2 = {2, 3, 6, 7, 10, 11, 14, 15};
    const vint even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
    vfloat r4[4], r2[2];
    for (int i = 0; i < 4; i++)  /* lanes 0-3: 4 partial sums of key 2i, lanes 4-7: of key 2i+1 */
        r4[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], lo4) + __builtin_shuffle(p[2 * i], p[2 * i + 1], hi4);
    for (int i = 0; i < 2; i++)  /* 2 lanes per key, keys 4i .. 4i+3 */
        r2[i] = __builtin_shuffle(r4[2 * i], r4[2 * i + 1], lo2) + __builtin_shuffle(r4[2 * i], r4[2 * i + 1], hi2);
    return __builtin_shuffle(r2[0], r2[1], even) + __builtin_shuffle(r2[0], r2[1], odd);
}
#endif

typedef struct {
    const void *key_cache, *value_cache;
    const int64_t *table;
    int64_t h, num_blocks, block_size, head_dim, context;
} Context;

/* The cache offset (in elements) of key ``t`` of the task's context. */
static inline int64_t row_offset(const Context *c, int64_t block, int64_t i) {
    return ((c->h * c->num_blocks + c->table[block]) * c->block_size + i) * c->head_dim;
}

#define PREFETCH_KEYS 24 /* rows requested ahead: blocks lie anywhere, so no hardware prefetcher guesses them */

/* A cursor over the context's rows PREFETCH_KEYS ahead of the one being read, asking for each row's
 * cache lines. */
typedef struct {
    int64_t t, block, i;
} Prefetcher;

static inline void prefetch_next(Prefetcher *p, const Context *c, const void *cache, const void *also,
                                 int64_t row_bytes, int bf16) {
    if (p->t >= c->context) return;
    const int64_t offset = row_offset(c, p->block, p->i) * (bf16 ? 2 : 4);
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch((const char *)cache + offset + b);
    if (also != NULL)
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch((const char *)also + offset + b);
    if (++p->i == c->block_size) { p->block++; p->i = 0; }
    p->t++;
}

/* Rows ``cache`` (and, unless NULL, the same rows of ``also``) from the context's start, PREFETCH_KEYS
 * of them requested at once; then ``prefetch_next`` keeps that distance. */
static inline Prefetcher prefetch_start(const Context *c, const void *cache, const void *also, int64_t row_bytes,
                                        int bf16) {
    Prefetcher p = {0, 0, 0};
    while (p.t < PREFETCH_KEYS && p.t < c->context) prefetch_next(&p, c, cache, also, row_bytes, bf16);
    return p;
}

/* scores[g * stride + t] = q_g . k_t for every key t of the context (q already scaled). */
static inline __attribute__((always_inline)) void score_context(
    const Context *c, const vfloat *q, int64_t group, vfloat *partial, float *scores, int64_t stride,
    const int64_t vectors, int bf16) {
    int64_t block = 0, i = 0;  /* where the next key lies */
    const int64_t row_bytes = c->head_dim * (bf16 ? 2 : 4);
    /* The value rows come along: the accumulation reads them right after, from cache. */
    Prefetcher ahead = prefetch_start(c, c->key_cache, c->value_cache, row_bytes, bf16);
    for (int64_t t0 = 0; t0 < c->context; t0 += KEYS) {
        const int64_t n = c->context - t0 < KEYS ? c->context - t0 : KEYS;
        for (int64_t k = 0; k < KEYS; k++) {
            vfloat row[MAX_VECTORS];
            if (k < n) {
                prefetch_next(&ahead, c, c->key_cache, c->value_cache, row_bytes, bf16);
                const int64_t offset = row_offset(c, block, i);
                if (++i == c->block_size) { block++; i = 0; }
                for (int64_t j = 0; j < vectors; j++) row[j] = vload(c->key_cache, offset + j * LANES, bf16);
            } else {
                for (int64_t j = 0; j < vectors; j++) row[j] = (vfloat){0};
            }
            for (int64_t g = 0; g < group; g++) {
                vfloat dot = q[g * vectors] * row[0];
                for (int64_t j = 1; j < vectors; j++) dot += q[g * vectors + j] * row[j];
                partial[g * KEYS + k] = dot;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            const vfloat sums = reduce_lanes(partial + g * KEYS);
            memcpy(scores + g * stride + t0, &sums, sizeof(float) * (size_t)n);
        }
    }
}

/* acc_g = sum_t probs[g * stride + t] * v_t for the ``rows`` query rows from ``first`` (at most 4). */
static inline __attribute__((always_inline)) void accumulate_context(
    const Context *c, const float *probs, int64_t stride, int64_t first, int64_t rows, vfloat *acc,
    const int64_t vectors, int bf16) {
    vfloat a[4][MAX_VECTORS];
    for (int64_t g = 0; g < rows; g++)
        for (int64_t j = 0; j < vectors; j++) a[g][j] = (vfloat){0};
    int64_t block = 0, i = 0;
    for (int64_t t = 0; t < c->context; t++) {  /* rows prefetched by score_context */
        const int64_t offset = row_offset(c, block, i);
        if (++i == c->block_size) { block++; i = 0; }
        vfloat row[MAX_VECTORS];
        for (int64_t j = 0; j < vectors; j++) row[j] = vload(c->value_cache, offset + j * LANES, bf16);
        for (int64_t g = 0; g < rows; g++) {
            const float p = probs[(first + g) * stride + t];
            for (int64_t j = 0; j < vectors; j++) a[g][j] += p * row[j];
        }
    }
    for (int64_t g = 0; g < rows; g++)
        for (int64_t j = 0; j < vectors; j++) acc[(first + g) * vectors + j] = a[g][j];
}

/* Rows of the group whose accumulators fit in registers at once (half of them), for ``vectors`` per row. */
static inline int64_t rows_at_once(int64_t vectors) {
    const int64_t rows = REGISTERS / 2 / vectors;
    return rows < 1 ? 1 : rows > 4 ? 4 : rows;
}

static inline __attribute__((always_inline)) void attend_task(
    const Context *c, vfloat *q, vfloat *acc, vfloat *partial, float *scores, int64_t stride, int64_t group,
    const int64_t vectors, int bf16) {
    score_context(c, q, group, partial, scores, stride, vectors, bf16);
    for (int64_t g = 0; g < group; g++) {  /* softmax weights, fp32 */
        float *sg = scores + g * stride;
        const float top = max_array(sg, c->context, -INFINITY);
        float sum = 0.0f;
        #pragma omp simd reduction(+:sum)
        for (int64_t t = 0; t < c->context; t++) {
            sg[t] = exp_nonpositive(sg[t] - top);
            sum += sg[t];
        }
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < c->context; t++) sg[t] *= inv;
    }
    const int64_t step = rows_at_once(vectors);
    for (int64_t first = 0; first < group; first += step)
        accumulate_context(c, scores, stride, first, group - first < step ? group - first : step, acc, vectors,
                           bf16);
}

static void attend_task_any(const Context *c, vfloat *q, vfloat *acc, vfloat *partial, float *scores,
                            int64_t stride, int64_t group, int64_t vectors, int bf16) {
    if (bf16) {
        switch (vectors) {
            case 64 / LANES: attend_task(c, q, acc, partial, scores, stride, group, 64 / LANES, 1); return;
            case 128 / LANES: attend_task(c, q, acc, partial, scores, stride, group, 128 / LANES, 1); return;
            default: attend_task(c, q, acc, partial, scores, stride, group, vectors, 1); return;
        }
    }
    switch (vectors) {
        case 64 / LANES: attend_task(c, q, acc, partial, scores, stride, group, 64 / LANES, 0); return;
        case 128 / LANES: attend_task(c, q, acc, partial, scores, stride, group, 128 / LANES, 0); return;
        default: attend_task(c, q, acc, partial, scores, stride, group, vectors, 0); return;
    }
}

static inline __attribute__((always_inline)) int decode_attention(
    const void *query, int64_t query_token_stride, const void *new_key, const void *new_value,
    int64_t new_token_stride, const int64_t *new_slots, void *key_cache, void *value_cache,
    const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
    float scale, int num_threads, int bf16) {
    const int64_t group = num_heads / num_kv_heads;
    if (head_dim > MAX_HEAD_DIM || head_dim % LANES != 0 || group > MAX_GROUP || group * num_kv_heads != num_heads)
        return -1;
    const int64_t vectors = head_dim / LANES, element = bf16 ? 2 : 4;
    int64_t max_context = KEYS;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (context_lens[s] < 1 || context_lens[s] > max_blocks * block_size) return -1;
        if (new_slots != NULL && (new_slots[s] < 0 || new_slots[s] >= num_blocks * block_size)) return -1;
        const int64_t padded = (context_lens[s] + KEYS - 1) / KEYS * KEYS;
        max_context = padded > max_context ? padded : max_context;
    }
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        /* this thread's buffers: the group's scaled queries and accumulators, the partial sums of
         * KEYS keys per query row, the scores */
        vfloat *buffer = NULL;
        const size_t floats = (size_t)(2 * group * head_dim + group * KEYS * LANES + group * max_context);
        if (posix_memalign((void **)&buffer, 64, floats * sizeof(float)) != 0) {
            buffer = NULL;
            #pragma omp atomic write
            failed = 1;
        }
        vfloat *q = buffer, *acc = q + group * vectors, *partial = acc + group * vectors;
        float *scores = (float *)(partial + group * KEYS);
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t s = 0; s < num_seqs; s++) {
            for (int64_t h = 0; h < num_kv_heads; h++) {
                if (buffer == NULL) continue;
                if (new_slots != NULL) {  /* the step's own K/V row first: it is the context's last */
                    const int64_t slot = new_slots[s];
                    const int64_t target = ((h * num_blocks * block_size) + slot) * head_dim * element;
                    const int64_t source = (s * new_token_stride + h * head_dim) * element;
                    memcpy((char *)key_cache + target, (const char *)new_key + source, (size_t)(head_dim * element));
                    memcpy((char *)value_cache + target, (const char *)new_value + source,
                           (size_t)(head_dim * element));
                }
                const Context c = {key_cache, value_cache, block_tables + s * max_blocks, h, num_blocks, block_size,
                                   head_dim, context_lens[s]};
                for (int64_t g = 0; g < group; g++)
                    for (int64_t j = 0; j < vectors; j++)
                        q[g * vectors + j] = scale * vload(query, s * query_token_stride + (h * group + g) * head_dim
                                                                      + j * LANES, bf16);
                attend_task_any(&c, q, acc, partial, scores, max_context, group, vectors, bf16);
                for (int64_t g = 0; g < group; g++)
                    for (int64_t j = 0; j < vectors; j++)
                        vstore(out, (s * num_heads + h * group + g) * head_dim + j * LANES, acc[g * vectors + j], bf16);
            }
        }
        free(buffer);
    }
    return failed ? -1 : 0;
}

#define DECODE_ARGS                                                                                    \
    const void *query, int64_t query_token_stride, const void *new_key, const void *new_value,         \
    int64_t new_token_stride, const int64_t *new_slots, void *key_cache, void *value_cache,            \
    const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs, \
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,  \
    float scale, int num_threads
#define DECODE_PASS                                                                                    \
    query, query_token_stride, new_key, new_value, new_token_stride, new_slots, key_cache, value_cache,  \
    block_tables, max_blocks, context_lens, out, num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, \
    block_size, scale, num_threads

/* Return 0, or -1 when a size is beyond the kernel's limits, a context exceeds its block table or
 * a new slot the cache (nothing written), or a buffer cannot be allocated (the caller raises).
 * new_key/new_value/new_slots: NULL, or the step's K/V rows ([num_seqs, num_kv_heads, head_dim],
 * token stride new_token_stride) to write at new_slots first. */
int paged_decode_attention_f32(DECODE_ARGS) { return decode_attention(DECODE_PASS, 0); }
int paged_decode_attention_bf16(DECODE_ARGS) { return decode_attention(DECODE_PASS, 1); }
