/* Paged decode attention for the CPU: one query token per sequence, read straight from the
 * block-table KV cache (no gathered copy of the context), GQA-grouped, fp32 math.
 *
 * Cache layout (the torch backend's, head-major): [num_kv_heads, num_blocks, block_size, head_dim],
 * contiguous. Work is split over (sequence, KV head) tasks with OpenMP (torch's own libgomp); each
 * thread allocates its buffers once. A task:
 *
 * 1. optionally writes the step's new K/V row of its (sequence, head) into its slot (fusing the
 *    cache write into this call: the row is read back at once, while it is in cache);
 * 2. walks the context in chunks of KEY_CHUNK keys, the online softmax of attention_math.h (the
 *    prefill kernel's arithmetic, so a token gets the same bits whether it decodes or prefills):
 *    scores the group's query rows against the chunk, 16 keys at a time: each key row is
 *    converted to fp32 once, in registers, and multiplied with every query row of the group; the
 *    LANES partial-sum vectors of a query row are then summed by tree_lanes (shuffles and adds)
 *    into one vector of LANES scores, instead of LANES horizontal sums; then advances each row's
 *    softmax and accumulates the chunk's values with the rows' accumulators in registers, each
 *    value row converted once.
 *
 * Blocks lie anywhere in the cache, so no hardware prefetcher can guess the next row: the scoring
 * asks for each key row and its value row PREFETCH_KEYS keys ahead, and the accumulation finds the
 * values in cache (24 rows ahead with the values: 23 % less time than 16 ahead without them,
 * SmolLM2's shapes on a Zen 5 EPYC, in both dtypes and with AVX2 code).
 *
 * head_dim 64 and 128 get code with the row sizes fixed at compile time (rows live in registers);
 * other multiples of LANES run the same code with runtime sizes; others are refused.
 *
 * Built at first use by hetero_core/model/cpu_kernels.py with the system C compiler
 * (-O3 -march=native; NaN/Inf kept, no reassociation).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "attention_math.h"

#define MAX_HEAD_DIM 512
#define MAX_GROUP 64
#define MAX_VECTORS (MAX_HEAD_DIM / LANES)
#define KEYS LANES /* keys scored together: one vector of scores per query row */

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

/* The cache offsets of the chunk's ``n`` keys, from the cursor (block, i), which moves past them. */
static inline void chunk_offsets(const Context *c, int64_t n, int64_t *block, int64_t *i, int64_t *offsets) {
    for (int64_t k = 0; k < n; k++) {
        offsets[k] = row_offset(c, *block, *i);
        if (++*i == c->block_size) { ++*block; *i = 0; }
    }
}

/* scores[g * KEY_CHUNK + k] = q_g . k_k for the chunk's ``n`` keys at ``offsets`` (q already scaled;
 * attention_math.h's lane partials and tree). */
static inline __attribute__((always_inline)) void score_chunk(
    const Context *c, const int64_t *offsets, int64_t n, const vfloat *q, int64_t group, vfloat *partial,
    float *scores, Prefetcher *ahead, const int64_t vectors, int bf16) {
    const int64_t row_bytes = c->head_dim * (bf16 ? 2 : 4);
    for (int64_t k0 = 0; k0 < n; k0 += KEYS) {
        for (int64_t k = 0; k < KEYS; k++) {
            vfloat row[MAX_VECTORS];
            if (k0 + k < n) {
                /* The value rows come along: the accumulation reads them right after, from cache. */
                prefetch_next(ahead, c, c->key_cache, c->value_cache, row_bytes, bf16);
                for (int64_t j = 0; j < vectors; j++) row[j] = vload(c->key_cache, offsets[k0 + k] + j * LANES, bf16);
            } else {
                for (int64_t j = 0; j < vectors; j++) row[j] = (vfloat){0};
            }
            for (int64_t g = 0; g < group; g++) {
                vfloat dot = {0};
                for (int64_t j = 0; j < vectors; j++) dot = vfma(q[g * vectors + j], row[j], dot);
                partial[g * KEYS + k] = dot;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            const vfloat sums = tree_lanes(partial + g * KEYS);
            memcpy(scores + g * KEY_CHUNK + k0, &sums, sizeof sums);
        }
    }
}

/* acc_g = acc_g * alpha_g + sum_k weights[g * KEY_CHUNK + k] * v_k over the chunk's ``n`` values at
 * ``offsets``, for the ``rows`` query rows from ``first`` (at most 4), in registers. */
static inline __attribute__((always_inline)) void accumulate_chunk(
    const Context *c, const int64_t *offsets, int64_t n, const float *weights, const float *alpha, int64_t first,
    int64_t rows, vfloat *acc, const int64_t vectors, int bf16) {
    vfloat a[4][MAX_VECTORS];
    for (int64_t g = 0; g < rows; g++)
        for (int64_t j = 0; j < vectors; j++) a[g][j] = acc[(first + g) * vectors + j] * alpha[first + g];
    for (int64_t k = 0; k < n; k++) {  /* rows prefetched by score_chunk */
        vfloat row[MAX_VECTORS];
        for (int64_t j = 0; j < vectors; j++) row[j] = vload(c->value_cache, offsets[k] + j * LANES, bf16);
        for (int64_t g = 0; g < rows; g++) {
            const vfloat p = vsplat(weights[(first + g) * KEY_CHUNK + k]);
            for (int64_t j = 0; j < vectors; j++) a[g][j] = vfma(p, row[j], a[g][j]);
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

/* The per-task buffers (a thread's, allocated once): the group's scaled queries and accumulators, the
 * partial sums of KEYS keys per query row, a chunk's scores, the rows' softmax state and the chunk's
 * key offsets. */
typedef struct {
    vfloat *q, *acc, *partial;
    float *scores, *row_max, *row_sum, *alpha;
    int64_t *offsets;
} Buffers;

/* acc_g = the attention output of the group's rows, normalised (q already scaled). */
static inline __attribute__((always_inline)) void attend_task(const Context *c, const Buffers *b, int64_t group,
                                                              const int64_t vectors, int bf16) {
    for (int64_t g = 0; g < group; g++) {
        b->row_max[g] = -INFINITY;
        b->row_sum[g] = 0.0f;
        for (int64_t j = 0; j < vectors; j++) b->acc[g * vectors + j] = (vfloat){0};
    }
    Prefetcher ahead = prefetch_start(c, c->key_cache, c->value_cache, c->head_dim * (bf16 ? 2 : 4), bf16);
    int64_t block = 0, i = 0;  /* where the next chunk starts */
    const int64_t step = rows_at_once(vectors);
    for (int64_t c0 = 0; c0 < c->context; c0 += KEY_CHUNK) {
        const int64_t n = c->context - c0 < KEY_CHUNK ? c->context - c0 : KEY_CHUNK;
        chunk_offsets(c, n, &block, &i, b->offsets);
        score_chunk(c, b->offsets, n, b->q, group, b->partial, b->scores, &ahead, vectors, bf16);
        for (int64_t g = 0; g < group; g++)
            b->alpha[g] = softmax_chunk(b->scores + g * KEY_CHUNK, n, &b->row_max[g], &b->row_sum[g]);
        for (int64_t first = 0; first < group; first += step)
            accumulate_chunk(c, b->offsets, n, b->scores, b->alpha, first, group - first < step ? group - first : step,
                             b->acc, vectors, bf16);
    }
    for (int64_t g = 0; g < group; g++) {
        const float inv = 1.0f / b->row_sum[g];
        for (int64_t j = 0; j < vectors; j++) b->acc[g * vectors + j] = b->acc[g * vectors + j] * inv;
    }
}

static void attend_task_any(const Context *c, const Buffers *b, int64_t group, int64_t vectors, int bf16) {
    if (bf16) {
        switch (vectors) {
            case 64 / LANES: attend_task(c, b, group, 64 / LANES, 1); return;
            case 128 / LANES: attend_task(c, b, group, 128 / LANES, 1); return;
            default: attend_task(c, b, group, vectors, 1); return;
        }
    }
    switch (vectors) {
        case 64 / LANES: attend_task(c, b, group, 64 / LANES, 0); return;
        case 128 / LANES: attend_task(c, b, group, 128 / LANES, 0); return;
        default: attend_task(c, b, group, vectors, 0); return;
    }
}

static inline __attribute__((always_inline)) int decode_attention(
    const void *query, int64_t query_token_stride, const void *new_key, const void *new_value,
    int64_t new_token_stride, const int64_t *new_slots, void *key_cache, void *value_cache,
    const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
    float scale, int num_threads, int bf16) {
    if (num_seqs < 0 || num_kv_heads < 1 || num_heads < 1 || head_dim < LANES || head_dim > MAX_HEAD_DIM
        || head_dim % LANES != 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP
        || num_blocks < 0 || block_size < 1 || max_blocks < 0)
        return -1;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t vectors = head_dim / LANES, element = bf16 ? 2 : 4;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (context_lens[s] < 1 || context_lens[s] > max_blocks * block_size) return -1;
        for (int64_t b = 0; b < (context_lens[s] + block_size - 1) / block_size; b++)
            if (block_tables[s * max_blocks + b] < 0 || block_tables[s * max_blocks + b] >= num_blocks) return -1;
        if (new_slots != NULL && (new_slots[s] < 0 || new_slots[s] >= num_blocks * block_size)) return -1;
    }
    if (num_seqs == 0) return 0;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        /* this thread's buffers (Buffers) in one allocation */
        const size_t vectors_needed = (size_t)(2 * group * vectors + group * KEYS);
        const size_t floats_needed = (size_t)(group * KEY_CHUNK + 3 * group);
        char *buffer = NULL;
        if (posix_memalign((void **)&buffer, 64, vectors_needed * sizeof(vfloat) + floats_needed * sizeof(float)
                                                     + KEY_CHUNK * sizeof(int64_t)) != 0) {
            buffer = NULL;
            #pragma omp atomic write
            failed = 1;
        }
        Buffers b = {0};
        if (buffer != NULL) {
            b.q = (vfloat *)buffer;
            b.acc = b.q + group * vectors;
            b.partial = b.acc + group * vectors;
            b.offsets = (int64_t *)(b.partial + group * KEYS);
            b.scores = (float *)(b.offsets + KEY_CHUNK);
            b.row_max = b.scores + group * KEY_CHUNK;
            b.row_sum = b.row_max + group;
            b.alpha = b.row_sum + group;
        }
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
                        b.q[g * vectors + j] = scale * vload(query, s * query_token_stride + (h * group + g) * head_dim
                                                                        + j * LANES, bf16);
                attend_task_any(&c, &b, group, vectors, bf16);
                for (int64_t g = 0; g < group; g++)
                    for (int64_t j = 0; j < vectors; j++)
                        vstore(out, (s * num_heads + h * group + g) * head_dim + j * LANES, b.acc[g * vectors + j], bf16);
            }
        }
        free(buffer);
    }
    return failed ? -2 : 0;
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

/* Return 0; -1 when a size is beyond the kernel's limits, a context exceeds its block table, a block
 * lies outside the cache or a new slot outside it (nothing written); -2 when a buffer cannot be
 * allocated (the caller raises). No sequences: nothing to do.
 * new_key/new_value/new_slots: NULL, or the step's K/V rows ([num_seqs, num_kv_heads, head_dim],
 * token stride new_token_stride) to write at new_slots first. */
int paged_decode_attention_f32(DECODE_ARGS) { return decode_attention(DECODE_PASS, 0); }
int paged_decode_attention_bf16(DECODE_ARGS) { return decode_attention(DECODE_PASS, 1); }
