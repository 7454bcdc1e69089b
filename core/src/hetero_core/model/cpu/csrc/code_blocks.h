/* The packed layout of block-code weights, read by coded_linear (fp32 activations, f32_linear.c) and
 * q8a_coded_linear (int8 activations, q8a_coded_linear.c): one layout, so either kernel runs a packed
 * weight and the choice between them is a call's, not the packing's.
 *
 * [N / 16][K / B][bytes]: for one panel of 16 output columns and one block of B inputs, the block's
 * scales as fp32, then its codes in the order VPDPBUSD multiplies (per 32-bit lane one column's codes
 * of 4 consecutive inputs: each 64-byte vector is 16 columns x 4 inputs). Three formats:
 *
 * - CODES_Q4 (4): B = 32, d[16] and m[16], w = d * q + m with q in 0..15 (GGUF Q4_1, Q4_K's
 *   sub-blocks); 4 vectors, vector v byte 4c + j: column c's code of input 4v + j in its low nibble,
 *   of input 16 + 4v + j in its high one. 384 bytes.
 * - CODES_Q8 (8): B = 32, d[16] and m[16], w = d * q + m with q in -128..127 (Q8_0: m = 0); 8
 *   vectors, vector t byte 4c + j: q + 128 (an unsigned byte) of column c, input 4t + j. 640 bytes.
 * - CODES_Q8_SUB16 (9): B = 16, d[16] only, w = d * q (Q6_K: d = the super-block's f16 d times the
 *   sub-block's int8 scale, exact in fp32; q - 32 in -32..31); 4 vectors as CODES_Q8's. 320 bytes.
 *
 * d * q is exact in fp32 in each (d has at most 11 + 8 significant bits, q 8), so d * q + m rounds
 * once: the dequantized checkpoint's value itself.
 */
#ifndef HETERO_CODE_BLOCKS_H
#define HETERO_CODE_BLOCKS_H

#include <stdint.h>

#define CODES_Q4 4
#define CODES_Q8 8
#define CODES_Q8_SUB16 9
#define CODE_PANEL 16 /* output columns per panel */

static inline int code_format_known(int format) {
    return format == CODES_Q4 || format == CODES_Q8 || format == CODES_Q8_SUB16;
}
/* Inputs per block, scale vectors before the codes (d, or d and m), and bytes per block. */
static inline __attribute__((always_inline)) int code_block_inputs(const int format) {
    return format == CODES_Q8_SUB16 ? 16 : 32;
}
static inline __attribute__((always_inline)) int code_has_m(const int format) { return format != CODES_Q8_SUB16; }
static inline __attribute__((always_inline)) int code_scale_bytes(const int format) {
    return (code_has_m(format) ? 2 : 1) * CODE_PANEL * (int)sizeof(float);
}
static inline __attribute__((always_inline)) int code_block_bytes(const int format) {
    return code_scale_bytes(format) + code_block_inputs(format) * CODE_PANEL * (format == CODES_Q4 ? 4 : 8) / 8;
}

/* Input ``input`` of a block's codes: which 64-byte vector holds it and how far its bits are shifted
 * in each column's 32-bit lane. */
static inline __attribute__((always_inline)) int code_vector_index(int input, const int format) {
    return format == CODES_Q4 ? (input % 16) / 4 : input / 4;
}
static inline __attribute__((always_inline)) int code_shift(int input, const int format) {
    return 8 * (input % 4) + (format == CODES_Q4 && input >= 16 ? 4 : 0);
}

#endif
