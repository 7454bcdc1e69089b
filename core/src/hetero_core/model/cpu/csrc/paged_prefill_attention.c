/* Paged causal attention for multi-token queries (prefill chunks) on the CPU, read straight from
 * the block-table KV cache after the step's own K/V were written there, GQA-grouped, fp32 math.
 *
 * One call attends every prefilling sequence of a step. A sequence's query rows are tokens
 * query_start .. query_start + query_len of the flat batch; its context is context_len tokens, the
 * last query_len of which are the new ones, so query token j sees keys 0 .. context_len - query_len + j
 * (a cached prefix is just more keys). The work is split into tasks of (sequence, tile of
 * TILE_TOKENS query tokens, KV head), run by OpenMP (torch's libgomp) with dynamic scheduling.
 *
 * A task is flash attention over its rows (each tile token times each query head of the group):
 * keys come in chunks of KEY_CHUNK, converted to fp32 once, scored ROW_BLOCK rows at a time against
 * each key row (the rows' queries in registers), then an online softmax and the value accumulation
 * with the row's accumulator in registers. Each row's arithmetic is attention_math.h's, the decode
 * kernel's: a token gets the same bits however its prompt is chunked or batched. head_dim is padded
 * to a multiple of LANES inside the task's buffers, so any head size works.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "attention_math.h"

#define TILE_TOKENS 16
#define MAX_PADDED_HEAD_DIM 512
#define ROW_BLOCK 4 /* query rows scored together against each key row */

typedef struct {
    float *query, *acc, *scores, *keys, *values, *row_max, *row_sum;
    vfloat *partial;
} Scratch;

static int scratch_alloc(Scratch *s, int64_t rows, int64_t dim) {
    const size_t floats = (size_t)(2 * rows * dim + rows * KEY_CHUNK + 2 * dim * KEY_CHUNK + 2 * rows
                                   + ROW_BLOCK * LANES * LANES);
    float *base = NULL;
    if (posix_memalign((void **)&base, 64, floats * sizeof(float)) != 0) return -1;
    /* Zeroed once: the padding of head_dim (columns of keys and values) is never written again, and
     * stays zero; rows of a chunk beyond its keys are never read. */
    memset(base, 0, floats * sizeof(float));
    s->partial = (vfloat *)base;
    s->query = base + ROW_BLOCK * LANES * LANES;
    s->acc = s->query + rows * dim;
    s->keys = s->acc + rows * dim;
    s->values = s->keys + dim * KEY_CHUNK;
    s->scores = s->values + KEY_CHUNK * dim;
    s->row_max = s->scores + rows * KEY_CHUNK;
    s->row_sum = s->row_max + rows;
    return 0;
}

/* scores[r * KEY_CHUNK + k] = query_r . keys_k for the ``rows`` (at most ROW_BLOCK) query rows from
 * ``query`` and the chunk's first n keys (rounded up to LANES; keys [KEY_CHUNK][dim], fp32): the
 * decode kernel's lane partials (one vfma chain per lane from zero) and tree_lanes, the rows' queries
 * in registers, each key row loaded once for all of them. */
static inline __attribute__((always_inline)) void score_rows(
    const float *restrict query, int64_t rows, const float *restrict keys, float *restrict scores, vfloat *partial,
    int64_t n, const int64_t vectors) {
    vfloat q[ROW_BLOCK][MAX_PADDED_HEAD_DIM / LANES];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < vectors; j++) memcpy(&q[r][j], query + r * vectors * LANES + j * LANES, sizeof(vfloat));
    for (int64_t k0 = 0; k0 < n; k0 += LANES) {
        for (int64_t k = 0; k < LANES; k++) {
            const float *key = keys + (k0 + k) * vectors * LANES;
            for (int64_t r = 0; r < rows; r++) {
                vfloat dot = {0};
                for (int64_t j = 0; j < vectors; j++) {
                    vfloat kv;
                    memcpy(&kv, key + j * LANES, sizeof kv);
                    dot = vfma(q[r][j], kv, dot);
                }
                partial[r * LANES + k] = dot;
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            const vfloat sums = tree_lanes(partial + r * LANES);
            memcpy(scores + r * KEY_CHUNK + k0, &sums, sizeof sums);
        }
    }
}

static void score_rows_any(const float *query, int64_t rows, const float *keys, float *scores, vfloat *partial,
                           int64_t n, int64_t vectors) {
    switch (vectors) {
        case 64 / LANES: score_rows(query, rows, keys, scores, partial, n, 64 / LANES); break;
        case 128 / LANES: score_rows(query, rows, keys, scores, partial, n, 128 / LANES); break;
        default: score_rows(query, rows, keys, scores, partial, n, vectors);
    }
}

/* acc[0:dim] = acc * alpha + sum_k weights[k] * values[k, 0:dim] (in order); ``vectors`` = dim / LANES,
 * a constant where inlined, so the accumulator lives in registers. */
static inline __attribute__((always_inline)) void accumulate_values(
    float *restrict acc, const float *restrict weights, const float *restrict values, int64_t count, float alpha,
    const int64_t vectors) {
    vfloat a[MAX_PADDED_HEAD_DIM / LANES];
    vfloat *acc_v = (vfloat *)acc;
    for (int64_t i = 0; i < vectors; i++) a[i] = acc_v[i] * alpha;
    for (int64_t k = 0; k < count; k++) {
        const vfloat *v = (const vfloat *)(values + k * vectors * LANES);
        const vfloat p = vsplat(weights[k]);
        for (int64_t i = 0; i < vectors; i++) a[i] = vfma(p, v[i], a[i]);
    }
    for (int64_t i = 0; i < vectors; i++) acc_v[i] = a[i];
}

static void accumulate_values_any(float *acc, const float *weights, const float *values, int64_t count, float alpha,
                                  int64_t vectors) {
    switch (vectors) {
        case 64 / LANES: accumulate_values(acc, weights, values, count, alpha, 64 / LANES); break;
        case 128 / LANES: accumulate_values(acc, weights, values, count, alpha, 128 / LANES); break;
        default: accumulate_values(acc, weights, values, count, alpha, vectors);
    }
}

/* One task: ``tokens`` query tokens from ``first`` (position ``first_pos`` of the sequence) times
 * ``group`` query heads of KV head ``h``. */
static inline __attribute__((always_inline)) void attend_tile(
    const Scratch *s, const void *query, int64_t query_token_stride, const void *key_cache,
    const void *value_cache, const int64_t *table, void *out, int64_t out_token_stride, int64_t first,
    int64_t tokens, int64_t first_pos, int64_t h, int64_t group, int64_t head_dim, int64_t dim,
    int64_t num_blocks, int64_t block_size, float scale, int bf16) {
    const int64_t rows = tokens * group;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r / group, head = h * group + r % group;
        float *q = s->query + r * dim;
        for (int64_t d = 0; d < head_dim; d++)
            q[d] = scale * load_elem(query, (first + t) * query_token_stride + head * head_dim + d, bf16);
        for (int64_t d = head_dim; d < dim; d++) q[d] = 0.0f;
        memset(s->acc + r * dim, 0, sizeof(float) * (size_t)dim);
        s->row_max[r] = -INFINITY;
        s->row_sum[r] = 0.0f;
    }
    const int64_t last_pos = first_pos + tokens - 1;
    for (int64_t start = 0; start <= last_pos; start += KEY_CHUNK) {
        const int64_t count = last_pos - start + 1 < KEY_CHUNK ? last_pos - start + 1 : KEY_CHUNK;
        /* The chunk's keys and values in fp32. Rows beyond ``count`` hold stale keys, whose scores are
         * never used. */
        for (int64_t k = 0; k < count; k++) {
            const int64_t pos = start + k;
            const int64_t base = ((h * num_blocks + table[pos / block_size]) * block_size + pos % block_size)
                                 * head_dim;
            int64_t d = 0;
            for (; d + LANES <= head_dim; d += LANES) {
                const vfloat key = vload(key_cache, base + d, bf16), value = vload(value_cache, base + d, bf16);
                memcpy(s->keys + k * dim + d, &key, sizeof key);
                memcpy(s->values + k * dim + d, &value, sizeof value);
            }
            for (; d < head_dim; d++) {
                s->keys[k * dim + d] = load_elem(key_cache, base + d, bf16);
                s->values[k * dim + d] = load_elem(value_cache, base + d, bf16);
            }
        }
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
            const int64_t block = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
            const int64_t seen = first_pos + (r0 + block - 1) / group - start + 1;  /* keys the block's last row sees */
            if (seen <= 0) continue;
            score_rows_any(s->query + r0 * dim, block, s->keys, s->scores + r0 * KEY_CHUNK, s->partial,
                           seen < count ? seen : count, dim / LANES);
            for (int64_t r = r0; r < r0 + block; r++) {
                const int64_t visible = first_pos + r / group - start + 1;  /* keys of this chunk row r sees */
                if (visible <= 0) continue;
                const int64_t n = visible < count ? visible : count;
                float *sc = s->scores + r * KEY_CHUNK;
                const float alpha = softmax_chunk(sc, n, &s->row_max[r], &s->row_sum[r]);
                accumulate_values_any(s->acc + r * dim, sc, s->values, n, alpha, dim / LANES);
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r / group, head = h * group + r % group;
        const float inv = 1.0f / s->row_sum[r];
        const int64_t target = (first + t) * out_token_stride + head * head_dim;
        int64_t d = 0;
        for (; d + LANES <= head_dim; d += LANES) {  /* vstore: the decode kernel's rounding to bf16 */
            vfloat v;
            memcpy(&v, s->acc + r * dim + d, sizeof v);
            vstore(out, target + d, v * inv, bf16);
        }
        for (; d < head_dim; d++) store_elem(out, target + d, s->acc[r * dim + d] * inv, bf16);
    }
}

/* Returns 0; -1 when a size is beyond the kernel's limits or a sequence's numbers disagree (a query
 * longer than its context, a context beyond its block table, a block outside the cache), nothing
 * written;
 * -2 when a buffer cannot be allocated (nothing is then promised about ``out``). No sequences: nothing
 * to do. */
static inline __attribute__((always_inline)) int prefill_attention(
    const void *query, int64_t query_token_stride, const void *key_cache, const void *value_cache,
    const int64_t *block_tables, int64_t max_blocks, const int64_t *query_start, const int64_t *query_len,
    const int64_t *context_lens, void *out, int64_t out_token_stride, int64_t num_seqs, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, float scale,
    int num_threads, int bf16) {
    if (num_seqs < 0 || num_heads < 1 || num_kv_heads < 1 || head_dim < 1 || num_heads % num_kv_heads != 0
        || padded_dim(head_dim) > MAX_PADDED_HEAD_DIM || num_blocks < 0 || block_size < 1 || max_blocks < 0)
        return -1;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t dim = padded_dim(head_dim);
    for (int64_t i = 0; i < num_seqs; i++) {
        if (query_start[i] < 0 || query_len[i] < 1 || query_len[i] > context_lens[i]
            || context_lens[i] > max_blocks * block_size)
            return -1;
        for (int64_t b = 0; b < (context_lens[i] + block_size - 1) / block_size; b++)
            if (block_tables[i * max_blocks + b] < 0 || block_tables[i * max_blocks + b] >= num_blocks) return -1;
    }
    if (num_seqs == 0) return 0;
    int64_t *task_start = malloc(sizeof(int64_t) * (size_t)(num_seqs + 1));
    if (task_start == NULL) return -2;
    task_start[0] = 0;
    for (int64_t i = 0; i < num_seqs; i++)
        task_start[i + 1] = task_start[i] + (query_len[i] + TILE_TOKENS - 1) / TILE_TOKENS * num_kv_heads;
    const int64_t num_tasks = task_start[num_seqs];
    int failed = 0;
    #pragma omp parallel num_threads(num_threads)
    {
        Scratch scratch = {0};
        const int ok = scratch_alloc(&scratch, TILE_TOKENS * group, dim) == 0;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        int64_t seq = 0;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = num_tasks - 1; task >= 0; task--) {  /* the longest contexts first */
            if (!ok) continue;
            while (task < task_start[seq]) seq--;
            while (task >= task_start[seq + 1]) seq++;
            const int64_t local = task - task_start[seq];
            const int64_t tile = local / num_kv_heads, h = local % num_kv_heads;
            const int64_t first_token = tile * TILE_TOKENS;
            const int64_t rest = query_len[seq] - first_token;
            const int64_t tokens = rest < TILE_TOKENS ? rest : TILE_TOKENS;
            const int64_t first_pos = context_lens[seq] - query_len[seq] + first_token;
            attend_tile(&scratch, query, query_token_stride, key_cache, value_cache,
                        block_tables + seq * max_blocks, out, out_token_stride, query_start[seq] + first_token,
                        tokens, first_pos, h, group, head_dim, dim, num_blocks, block_size, scale, bf16);
        }
        if (ok) free(scratch.partial);
    }
    free(task_start);
    return failed ? -2 : 0;
}

#define PREFILL_ARGS                                                                                   \
    const void *query, int64_t query_token_stride, const void *key_cache, const void *value_cache,     \
    const int64_t *block_tables, int64_t max_blocks, const int64_t *query_start, const int64_t *query_len, \
    const int64_t *context_lens, void *out, int64_t out_token_stride, int64_t num_seqs, int64_t num_heads, \
    int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size, float scale, int num_threads
#define PREFILL_PASS                                                                                   \
    query, query_token_stride, key_cache, value_cache, block_tables, max_blocks, query_start, query_len, \
    context_lens, out, out_token_stride, num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, \
    scale, num_threads

int paged_prefill_attention_f32(PREFILL_ARGS) { return prefill_attention(PREFILL_PASS, 0); }
int paged_prefill_attention_bf16(PREFILL_ARGS) { return prefill_attention(PREFILL_PASS, 1); }
