/* Linears over block-code weights (code_blocks.h) with the activations quantized to int8: integer dot
 * products on the codes, as llama.cpp runs its quantized files (Q8 activations, VNNI).
 *
 * coded_linear (f32_linear.c) expands every code to fp32 and multiplies in fp32: exact, but 64 fp32
 * products per 64 code bytes, slow once rows are batched. Here each row of x is quantized per block of
 * 32 inputs, as llama.cpp's Q8_0 (a = rint(x * 127 / max|x|) in -127..127, sx = max|x| / 127; the
 * block's sums of a kept, per 16 inputs, for the m term and the offset below), and every block of a
 * weight panel adds, per column,
 *
 *     y += (d * sx) * isum [+ m * (sx * asum)]      isum = sum over the block of q * a, exact in int32
 *
 * isum by VPDPBUSD (AVX-512 VNNI: unsigned bytes times signed ones, four products per 32-bit lane;
 * the weight is the unsigned operand: 4-bit codes are 0..15, 8-bit ones are stored as q + 128 and
 * 128 * asum is taken off), by VPMADDUBSW + VPMADDWD on AVX2 (4-bit codes: at most 8 * 2 * 15 * 127 =
 * 30,480 per int16 lane over a block, no saturation; 8-bit: |q| times a with q's sign moved onto a,
 * at most 2 * 128 * 127 = 32,512 per pair), or by plain int32 vector arithmetic elsewhere: the same
 * integers on every path, exactly (below 2^24, so converted to fp32 exactly too).
 *
 * Batch invariance: a row's activation codes and scales come from that row alone; threads, passes and
 * row chunks split the outputs and the rows, never K; every output is the bias (or zero) followed by
 * the fp32 terms above block by block in input order, one vfma each, whatever the rows per pass or
 * the ISA path, so a row's result does not depend on its batch-mates or the thread count (and is the
 * same bits on every build with FMA). It differs from coded_linear's fp32 results by the activations'
 * quantization (2^-8 of each block's largest |x|): a choice (torch option ``code_activations``).
 *
 * Calls of ``tile_rows`` rows or more (the kernels' code_tile_rows; model/cpu/amx_int8.py sets it where
 * the CPU has AMX-INT8 and Linux grants the tiles) sum on AMX-INT8 tiles instead (q8a_coded_linear_amx.c):
 * the same integers and this epilogue in the same order, so the same bits for every row count.
 *
 * Layout as coded_linear's (one packed weight for both); ``swiglu`` as there (the fused gate/up
 * weight's panels paired as swiglu_pair_columns says). Decode steps (one pass of up to Q8A_ROWS rows,
 * or a few) read each group's codes from memory once and again from cache; prefills walk x in chunks
 * of rows (Q8A_CHUNK_BYTES of codes) so that a chunk stays in L2 across the groups.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "code_blocks.h"
#include "kernel_math.h"
#include "q8a_rows.h"

#define PANEL CODE_PANEL
#define PANEL_VECTORS (PANEL / LANES)
#define ACT_BLOCK Q8A_ACT_BLOCK

#if defined(__AVX512VNNI__) && LANES == 16
#define Q8A_PATH 2 /* VPDPBUSD */
#define Q8A_WIDTH 2
#define Q8A_ROWS 4
#elif defined(__AVX2__) && LANES == 8
#define Q8A_PATH 1 /* VPMADDUBSW + VPMADDWD */
#define Q8A_WIDTH 1
#define Q8A_ROWS 2
#else
#define Q8A_PATH 0 /* int32 vector arithmetic */
#define Q8A_WIDTH (LANES == 16 ? 2 : 1) /* 16 lanes: SwiGLU pairs are two panels */
#define Q8A_ROWS 2
#endif
/* The weight's 8-bit codes come out as q + 128 (VPDPBUSD's unsigned operand): sums less 128 * asum. */
#define BIASED_SUMS (Q8A_PATH == 2)
#define Q8A_CHUNK_BYTES (256 * 1024)
#define Q8A_PREFETCH_BYTES 1024 /* how far ahead of its first pass a group's codes are asked for */
#define MAX_K (1 << 20)          /* sums stay exact in fp32 (and int32) for any K; this bounds buffers */

int q8a_coded_linear_path(void) { return Q8A_PATH; }

/* Row r of x quantized per block of 32 inputs (as int8_linear.c's w8a8 quantize_row, without its offset). */
static void quantize_row(const void *x, int64_t ldx, int x_bf16, int64_t r, const struct q8a_rows *a) {
    const int64_t k = a->k;
    for (int64_t b = 0; b < k / ACT_BLOCK; b++) {
        float values[ACT_BLOCK], absmax = 0.0f;
        for (int i = 0; i < ACT_BLOCK; i++) {
            values[i] = load_elem(x, r * ldx + b * ACT_BLOCK + i, x_bf16);
            const float v = fabsf(values[i]);
            absmax = v > absmax ? v : absmax;
        }
        const float inverse = absmax > 0.0f ? 127.0f / absmax : 0.0f;
        const float sx = absmax / 127.0f;
        a->scale[r * (k / ACT_BLOCK) + b] = sx;
        int32_t sums[2] = {0, 0};
        for (int i = 0; i < ACT_BLOCK; i++) {
            float q = rintf(values[i] * inverse);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            a->codes[r * a->lda + b * ACT_BLOCK + i] = (int8_t)q;
            sums[i / 16] += (int32_t)q;
        }
        a->m_scale[r * (k / ACT_BLOCK) + b] = sx * (float)(sums[0] + sums[1]);
        a->offsets[r * (k / 16) + 2 * b] = 128 * sums[0];
        a->offsets[r * (k / 16) + 2 * b + 1] = 128 * sums[1];
    }
}

static inline int32_t load_quad(const int8_t *p) {
    int32_t quad;
    memcpy(&quad, p, sizeof quad);
    return quad;
}

/* The exact integer sums of one weight block (``codes``: its code vectors, for panel c at codes[c]) with
 * the activation codes ``xa`` (row r's block inputs at xa + r * lda), into sums[c * PANEL_VECTORS + v][r]
 * (8-bit: of q + 128 where BIASED_SUMS). */
static inline __attribute__((always_inline)) void block_sums(const uint8_t *const codes[], const int8_t *xa,
                                                            int64_t lda, const int rows, const int width,
                                                            const int format, vint sums[][Q8A_ROWS]) {
    const int kind = code_kind(format);
#if Q8A_PATH != 0
    const int vectors = kind == CODES_Q8 ? 8 : 4;  /* 64-byte code vectors per block */
#endif
#if Q8A_PATH == 2
    const __m512i nibbles = _mm512_set1_epi8(0x0f);
    __m512i acc[Q8A_WIDTH][Q8A_ROWS];
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++) acc[c][r] = _mm512_setzero_si512();
    for (int t = 0; t < vectors; t++) {
        __m512i low[Q8A_ROWS], high[Q8A_ROWS];
        for (int r = 0; r < rows; r++) {
            low[r] = _mm512_set1_epi32(load_quad(xa + r * lda + 4 * t));
            if (kind == CODES_Q4) high[r] = _mm512_set1_epi32(load_quad(xa + r * lda + 16 + 4 * t));
        }
        for (int c = 0; c < width; c++) {
            const __m512i w = _mm512_loadu_si512((const void *)(codes[c] + 64 * t));
            if (kind == CODES_Q4) {
                const __m512i lo = _mm512_and_si512(w, nibbles), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibbles);
                for (int r = 0; r < rows; r++) {
                    acc[c][r] = _mm512_dpbusd_epi32(acc[c][r], lo, low[r]);
                    acc[c][r] = _mm512_dpbusd_epi32(acc[c][r], hi, high[r]);
                }
            } else {
                for (int r = 0; r < rows; r++) acc[c][r] = _mm512_dpbusd_epi32(acc[c][r], w, low[r]);
            }
        }
    }
    for (int c = 0; c < width; c++)
        for (int r = 0; r < rows; r++) sums[c][r] = (vint)acc[c][r];
#elif Q8A_PATH == 1
    const __m256i nibbles = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i acc[Q8A_WIDTH * 2][Q8A_ROWS];  /* int16 pairs (4-bit) or int32 sums (8-bit), columns 0-7 and 8-15 */
    for (int h = 0; h < width * 2; h++)
        for (int r = 0; r < rows; r++) acc[h][r] = _mm256_setzero_si256();
    for (int t = 0; t < vectors; t++) {
        __m256i low[Q8A_ROWS], high[Q8A_ROWS];
        for (int r = 0; r < rows; r++) {
            low[r] = _mm256_set1_epi32(load_quad(xa + r * lda + 4 * t));
            if (kind == CODES_Q4) high[r] = _mm256_set1_epi32(load_quad(xa + r * lda + 16 + 4 * t));
        }
        for (int h = 0; h < width * 2; h++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(codes[h / 2] + 64 * t + 32 * (h % 2)));
            if (kind == CODES_Q4) {
                const __m256i lo = _mm256_and_si256(w, nibbles), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibbles);
                for (int r = 0; r < rows; r++)
                    acc[h][r] = _mm256_add_epi16(acc[h][r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, low[r]),
                                                                             _mm256_maddubs_epi16(hi, high[r])));
            } else {
                const __m256i q = _mm256_xor_si256(w, flip);  /* q itself, signed */
                const __m256i magnitude = _mm256_abs_epi8(q);
                for (int r = 0; r < rows; r++)
                    acc[h][r] = _mm256_add_epi32(
                        acc[h][r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(low[r], q)), ones));
            }
        }
    }
    for (int h = 0; h < width * 2; h++)
        for (int r = 0; r < rows; r++)
            sums[h][r] = (vint)(kind == CODES_Q4 ? _mm256_madd_epi16(acc[h][r], ones) : acc[h][r]);
#else
    for (int c = 0; c < width; c++)
        for (int v = 0; v < PANEL_VECTORS; v++)
            for (int r = 0; r < rows; r++) sums[c * PANEL_VECTORS + v][r] = (vint){0};
    const int inputs = code_block_inputs(format);
    for (int i = 0; i < inputs; i++)
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS; v++) {
                vint u;
                memcpy(&u, codes[c] + 64 * code_vector_index(i, format) + v * LANES * 4, sizeof u);
                vint q = (u >> code_shift(i, format)) & (kind == CODES_Q4 ? 15 : 255);
                if (kind != CODES_Q4) q -= 128;
                for (int r = 0; r < rows; r++) sums[c * PANEL_VECTORS + v][r] += q * (int32_t)xa[r * lda + i];
            }
#endif
}

/* ``rows`` rows of activations against ``width`` panels (their blocks at ``panel``, panel_bytes apart):
 * y = bias, then for each weight block in input order vfma(d * sx, isum, y) and, with m, vfma(m, sx * asum, y). */
static inline __attribute__((always_inline)) void q8a_panel_rows(
    const struct q8a_rows *a, int64_t r0, const uint8_t *panel, int64_t panel_bytes, const float *bias, void *y,
    int64_t ldy, const int rows, const int width, const int format, const int layout, const int swiglu, const int out_bf16,
    int prefetch) {
    const int64_t k = a->k, span = code_block_inputs(format), blocks = k / span;
    const int64_t lda = a->lda, act_blocks = k / ACT_BLOCK, sum_blocks = k / 16;
    vfloat acc[Q8A_WIDTH * PANEL_VECTORS][Q8A_ROWS];
    for (int c = 0; c < width * PANEL_VECTORS; c++) {
        vfloat start = {0};
        if (bias != NULL) memcpy(&start, bias + c * LANES, sizeof start);
        for (int r = 0; r < rows; r++) acc[c][r] = start;
    }
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *codes[Q8A_WIDTH];
        for (int c = 0; c < width; c++) {
            codes[c] = code_block_codes(panel + c * panel_bytes, b, format, layout);
            if (prefetch)  /* the first pass streams the codes from memory: its next lines, ahead */
                for (int l = 0; l < code_stream_bytes(format, layout); l += 64)
                    __builtin_prefetch(codes[c] + Q8A_PREFETCH_BYTES + l, 0, 2);
        }
        const int64_t i0 = b * span, act = i0 / ACT_BLOCK;
        vint sums[Q8A_WIDTH * PANEL_VECTORS][Q8A_ROWS];
        block_sums(codes, a->codes + r0 * lda + i0, lda, rows, width, format, sums);
        const float *sx = a->scale + r0 * act_blocks + act, *m_scale = a->m_scale + r0 * act_blocks + act;
        const int32_t *offsets = a->offsets + r0 * sum_blocks + i0 / 16;  /* row r: [r * sum_blocks], 1 or 2 */
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS; v++) {
                const vfloat d = code_block_scale(panel + c * panel_bytes, b, v, 0, format, layout);
                const vfloat m = code_block_scale(panel + c * panel_bytes, b, v, 1, format, layout);
                for (int r = 0; r < rows; r++) {
                    vint s = sums[c * PANEL_VECTORS + v][r];
                    if (BIASED_SUMS && code_kind(format) != CODES_Q4)
                        s -= span == 16 ? offsets[r * sum_blocks] : offsets[r * sum_blocks] + offsets[r * sum_blocks + 1];
                    const int i = c * PANEL_VECTORS + v;
                    acc[i][r] = vfma(d * vsplat(sx[r * act_blocks]), __builtin_convertvector(s, vfloat), acc[i][r]);
                    if (code_has_m(format)) acc[i][r] = vfma(m, vsplat(m_scale[r * act_blocks]), acc[i][r]);
                }
            }
    }
    if (swiglu) {
#if LANES == 16  /* panels 2j and 2j + 1: gate and up of output panel j (swiglu_pair_columns 16) */
        for (int c = 0; c < width; c += 2)
            for (int r = 0; r < rows; r++)
                vstore(y, r * ldy + c / 2 * PANEL, vswiglu(acc[c][r], acc[c + 1][r], out_bf16), out_bf16);
#else  /* the halves of panel c: gate and up of output columns 8c .. 8c + 7 (swiglu_pair_columns 8) */
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS / 2; v++)
                for (int r = 0; r < rows; r++) {
                    const vfloat out = vswiglu(acc[c * PANEL_VECTORS + v][r],
                                               acc[c * PANEL_VECTORS + v + PANEL_VECTORS / 2][r], out_bf16);
                    vstore(y, r * ldy + c * PANEL / 2 + v * LANES, out, out_bf16);
                }
#endif
        return;
    }
    for (int c = 0; c < width * PANEL_VECTORS; c++)
        for (int r = 0; r < rows; r++) vstore(y, r * ldy + c * LANES, acc[c][r], out_bf16);
}

#define Q8A_CALL(n, w, f) \
    case n: q8a_panel_rows(a, r0, panel, panel_bytes, bias, y, ldy, n, w, f, layout, swiglu, out_bf16, prefetch); break;
#if Q8A_ROWS == 4
#define Q8A_CASES(w, f) Q8A_CALL(1, w, f) Q8A_CALL(2, w, f) Q8A_CALL(3, w, f) Q8A_CALL(4, w, f)
#else
#define Q8A_CASES(w, f) Q8A_CALL(1, w, f) Q8A_CALL(2, w, f)
#endif

static inline __attribute__((always_inline)) void q8a_pass_as(
    const struct q8a_rows *a, int64_t r0, const uint8_t *panel, int64_t panel_bytes, const float *bias, void *y,
    int64_t ldy, int64_t rows, int width, const int format, const int layout, int swiglu, int out_bf16, int prefetch) {
#if Q8A_WIDTH == 2
    if (width == 2) {
        switch (rows) { Q8A_CASES(2, format) }
        return;
    }
#else
    (void)width;
#endif
    switch (rows) { Q8A_CASES(1, format) }
}

/* One pass, the codes' format fixed at compile time: one copy of the loops per format. */
static void q8a_pass(const struct q8a_rows *a, int64_t r0, const uint8_t *panel, int64_t panel_bytes,
                     const float *bias, void *y, int64_t ldy, int64_t rows, int width, int format, int swiglu,
                     int out_bf16, int prefetch) {
#define Q8A_PASS_AS(kind, layout) \
    q8a_pass_as(a, r0, panel, panel_bytes, bias, y, ldy, rows, width, kind, layout, swiglu, out_bf16, prefetch)
    CODE_FORMAT_SWITCH(format, Q8A_PASS_AS);
#undef Q8A_PASS_AS
}

/* x [M, K] fp32 or bf16 (x_bf16; row stride ldx), ``packed`` block codes in ``format`` (code_blocks.h;
 * K a multiple of 32), bias fp32 [N] (the packed column order) or NULL, y [M, N] (row stride ldy; [M,
 * N / 2] with swiglu) fp32 or bf16 (out_bf16). ``tile_rows``: a call of at least this many rows sums on
 * AMX-INT8 tiles where they are granted (q8a_coded_linear_amx.c; the same bits), 0: never. Returns 0;
 * -1 for shapes refused or another format (nothing written); -2 when the activations' buffer cannot be
 * allocated. */
int q8a_coded_linear(const void *x, int64_t ldx, int x_bf16, const uint8_t *packed, const float *bias, void *y,
                     int64_t ldy, int64_t m, int64_t n, int64_t k, int format, int swiglu, int out_bf16,
                     int64_t tile_rows, int num_threads) {
    if (!code_format_known(format) || linear_refuses(m, n, k, ldx, ldy, swiglu, code_k_multiple(format)) ||
        k % ACT_BLOCK || k > MAX_K)
        return -1;
    if (m == 0 || n == 0) return 0;
    const int tiles = tile_rows > 0 && m >= tile_rows && k > 0 && q8a_tiles_granted();
    const int64_t element = out_bf16 ? 2 : 4;
    const size_t per_block = (size_t)(m * (k / ACT_BLOCK));
    /* Tiles read whole blocks of rows: the codes of the rows past m are zeros. */
    const int64_t code_rows = tiles ? (m + Q8A_TILE_ROW_BLOCK - 1) / Q8A_TILE_ROW_BLOCK * Q8A_TILE_ROW_BLOCK : m;
    /* A tile's 16 rows a multiple of 4 KiB apart would share a few L1 sets: tiles' rows 64 bytes longer. */
    const int64_t lda = tiles ? k + 64 : k;
    struct q8a_rows a = {malloc((size_t)(code_rows * lda) + 64), malloc(per_block * sizeof(float) + 64),
                         malloc(per_block * sizeof(float) + 64), malloc(2 * per_block * sizeof(int32_t) + 64), k, lda};
    if (a.codes == NULL || a.scale == NULL || a.m_scale == NULL || a.offsets == NULL) {
        free(a.codes), free(a.scale), free(a.m_scale), free(a.offsets);
        return -2;
    }
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (m * k >= (1 << 16))
    for (int64_t r = 0; r < m; r++) quantize_row(x, ldx, x_bf16, r, &a);
    if (tiles) {
        memset(a.codes + m * lda, 0, (size_t)((code_rows - m) * lda));
        const int status = q8a_tiles_linear(&a, packed, bias, y, ldy, m, n, format, swiglu, out_bf16, num_threads);
        free(a.codes), free(a.scale), free(a.m_scale), free(a.offsets);
        return status;
    }
    const int64_t panels = n / PANEL, groups = (panels + Q8A_WIDTH - 1) / Q8A_WIDTH;
    const int64_t panel_bytes = code_panel_bytes(k, format);
    int64_t chunk = k > 0 ? Q8A_CHUNK_BYTES / k / Q8A_ROWS * Q8A_ROWS : m;  /* (K = 0: y is the bias) */
    if (chunk < 16 * Q8A_ROWS) chunk = 16 * Q8A_ROWS;
    #pragma omp parallel num_threads(num_threads)
    for (int64_t c0 = 0; c0 < m; c0 += chunk) {
        const int64_t chunk_rows = m - c0 < chunk ? m - c0 : chunk;
        /* The same groups to each thread in every chunk (a static schedule): no barrier between chunks. */
        #pragma omp for schedule(static) nowait
        for (int64_t group = 0; group < groups; group++) {
            const int64_t p = group * Q8A_WIDTH;
            const int width = panels - p < Q8A_WIDTH ? (int)(panels - p) : Q8A_WIDTH;
            const uint8_t *panel = packed + p * panel_bytes;
            const float *b = bias != NULL ? bias + p * PANEL : NULL;
            char *y_group = (char *)y + (c0 * ldy + (swiglu ? p * PANEL / 2 : p * PANEL)) * element;
            const int64_t passes = (chunk_rows + Q8A_ROWS - 1) / Q8A_ROWS;  /* rows split evenly over the passes */
            for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
                const int64_t rows = (chunk_rows - m0) / (passes - pass);
                q8a_pass(&a, c0 + m0, panel, panel_bytes, b, y_group + m0 * ldy * element, ldy, rows, width, format,
                         swiglu, out_bf16, pass == 0);
                m0 += rows;
            }
        }
    }
    free(a.codes), free(a.scale), free(a.m_scale), free(a.offsets);
    return 0;
}
