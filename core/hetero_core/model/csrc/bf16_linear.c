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
 * Compiled only where the compiler targets AVX-512 BF16 (-march=native on such a CPU);
 * elsewhere bf16_linear_available() is 0 and the caller keeps oneDNN.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Panels (16 columns each) and rows of x per pass: WIDTH * ROWS = 24 accumulators in registers.
 * Measured on a Zen 5 EPYC over SmolLM2's 30 layers at 32 rows: 3 x 8 10.8 ms, 2 x 12 11.4 ms,
 * 4 x 6 11.1 ms (oneDNN 12.6 ms). The switch cases below go up to these two. */
#define WIDTH 3
#define ROWS 8
#define PREFETCH_LINES 24 /* how far ahead of the panel stream the loads are asked for (64-byte lines) */

int bf16_linear_available(void) { return 1; }

/* ``width`` panels (16 columns each, one after the other in memory) for ``rows`` rows of x. */
static inline __attribute__((always_inline)) void panel_rows(
    const uint16_t *x, int64_t ldx, const uint16_t *panel, const float *bias16, void *y, int64_t ldy,
    int64_t pairs, const int rows, const int width, int out_f32, const char *ahead, int64_t ahead_lines) {
    __m512 acc[WIDTH][ROWS];
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++)
            acc[c][r] = bias16 != NULL ? _mm512_loadu_ps(bias16 + 16 * c) : _mm512_setzero_ps();
    const int64_t ahead_per_pair = (ahead_lines + pairs - 1) / pairs;
    for (int64_t kp = 0; kp < pairs; kp++) {
        for (int64_t a = kp * ahead_per_pair; a < (kp + 1) * ahead_per_pair && a < ahead_lines; a++)
            _mm_prefetch(ahead + 64 * a, _MM_HINT_T1);  /* the next panels, while this pass runs from cache */
        __m512bh w[WIDTH];
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
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++) {
            if (out_f32) _mm512_storeu_ps((float *)y + r * ldy + 16 * c, acc[c][r]);
            else _mm256_storeu_si256((__m256i *)((uint16_t *)y + r * ldy + 16 * c), (__m256i)_mm512_cvtneps_pbh(acc[c][r]));
        }
}

#define WIDTH_CASE(n, c) case c: panel_rows(xr, ldx, w, b, yr, ldy, pairs, n, c, out_f32, ahead, ahead_lines); break;
#define ROWS_CASE(n) case n: \
    switch (width) { WIDTH_CASE(n, 1) WIDTH_CASE(n, 2) WIDTH_CASE(n, 3) } \
    break;

/* x [M, K] (row stride ldx), packed weight [N / 16][K / 2][16][2], bias fp32 [N] or NULL, y [M, N] (row
 * stride ldy) in bf16, or in fp32 with out_f32 (the sums unrounded: logits); N a multiple of 16, K even
 * (the caller checks). Returns 0. */
int bf16_linear(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int num_threads) {
    const int64_t panels = n / 16, pairs = k / 2;
    const int64_t groups = (panels + WIDTH - 1) / WIDTH;  /* WIDTH panels at a time (fewer at the end) */
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t group = 0; group < groups; group++) {
        const int64_t p = WIDTH * group;
        const int width = panels - p < WIDTH ? (int)(panels - p) : WIDTH;
        const uint16_t *w = packed + p * pairs * 32;
        const float *b = bias != NULL ? bias + p * 16 : NULL;
        const int64_t passes = (m + ROWS - 1) / ROWS;  /* rows split evenly: 20 -> 7 + 7 + 6, not 8 + 8 + 4 */
        /* The first pass streams this group's panels from memory; the others read them from cache and
         * meanwhile pull the next group's panels in (one share each), so memory never idles. */
        const int64_t next_panels = panels - p - width < WIDTH ? panels - p - width : WIDTH;
        const char *next = (const char *)(w + width * pairs * 32);
        const int64_t next_lines = next_panels * pairs, share = passes > 1 ? (next_lines + passes - 2) / (passes - 1) : 0;
        for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
            const int64_t rows = (m - m0) / (passes - pass);
            const int64_t first_line = pass == 0 ? 0 : (pass - 1) * share;
            const char *ahead = next + 64 * first_line;
            const int64_t ahead_lines = pass == 0 ? 0 : (next_lines - first_line < share ? next_lines - first_line : share);
            const uint16_t *xr = x + m0 * ldx;
            void *yr = out_f32 ? (void *)((float *)y + m0 * ldy + p * 16) : (void *)((uint16_t *)y + m0 * ldy + p * 16);
            m0 += rows;
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
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int num_threads) {
    (void)x, (void)ldx, (void)packed, (void)bias, (void)y, (void)ldy, (void)m, (void)n, (void)k, (void)out_f32;
    (void)num_threads;
    return -1;
}

#endif
