/* bf16 linears on AMX tiles (Intel Sapphire Rapids and later): y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
 *
 * Built only into the AMX variant of the kernels library (``-mamx-tile -mamx-bf16 -DHETERO_AMX``, see
 * ``model/cpu/amx.py``), whose ``bf16_linear`` (bf16_linear.c) hands every call here once
 * ``amx_request_permission`` has had the kernel grant this process the tile data state
 * (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); without the grant a tile instruction
 * faults, so until then ``bf16_linear`` keeps its AVX-512 path.
 *
 * The packed weight is bf16_linear's own layout, [N / 16][K / 2][16][2]: 16 k-pairs of one panel
 * are exactly one B tile (16 rows of 64 bytes, VNNI order), so the AMX variant reads the same
 * prepared weights. Per group of up to GROUP panels (threads split the groups) and block of 16 rows
 * of x: GROUP accumulator tiles C (16 rows x 16 fp32 columns) start from the bias (or zero), then for
 * each 32 inputs one A tile (16 rows of x) and, per panel, one B tile and TDPBF16PS; the last K % 32
 * inputs use a narrower A and a shorter B tile. Rows past M in the last block come from a zeroed copy.
 *
 * Batch invariance: every output is the bias followed by the same sequence of tile dot products over
 * the inputs in order, for every M (one row, a partial block or a full one): a row's result never
 * depends on its batch-mates or the threads. Its bits differ from the AVX-512 path's (another
 * instruction), so a process runs one of the two for all its bf16 linears (fused decode included).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "amx_tiles.h"
#include "kernel_math.h"

#if defined(HETERO_AMX) && defined(HETERO_AMX_EMULATED)
#include "amx_emulation.h" /* the tile instructions in C: tests on CPUs without AMX */
#define AMX_TILES 1
#elif defined(HETERO_AMX) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#define AMX_TILES 1
#endif

#ifdef AMX_TILES

#define GROUP 4       /* accumulator tiles 0-3: four 16-column panels */
#define TILE_ROWS 16  /* rows of x per block */
#define TILE_PAIRS 16 /* k-pairs per full A / B tile (32 inputs, 64 bytes a row) */

static int granted = 0;

/* Asks the kernel for the AMX tile data state (once per process); 0 when granted, -1 when refused. */
int amx_request_permission(void) {
#ifndef HETERO_AMX_EMULATED
    if (amx_tile_permission() != 0) return -1;
#endif
    granted = 1;
    return 0;
}

/* 1 once the grant is held: bf16_linear then runs on tiles. */
int bf16_linear_amx_granted(void) { return granted; }

/* Tiles: 0-3 accumulators, 4 A, 5 B, 6 A of the last K % 32 inputs, 7 B of them. */
static void configure(tile_config *cfg, int64_t tail_pairs) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 6; t++) cfg->rows[t] = TILE_ROWS, cfg->colsb[t] = 64;
    cfg->rows[6] = TILE_ROWS, cfg->colsb[6] = (uint16_t)(tail_pairs > 0 ? 4 * tail_pairs : 64);
    cfg->rows[7] = (uint8_t)(tail_pairs > 0 ? tail_pairs : TILE_ROWS), cfg->colsb[7] = 64;
}

/* Tile numbers are immediates: one step of panel ``c`` (when the group has it). */
#define PANEL_STEP(c, a_tile, b_tile, offset) \
    if (width > c) { _tile_loadd(b_tile, panel + (c) * pairs * 32 + (offset), 64); _tile_dpbf16ps(c, a_tile, b_tile); }
#define EACH_PANEL(a_tile, b_tile, offset) \
    PANEL_STEP(0, a_tile, b_tile, offset) PANEL_STEP(1, a_tile, b_tile, offset) \
    PANEL_STEP(2, a_tile, b_tile, offset) PANEL_STEP(3, a_tile, b_tile, offset)
#define START(c) if (width > c) { if (start != NULL) _tile_loadd(c, start + 16 * (c), GROUP * 16 * sizeof(float)); else _tile_zero(c); }
#define SAVE(c) if (width > c) _tile_stored(c, sums + 16 * (c), GROUP * 16 * sizeof(float));

/* One block: 16 rows of x (``a``, row stride ``lda`` elements) against ``width`` panels -> ``sums``
 * [16][GROUP * 16] fp32; ``start`` [16][GROUP * 16] (the bias on every row) or NULL. */
static void block(const uint16_t *a, int64_t lda, const uint16_t *panel, int64_t pairs, const float *start,
                  const int width, float *sums) {
    START(0) START(1) START(2) START(3)
    const int64_t full = pairs / TILE_PAIRS;
    for (int64_t kb = 0; kb < full; kb++) {
        _tile_loadd(4, a + kb * 2 * TILE_PAIRS, lda * sizeof(uint16_t));
        EACH_PANEL(4, 5, kb * TILE_PAIRS * 32)
    }
    if (pairs % TILE_PAIRS) {
        _tile_loadd(6, a + full * 2 * TILE_PAIRS, lda * sizeof(uint16_t));
        EACH_PANEL(6, 7, full * TILE_PAIRS * 32)
    }
    SAVE(0) SAVE(1) SAVE(2) SAVE(3)
}

/* ``rows`` rows of ``sums`` to y: fp32, bf16, or silu(gate) * up of each gate/up panel pair in bf16. */
static void write_rows(const float *sums, int64_t rows, int width, void *y, int64_t ldy, int out_f32,
                       int swiglu) {
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < width; c += swiglu ? 2 : 1)
            for (int v = 0; v < 16 / LANES; v++) {
                const int64_t at = r * GROUP * 16 + 16 * c + v * LANES;
                if (swiglu)  /* panels c and c + 1: gate and up of output panel c / 2 */
                    vstore(y, r * ldy + 16 * (c / 2) + v * LANES, vswiglu(vload(sums, at, 0), vload(sums, at + 16, 0), 1), 1);
                else
                    vstore(y, r * ldy + 16 * c + v * LANES, vload(sums, at, 0), !out_f32);
            }
}

/* bf16_linear's contract (its caller has checked the shapes; m, n > 0). Returns 0; -2 when the
 * zeroed copy of the last rows cannot be allocated. */
int bf16_linear_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                    int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
    const int64_t panels = n / 16, pairs = k / 2, full_blocks = m / TILE_ROWS, last_rows = m % TILE_ROWS;
    uint16_t *last = NULL;  /* the last partial block of x, zero-padded to 16 rows */
    if (last_rows > 0) {
        last = calloc((size_t)(TILE_ROWS * (k > 0 ? k : 1)), sizeof(uint16_t));
        if (last == NULL) return -2;
        for (int64_t r = 0; r < last_rows; r++) memcpy(last + r * k, x + (full_blocks * TILE_ROWS + r) * ldx, (size_t)k * 2);
    }
    const int64_t groups = (panels + GROUP - 1) / GROUP;
    #pragma omp parallel num_threads(num_threads)
    {
        tile_config cfg;
        configure(&cfg, pairs % TILE_PAIRS);
        _tile_loadconfig(&cfg);
        float sums[TILE_ROWS * GROUP * 16] __attribute__((aligned(64)));
        float start[TILE_ROWS * GROUP * 16] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int64_t group = 0; group < groups; group++) {
            const int64_t p = GROUP * group;
            const int width = panels - p < GROUP ? (int)(panels - p) : GROUP;
            const uint16_t *panel = packed + p * pairs * 32;
            if (bias != NULL)
                for (int r = 0; r < TILE_ROWS; r++) memcpy(start + r * GROUP * 16, bias + p * 16, (size_t)width * 16 * sizeof(float));
            const int64_t column = swiglu ? p / 2 * 16 : p * 16;
            for (int64_t b = 0; b < full_blocks + (last_rows > 0); b++) {
                const int is_last = b == full_blocks;
                if (k > 0) block(is_last ? last : x + b * TILE_ROWS * ldx, is_last ? k : ldx, panel, pairs,
                                 bias != NULL ? start : NULL, width, sums);
                else  /* no inputs: the bias alone */
                    for (int64_t i = 0; i < TILE_ROWS * GROUP * 16; i++) sums[i] = bias != NULL ? start[i] : 0.0f;
                void *yr = out_f32 ? (void *)((float *)y + b * TILE_ROWS * ldy + column)
                                   : (void *)((uint16_t *)y + b * TILE_ROWS * ldy + column);
                write_rows(sums, is_last ? last_rows : TILE_ROWS, width, yr, ldy, out_f32, swiglu);
            }
        }
        _tile_release();
    }
    free(last);
    return 0;
}

#else  /* not an AMX build: the calls exist (one symbol table for every build) and refuse */

int amx_request_permission(void) { return -1; }
int bf16_linear_amx_granted(void) { return 0; }
int bf16_linear_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                    int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads) {
    (void)x, (void)ldx, (void)packed, (void)bias, (void)y, (void)ldy, (void)m, (void)n, (void)k, (void)out_f32,
        (void)swiglu, (void)num_threads;
    return -1;
}

#endif
