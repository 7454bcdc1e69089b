/* bf16 linear layers for few rows (decode steps), with AVX-512 BF16 dot products.
 *
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), bf16 in and out, fp32 accumulation. oneDNN runs these
 * shapes either compute-bound or memory-bound but seldom both at once: for 32 rows the 30 layers of
 * SmolLM2-135M take ~13 ms, the sum of their compute at the bf16 peak (~7.5 ms) and of streaming
 * their weights from memory (~4.7 ms). Here each thread walks its share of the weight in one
 * sequential stream (the hardware prefetcher keeps it ahead) while every weight vector it loads
 * feeds up to ROWS dot products against rows of x kept in L1, so streaming hides behind compute.
 * With more rows than one pass takes, the later passes over a group of panels run from cache and
 * prefetch the next group meanwhile (30 layers at 32 rows: 10.5 -> ~8 ms; the arithmetic alone,
 * weights in cache, is 7.2 ms, 940 GFLOP/s).
 *
 * The weight is packed once at load (by the caller, in torch) as [N / 16][K / 2][16][2]: 16 output
 * columns (one panel) by pairs of the reduction dimension, the layout VDPBF16PS multiplies. A
 * panel's 16 fp32 accumulators per row of x live in registers for its whole K.
 *
 * With ``swiglu`` the weight is the MLP's fused gate/up projection with its panels interleaved
 * (gate panel i, then up panel i) and the kernel writes silu(gate) * up, N / 2 columns (bf16), as
 * f32_linear.c does.
 *
 * Compiled only where the compiler targets AVX-512 BF16 (-march=native on such a CPU);
 * elsewhere bf16_linear_available() is 0 and the caller keeps oneDNN.
 */
#include <stdint.h>
#include <string.h>

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

int bf16_linear_available(void) { return 1; }

/* ``width`` panels (16 columns each, one after the other in memory) for ``rows`` rows of x. */
static inline __attribute__((always_inline)) void panel_rows(
    const uint16_t *x, int64_t ldx, const uint16_t *panel, const float *bias16, void *y, int64_t ldy,
    int64_t pairs, const int rows, const int width, int out_f32, const int swiglu, const char *ahead,
    int64_t ahead_lines) {
    __m512 acc[SWIGLU_WIDTH > WIDTH ? SWIGLU_WIDTH : WIDTH][MAX_ROWS];
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++)
            acc[c][r] = bias16 != NULL ? _mm512_loadu_ps(bias16 + 16 * c) : _mm512_setzero_ps();
    const int64_t ahead_per_pair = (ahead_lines + pairs - 1) / pairs;
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

/* x [M, K] (row stride ldx), packed weight [N / 16][K / 2][16][2], bias fp32 [N] (in the weight's
 * column order) or NULL, y [M, N] (row stride ldy) in bf16, or in fp32 with out_f32 (the sums
 * unrounded: logits), or [M, N / 2] bf16 with swiglu (the weight's panels then pairs of gate and up);
 * N a multiple of 16 (of 32 with swiglu), K even (the caller checks). Returns 0. */
int bf16_linear(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
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
            const char *ahead = next + 64 * first_line;
            const int64_t ahead_lines = pass == 0 ? 0 : (next_lines - first_line < share ? next_lines - first_line : share);
            const uint16_t *xr = x + m0 * ldx;
            void *yr = out_f32 ? (void *)((float *)y + m0 * ldy + column) : (void *)((uint16_t *)y + m0 * ldy + column);
            m0 += rows;
            if (swiglu) {
                if (few) {
                    switch (rows) {
                        PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) PAIR_CASE(5) PAIR_CASE(6)
                        PAIR_CASE(7) PAIR_CASE(8) PAIR_CASE(9) PAIR_CASE(10) PAIR_CASE(11) PAIR_CASE(12)
                    }
                } else {
                    switch (rows) { SWIGLU_CASE(1) SWIGLU_CASE(2) SWIGLU_CASE(3) SWIGLU_CASE(4) SWIGLU_CASE(5) SWIGLU_CASE(6) }
                }
                continue;
            }
            switch (rows) {
                ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
                ROWS_CASE(8)
            }
        }
    }
    return 0;
}

#else

int bf16_linear_available(void) { return 0; }

int bf16_linear(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
    (void)x, (void)ldx, (void)packed, (void)bias, (void)y, (void)ldy, (void)m, (void)n, (void)k, (void)out_f32;
    (void)swiglu, (void)num_threads;
    return -1;
}

#endif
