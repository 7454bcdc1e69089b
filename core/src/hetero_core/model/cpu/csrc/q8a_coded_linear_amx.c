/* q8a_coded_linear's integer sums on AMX-INT8 tiles (Intel Sapphire Rapids and later), for calls of
 * many rows: the same results, bit for bit, as its vector paths (VNNI, AVX2, int32).
 *
 * Per group of two 16-column panels (threads split the groups, as on the vector path) and block of 32
 * rows of activation codes (two A tiles of 16 rows), each weight block of 32 inputs (16 for
 * CODES_Q8_SUB16) is one TDPBSUD per row half and panel: signed activation codes (A, 16 rows x 32
 * bytes) times unsigned weight codes (B, 8 rows of 16 columns x 4 bytes, VPDPBUSD's order) into a
 * zeroed int32 C tile, stored, then scaled as the vector path scales its sums. The 8-bit layouts'
 * code vectors are B tiles as they lie in the packed weight (q + 128, an unsigned byte: 128 * asum is
 * taken off, as on the VNNI path); a 4-bit block's 4 vectors are split into 8 rows of nibbles (0..15)
 * in a per-thread scratch. Rows past M in the last block are read from the zeroed rows the caller
 * allocates (q8a_rows.h) and never written.
 *
 * Why the bits match: TDPBSUD's sums are exact integers (below 2^21 per block), the same integers as
 * VPDPBUSD's or the int32 path's; every output then starts from the bias (or zero) and takes, block by
 * block in input order, vfma(d * sx, isum, y) and, with m, vfma(m, sx * asum, y), the vector path's
 * epilogue written again in the same order. So a process may run a call of 1 row on VNNI and one of 64
 * on tiles and every row still gets the bits it would get alone: batch invariance survives the switch.
 *
 * Compiled wherever the compiler targets AMX-INT8 (``-march=native`` on such a CPU defines
 * __AMX_TILE__ and __AMX_INT8__), in every variant of the library, since the tiles change no result;
 * live only once ``q8a_tiles_request`` has had Linux grant the tile state (amx_tiles.h). The emulated
 * build (HETERO_AMX_EMULATED, amx_emulation.h) runs the same code on tiles in C, on any CPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "code_blocks.h"
#include "kernel_math.h"
#include "q8a_rows.h"

#if defined(HETERO_AMX_EMULATED)
#include "amx_emulation.h" /* the tile instructions in C: tests on CPUs without AMX */
#include "amx_tiles.h"
#define Q8A_TILES 2
#elif defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>

#include "amx_tiles.h"
#define Q8A_TILES 1
#else
#define Q8A_TILES 0
#endif

/* 0: no tiles in this build; 1: AMX-INT8; 2: tiles emulated in C. */
int q8a_tiles_build(void) { return Q8A_TILES; }

#if Q8A_TILES

#define PANEL CODE_PANEL
#define PANEL_VECTORS (PANEL / LANES)
#define TILE_ROWS 16                    /* rows of one A tile */
#define BLOCK_ROWS Q8A_TILE_ROW_BLOCK   /* two A tiles */
#define WIDTH 2                         /* panels per group: two B tiles (a SwiGLU pair with 16 lanes) */
#define CHUNK_BYTES (256 * 1024)        /* activation codes per row chunk: they stay in L2 across groups */
#define PREFETCH_BYTES 1024
#define Q4_TILE_BYTES (8 * 64)         /* a 4-bit block's B tile: 8 rows of 16 columns x 4 codes */
#define STEP_BLOCKS 4                   /* weight blocks whose sums are stored before the epilogue runs them */

static int granted = Q8A_TILES == 2; /* emulated tiles need no grant */

/* Asks Linux for the tile data state; 0 when held (the tiles then run), -1 when refused. */
int q8a_tiles_request(void) {
#if Q8A_TILES == 1
    if (amx_tile_permission() != 0) return -1;
#endif
    granted = 1;
    return 0;
}

int q8a_tiles_granted(void) { return granted; }

/* Tiles: C 0-3 (row half h, panel c: tile 2h + c; 16 rows x 16 int32), A 4-5 (the row halves' codes
 * of one block: 16 rows x span bytes), B 6-7 (the panels' codes of the block: span / 4 rows x 64). */
static void configure(tile_config *cfg, int span) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 4; t++) cfg->rows[t] = TILE_ROWS, cfg->colsb[t] = 64;
    for (int t = 4; t < 6; t++) cfg->rows[t] = TILE_ROWS, cfg->colsb[t] = (uint16_t)span;
    for (int t = 6; t < 8; t++) cfg->rows[t] = (uint8_t)(span / 4), cfg->colsb[t] = 64;
}

/* A 4-bit block's code vectors (vector t: inputs 4t + j in the low nibbles, 16 + 4t + j in the high
 * ones) as a B tile of 8 rows: row t the low nibbles, row 4 + t the high ones. */
static inline void unpack_nibbles(const uint8_t *codes, uint8_t *tile) {
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 64; i++) {
            tile[64 * t + i] = codes[64 * t + i] & 15;
            tile[64 * (4 + t) + i] = codes[64 * t + i] >> 4;
        }
}

/* One weight block's exact sums: ``halves`` row halves of the codes at ``xa`` (row stride ``lda``)
 * times ``width`` B tiles -> sums[2h + c][row][column]. Tile numbers are immediates: spelled out. */
static inline __attribute__((always_inline)) void tile_sums(const int8_t *xa, int64_t lda, const uint8_t *const b[],
                                                           const int halves, const int width,
                                                           int32_t sums[4][TILE_ROWS][PANEL]) {
    _tile_zero(0);
    _tile_loadd(4, xa, lda);
    _tile_loadd(6, b[0], 64);
    _tile_dpbsud(0, 4, 6);
    if (width == 2) {
        _tile_zero(1);
        _tile_loadd(7, b[1], 64);
        _tile_dpbsud(1, 4, 7);
    }
    if (halves == 2) {
        _tile_zero(2);
        _tile_loadd(5, xa + TILE_ROWS * lda, lda);
        _tile_dpbsud(2, 5, 6);
        if (width == 2) {
            _tile_zero(3);
            _tile_dpbsud(3, 5, 7);
        }
    }
    _tile_stored(0, sums[0], 64);
    if (width == 2) _tile_stored(1, sums[1], 64);
    if (halves == 2) {
        _tile_stored(2, sums[2], 64);
        if (width == 2) _tile_stored(3, sums[3], 64);
    }
}

/* ``rows`` (<= 32) rows from row r0 against ``width`` panels: q8a_coded_linear.c's q8a_panel_rows with
 * the sums from tiles, its epilogue and its stores as there. 4-bit codes: their B tiles from
 * ``unpacked`` (the group's, unpack_group's) where not NULL, else split block by block here. */
static inline __attribute__((always_inline)) void tile_rows(const struct q8a_rows *a, int64_t r0, int rows,
                                                           const uint8_t *panel, int64_t panel_bytes,
                                                           const float *bias, void *y, int64_t ldy, const int halves,
                                                           const int width, const int format, int layout, int swiglu,
                                                           int out_bf16, int prefetch, const uint8_t *unpacked) {
    const int64_t k = a->k, span = code_block_inputs(format), blocks = k / span;
    const int64_t act_blocks = k / Q8A_ACT_BLOCK, sum_blocks = k / 16;
    const int four = code_kind(format) == CODES_Q4;
    vfloat acc[BLOCK_ROWS][WIDTH * PANEL_VECTORS];
    int32_t sums[STEP_BLOCKS][4][TILE_ROWS][PANEL] __attribute__((aligned(64)));
    uint8_t nibbles[WIDTH][8 * 64] __attribute__((aligned(64)));
    for (int c = 0; c < width * PANEL_VECTORS; c++) {
        vfloat start = {0};
        if (bias != NULL) memcpy(&start, bias + c * LANES, sizeof start);
        for (int r = 0; r < rows; r++) acc[r][c] = start;
    }
    for (int64_t b0 = 0; b0 < blocks; b0 += STEP_BLOCKS) {
        const int steps = blocks - b0 < STEP_BLOCKS ? (int)(blocks - b0) : STEP_BLOCKS;
        vfloat d[STEP_BLOCKS][WIDTH * PANEL_VECTORS], m[STEP_BLOCKS][WIDTH * PANEL_VECTORS];
        for (int j = 0; j < steps; j++) {
            const uint8_t *tiles[WIDTH];
            for (int c = 0; c < width; c++) {
                const uint8_t *panel_c = panel + c * panel_bytes, *codes = code_block_codes(panel_c, b0 + j, format, layout);
                if (prefetch)
                    for (int l = 0; l < code_stream_bytes(format, layout); l += 64)
                        __builtin_prefetch(codes + PREFETCH_BYTES + l, 0, 2);
                if (four && unpacked != NULL) {
                    tiles[c] = unpacked + ((b0 + j) * WIDTH + c) * Q4_TILE_BYTES;
                } else if (four) {
                    unpack_nibbles(codes, nibbles[c]);
                    tiles[c] = nibbles[c];
                } else {
                    tiles[c] = codes;
                }
                for (int v = 0; v < PANEL_VECTORS; v++) {
                    d[j][c * PANEL_VECTORS + v] = code_block_scale(panel_c, b0 + j, v, 0, format, layout);
                    m[j][c * PANEL_VECTORS + v] = code_block_scale(panel_c, b0 + j, v, 1, format, layout);
                }
            }
            tile_sums(a->codes + r0 * a->lda + (b0 + j) * span, a->lda, tiles, halves, width, sums[j]);
        }
        /* Each row's outputs through the step's blocks in input order (its accumulators read and
         * written once per step, not once per block). */
        for (int r = 0; r < rows; r++) {
            const int64_t row = r0 + r;
            vfloat out[WIDTH * PANEL_VECTORS];
            for (int i = 0; i < width * PANEL_VECTORS; i++) out[i] = acc[r][i];
            for (int j = 0; j < steps; j++) {
                const int64_t i0 = (b0 + j) * span, act = i0 / Q8A_ACT_BLOCK;
                const float sx = a->scale[row * act_blocks + act], m_scale = a->m_scale[row * act_blocks + act];
                const int32_t *offsets = a->offsets + row * sum_blocks + i0 / 16;
                const int32_t offset = four ? 0 : span == 16 ? offsets[0] : offsets[0] + offsets[1];
                for (int c = 0; c < width; c++)
                    for (int v = 0; v < PANEL_VECTORS; v++) {
                        vint s;
                        memcpy(&s, &sums[j][2 * (r / TILE_ROWS) + c][r % TILE_ROWS][v * LANES], sizeof s);
                        if (!four) s -= offset;  /* the codes' + 128 */
                        const int i = c * PANEL_VECTORS + v;
                        out[i] = vfma(d[j][i] * vsplat(sx), __builtin_convertvector(s, vfloat), out[i]);
                        if (code_has_m(format)) out[i] = vfma(m[j][i], vsplat(m_scale), out[i]);
                    }
            }
            for (int i = 0; i < width * PANEL_VECTORS; i++) acc[r][i] = out[i];
        }
    }
    if (swiglu) {
#if LANES == 16 /* panels 0 and 1: gate and up of one output panel (swiglu_pair_columns 16) */
        for (int r = 0; r < rows; r++) vstore(y, r * ldy, vswiglu(acc[r][0], acc[r][1], out_bf16), out_bf16);
#else /* the halves of panel c: gate and up of output columns 8c .. 8c + 7 (swiglu_pair_columns 8) */
        for (int c = 0; c < width; c++)
            for (int v = 0; v < PANEL_VECTORS / 2; v++)
                for (int r = 0; r < rows; r++) {
                    const vfloat out = vswiglu(acc[r][c * PANEL_VECTORS + v],
                                               acc[r][c * PANEL_VECTORS + v + PANEL_VECTORS / 2], out_bf16);
                    vstore(y, r * ldy + c * PANEL / 2 + v * LANES, out, out_bf16);
                }
#endif
        return;
    }
    for (int c = 0; c < width * PANEL_VECTORS; c++)
        for (int r = 0; r < rows; r++) vstore(y, r * ldy + c * LANES, acc[r][c], out_bf16);
}

/* One copy of the loops per format, width and number of row halves. */
static inline __attribute__((always_inline)) void tile_rows_as(const struct q8a_rows *a, int64_t r0, int rows,
                                                              const uint8_t *panel, int64_t panel_bytes,
                                                              const float *bias, void *y, int64_t ldy, int width,
                                                              const int format, int layout, int swiglu, int out_bf16,
                                                              int prefetch, const uint8_t *unpacked) {
#define TILE_ROWS_CALL(h, w) \
    tile_rows(a, r0, rows, panel, panel_bytes, bias, y, ldy, h, w, format, layout, swiglu, out_bf16, prefetch, unpacked)
    const int halves = rows > TILE_ROWS ? 2 : 1;
    if (halves == 2 && width == 2) TILE_ROWS_CALL(2, 2);
    else if (halves == 2) TILE_ROWS_CALL(2, 1);
    else if (width == 2) TILE_ROWS_CALL(1, 2);
    else TILE_ROWS_CALL(1, 1);
#undef TILE_ROWS_CALL
}

static void tile_pass(const struct q8a_rows *a, int64_t r0, int rows, const uint8_t *panel, int64_t panel_bytes,
                      const float *bias, void *y, int64_t ldy, int width, int format, int swiglu, int out_bf16,
                      int prefetch, const uint8_t *unpacked) {
#define TILE_PASS_AS(f) \
    tile_rows_as(a, r0, rows, panel, panel_bytes, bias, y, ldy, width, f, format, swiglu, out_bf16, prefetch, unpacked)
    CODE_KIND_SWITCH(format, TILE_PASS_AS);
#undef TILE_PASS_AS
}

/* A group's 4-bit codes, every block of its ``width`` panels, as B tiles: [block][WIDTH][8 x 64]. */
static void unpack_group(const uint8_t *panel, int64_t panel_bytes, int64_t blocks, int width, int layout,
                         uint8_t *unpacked) {
    for (int64_t b = 0; b < blocks; b++)
        for (int c = 0; c < width; c++)
            unpack_nibbles(code_block_codes(panel + c * panel_bytes, b, CODES_Q4, layout), unpacked + (b * WIDTH + c) * Q4_TILE_BYTES);
}

/* q8a_coded_linear's contract after its checks and quantization (m, n, k > 0; ``a``'s codes allocated
 * to whole blocks of 32 rows). Returns 0. */
int q8a_tiles_linear(const struct q8a_rows *a, const uint8_t *packed, const float *bias, void *y, int64_t ldy,
                     int64_t m, int64_t n, int format, int swiglu, int out_bf16, int num_threads) {
    const int64_t k = a->k, element = out_bf16 ? 2 : 4, span = code_block_inputs(format);
    const int64_t panels = n / PANEL, groups = (panels + WIDTH - 1) / WIDTH;
    const int64_t panel_bytes = code_panel_bytes(k, format);
    int64_t chunk = CHUNK_BYTES / a->lda / BLOCK_ROWS * BLOCK_ROWS;
    if (chunk < BLOCK_ROWS) chunk = BLOCK_ROWS;
    #pragma omp parallel num_threads(num_threads)
    {
        tile_config cfg;
        configure(&cfg, (int)span);
        _tile_loadconfig(&cfg);
        /* 4-bit codes over several row blocks: each group's B tiles split once per chunk, not once per
         * row block (where the buffer cannot be had, block by block: the same tiles). */
        const int64_t blocks = k / span;
        uint8_t *unpacked = code_kind(format) == CODES_Q4 && m > BLOCK_ROWS
                                ? aligned_alloc(64, (size_t)(blocks * WIDTH * Q4_TILE_BYTES))
                                : NULL;
        for (int64_t c0 = 0; c0 < m; c0 += chunk) {
            const int64_t chunk_rows = m - c0 < chunk ? m - c0 : chunk;
            /* The same groups to each thread in every chunk (a static schedule): no barrier between chunks. */
            #pragma omp for schedule(static) nowait
            for (int64_t group = 0; group < groups; group++) {
                const int64_t p = group * WIDTH;
                const int width = panels - p < WIDTH ? (int)(panels - p) : WIDTH;
                const float *b = bias != NULL ? bias + p * PANEL : NULL;
                const int reuse = unpacked != NULL && chunk_rows > BLOCK_ROWS;
                if (reuse) unpack_group(packed + p * panel_bytes, panel_bytes, blocks, width, format, unpacked);
                char *y_group = (char *)y + (c0 * ldy + (swiglu ? p * PANEL / 2 : p * PANEL)) * element;
                for (int64_t m0 = 0; m0 < chunk_rows; m0 += BLOCK_ROWS) {
                    const int rows = chunk_rows - m0 < BLOCK_ROWS ? (int)(chunk_rows - m0) : BLOCK_ROWS;
                    tile_pass(a, c0 + m0, rows, packed + p * panel_bytes, panel_bytes, b,
                              y_group + m0 * ldy * element, ldy, width, format, swiglu, out_bf16, m0 == 0 && !reuse,
                              reuse ? unpacked : NULL);
                }
            }
        }
        _tile_release();
        free(unpacked);
    }
    return 0;
}

#else /* no tiles in this build: the calls exist (one symbol table for every build) and refuse */

int q8a_tiles_request(void) { return -1; }
int q8a_tiles_granted(void) { return 0; }
int q8a_tiles_linear(const struct q8a_rows *a, const uint8_t *packed, const float *bias, void *y, int64_t ldy,
                     int64_t m, int64_t n, int format, int swiglu, int out_bf16, int num_threads) {
    (void)a, (void)packed, (void)bias, (void)y, (void)ldy, (void)m, (void)n, (void)format, (void)swiglu,
        (void)out_bf16, (void)num_threads;
    return -1;
}

#endif
