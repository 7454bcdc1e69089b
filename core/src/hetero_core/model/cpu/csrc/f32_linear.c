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
 *
 * Batch invariance: threads, groups, passes and row chunks split the outputs and the rows, never K.
 * Every output is the bias (or zero) followed by one vfma chain over the inputs in order, whichever
 * of the code paths below (1-8 rows per pass, 1-3 panels, codes expanded in registers or in a buffer)
 * computes it, so a row's result does not depend on how many rows come with it.
 *
 * With ``swiglu`` the weight is the MLP's fused gate/up projection with its panels interleaved
 * (gate panel i, then up panel i) and the kernel writes silu(gate) * up, N / 2 columns: the
 * activation is applied in registers and the gate/up output is never stored.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include <immintrin.h>
#include <omp.h>

#include "kernel_math.h"

/* Panels per group and rows of x per pass, from the registers: VECTORS * ROWS accumulators plus a
 * group's weight vectors and one broadcast. AVX-512 (32 registers): 3 panels x 8 rows = 24
 * accumulators; SwiGLU: 2 gate/up pairs x 6 rows, or, for up to 12 rows in all, 1 pair x 12 rows
 * (one pass). AVX2 (16): 1 panel (2 vectors) x 6 rows = 12. SSE (16): 1 panel (4 vectors) x 3 rows.
 *
 * SWIGLU_PAIR_COLUMNS: how the fused gate/up weight's rows are interleaved (the packer asks
 * ``swiglu_pair_columns``). With 16-lane vectors a pair is two panels, 16 gate columns then the 16
 * up columns of the same outputs. With narrower ones a pair is one panel, 8 gate columns then their
 * 8 up columns, so SwiGLU runs the plain configuration: a panel's first half of vectors are gates,
 * its second half ups. (AVX2 had taken pairs of panels one 8-column slice at a time: every pass then
 * read half of each line of a 72 KiB pair, from L2, at 130 instead of 160 GF/s.) */
#if LANES == 16
#define F32_WIDTH 3
#define F32_ROWS 8
#define SWIGLU_PAIR_COLUMNS 16
#define SWIGLU_WIDTH 4
#define SWIGLU_ROWS 6
#define SWIGLU_FEW_WIDTH 2 /* panels of the configuration for few rows: 1 pair */
#define SWIGLU_FEW_ROWS 12 /* and its rows */
#define SWIGLU_SLICE 1 /* vectors of each panel per pass */
#else
#if LANES == 8
#define F32_ROWS 6
#else
#define F32_ROWS 3
#endif
#define F32_WIDTH 1
#define SWIGLU_PAIR_COLUMNS 8
#define SWIGLU_WIDTH 1
#define SWIGLU_ROWS F32_ROWS
#define SWIGLU_FEW_WIDTH 1
#define SWIGLU_FEW_ROWS F32_ROWS
#define SWIGLU_SLICE PANEL_VECTORS
#endif
/* Block codes at few rows (decode steps), their codes expanded in registers: a pass of one panel keeps
 * two chains (8 lanes) of fused multiply-adds per row, each waiting on the last (4-5 cycles), which
 * bound AVX2's one-row rate; CODE_FEW_WIDTH panels a pass there, as many more chains, the same sums in
 * the same order per output. (AVX-512's passes take 3 panels already.) */
#if LANES == 8
#define CODE_FEW_ROWS 2
#define CODE_FEW_WIDTH 3
#else
#define CODE_FEW_ROWS 0
#define CODE_FEW_WIDTH 1
#endif
#define MAX_ROWS (F32_ROWS > SWIGLU_FEW_ROWS ? F32_ROWS : SWIGLU_FEW_ROWS)
#define MAX_WIDTH_ (F32_WIDTH > SWIGLU_WIDTH ? F32_WIDTH : SWIGLU_WIDTH)
#define MAX_WIDTH (MAX_WIDTH_ > CODE_FEW_WIDTH ? MAX_WIDTH_ : CODE_FEW_WIDTH)
#define PANEL 16 /* output columns per panel */
#define PANEL_VECTORS (PANEL / LANES)
#define F32_PREFETCH_LINES 16 /* how far ahead of the panel stream the loads are asked for (64-byte lines) */

/* ---- The same linear over weights that are exact block codes (GGUF's Q4_1, Q8_0, Q4_K, Q6_K). ----
 *
 * A block code stores a weight as d * q + m (q a 4-bit or 8-bit code, d and m per block of 32 inputs,
 * or d alone per 16: code_blocks.h). d * q is exact in fp32, so d * q + m, rounded once whether fused
 * or not, is the dequantized checkpoint's value itself. ``coded_linear`` expands the codes, in
 * registers for one or two passes (decode steps) or once per group into a per-thread buffer for
 * more, and runs the passes above: its results equal f32_linear's on the dequantized weight bit for
 * bit, while the weight streams at 0.625-1.25 bytes per weight instead of 4. (q8a_coded_linear.c
 * runs the same packed weight with the activations quantized to int8.) */
#include "code_blocks.h"
/* Passes that expand the codes in registers, each pass again; more expand them once into a buffer.
 * AVX-512 (32 registers): every pass a decode step or prompt chunk has (see coded_linear); AVX2: 1
 * (measured on an Emerald Rapids Xeon with cold weights). */
#if LANES == 16
#define FUSED_CODE_PASSES 64
#else
#define FUSED_CODE_PASSES 1
#endif

/* Input ``input`` of a packed block (its codes at ``block_codes``): its codes for the LANES columns of vector ``v`` of the panel, as
 * floats, straight from memory into registers (each column's 32-bit lane holds 4 inputs' codes). */
static inline __attribute__((always_inline)) vfloat code_vector(const uint8_t *block_codes, int input, int v,
                                                                const int format) {
    const uint8_t *codes = block_codes + 64 * code_vector_index(input, format);
    vint u;
    memcpy(&u, codes + v * LANES * 4, sizeof u);
    const int four = code_kind(format) == CODES_Q4;
    const vint q = (u >> code_shift(input, format)) & (four ? 15 : 255);
    return __builtin_convertvector(four ? q : q - 128, vfloat);  /* 8-bit codes are q + 128 */
}

/* ``rows`` rows of x against ``width`` panels, ``slice`` vectors of each panel from vector ``v0``
 * (all of it: slice = PANEL_VECTORS, v0 = 0). */
static inline __attribute__((always_inline)) void f32_panel_rows(
    const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy,
    int64_t k, const int rows, const int width, const int slice, int v0, const int swiglu, const char *ahead,
    int64_t ahead_lines, const uint8_t *codes, const int bits, int layout) {
    vfloat acc[MAX_WIDTH * PANEL_VECTORS][MAX_ROWS];
    for (int c = 0; c < width; c++)
        for (int v = 0; v < slice; v++) {
            vfloat start = {0};
            if (bias != NULL) memcpy(&start, bias + c * PANEL + (v0 + v) * LANES, sizeof start);
            for (int r = 0; r < rows; r++) acc[c * slice + v][r] = start;
        }
    const int64_t ahead_per_step = k > 0 ? (ahead_lines + k - 1) / k : 0;
    const int64_t span = codes != NULL ? code_block_inputs(bits) : k;  /* inputs that share a block's d and m */
    for (int64_t i0 = 0; i0 < k; i0 += span) {
        vfloat d[MAX_WIDTH * PANEL_VECTORS], m[MAX_WIDTH * PANEL_VECTORS];
        const uint8_t *blocks[MAX_WIDTH];
        if (codes != NULL)  /* block codes (coded_linear): d and m once per block, the codes expanded in registers */
            for (int c = 0; c < width; c++) {
                const uint8_t *panel_codes = codes + c * code_panel_bytes_as(k, bits, layout);
                blocks[c] = code_block_codes(panel_codes, i0 / span, bits, layout);
                for (int v = 0; v < slice; v++) {
                    d[c * slice + v] = code_block_scale(panel_codes, i0 / span, v0 + v, 0, bits, layout);
                    m[c * slice + v] = code_block_scale(panel_codes, i0 / span, v0 + v, 1, bits, layout);
                }
            }
        for (int64_t i = i0; i < i0 + span; i++) {
            for (int64_t a = i * ahead_per_step; a < (i + 1) * ahead_per_step && a < ahead_lines; a++)
                __builtin_prefetch(ahead + 64 * a, 0, 2);  /* the next panels, while this pass runs from cache */
            vfloat w[MAX_WIDTH * PANEL_VECTORS];
            for (int c = 0; c < width; c++) {  /* the panels follow each other: K lines each */
                if (codes != NULL) {
                    for (int v = 0; v < slice; v++) {  /* d * q is exact: one rounding, fused or not */
                        w[c * slice + v] = d[c * slice + v] * code_vector(blocks[c], (int)(i - i0), v0 + v, bits);
                        if (code_has_m(bits)) w[c * slice + v] += m[c * slice + v];
                    }
                    continue;
                }
                const float *line = panel + (c * k + i) * PANEL;
                __builtin_prefetch(line + F32_PREFETCH_LINES * PANEL, 0, 3);
                for (int v = 0; v < slice; v++) memcpy(&w[c * slice + v], line + (v0 + v) * LANES, sizeof(vfloat));
            }
            for (int r = 0; r < rows; r++) {  /* one fused multiply-add chain per output, in input order */
                const vfloat xr = vsplat(x[r * ldx + i]);
                for (int v = 0; v < width * slice; v++) acc[v][r] = vfma(w[v], xr, acc[v][r]);
            }
        }
    }
    if (swiglu) {
#if SWIGLU_PAIR_COLUMNS == PANEL  /* panels 2j and 2j + 1: gate and up of output panel j */
        for (int c = 0; c < width; c += 2)
            for (int v = 0; v < slice; v++)
                for (int r = 0; r < rows; r++) {
                    const vfloat out = vswiglu(acc[c * slice + v][r], acc[(c + 1) * slice + v][r], 0);
                    memcpy(y + r * ldy + c / 2 * PANEL + (v0 + v) * LANES, &out, sizeof out);
                }
#else  /* the halves of panel c: gate and up of output columns 8c .. 8c + 7 (the whole panel in each pass) */
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS / 2; v++)
                for (int r = 0; r < rows; r++) {
                    const vfloat out = vswiglu(acc[c * slice + v][r], acc[c * slice + v + PANEL_VECTORS / 2][r], 0);
                    memcpy(y + r * ldy + c * SWIGLU_PAIR_COLUMNS + v * LANES, &out, sizeof out);
                }
#endif
        return;
    }
    for (int c = 0; c < width; c++)
        for (int v = 0; v < slice; v++)
            for (int r = 0; r < rows; r++)
                memcpy(y + r * ldy + c * PANEL + (v0 + v) * LANES, &acc[c * slice + v][r], sizeof(vfloat));
}

/* The cases of the switches below: rows 1 .. n. */
#define CASES_1(F, w) F(1, w)
#define CASES_2(F, w) CASES_1(F, w) F(2, w)
#define CASES_3(F, w) CASES_2(F, w) F(3, w)
#define CASES_6(F, w) CASES_3(F, w) F(4, w) F(5, w) F(6, w)
#define CASES_8(F, w) CASES_6(F, w) F(7, w) F(8, w)
#define CASES_12(F, w) CASES_8(F, w) F(9, w) F(10, w) F(11, w) F(12, w)
#define CASES__(n) CASES_##n
#define CASES(n) CASES__(n)

#define PLAIN_CALL(n, c) \
    case n: f32_panel_rows(xr, ldx, w, b, yr, ldy, k, n, c, PANEL_VECTORS, 0, 0, ahead, ahead_lines, codes, bits, layout); break;
#define SWIGLU_CALL(n, c) \
    case n: f32_panel_rows(xr, ldx, w, b, yr, ldy, k, n, c, SWIGLU_SLICE, v0, 1, v0 ? NULL : ahead, v0 ? 0 : ahead_lines, \
                           codes, bits, layout); \
    break;

/* The few-row passes of 2 .. CODE_FEW_WIDTH panels (a group's last may be narrower), rows 1 .. CODE_FEW_ROWS. */
#define FEW_CODE_WIDTH(F, c) \
    case c: switch (rows) { CASES(CODE_FEW_ROWS)(F, c) } break;
#if CODE_FEW_WIDTH == 4
#define FEW_CODE_WIDTHS(F) switch (width) { FEW_CODE_WIDTH(F, 2) FEW_CODE_WIDTH(F, 3) FEW_CODE_WIDTH(F, 4) }
#else
#define FEW_CODE_WIDTHS(F) switch (width) { FEW_CODE_WIDTH(F, 2) FEW_CODE_WIDTH(F, 3) }
#endif

/* One pass: ``rows`` rows of x against a group of ``width`` panels. */
static inline __attribute__((always_inline)) void f32_pass_as(
    const float *xr, int64_t ldx, const float *w, const float *b, float *yr, int64_t ldy, int64_t k, int64_t rows,
    int width, int swiglu, const char *ahead, int64_t ahead_lines, const uint8_t *codes, const int bits,
    int layout) {
    if (swiglu) {
#if SWIGLU_PAIR_COLUMNS == PANEL
        for (int v0 = 0; v0 < PANEL_VECTORS; v0 += SWIGLU_SLICE) {  /* a panel's vectors, a slice at a time */
            if (width == 4) {
                switch (rows) { CASES(SWIGLU_ROWS)(SWIGLU_CALL, 4) }
                continue;
            }
            switch (rows) { CASES(SWIGLU_FEW_ROWS)(SWIGLU_CALL, 2) }  /* one pair */
        }
#else
        const int v0 = 0;  /* every vector of the panel: it holds both halves of its pairs */
#if CODE_FEW_WIDTH > 1
        if (width > 1 && rows <= CODE_FEW_ROWS) {
            FEW_CODE_WIDTHS(SWIGLU_CALL)
            return;
        }
#endif
        switch (rows) { CASES(SWIGLU_ROWS)(SWIGLU_CALL, 1) }
#endif
        return;
    }
#if CODE_FEW_WIDTH > 1
    if (width > F32_WIDTH && rows <= CODE_FEW_ROWS) {
        FEW_CODE_WIDTHS(PLAIN_CALL)
        return;
    }
#endif
    switch (width) {
        case F32_WIDTH: switch (rows) { CASES(F32_ROWS)(PLAIN_CALL, F32_WIDTH) } break;
#if F32_WIDTH == 3
        case 2: switch (rows) { CASES(F32_ROWS)(PLAIN_CALL, 2) } break;
        case 1: switch (rows) { CASES(F32_ROWS)(PLAIN_CALL, 1) } break;
#endif
    }
}

/* f32_pass_as with the weight's kind fixed at compile time (fp32 panels, or a kind of codes; their
 * scales' storage read at run time): one copy of the loops each, so none carries another's code. */
static inline void f32_pass(const float *xr, int64_t ldx, const float *w, const float *b, float *yr, int64_t ldy,
                            int64_t k, int64_t rows, int width, int swiglu, const char *ahead, int64_t ahead_lines,
                            const uint8_t *codes, int bits) {
#define PASS_AS(f) f32_pass_as(xr, ldx, w, b, yr, ldy, k, rows, width, swiglu, ahead, ahead_lines, codes, f, bits)
    if (codes == NULL)
        f32_pass_as(xr, ldx, w, b, yr, ldy, k, rows, width, swiglu, ahead, ahead_lines, NULL, 0, 0);
    else
        CODE_KIND_SWITCH(bits, PASS_AS);
#undef PASS_AS
}

/* How the rows of a fused gate/up weight are interleaved for ``swiglu`` (see SWIGLU_PAIR_COLUMNS):
 * 16 gate rows then their 16 up rows, or 8 and 8. */
int swiglu_pair_columns(void) { return SWIGLU_PAIR_COLUMNS; }

/* Rows of x per chunk: the passes over a group of panels read x's rows again for every group, so a
 * large x (a prefill's) is walked a chunk at a time, every group over one chunk before the next, and
 * the chunk stays in L2 instead of streaming from L3 once per group (AVX2's groups are one panel:
 * qkv at 2,597 rows ran at 124 GF/s instead of oneDNN's 163). Whole passes of ``max_rows``, and at
 * least MIN_CHUNK_PASSES of them: every chunk streams each group's panels in again. */
#define X_CHUNK_BYTES (256 * 1024)
#define MIN_CHUNK_PASSES 16
static int64_t row_chunk(int64_t m, int64_t k, int max_rows) {
    int64_t chunk = k > 0 ? X_CHUNK_BYTES / (k * (int64_t)sizeof(float)) / max_rows * max_rows : m;
    if (chunk < MIN_CHUNK_PASSES * max_rows) chunk = MIN_CHUNK_PASSES * max_rows;
    if (chunk >= m) return m;
    const int64_t chunks = (m + chunk - 1) / chunk;  /* the same rows in each */
    return ((m + chunks - 1) / chunks + max_rows - 1) / max_rows * max_rows;
}

/* How a linear of ``m`` rows over ``n`` outputs and ``k`` inputs is split: groups of ``group_width``
 * panels (a thread's unit of work), passes of up to ``max_rows`` rows, chunks of ``chunk`` rows. */
struct linear_plan {
    int64_t panels, groups, chunk;
    int group_width, max_rows;
};

static struct linear_plan plan_linear(int64_t m, int64_t n, int64_t k, int swiglu) {
    struct linear_plan plan;
    const int few = swiglu && m <= SWIGLU_FEW_ROWS;  /* one pass of one pair per group */
    plan.panels = n / PANEL;
    plan.group_width = few ? SWIGLU_FEW_WIDTH : swiglu ? SWIGLU_WIDTH : F32_WIDTH;
    plan.max_rows = few ? SWIGLU_FEW_ROWS : swiglu ? SWIGLU_ROWS : F32_ROWS;
    plan.groups = (plan.panels + plan.group_width - 1) / plan.group_width;
    plan.chunk = row_chunk(m, k, plan.max_rows);
    return plan;
}

/* x [M, K] (row stride ldx), packed weight [N / 16][K][16], bias [N] (in the weight's column order)
 * or NULL, y [M, N] (row stride ldy), or [M, N / 2] with swiglu (the weight's panels then pairs of
 * gate and up). Returns 0, or -1 for shapes linear_refuses (nothing written). */
int f32_linear(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, int swiglu, int num_threads) {
    if (linear_refuses(m, n, k, ldx, ldy, swiglu, 1)) return -1;
    if (m == 0 || n == 0) return 0;
    const struct linear_plan plan = plan_linear(m, n, k, swiglu);
    const int64_t panels = plan.panels, groups = plan.groups, chunk = plan.chunk;
    const int group_width = plan.group_width, max_rows = plan.max_rows;
    #pragma omp parallel num_threads(num_threads)
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
        const int64_t chunk_rows = m - r0 < chunk ? m - r0 : chunk;
        const float *x_chunk = x + r0 * ldx;
        /* The same groups to each thread in every chunk (a static schedule): no barrier between chunks. */
        #pragma omp for schedule(static) nowait
        for (int64_t group = 0; group < groups; group++) {
            const int64_t p = group_width * group;
            const int width = panels - p < group_width ? (int)(panels - p) : group_width;
            const float *w = packed + p * k * PANEL;
            const float *b = bias != NULL ? bias + p * PANEL : NULL;
            const int64_t passes = (chunk_rows + max_rows - 1) / max_rows;  /* rows split evenly over the passes */
            /* The first pass streams this group's panels from memory; the others read them from cache
             * and meanwhile pull the next group's panels in (one share each). */
            const int64_t next_panels = panels - p - width < group_width ? panels - p - width : group_width;
            const char *next = (const char *)(w + width * k * PANEL);
            const int64_t next_lines = next_panels * k, share = passes > 1 ? (next_lines + passes - 2) / (passes - 1) : 0;
            float *y_group = y + r0 * ldy + (swiglu ? p * (PANEL / 2) : p * PANEL);
            for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
                const int64_t rows = (chunk_rows - m0) / (passes - pass);
                const int64_t first_line = pass == 0 ? 0 : (pass - 1) * share;
                const int64_t ahead_lines = pass == 0 ? 0 : (next_lines - first_line < share ? next_lines - first_line : share);
                f32_pass(x_chunk + m0 * ldx, ldx, w, b, y_group + m0 * ldy, ldy, k, rows, width, swiglu,
                         next + 64 * first_line, ahead_lines, NULL, 0);
                m0 += rows;
            }
        }
    }
    return 0;
}

/* ``width`` panels (``k`` inputs each) of codes in ``format`` from ``packed`` into ``out`` in
 * f32_linear's layout. */
static inline __attribute__((always_inline)) void expand_codes_as(const uint8_t *packed, int width, int64_t k,
                                                                 const int format, int layout, float *out) {
    const int span = code_block_inputs(format);
    const int64_t blocks = k / span;
    for (int c = 0; c < width; c++)
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *panel = packed + c * code_panel_bytes_as(k, format, layout);
            const uint8_t *block = code_block_codes(panel, b, format, layout);
            vfloat d[PANEL_VECTORS], m[PANEL_VECTORS];
            for (int v = 0; v < PANEL_VECTORS; v++) {
                d[v] = code_block_scale(panel, b, v, 0, format, layout);
                m[v] = code_block_scale(panel, b, v, 1, format, layout);
            }
            float *line = out + (c * k + b * span) * PANEL;
            for (int i = 0; i < span; i++)
                for (int v = 0; v < PANEL_VECTORS; v++) {
                    vfloat w = d[v] * code_vector(block, i, v, format);  /* d * q is exact: one rounding */
                    if (code_has_m(format)) w += m[v];
                    memcpy(line + i * PANEL + v * LANES, &w, sizeof w);
                }
        }
}

static void expand_codes(const uint8_t *packed, int width, int64_t k, int format, float *out) {
#define EXPAND_AS(f) expand_codes_as(packed, width, k, f, format, out)  /* one copy of the loop per kind */
    CODE_KIND_SWITCH(format, EXPAND_AS);
#undef EXPAND_AS
}

/* The expanded panels a thread works on (a group, or a run of groups for a large x); grown as
 * needed, kept for the thread's life. */
static __thread float *code_scratch;
static __thread int64_t code_scratch_floats;

static float *code_buffer(int64_t floats) {
    if (floats > code_scratch_floats) {
        free(code_scratch);
        code_scratch = aligned_alloc(64, (size_t)floats * sizeof(float));
        code_scratch_floats = code_scratch != NULL ? floats : 0;
    }
    return code_scratch;
}

/* The passes of ``chunk_rows`` rows of x against group ``group`` (its panels at ``w``, expanded, or
 * at ``codes``, expanded in registers), prefetching ``ahead_bytes`` bytes from ``ahead`` meanwhile. */
static void coded_group_passes(const float *x, int64_t ldx, const float *w, const uint8_t *codes, const float *bias,
                               float *y, int64_t ldy, int64_t chunk_rows, int64_t panels, int64_t k, int bits,
                               int swiglu, int group_width, int max_rows, int64_t group, const char *ahead,
                               int64_t ahead_bytes) {
    const int64_t p = group_width * group;
    const int width = panels - p < group_width ? (int)(panels - p) : group_width;
    const float *b = bias != NULL ? bias + p * PANEL : NULL;
    const int64_t passes = (chunk_rows + max_rows - 1) / max_rows;  /* rows split evenly over the passes */
    const int64_t lines = ahead_bytes / 64, share = (lines + passes - 1) / passes;
    float *y_group = y + (swiglu ? p * (PANEL / 2) : p * PANEL);
    for (int64_t pass = 0, m0 = 0; pass < passes; pass++) {
        const int64_t rows = (chunk_rows - m0) / (passes - pass);
        const int64_t first_line = pass * share < lines ? pass * share : lines;
        const int64_t ahead_lines = lines - first_line < share ? lines - first_line : share;
        f32_pass(x + m0 * ldx, ldx, w, b, y_group + m0 * ldy, ldy, k, rows, width, swiglu, ahead + 64 * first_line,
                 ahead_lines, codes, bits);
        m0 += rows;
    }
}

/* Bytes of expanded panels an AVX2 thread keeps for the row chunks of a large x. */
#define EXPANDED_GROUPS_BYTES (512 * 1024)
/* Bytes of codes a thread walks every chunk of a large x against before its next groups (see coded_linear). */
#define CODE_GROUPS_BYTES (256 * 1024)

/* As f32_linear, with ``packed`` holding block codes in the layout of code_blocks.h, ``bits`` its
 * format (code_blocks.h; K a multiple of code_k_multiple). Returns 0; -1 for shapes
 * linear_refuses or another format (nothing written); -2 when a thread's buffer cannot be allocated.
 *
 * Every pass expands its group's codes in registers (AVX-512: up to FUSED_CODE_PASSES passes, all a
 * decode step or short prompt has), reading a group's codes (about 20-80 KB) from L1/L2 again for
 * each pass of 8 rows: on a 2-core Xeon this ran 2.4x the rate of expanding a group once into an fp32
 * buffer and reading that from L2 at every pass (110 vs 45 GMAC/s at 32-128 rows, 2 threads; the
 * buffer's 4 bytes a weight were the bound). One chunk of x (decode steps, short prompts): the passes
 * pull the next group's codes into cache. Several chunks (long prefills): a thread takes a run of its
 * groups, about CODE_GROUPS_BYTES of codes, and runs every chunk of x against that run before the
 * next, so x's chunks stay in L2 and the codes are read from memory once. AVX2 (16 registers) keeps
 * the buffer for more than one pass. */
int coded_linear(const float *x, int64_t ldx, const uint8_t *packed, const float *bias, float *y, int64_t ldy,
                 int64_t m, int64_t n, int64_t k, int bits, int swiglu, int num_threads) {
    if (!code_format_known(bits) || linear_refuses(m, n, k, ldx, ldy, swiglu, code_k_multiple(bits))) return -1;
    if (m == 0 || n == 0) return 0;
    if (k == 0) return f32_linear(x, ldx, NULL, bias, y, ldy, m, n, 0, swiglu, num_threads);  /* y = bias */
    struct linear_plan plan = plan_linear(m, n, k, swiglu);
    if (m <= CODE_FEW_ROWS && plan.group_width < CODE_FEW_WIDTH) {  /* decode steps: more chains a pass */
        plan.group_width = CODE_FEW_WIDTH;
        plan.groups = (plan.panels + CODE_FEW_WIDTH - 1) / CODE_FEW_WIDTH;
    }
    const int64_t panels = plan.panels, groups = plan.groups, chunk = plan.chunk;
    const int group_width = plan.group_width, max_rows = plan.max_rows;
    const int64_t panel_bytes = code_panel_bytes(k, bits), group_floats = group_width * k * PANEL;
    int failed = 0;
    if (chunk < m && FUSED_CODE_PASSES == 1) {  /* AVX2: a run of groups expanded once */
        int64_t run = EXPANDED_GROUPS_BYTES / (group_floats * (int64_t)sizeof(float));
        if (run < 1) run = 1;
        #pragma omp parallel num_threads(num_threads) reduction(| : failed)
        {
            const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
            const int64_t first = groups * thread / threads, end = groups * (thread + 1) / threads;
            float *w = code_buffer(run * group_floats);
            failed = w == NULL && first < end;
            for (int64_t g0 = first; g0 < end && w != NULL; g0 += run) {
                const int64_t g1 = end - g0 < run ? end : g0 + run;
                const int64_t p0 = g0 * group_width, p1 = g1 * group_width < panels ? g1 * group_width : panels;
                expand_codes(packed + p0 * panel_bytes, (int)(p1 - p0), k, bits, w);  /* panels follow each other */
                for (int64_t r0 = 0; r0 < m; r0 += chunk)
                    for (int64_t g = g0; g < g1; g++)
                        coded_group_passes(x + r0 * ldx, ldx, w + (g - g0) * group_floats, NULL, bias, y + r0 * ldy,
                                           ldy, m - r0 < chunk ? m - r0 : chunk, panels, k, bits, swiglu, group_width,
                                           max_rows, g, NULL, 0);
            }
        }
        return failed ? -2 : 0;
    }
    if (chunk < m) {
        int64_t run = CODE_GROUPS_BYTES / (group_width * panel_bytes);
        if (run < 1) run = 1;
        #pragma omp parallel num_threads(num_threads)
        {
            const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
            const int64_t first = groups * thread / threads, end = groups * (thread + 1) / threads;
            for (int64_t g0 = first; g0 < end; g0 += run) {
                const int64_t g1 = end - g0 < run ? end : g0 + run;
                for (int64_t r0 = 0; r0 < m; r0 += chunk)
                    for (int64_t g = g0; g < g1; g++)
                        coded_group_passes(x + r0 * ldx, ldx, NULL, packed + g * group_width * panel_bytes, bias,
                                           y + r0 * ldy, ldy, m - r0 < chunk ? m - r0 : chunk, panels, k, bits, swiglu,
                                           group_width, max_rows, g, NULL, 0);
            }
        }
        return 0;
    }
    const int64_t passes = (m + max_rows - 1) / max_rows;
    #pragma omp parallel for schedule(static) num_threads(num_threads) reduction(| : failed)
    for (int64_t group = 0; group < groups; group++) {
        const int64_t p = group_width * group;
        const int width = panels - p < group_width ? (int)(panels - p) : group_width;
        const uint8_t *group_codes = packed + p * panel_bytes;
        const uint8_t *codes = passes <= FUSED_CODE_PASSES ? group_codes : NULL;
        float *w = NULL;
        if (codes == NULL) {
            w = code_buffer(group_floats);
            if (w == NULL) {
                failed = 1;
                continue;
            }
            expand_codes(group_codes, width, k, bits, w);
        }
        const int64_t next_panels = panels - p - width < group_width ? panels - p - width : group_width;
        coded_group_passes(x, ldx, w, codes, bias, y, ldy, m, panels, k, bits, swiglu, group_width, max_rows, group,
                           (const char *)(group_codes + width * panel_bytes), next_panels * panel_bytes);
    }
    return failed ? -2 : 0;
}
