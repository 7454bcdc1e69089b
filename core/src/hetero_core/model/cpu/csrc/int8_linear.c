/* int8 linears: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W stored as symmetric int8 codes q[N, K]
 * and fp32 scales per output channel, or per group of ``group_size`` inputs of each output channel
 * (W ~ s[n, k / group_size] q[n, k]; below, one group for brevity).
 *
 * ``int8_linear`` (weight-only int8): with AVX-512 VNNI and groups of at most 1,024 inputs, the
 * activations as int16 per token and group (2^-16 of the group's max |x|: finer than their own bf16
 * rounding) and exact int32 sums by VPDPWSSD (``wide_rows``); elsewhere x in fp32 (bf16 widened once
 * per call), each weight code widened to fp32 in registers, one fp32 fused multiply-add chain per
 * output over k in order; then y = acc * s[n] + bias[n]. Half the weight bytes of bf16.
 *
 * ``w8a8_linear`` (weights and activations in int8): each row of x is quantized on the fly,
 * symmetric per token and group (a = x / sx, sx = max|x| / 127 over the row's inputs of the group,
 * rounded to nearest even, in [-127, 127]: with one group per row, plain per-token scales); the
 * products are summed in int32, exactly: with AVX-512 VNNI, VPDPBUSD multiplies unsigned by signed
 * bytes, so the activations go in as a + 128 and 128 * sum_k q[n, k] (``colsum``, computed at
 * packing) is taken off afterwards; elsewhere plain int32 vector arithmetic does the same sums.
 * y = float(acc) * (sx * s[n]) + bias[n] (one such term per group, added in order).
 *
 * Packed by the caller (``pack_int8_linear``) as [N / 16][K / 4][16][4] int8: 16 output columns (one
 * panel) by quads of the reduction dimension, the layout VPDPBUSD multiplies; both kernels read it
 * (weight-only takes byte j of a 32-bit lane as input 4 kq + j). K must be a multiple of 4.
 *
 * Batch invariance: threads and passes split the outputs and the rows, never K; every output is one
 * chain over k in order (weight-only) or an exact integer sum (W8A8), and a row's activation scale
 * comes from that row alone, so a row's result never depends on its batch-mates. W8A8's integer sums
 * are the same bits on every CPU and path (VNNI or not); the final scaling is one vfma (as the other
 * kernels, two roundings on a CPU without FMA).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "kernel_math.h"

#define PANEL 16
#define PANEL_VECTORS (PANEL / LANES)
/* Per pass: WIDTH panels x ROWS rows, each with an accumulator and a running total in registers. */
#if LANES == 16
#define WIDTH 3 /* panels per group */
#define ROWS 4
#elif LANES == 8
#define WIDTH 1
#define ROWS 3
#else
#define WIDTH 1
#define ROWS 2
#endif
#define MAX_K 65536 /* (255 * 127) * K stays below 2^31: the int32 sums cannot overflow */

#if defined(__AVX512VNNI__) && LANES == 16
#include <immintrin.h>
int w8a8_linear_vnni(void) { return 1; }
#else
int w8a8_linear_vnni(void) { return 0; }
#endif

/* Lane j's four bytes (inputs 4 kq .. 4 kq + 3 of column j), sign-extended. */
static inline __attribute__((always_inline)) void split_quad(vint u, vint out[4]) {
    out[0] = (u << 24) >> 24;
    out[1] = (u << 16) >> 24;
    out[2] = (u << 8) >> 24;
    out[3] = u >> 24;
}

/* Weight-only: ``rows`` rows of x (fp32) against ``width`` panels, ``groups`` groups of ``group_quads``
 * quads along K each with its own scales (panel c, group g: scale + (c * groups + g) * 16). Every
 * output: acc_g = one vfma chain over its group's inputs in order, then total = vfma(acc_g, s_g, total)
 * for g in order, total starting at the bias. */
static inline __attribute__((always_inline)) void float_rows(
    const float *x, int64_t ldx, const int8_t *panel, const float *scale, const float *bias, void *y, int64_t ldy,
    int64_t groups, int64_t group_quads, const int rows, const int width, int out_bf16) {
    const int64_t quads = groups * group_quads;
    vfloat total[WIDTH * PANEL_VECTORS][ROWS];
    for (int c = 0; c < width * PANEL_VECTORS; c++) {
        vfloat b = {0};
        if (bias != NULL) memcpy(&b, bias + c * LANES, sizeof b);
        for (int r = 0; r < rows; r++) total[c][r] = b;
    }
    for (int64_t g = 0; g < groups; g++) {
        vfloat acc[WIDTH * PANEL_VECTORS][ROWS];
        for (int c = 0; c < width * PANEL_VECTORS; c++)
            for (int r = 0; r < rows; r++) acc[c][r] = (vfloat){0};
        for (int64_t kq = g * group_quads; kq < (g + 1) * group_quads; kq++)
            for (int c = 0; c < width; c++)
                for (int v = 0; v < PANEL_VECTORS; v++) {
                    vint u, parts[4];
                    memcpy(&u, panel + ((c * quads + kq) * PANEL + v * LANES) * 4, sizeof u);
                    split_quad(u, parts);
                    for (int j = 0; j < 4; j++) {
                        const vfloat w = __builtin_convertvector(parts[j], vfloat);
                        for (int r = 0; r < rows; r++)
                            acc[c * PANEL_VECTORS + v][r] = vfma(w, vsplat(x[r * ldx + 4 * kq + j]), acc[c * PANEL_VECTORS + v][r]);
                    }
                }
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS; v++) {
                vfloat s;
                memcpy(&s, scale + (c * groups + g) * PANEL + v * LANES, sizeof s);
                for (int r = 0; r < rows; r++)
                    total[c * PANEL_VECTORS + v][r] = vfma(acc[c * PANEL_VECTORS + v][r], s, total[c * PANEL_VECTORS + v][r]);
            }
    }
    for (int c = 0; c < width * PANEL_VECTORS; c++)
        for (int r = 0; r < rows; r++) vstore(y, r * ldy + c * LANES, total[c][r], out_bf16);
}

/* W8A8: ``rows`` rows of quantized x (a + 128, bytes; ``row_scale`` sx per row and group) against ``width``
 * panels, in groups as float_rows (``colsum``: the codes' sum over each group, laid out as the
 * scales): per group the exact int32 sum, then total = vfma(float(sum), s_g * sx, total). */
static inline __attribute__((always_inline)) void int_rows(
    const uint8_t *xq, int64_t ldx, const float *row_scale, const int8_t *panel, const float *scale,
    const int32_t *colsum, const float *bias, void *y, int64_t ldy, int64_t groups, int64_t group_quads,
    const int rows, const int width, int out_bf16) {
    const int64_t quads = groups * group_quads;
    vfloat total[WIDTH * PANEL_VECTORS][ROWS];
    for (int c = 0; c < width * PANEL_VECTORS; c++) {
        vfloat b = {0};
        if (bias != NULL) memcpy(&b, bias + c * LANES, sizeof b);
        for (int r = 0; r < rows; r++) total[c][r] = b;
    }
    for (int64_t g = 0; g < groups; g++) {
        vint acc[WIDTH * PANEL_VECTORS][ROWS];
        for (int c = 0; c < width * PANEL_VECTORS; c++)
            for (int r = 0; r < rows; r++) acc[c][r] = (vint){0};
        for (int64_t kq = g * group_quads; kq < (g + 1) * group_quads; kq++)
            for (int c = 0; c < width; c++)
                for (int v = 0; v < PANEL_VECTORS; v++) {
                    vint u;
                    memcpy(&u, panel + ((c * quads + kq) * PANEL + v * LANES) * 4, sizeof u);
#if defined(__AVX512VNNI__) && LANES == 16
                    for (int r = 0; r < rows; r++) {
                        int32_t quad;
                        memcpy(&quad, xq + r * ldx + 4 * kq, sizeof quad);
                        acc[c][r] = (vint)_mm512_dpbusd_epi32((__m512i)acc[c][r], _mm512_set1_epi32(quad), (__m512i)u);
                    }
#else
                    vint parts[4];
                    split_quad(u, parts);
                    for (int r = 0; r < rows; r++) {
                        const uint8_t *a = xq + r * ldx + 4 * kq;
                        acc[c * PANEL_VECTORS + v][r] += parts[0] * (int32_t)a[0] + parts[1] * (int32_t)a[1]
                                                         + parts[2] * (int32_t)a[2] + parts[3] * (int32_t)a[3];
                    }
#endif
                }
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS; v++) {
                vfloat s;
                vint sums;
                const int64_t at = (c * groups + g) * PANEL + v * LANES;
                memcpy(&s, scale + at, sizeof s);
                memcpy(&sums, colsum + at, sizeof sums);
                for (int r = 0; r < rows; r++) {
                    const int i = c * PANEL_VECTORS + v;
                    const vfloat exact = __builtin_convertvector(acc[i][r] - 128 * sums, vfloat);
                    total[i][r] = vfma(exact, s * vsplat(row_scale[r * groups + g]), total[i][r]);
                }
            }
    }
    for (int c = 0; c < width * PANEL_VECTORS; c++)
        for (int r = 0; r < rows; r++) vstore(y, r * ldy + c * LANES, total[c][r], out_bf16);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && LANES == 16
#define WIDE_ACTIVATIONS 1
#define WIDE_ROWS 2 /* 2 x WIDTH x WIDE_ROWS int32 accumulators and WIDTH x WIDE_ROWS totals in registers */
#define WIDE_MAX_GROUP 1024 /* (G / 2) x 32767 x 127 stays below 2^31 */
/* Weight-only with AVX-512 VNNI: the activations as int16 per token and group (x16 = x / sx, sx =
 * max|x| / 32767 over the group: 2^-16 of the group's largest value, finer than bf16's own rounding
 * of any value above 1/128 of it), products summed exactly in int32 by VPDPWSSD on the codes
 * widened to int16 (VPMOVSXBW), then total = vfma(float(sum), s_g * sx, total) per group. Columns
 * 0-7 and 8-15 of a panel's quads widen to two vectors whose lanes alternate inputs (4 kq, 4 kq + 1)
 * and (4 kq + 2, 4 kq + 3) of one column; the two lanes of a column are added at the group's end. */
static inline __attribute__((always_inline)) void wide_rows(
    const int16_t *x16, int64_t ldx, const float *row_scale, const int8_t *panel, const float *scale,
    const float *bias, void *y, int64_t ldy, int64_t groups, int64_t group_quads, const int rows, const int width,
    int out_bf16) {
    const int64_t quads = groups * group_quads;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 total[WIDTH][WIDE_ROWS];
    for (int c = 0; c < width; c++) {
        const __m512 b = bias != NULL ? _mm512_loadu_ps(bias + c * PANEL) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) total[c][r] = b;
    }
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[WIDTH][2][WIDE_ROWS];
        for (int c = 0; c < width; c++)
            for (int r = 0; r < rows; r++) acc[c][0][r] = acc[c][1][r] = _mm512_setzero_si512();
        for (int64_t kq = g * group_quads; kq < (g + 1) * group_quads; kq++) {
            __m512i xr[WIDE_ROWS];  /* inputs 4 kq .. 4 kq + 3 of each row: (x0, x1) and (x2, x3) alternating */
            for (int r = 0; r < rows; r++) {
                int64_t four;
                memcpy(&four, x16 + r * ldx + 4 * kq, sizeof four);
                xr[r] = _mm512_set1_epi64(four);
            }
            for (int c = 0; c < width; c++) {
                const int8_t *codes = panel + (c * quads + kq) * PANEL * 4;
                const __m512i low = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)codes));
                const __m512i high = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(codes + 32)));
                for (int r = 0; r < rows; r++) {
                    acc[c][0][r] = _mm512_dpwssd_epi32(acc[c][0][r], low, xr[r]);
                    acc[c][1][r] = _mm512_dpwssd_epi32(acc[c][1][r], high, xr[r]);
                }
            }
        }
        for (int c = 0; c < width; c++) {
            const __m512 s = _mm512_loadu_ps(scale + (c * groups + g) * PANEL);
            for (int r = 0; r < rows; r++) {
                const __m512i sums = _mm512_add_epi32(_mm512_permutex2var_epi32(acc[c][0][r], even, acc[c][1][r]),
                                                      _mm512_permutex2var_epi32(acc[c][0][r], odd, acc[c][1][r]));
                total[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums),
                                              _mm512_mul_ps(s, _mm512_set1_ps(row_scale[r * groups + g])), total[c][r]);
            }
        }
    }
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++) vstore(y, r * ldy + c * PANEL, (vfloat)total[c][r], out_bf16);
}

/* Row r of x as int16 per group (x16 = rint(x * 32767 / max|x|)), sx into row_scale[r * groups + g]. */
static void quantize_row16(const void *x, int64_t ldx, int x_bf16, int64_t r, int64_t k, int64_t group_size,
                           int16_t *x16, float *row_scale) {
    for (int64_t g = 0, i0 = 0; i0 < k; g++, i0 += group_size) {
        float absmax = 0.0f;
        for (int64_t i = i0; i < i0 + group_size; i++) {
            const float v = fabsf(load_elem(x, r * ldx + i, x_bf16));
            absmax = v > absmax ? v : absmax;
        }
        const float inverse = absmax > 0.0f ? 32767.0f / absmax : 0.0f;
        row_scale[r * (k / group_size) + g] = absmax / 32767.0f;
        for (int64_t i = i0; i < i0 + group_size; i++) {
            float q = rintf(load_elem(x, r * ldx + i, x_bf16) * inverse);
            q = q > 32767.0f ? 32767.0f : q < -32767.0f ? -32767.0f : q;
            x16[r * k + i] = (int16_t)q;
        }
    }
}
#define WIDE_CALL(n, w) case n: wide_rows(x16, ldx, rs, p, s, b, yr, ldy, groups, group_quads, n, w, out_bf16); break;
#else
#define WIDE_ACTIVATIONS 0
#define WIDE_MAX_GROUP 0
#endif

#if WIDE_ACTIVATIONS
#define WIDE_ROWS_OR(fallback) WIDE_ROWS
#else
#define WIDE_ROWS_OR(fallback) fallback
#endif
#define FLOAT_CALL(n, w) case n: float_rows(xf, ldx, p, s, b, yr, ldy, groups, group_quads, n, w, out_bf16); break;
#define INT_CALL(n, w) case n: int_rows(xq, ldx, rs, p, s, cs, b, yr, ldy, groups, group_quads, n, w, out_bf16); break;
#if ROWS == 4
#define ROW_CASES(F, w) F(1, w) F(2, w) F(3, w) F(4, w)
#elif ROWS == 3
#define ROW_CASES(F, w) F(1, w) F(2, w) F(3, w)
#else
#define ROW_CASES(F, w) F(1, w) F(2, w)
#endif

static void pass(const float *xf, const uint8_t *xq, const int16_t *x16, const float *rs, int64_t ldx,
                 const int8_t *p, const float *s, const int32_t *cs, const float *b, void *yr, int64_t ldy,
                 int64_t groups, int64_t group_quads, int64_t rows, int width, int out_bf16) {
#if WIDE_ACTIVATIONS
    if (x16 != NULL) {
        switch (width) {
            case 1: switch (rows) { WIDE_CALL(1, 1) WIDE_CALL(2, 1) } break;
            case 2: switch (rows) { WIDE_CALL(1, 2) WIDE_CALL(2, 2) } break;
            case 3: switch (rows) { WIDE_CALL(1, 3) WIDE_CALL(2, 3) } break;
        }
        return;
    }
#else
    (void)x16;
#endif
    if (xq == NULL) {
        switch (width) {
            case 1: switch (rows) { ROW_CASES(FLOAT_CALL, 1) } break;
#if WIDTH == 3
            case 2: switch (rows) { ROW_CASES(FLOAT_CALL, 2) } break;
            case 3: switch (rows) { ROW_CASES(FLOAT_CALL, 3) } break;
#endif
        }
        return;
    }
    switch (width) {
        case 1: switch (rows) { ROW_CASES(INT_CALL, 1) } break;
#if WIDTH == 3
        case 2: switch (rows) { ROW_CASES(INT_CALL, 2) } break;
        case 3: switch (rows) { ROW_CASES(INT_CALL, 3) } break;
#endif
    }
}

/* Row r of x quantized, group by group of ``group_size`` inputs: a + 128 as bytes into xq, sx into
 * row_scale[r * groups + g]. */
static void quantize_row(const void *x, int64_t ldx, int x_bf16, int64_t r, int64_t k, int64_t group_size,
                         uint8_t *xq, float *row_scale) {
    for (int64_t g = 0, i0 = 0; i0 < k; g++, i0 += group_size) {
        float absmax = 0.0f;
        for (int64_t i = i0; i < i0 + group_size; i++) {
            const float v = fabsf(load_elem(x, r * ldx + i, x_bf16));
            absmax = v > absmax ? v : absmax;
        }
        const float inverse = absmax > 0.0f ? 127.0f / absmax : 0.0f;
        row_scale[r * (k / group_size) + g] = absmax / 127.0f;
        for (int64_t i = i0; i < i0 + group_size; i++) {
            float q = rintf(load_elem(x, r * ldx + i, x_bf16) * inverse);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            xq[r * k + i] = (uint8_t)((int32_t)q + 128);
        }
    }
}

/* x [M, K] fp32 or bf16 (x_bf16; row stride ldx), packed [N / 16][K / 4][16][4] int8, scale fp32
 * [N / 16][K / group_size][16] (group_size = K: one scale per output channel), colsum int32 laid out
 * as scale (each group's sum of codes; w8a8 only, NULL for weight-only), bias fp32 [N] or NULL, y
 * [M, N] (row stride ldy) fp32 or bf16 (out_bf16). w8a8: activations quantized per row (see above).
 * Returns 0; -1 for shapes refused (K not a multiple of 4 or above MAX_K, group_size not a multiple
 * of 4 dividing K; nothing written); -2 when the call's buffer cannot be allocated. */
static int run_linear(const void *x, int64_t ldx, int x_bf16, const int8_t *packed, const float *scale,
                      const int32_t *colsum, const float *bias, void *y, int64_t ldy, int64_t m, int64_t n, int64_t k,
                      int64_t group_size, int out_bf16, int w8a8, int num_threads) {
    if (linear_refuses(m, n, k, ldx, ldy, 0, 4) || k > MAX_K || (w8a8 && colsum == NULL) || group_size < 4
        || group_size % 4 != 0 || k % group_size != 0) return -1;
    if (m == 0 || n == 0) return 0;
    float *xf = NULL, *row_scale = NULL;
    uint8_t *xq = NULL;
    int16_t *x16 = NULL;
    if (w8a8) {
        xq = malloc((size_t)(m * k) + 1);
        row_scale = malloc((size_t)(m * (k / group_size)) * sizeof(float) + 1);
        if (xq == NULL || row_scale == NULL) { free(xq); free(row_scale); return -2; }
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k >= (1 << 16))
        for (int64_t r = 0; r < m; r++) quantize_row(x, ldx, x_bf16, r, k, group_size, xq, row_scale);
    } else if (WIDE_ACTIVATIONS && group_size <= WIDE_MAX_GROUP) {  /* int16 activations, VPDPWSSD */
        x16 = malloc((size_t)(m * k) * sizeof(int16_t) + 1);
        row_scale = malloc((size_t)(m * (k / group_size)) * sizeof(float) + 1);
        if (x16 == NULL || row_scale == NULL) { free(x16); free(row_scale); return -2; }
#if WIDE_ACTIVATIONS
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k >= (1 << 16))
        for (int64_t r = 0; r < m; r++) quantize_row16(x, ldx, x_bf16, r, k, group_size, x16, row_scale);
#endif
    } else if (x_bf16) {
        xf = malloc((size_t)(m * k) * sizeof(float) + 1);
        if (xf == NULL) return -2;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k >= (1 << 16))
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < k; i++) xf[r * k + i] = bf16_to_f32(((const uint16_t *)x)[r * ldx + i]);
    }
    const float *x_float = (w8a8 || x16 != NULL) ? NULL : xf != NULL ? xf : (const float *)x;
    const int64_t ld = (w8a8 || xf != NULL || x16 != NULL) ? k : ldx;
    const int max_rows = x16 != NULL ? WIDE_ROWS_OR(ROWS) : ROWS;
    const int64_t panels = n / PANEL, quads = k / 4, groups = (panels + WIDTH - 1) / WIDTH;
    const int64_t k_groups = k / group_size, group_quads = group_size / 4;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t group = 0; group < groups; group++) {
        const int64_t p = WIDTH * group;
        const int width = panels - p < WIDTH ? (int)(panels - p) : WIDTH;
        const int64_t passes = (m + max_rows - 1) / max_rows;
        for (int64_t pass_index = 0, m0 = 0; pass_index < passes; pass_index++) {
            const int64_t rows = (m - m0) / (passes - pass_index);  /* rows split evenly over the passes */
            void *yr = out_bf16 ? (void *)((uint16_t *)y + m0 * ldy + p * PANEL) : (void *)((float *)y + m0 * ldy + p * PANEL);
            pass(x_float != NULL ? x_float + m0 * ld : NULL, xq != NULL ? xq + m0 * ld : NULL,
                 x16 != NULL ? x16 + m0 * ld : NULL,
                 row_scale != NULL ? row_scale + m0 * k_groups : NULL, ld, packed + p * quads * PANEL * 4,
                 scale + p * k_groups * PANEL, colsum != NULL ? colsum + p * k_groups * PANEL : NULL,
                 bias != NULL ? bias + p * PANEL : NULL, yr, ldy, k_groups, group_quads, rows, width, out_bf16);
            m0 += rows;
        }
    }
    free(xf);
    free(xq);
    free(x16);
    free(row_scale);
    return 0;
}

int int8_linear(const void *x, int64_t ldx, int x_bf16, const int8_t *packed, const float *scale, const float *bias,
                void *y, int64_t ldy, int64_t m, int64_t n, int64_t k, int64_t group_size, int out_bf16,
                int num_threads) {
    return run_linear(x, ldx, x_bf16, packed, scale, NULL, bias, y, ldy, m, n, k, group_size, out_bf16, 0,
                      num_threads);
}

int w8a8_linear(const void *x, int64_t ldx, int x_bf16, const int8_t *packed, const float *scale,
                const int32_t *colsum, const float *bias, void *y, int64_t ldy, int64_t m, int64_t n, int64_t k,
                int64_t group_size, int out_bf16, int num_threads) {
    return run_linear(x, ldx, x_bf16, packed, scale, colsum, bias, y, ldy, m, n, k, group_size, out_bf16, 1,
                      num_threads);
}
