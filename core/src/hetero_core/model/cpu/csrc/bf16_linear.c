/* bf16 linear layers: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), bf16 in and out, fp32 accumulation.
 *
 * With AVX-512 BF16, VDPBF16PS dot products. oneDNN runs these shapes either compute-bound or
 * memory-bound but seldom both at once: for 32 rows the 30 layers of SmolLM2-135M take ~13 ms, the
 * sum of their compute at the bf16 peak (~7.5 ms) and of streaming their weights from memory
 * (~4.7 ms). Here each thread walks its share of the weight in one sequential stream (the hardware
 * prefetcher keeps it ahead) while every weight vector it loads feeds up to ROWS dot products
 * against rows of x kept in L1, so streaming hides behind compute. With more rows than one pass
 * takes, the later passes over a group of panels run from cache and prefetch the next group
 * meanwhile (30 layers at 32 rows: 10.5 -> ~8 ms; the arithmetic alone, weights in cache, is 7.2 ms,
 * 940 GFLOP/s).
 *
 * Without AVX-512 BF16 (any other x86: AVX-512F, AVX2, SSE) the same plan widens each weight pair to
 * two fp32 vectors in registers (a shift and a mask) and runs two vfma per pair: bf16 runs these
 * kernels on every CPU, with half the weight bytes of fp32. That widening is every pass's again, so
 * from EXPAND_ROWS rows on (prefills, batched decodes: several passes) each thread widens a run of
 * its panels once into f32_linear's layout and runs f32_linear's passes over them (widened_linear):
 * the same fp32 chains in the same order, so the same bits, at fp32's rate (a 1B model's 512-token
 * prefill on a 2-core AVX2 EPYC had taken 1.4x fp32's time).
 *
 * The weight is packed once at load (by the caller, in torch) as [N / 16][K / 2][16][2]: 16 output
 * columns (one panel) by pairs of the reduction dimension, the layout VDPBF16PS multiplies. A
 * panel's fp32 accumulators per row of x live in registers for its whole K.
 *
 * Batch invariance: threads, groups and passes split the outputs and the rows, never K; every output
 * is the bias (or zero) followed by one chain over the input pairs in order (a VDPBF16PS, or two vfma,
 * per pair), whatever the number of rows, so a row's result does not depend on its batch-mates.
 *
 * With ``swiglu`` the weight is the MLP's fused gate/up projection with its panels interleaved
 * (gate panel i, then up panel i) and the kernel writes silu(gate) * up, N / 2 columns (bf16), as
 * f32_linear.c does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "kernel_math.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Panels (16 columns each) and rows of x per pass: WIDTH * ROWS = 24 accumulators in registers.
 * Measured on a Zen 5 EPYC over SmolLM2's 30 layers at 32 rows: 3 x 8 10.8 ms, 2 x 12 11.4 ms,
 * 4 x 6 11.1 ms (oneDNN 12.6 ms). The switch cases below go up to these two. */
#define WIDTH 3
#define ROWS 8
/* SwiGLU: 2 gate/up pairs x 6 rows, or, for up to 12 rows in all, 1 pair x 12 rows (one pass):
 * against the unfused linear and silu_mul at SmolLM2's MLP shape, 1.03-1.10x (6 rows) and 1.21x at
 * 8 rows (12 rows). */
#define SWIGLU_WIDTH 4
#define SWIGLU_ROWS 6
#define SWIGLU_FEW_ROWS 12
#define MAX_ROWS (SWIGLU_FEW_ROWS > ROWS ? SWIGLU_FEW_ROWS : ROWS)
#define PREFETCH_LINES 24 /* how far ahead of the panel stream the loads are asked for (64-byte lines) */

int bf16_linear_native(void) { return 1; }
#define WIDENS_INPUT 0 /* the passes read x in bf16 */

/* ``width`` panels (16 columns each, one after the other in memory) for ``rows`` rows of x. */
static inline __attribute__((always_inline)) void panel_rows(
    const uint16_t *x, int64_t ldx, const uint16_t *panel, const float *bias16, void *y, int64_t ldy,
    int64_t pairs, const int rows, const int width, int out_f32, const int swiglu, const char *ahead,
    int64_t ahead_lines) {
    __m512 acc[SWIGLU_WIDTH > WIDTH ? SWIGLU_WIDTH : WIDTH][MAX_ROWS];
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++)
            acc[c][r] = bias16 != NULL ? _mm512_loadu_ps(bias16 + 16 * c) : _mm512_setzero_ps();
    const int64_t ahead_per_pair = pairs > 0 ? (ahead_lines + pairs - 1) / pairs : 0;
    for (int64_t kp = 0; kp < pairs; kp++) {
        for (int64_t a = kp * ahead_per_pair; a < (kp + 1) * ahead_per_pair && a < ahead_lines; a++)
            _mm_prefetch(ahead + 64 * a, _MM_HINT_T1);  /* the next panels, while this pass runs from cache */
        __m512bh w[SWIGLU_WIDTH > WIDTH ? SWIGLU_WIDTH : WIDTH];
        for (int c = 0; c < width; c++) {  /* the panels follow each other */
            const uint16_t *column = panel + c * pairs * 32;
            _mm_prefetch((const char *)(column + (kp + PREFETCH_LINES) * 32), _MM_HINT_T0);
            w[c] = (__m512bh)_mm512_loadu_si512((const void *)(column + kp * 32));
        }
        for (int r = 0; r < rows; r++) {
            int32_t pair;  /* x[r, 2 kp], x[r, 2 kp + 1], broadcast to all 16 columns */
            memcpy(&pair, x + r * ldx + 2 * kp, sizeof pair);
            const __m512bh xr = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < width; c++) acc[c][r] = _mm512_dpbf16_ps(acc[c][r], w[c], xr);
        }
    }
    if (swiglu) {  /* panels 2j and 2j + 1: gate and up of output panel j */
        for (int c = 0; c < width; c += 2)
            for (int r = 0; r < rows; r++) {
                const vfloat out = vswiglu((vfloat)acc[c][r], (vfloat)acc[c + 1][r], 1);
                _mm256_storeu_si256((__m256i *)((uint16_t *)y + r * ldy + 16 * (c / 2)),
                                    (__m256i)_mm512_cvtneps_pbh((__m512)out));
            }
        return;
    }
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++) {
            if (out_f32) _mm512_storeu_ps((float *)y + r * ldy + 16 * c, acc[c][r]);
            else _mm256_storeu_si256((__m256i *)((uint16_t *)y + r * ldy + 16 * c), (__m256i)_mm512_cvtneps_pbh(acc[c][r]));
        }
}

#define WIDTH_CASE(n, c) case c: panel_rows(xr, ldx, w, b, yr, ldy, pairs, n, c, out_f32, 0, ahead, ahead_lines); break;
#define ROWS_CASE(n) case n: \
    switch (width) { WIDTH_CASE(n, 1) WIDTH_CASE(n, 2) WIDTH_CASE(n, 3) } \
    break;
#define SWIGLU_CASE(n) case n: \
    if (width == 4) panel_rows(xr, ldx, w, b, yr, ldy, pairs, n, 4, 0, 1, ahead, ahead_lines); \
    else panel_rows(xr, ldx, w, b, yr, ldy, pairs, n, 2, 0, 1, ahead, ahead_lines); \
    break;
#define PAIR_CASE(n) case n: panel_rows(xr, ldx, w, b, yr, ldy, pairs, n, 2, 0, 1, ahead, ahead_lines); break;

/* One pass: ``rows`` rows of x against a group of ``width`` panels (swiglu: pairs of them; ``few``:
 * the one-pair configuration for few rows). */
static void bf16_pass(const void *x, int64_t ldx, const uint16_t *w, const float *b, void *yr, int64_t ldy,
                      int64_t pairs, int64_t rows, int width, int out_f32, int swiglu, int few, const char *ahead,
                      int64_t ahead_lines) {
    const uint16_t *xr = x;
    if (swiglu) {
        if (few) {
            switch (rows) {
                PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) PAIR_CASE(5) PAIR_CASE(6)
                PAIR_CASE(7) PAIR_CASE(8) PAIR_CASE(9) PAIR_CASE(10) PAIR_CASE(11) PAIR_CASE(12)
            }
        } else {
            switch (rows) { SWIGLU_CASE(1) SWIGLU_CASE(2) SWIGLU_CASE(3) SWIGLU_CASE(4) SWIGLU_CASE(5) SWIGLU_CASE(6) }
        }
        return;
    }
    switch (rows) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
    }
}

#else  /* no AVX-512 BF16: the weight's pairs widened to fp32 in registers */


int bf16_linear_native(void) { return 0; }
#define WIDENS_INPUT 1 /* the passes read x widened to fp32, once per call */

#define PANEL 16
#define PANEL_VECTORS (PANEL / LANES)
/* Panels per group, vectors of each panel per pass (a slice, from vector v0) and rows per pass, from
 * the registers: accumulators, a panel vector's two widened weight vectors, two broadcasts. */
#if LANES == 16
#define WIDTH 3
#define ROWS 8
#define SLICE 1
#define SWIGLU_WIDTH 4
#define SWIGLU_ROWS 6
#define SWIGLU_FEW_ROWS 12 /* one pair for up to this many rows */
#else
#define WIDTH 1
#if LANES == 8
#define ROWS 6
#else
#define ROWS 3
#endif
#define SLICE 2
#define SWIGLU_WIDTH 2
#define SWIGLU_ROWS ROWS
#define SWIGLU_FEW_ROWS ROWS
#endif
#define SWIGLU_SLICE 1
#define EXPAND_ROWS 64 /* rows from which widened_linear runs the call (below: 0.75-1.1x the widening passes) */
#define EXPANDED_RUN_BYTES (512 * 1024) /* fp32 panels a thread widens at a time (L2) */
#define MAX_WIDTH (WIDTH > SWIGLU_WIDTH ? WIDTH : SWIGLU_WIDTH)
#define MAX_ROWS (ROWS > SWIGLU_FEW_ROWS ? ROWS : SWIGLU_FEW_ROWS)
#define MAX_SLICE (SLICE > SWIGLU_SLICE ? SLICE : SWIGLU_SLICE)

/* ``rows`` rows of x (fp32: the call's input widened once) against ``width`` panels, ``slice`` vectors
 * of each from vector ``v0``: per pair of inputs, the LANES columns' two bf16 weights (one 32-bit lane
 * each) widened to an even and an odd fp32 vector, then acc = vfma(even, x[2kp], acc),
 * acc = vfma(odd, x[2kp + 1], acc). */
static inline __attribute__((always_inline)) void widened_rows(
    const float *x, int64_t ldx, const uint16_t *panel, const float *bias, void *y, int64_t ldy, int64_t pairs,
    const int rows, const int width, const int slice, int v0, int out_f32, const int swiglu) {
    vfloat acc[MAX_WIDTH * MAX_SLICE][MAX_ROWS];
    for (int c = 0; c < width; c++)
        for (int v = 0; v < slice; v++) {
            vfloat start = {0};
            if (bias != NULL) memcpy(&start, bias + c * PANEL + (v0 + v) * LANES, sizeof start);
            for (int r = 0; r < rows; r++) acc[c * slice + v][r] = start;
        }
    for (int64_t kp = 0; kp < pairs; kp++)
        for (int c = 0; c < width; c++)
            for (int v = 0; v < slice; v++) {
                vuint u;  /* lane j: column j's weights of inputs 2kp (low half) and 2kp + 1 (high half) */
                memcpy(&u, panel + (c * pairs + kp) * 2 * PANEL + (v0 + v) * 2 * LANES, sizeof u);
                const vuint low = u << 16, high = u & 0xffff0000u;
                vfloat even, odd;
                memcpy(&even, &low, sizeof low);
                memcpy(&odd, &high, sizeof high);
                for (int r = 0; r < rows; r++) {
                    const float *xr = x + r * ldx + 2 * kp;
                    acc[c * slice + v][r] = vfma(odd, vsplat(xr[1]), vfma(even, vsplat(xr[0]), acc[c * slice + v][r]));
                }
            }
    for (int c = 0; c < width; c += swiglu ? 2 : 1)
        for (int v = 0; v < slice; v++)
            for (int r = 0; r < rows; r++) {
                if (swiglu)  /* panels c and c + 1: gate and up of output panel c / 2 */
                    vstore(y, r * ldy + c / 2 * PANEL + (v0 + v) * LANES,
                           vswiglu(acc[c * slice + v][r], acc[(c + 1) * slice + v][r], 1), 1);
                else
                    vstore(y, r * ldy + c * PANEL + (v0 + v) * LANES, acc[c * slice + v][r], !out_f32);
            }
}

#define CASES_1(F, w) F(1, w)
#define CASES_2(F, w) CASES_1(F, w) F(2, w)
#define CASES_4(F, w) CASES_3(F, w) F(4, w)
#define CASES_6(F, w) CASES_4(F, w) F(5, w) F(6, w)
#define CASES_3(F, w) CASES_2(F, w) F(3, w)
#define CASES_8(F, w) CASES_6(F, w) F(7, w) F(8, w)
#define CASES_12(F, w) CASES_8(F, w) F(9, w) F(10, w) F(11, w) F(12, w)
#define CASES__(n) CASES_##n
#define CASES(n) CASES__(n)
#define PLAIN_CALL(n, c) case n: widened_rows(xr, ldx, w, b, yr, ldy, pairs, n, c, SLICE, v0, out_f32, 0); break;
#define SWIGLU_CALL(n, c) case n: widened_rows(xr, ldx, w, b, yr, ldy, pairs, n, c, SWIGLU_SLICE, v0, 0, 1); break;

static void bf16_pass(const void *x, int64_t ldx, const uint16_t *w, const float *b, void *yr, int64_t ldy,
                      int64_t pairs, int64_t rows, int width, int out_f32, int swiglu, int few, const char *ahead,
                      int64_t ahead_lines) {
    (void)ahead, (void)ahead_lines;
    const float *xr = x;  /* the hardware prefetcher follows these loops' sequential stream */
    if (swiglu) {
        for (int v0 = 0; v0 < PANEL_VECTORS; v0 += SWIGLU_SLICE) {
            if (few || width == 2) {
                switch (rows) { CASES(SWIGLU_FEW_ROWS)(SWIGLU_CALL, 2) }
                continue;
            }
            switch (rows) { CASES(SWIGLU_ROWS)(SWIGLU_CALL, SWIGLU_WIDTH) }
        }
        return;
    }
    for (int v0 = 0; v0 < PANEL_VECTORS; v0 += SLICE) {
        switch (width) {
            case WIDTH: switch (rows) { CASES(ROWS)(PLAIN_CALL, WIDTH) } break;
#if WIDTH == 3
            case 2: switch (rows) { CASES(ROWS)(PLAIN_CALL, 2) } break;
            case 1: switch (rows) { CASES(ROWS)(PLAIN_CALL, 1) } break;
#endif
        }
    }
}

/* Panels [p0, p1) of the packed bf16 weight ([N / 16][K / 2][16][2]) widened into f32_linear's layout
 * ([panels][K][16] fp32): exact. */
static void widen_panels(const uint16_t *packed, int64_t k, int64_t p0, int64_t p1, float *out) {
    const int64_t pairs = k / 2;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t kp = 0; kp < pairs; kp++)
            for (int v = 0; v < PANEL_VECTORS; v++) {
                vuint u;
                memcpy(&u, packed + (p * pairs + kp) * 2 * PANEL + v * 2 * LANES, sizeof u);
                const vuint low = u << 16, high = u & 0xffff0000u;
                float *row = out + ((p - p0) * k + 2 * kp) * PANEL + v * LANES;
                memcpy(row, &low, sizeof low);
                memcpy(row + PANEL, &high, sizeof high);
            }
}

/* bf16_linear from EXPAND_ROWS rows without native bf16: ``x`` widened (fp32 [M, K]). Each thread takes
 * its share of the panels a run at a time (EXPANDED_RUN_BYTES, swiglu: whole gate/up pairs), widens the
 * run, runs f32_linear on it (one thread: the passes, chunks and prefetches of the fp32 kernel) into
 * fp32 sums, and stores them as the widened passes do: rounded to bf16 (or fp32 with out_f32), or
 * silu(gate) * up with vswiglu's roundings. Returns 0, or -2 when a thread's buffers cannot be had. */
static int widened_linear(const float *x, const uint16_t *packed, const float *bias, void *y, int64_t ldy,
                          int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
    const int64_t panels = n / PANEL, step = swiglu ? 2 : 1;  /* gate/up: panels 2i and 2i + 1 */
    int64_t run = EXPANDED_RUN_BYTES / (k * PANEL * (int64_t)sizeof(float)) / step * step;
    if (run < step) run = step;
    int failed = 0;
    #pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const int64_t units = panels / step;  /* the share of each thread, in whole pairs */
        const int64_t first = units * thread / threads * step, end = units * (thread + 1) / threads * step;
        float *w = first < end ? malloc((size_t)(run * k * PANEL) * sizeof(float)) : NULL;
        float *sums = first < end ? malloc((size_t)(m * run * PANEL) * sizeof(float)) : NULL;
        failed = first < end && (w == NULL || sums == NULL);
        for (int64_t p0 = first; p0 < end && !failed; p0 += run) {
            const int64_t p1 = end - p0 < run ? end : p0 + run, cols = (p1 - p0) * PANEL;
            widen_panels(packed, k, p0, p1, w);
            f32_linear(x, k, w, bias != NULL ? bias + p0 * PANEL : NULL, sums, cols, m, cols, k, 0, 1);
            for (int64_t r = 0; r < m; r++)
                for (int64_t c = 0; c < cols; c += step * PANEL)
                    for (int v = 0; v < PANEL_VECTORS; v++) {
                        vfloat a;
                        memcpy(&a, sums + r * cols + c + v * LANES, sizeof a);
                        if (swiglu) {  /* panel c / 16: gates, the next: ups, of output panel (p0 * 16 + c) / 32 */
                            vfloat up;
                            memcpy(&up, sums + r * cols + c + PANEL + v * LANES, sizeof up);
                            vstore(y, r * ldy + (p0 * PANEL + c) / 2 + v * LANES, vswiglu(a, up, 1), 1);
                        } else {
                            vstore(y, r * ldy + p0 * PANEL + c + v * LANES, a, !out_f32);
                        }
                    }
        }
        free(w), free(sums);
    }
    return failed ? -2 : 0;
}

#endif

/* x [M, K] bf16 (row stride ldx), packed weight [N / 16][K / 2][16][2], bias fp32 [N] (in the weight's
 * column order) or NULL, y [M, N] (row stride ldy) in bf16, or in fp32 with out_f32 (the sums
 * unrounded: logits), or [M, N / 2] bf16 with swiglu (the weight's panels then pairs of gate and up).
 * Returns 0; -1 for shapes linear_refuses (K must be even; nothing written); -2 when the widened
 * copy of x cannot be allocated. */
int bf16_linear(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
    if (linear_refuses(m, n, k, ldx, ldy, swiglu, 2) || (swiglu && out_f32)) return -1;
    if (m == 0 || n == 0) return 0;
#ifdef HETERO_AMX
    if (bf16_linear_amx_granted())  /* the AMX variant, once the kernel granted the tiles: every shape */
        return bf16_linear_amx(x, ldx, packed, bias, y, ldy, m, n, k, out_f32, swiglu, num_threads);
#endif
    float *widened = NULL;  /* x in fp32, for the passes that widen (a pass reads each row many times) */
    if (WIDENS_INPUT && k > 0) {
        widened = malloc((size_t)(m * k) * sizeof(float));
        if (widened == NULL) return -2;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k >= (1 << 16))
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < k; i++) widened[r * k + i] = bf16_to_f32(x[r * ldx + i]);
    }
    const int64_t ld = widened != NULL ? k : ldx;
#if WIDENS_INPUT
    if (widened != NULL && m >= EXPAND_ROWS) {  /* several passes: the panels widened once (widened_linear) */
        const int status = widened_linear(widened, packed, bias, y, ldy, m, n, k, out_f32, swiglu, num_threads);
        free(widened);
        return status;
    }
#endif
    const int64_t panels = n / 16, pairs = k / 2;
    const int few = swiglu && m <= SWIGLU_FEW_ROWS;  /* one pass of one pair per group */
    const int group_width = few ? 2 : swiglu ? SWIGLU_WIDTH : WIDTH;
    const int max_rows = few ? SWIGLU_FEW_ROWS : swiglu ? SWIGLU_ROWS : ROWS;
    const int64_t groups = (panels + group_width - 1) / group_width;  /* group_width panels at a time */
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t group = 0; group < groups; group++) {
        const int64_t p = group_width * group;
        const int width = panels - p < group_width ? (int)(panels - p) : group_width;
        const uint16_t *w = packed + p * pairs * 32;
        const float *b = bias != NULL ? bias + p * 16 : NULL;
        const int64_t passes = (m + max_rows - 1) / max_rows;  /* rows split evenly: 20 -> 7 + 7 + 6, not 8 + 8 + 4 */
        /* The first pass streams this group's panels from memory; the others read them from cache and
         * meanwhile pull the next group's panels in (one share each), so memory never idles. */
        const int64_t next_panels = panels - p - width < group_width ? panels - p - width : group_width;
        const char *next = (const char *)(w + width * pairs * 32);
        const int64_t next_lines = next_panels * pairs, share = passes > 1 ? (next_lines + passes - 2) / (passes - 1) : 0;
        const int64_t column = swiglu ? p / 2 * 16 : p * 16;
        for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
            const int64_t rows = (m - m0) / (passes - pass);
            const int64_t first_line = pass == 0 ? 0 : (pass - 1) * share;
            const int64_t ahead_lines = pass == 0 ? 0 : (next_lines - first_line < share ? next_lines - first_line : share);
            void *yr = out_f32 ? (void *)((float *)y + m0 * ldy + column) : (void *)((uint16_t *)y + m0 * ldy + column);
            const void *xr = widened != NULL ? (const void *)(widened + m0 * ld) : (const void *)(x + m0 * ld);
            bf16_pass(xr, ld, w, b, yr, ldy, pairs, rows, width, out_f32, swiglu, few, next + 64 * first_line,
                      ahead_lines);
            m0 += rows;
        }
    }
    free(widened);
    return 0;
}
