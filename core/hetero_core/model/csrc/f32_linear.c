/* fp32 linear layers: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), with fused multiply-adds on whatever
 * vectors the CPU has (kernel_math.h's LANES: AVX-512, AVX2, SSE).
 *
 * The same plan as bf16_linear.c, for CPUs without bf16 arithmetic (AVX2-only ones run fp32 by
 * default). Each thread walks its share of the weight in one sequential stream while every weight
 * vector it loads feeds up to ROWS rows of x, so streaming the weight from memory hides behind the
 * arithmetic at decode sizes (oneDNN at 32 rows reaches ~75 % of its prefill rate); later passes
 * over a group of panels run from cache and prefetch the next group meanwhile.
 *
 * The weight is packed once at load (by the caller, in torch) as [N / 16][K][16]: 16 output columns
 * (one panel) for each step of the reduction dimension, one 64-byte line. Its layout does not depend
 * on the vector width: a panel is one AVX-512 vector, two AVX2 ones, four SSE ones. A group's
 * accumulators live in registers for the whole of K.
 */
#include <stdint.h>
#include <string.h>

#include "kernel_math.h"

/* Panels per group and rows of x per pass, from the registers: VECTORS * ROWS accumulators plus a
 * group's weight vectors and one broadcast. AVX-512 (32 registers): 3 panels x 8 rows = 24
 * accumulators; AVX2 (16): 1 panel (2 vectors) x 6 rows = 12; SSE (16): 1 panel (4 vectors) x 3 rows. */
#if LANES == 16
#define F32_WIDTH 3
#define F32_ROWS 8
#elif LANES == 8
#define F32_WIDTH 1
#define F32_ROWS 6
#else
#define F32_WIDTH 1
#define F32_ROWS 3
#endif
#define PANEL 16 /* output columns per panel */
#define PANEL_VECTORS (PANEL / LANES)
#define F32_PREFETCH_LINES 16 /* how far ahead of the panel stream the loads are asked for (64-byte lines) */

static inline __attribute__((always_inline)) void f32_panel_rows(
    const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy,
    int64_t k, const int rows, const int width, const char *ahead, int64_t ahead_lines) {
    vfloat acc[F32_WIDTH * PANEL_VECTORS][F32_ROWS];
    for (int v = 0; v < width * PANEL_VECTORS; v++) {
        vfloat start = {0};
        if (bias != NULL) memcpy(&start, bias + v * LANES, sizeof start);
        for (int r = 0; r < rows; r++) acc[v][r] = start;
    }
    const int64_t ahead_per_step = (ahead_lines + k - 1) / k;
    for (int64_t i = 0; i < k; i++) {
        for (int64_t a = i * ahead_per_step; a < (i + 1) * ahead_per_step && a < ahead_lines; a++)
            __builtin_prefetch(ahead + 64 * a, 0, 2);  /* the next panels, while this pass runs from cache */
        vfloat w[F32_WIDTH * PANEL_VECTORS];
        for (int c = 0; c < width; c++) {  /* the panels follow each other: K lines each */
            const float *line = panel + (c * k + i) * PANEL;
            __builtin_prefetch(line + F32_PREFETCH_LINES * PANEL, 0, 3);
            for (int v = 0; v < PANEL_VECTORS; v++) memcpy(&w[c * PANEL_VECTORS + v], line + v * LANES, sizeof(vfloat));
        }
        for (int r = 0; r < rows; r++) {
            const float xr = x[r * ldx + i];  /* broadcast to every lane */
            for (int v = 0; v < width * PANEL_VECTORS; v++) acc[v][r] += w[v] * xr;
        }
    }
    for (int v = 0; v < width * PANEL_VECTORS; v++)
        for (int r = 0; r < rows; r++) memcpy(y + r * ldy + v * LANES, &acc[v][r], sizeof(vfloat));
}

#define F32_WIDTH_CASE(n, c) case c: f32_panel_rows(xr, ldx, w, b, yr, ldy, k, n, c, ahead, ahead_lines); break;
#if F32_WIDTH == 3
#define F32_ROWS_CASE(n) case n: \
    switch (width) { F32_WIDTH_CASE(n, 1) F32_WIDTH_CASE(n, 2) F32_WIDTH_CASE(n, 3) } \
    break;
#else
#define F32_ROWS_CASE(n) case n: f32_panel_rows(xr, ldx, w, b, yr, ldy, k, n, 1, ahead, ahead_lines); break;
#endif

/* x [M, K] (row stride ldx), packed weight [N / 16][K][16], bias [N] or NULL, y [M, N] (row stride
 * ldy); N a multiple of 16 (the caller checks). Returns 0. */
int f32_linear(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, int num_threads) {
    const int64_t panels = n / PANEL;
    const int64_t groups = (panels + F32_WIDTH - 1) / F32_WIDTH;  /* F32_WIDTH panels at a time */
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t group = 0; group < groups; group++) {
        const int64_t p = F32_WIDTH * group;
        const int width = panels - p < F32_WIDTH ? (int)(panels - p) : F32_WIDTH;
        const float *w = packed + p * k * PANEL;
        const float *b = bias != NULL ? bias + p * PANEL : NULL;
        const int64_t passes = (m + F32_ROWS - 1) / F32_ROWS;  /* rows split evenly over the passes */
        /* The first pass streams this group's panels from memory; the others read them from cache and
         * meanwhile pull the next group's panels in (one share each). */
        const int64_t next_panels = panels - p - width < F32_WIDTH ? panels - p - width : F32_WIDTH;
        const char *next = (const char *)(w + width * k * PANEL);
        const int64_t next_lines = next_panels * k, share = passes > 1 ? (next_lines + passes - 2) / (passes - 1) : 0;
        for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
            const int64_t rows = (m - m0) / (passes - pass);
            const int64_t first_line = pass == 0 ? 0 : (pass - 1) * share;
            const char *ahead = next + 64 * first_line;
            const int64_t ahead_lines = pass == 0 ? 0 : (next_lines - first_line < share ? next_lines - first_line : share);
            const float *xr = x + m0 * ldx;
            float *yr = y + m0 * ldy + p * PANEL;
            m0 += rows;
            switch (rows) {
                F32_ROWS_CASE(1) F32_ROWS_CASE(2) F32_ROWS_CASE(3)
#if F32_ROWS >= 6
                F32_ROWS_CASE(4) F32_ROWS_CASE(5) F32_ROWS_CASE(6)
#endif
#if F32_ROWS >= 8
                F32_ROWS_CASE(7) F32_ROWS_CASE(8)
#endif
            }
        }
    }
    return 0;
}
