/* The AMX tile instructions bf16_linear_amx.c and q8a_coded_linear_amx.c use, in plain C
 * (HETERO_AMX_EMULATED): a tile register file per thread (per translation unit: each kernel configures
 * its own), so the kernels' blocking, tails, bias and outputs are tested on CPUs without AMX (the
 * tests build this variant; it is never loaded to run a model). TDPBF16PS adds each pair's two
 * products in order in fp32; the hardware's order within a pair may differ (other last bits).
 * TDPBSUD (AMX-INT8: signed bytes of A times unsigned bytes of B, four products per int32) is exact
 * integer arithmetic, as on the hardware: the same sums bit for bit. */
#ifndef HETERO_AMX_EMULATION_H
#define HETERO_AMX_EMULATION_H

#include <stdint.h>
#include <string.h>

#include "kernel_math.h"

static __thread struct {
    uint8_t bytes[16][64];
    int rows, colsb;
} emulated_tiles[8];

static inline void emulated_loadconfig(const void *config) {
    const uint8_t *c = config;  /* palette, start row, 14 reserved, 16 x colsb (uint16), 16 x rows */
    for (int t = 0; t < 8; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, sizeof colsb);
        emulated_tiles[t].colsb = colsb;
        emulated_tiles[t].rows = c[48 + t];
    }
}

static inline void emulated_loadd(int t, const void *base, int64_t stride) {
    for (int r = 0; r < emulated_tiles[t].rows; r++)
        memcpy(emulated_tiles[t].bytes[r], (const uint8_t *)base + r * stride, (size_t)emulated_tiles[t].colsb);
}

static inline void emulated_stored(int t, void *base, int64_t stride) {
    for (int r = 0; r < emulated_tiles[t].rows; r++)
        memcpy((uint8_t *)base + r * stride, emulated_tiles[t].bytes[r], (size_t)emulated_tiles[t].colsb);
}

static inline void emulated_zero(int t) { memset(emulated_tiles[t].bytes, 0, sizeof emulated_tiles[t].bytes); }

static inline void emulated_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < emulated_tiles[c].rows; m++)
        for (int n = 0; n < emulated_tiles[c].colsb / 4; n++) {
            float acc;
            memcpy(&acc, emulated_tiles[c].bytes[m] + 4 * n, sizeof acc);
            for (int kp = 0; kp < emulated_tiles[a].colsb / 4; kp++) {
                uint16_t x[2], w[2];
                memcpy(x, emulated_tiles[a].bytes[m] + 4 * kp, sizeof x);
                memcpy(w, emulated_tiles[b].bytes[kp] + 4 * n, sizeof w);
                acc += bf16_to_f32(x[0]) * bf16_to_f32(w[0]);
                acc += bf16_to_f32(x[1]) * bf16_to_f32(w[1]);
            }
            memcpy(emulated_tiles[c].bytes[m] + 4 * n, &acc, sizeof acc);
        }
}

/* C[m][n] += sum over k of A[m][k] (signed) * B[k / 4][4n + k % 4] (unsigned), in int32 (wrapping, as
 * the hardware; the kernels' sums stay far below 2^31). */
static inline void emulated_dpbsud(int c, int a, int b) {
    for (int m = 0; m < emulated_tiles[c].rows; m++)
        for (int n = 0; n < emulated_tiles[c].colsb / 4; n++) {
            int32_t acc;
            memcpy(&acc, emulated_tiles[c].bytes[m] + 4 * n, sizeof acc);
            uint32_t sum = (uint32_t)acc;
            for (int k = 0; k < emulated_tiles[a].colsb; k++)
                sum += (uint32_t)((int32_t)(int8_t)emulated_tiles[a].bytes[m][k] *
                                  (int32_t)emulated_tiles[b].bytes[k / 4][4 * n + k % 4]);
            acc = (int32_t)sum;
            memcpy(emulated_tiles[c].bytes[m] + 4 * n, &acc, sizeof acc);
        }
}

#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbsud
#undef _tile_release
#define _tile_loadconfig(config) emulated_loadconfig(config)
#define _tile_loadd(t, base, stride) emulated_loadd(t, base, stride)
#define _tile_stored(t, base, stride) emulated_stored(t, base, stride)
#define _tile_zero(t) emulated_zero(t)
#define _tile_dpbf16ps(c, a, b) emulated_dpbf16ps(c, a, b)
#define _tile_dpbsud(c, a, b) emulated_dpbsud(c, a, b)
#define _tile_release() ((void)0)

#endif
