/* The activations of one q8a_coded_linear call, quantized once per row (q8a_coded_linear.c) and read by
 * both of its paths: the vector one there and the AMX-INT8 tiles (q8a_coded_linear_amx.c). */
#ifndef HETERO_Q8A_ROWS_H
#define HETERO_Q8A_ROWS_H

#include <stdint.h>

#define Q8A_ACT_BLOCK 32      /* inputs per activation scale */
#define Q8A_TILE_ROW_BLOCK 32 /* rows per tile block (two A tiles): the codes are allocated to a multiple */

/* codes [m][lda] (lda >= k; rows past m up to a whole tile block: zeros); per block of 32 inputs the scale sx and
 * the m term's factor sx * asum [m][k / 32]; 128 times the codes' sums per 16 inputs [m][k / 16] (the
 * offset of 8-bit weight codes, stored as q + 128). A block's epilogue only broadcasts them. */
struct q8a_rows {
    int8_t *codes;
    float *scale, *m_scale;
    int32_t *offsets;
    int64_t k, lda;
};

#endif
