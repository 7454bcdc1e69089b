/* The packed layout of block-code weights, read by coded_linear (fp32 activations, f32_linear.c) and
 * q8a_coded_linear (int8 activations, q8a_coded_linear.c, and its AMX tiles): one layout, so either
 * kernel runs a packed weight and the choice between them is a call's, not the packing's.
 *
 * A weight is [N / 16] panels of 16 output columns, each panel its K inputs' blocks in input order. A
 * block of B inputs has per column a scale d and (most formats) an offset m, and codes in the order
 * VPDPBUSD multiplies (per 32-bit lane one column's codes of 4 consecutive inputs: each 64-byte vector
 * is 16 columns x 4 inputs). Three kinds of codes (code_kind):
 *
 * - CODES_Q4: B = 32, w = d * q + m with q in 0..15 (GGUF Q4_0/Q4_1, Q4_K's sub-blocks); 4 vectors,
 *   vector v byte 4c + j: column c's code of input 4v + j in its low nibble, of 16 + 4v + j in its
 *   high one (256 bytes of codes).
 * - CODES_Q8: B = 32, w = d * q + m with q in -128..127 (Q8_0, Q5_*: m = 0 or not); 8 vectors, vector
 *   t byte 4c + j: q + 128 (an unsigned byte) of column c, input 4t + j (512 bytes).
 * - CODES_Q8_SUB16: B = 16, w = d * q (Q6_K: q - 32 in -32..31); 4 vectors as CODES_Q8's (256 bytes).
 *
 * and three ways of storing the scales, each format one pair of them:
 *
 * - fp32 per block (CODES_Q4, CODES_Q8, CODES_Q8_SUB16): d[16] (and m[16]) before the block's codes.
 * - fp16 per block (CODES_Q4_F16: d[16], m[16]; CODES_Q8_F16: d[16], m = 0), for the formats whose
 *   scales are f16 in the file (Q4_0, Q4_1, Q8_0, Q5_0): the same values in half the bytes.
 * - per super-block of 256 inputs (CODES_Q4_SUPER: Q4_K; CODES_Q8_SUB16_SUPER: Q6_K), as the k-quants
 *   store them: a header of the base scales d[16] (and m[16]) in fp32, then each block's integer
 *   factors (uint8 dq[16] and mq[16] per 32-input block; int8 dq[16] per 16-input one), then the
 *   blocks' codes: d = base d * dq, m = base m * mq, products of an f16 value and a factor of at most
 *   8 bits, exact in fp32 (the values the fp32 formats store).
 *
 * d * q is exact in fp32 in each (d has at most 11 + 8 significant bits, q 8), so d * q + m rounds
 * once: the dequantized checkpoint's value itself. A weight's d and m are the same fp32 values in
 * every format that can hold them, so the kernels' results are the same bits whichever one it is
 * packed in; the compact ones only read fewer bytes (Q4_K: 0.59 instead of 0.75 a weight).
 */
#ifndef HETERO_CODE_BLOCKS_H
#define HETERO_CODE_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "kernel_math.h"

#define CODES_Q4 4
#define CODES_Q8 8
#define CODES_Q8_SUB16 9
#define CODES_Q4_F16 20
#define CODES_Q8_F16 24
#define CODES_Q4_SUPER 36
#define CODES_Q8_SUB16_SUPER 41
#define CODE_PANEL 16        /* output columns per panel */
#define CODE_SUPER_INPUTS 256 /* inputs per super-block (the k-quants' QK_K) */

/* F(kind) with the codes' kind (code_kind) a compile-time constant: one copy of a kernel's loops per
 * kind; the scales' storage (the format itself) is read at run time, once per block. */
#define CODE_KIND_SWITCH(format, F)                            \
    do {                                                       \
        switch (code_kind(format)) {                           \
            case CODES_Q4: F(CODES_Q4); break;                 \
            case CODES_Q8: F(CODES_Q8); break;                 \
            default: F(CODES_Q8_SUB16); break;                 \
        }                                                      \
    } while (0)

/* F(kind, format) with both compile-time constants: one copy of a kernel's loops per format (where
 * the scales' addressing is most of the work of a block, as at one row). */
#define CODE_FORMAT_SWITCH(format, F)                                        \
    do {                                                                     \
        switch (format) {                                                    \
            case CODES_Q4: F(CODES_Q4, CODES_Q4); break;                     \
            case CODES_Q4_F16: F(CODES_Q4, CODES_Q4_F16); break;             \
            case CODES_Q4_SUPER: F(CODES_Q4, CODES_Q4_SUPER); break;         \
            case CODES_Q8: F(CODES_Q8, CODES_Q8); break;                     \
            case CODES_Q8_F16: F(CODES_Q8, CODES_Q8_F16); break;             \
            case CODES_Q8_SUB16: F(CODES_Q8_SUB16, CODES_Q8_SUB16); break;   \
            default: F(CODES_Q8_SUB16, CODES_Q8_SUB16_SUPER); break;         \
        }                                                                    \
    } while (0)

static inline int code_format_known(int format) {
    return format == CODES_Q4 || format == CODES_Q8 || format == CODES_Q8_SUB16 || format == CODES_Q4_F16 ||
           format == CODES_Q8_F16 || format == CODES_Q4_SUPER || format == CODES_Q8_SUB16_SUPER;
}
/* How the codes are stored: CODES_Q4, CODES_Q8 or CODES_Q8_SUB16. */
static inline __attribute__((always_inline)) int code_kind(const int format) {
    return format == CODES_Q4_F16 || format == CODES_Q4_SUPER ? CODES_Q4
           : format == CODES_Q8_F16                           ? CODES_Q8
           : format == CODES_Q8_SUB16_SUPER                   ? CODES_Q8_SUB16
                                                              : format;
}
static inline __attribute__((always_inline)) int code_super(const int format) {
    return format == CODES_Q4_SUPER || format == CODES_Q8_SUB16_SUPER;
}
static inline __attribute__((always_inline)) int code_f16(const int format) {
    return format == CODES_Q4_F16 || format == CODES_Q8_F16;
}
/* Inputs per block; whether blocks have an m (and store one); the inputs a panel's K must be a multiple of. */
static inline __attribute__((always_inline)) int code_block_inputs(const int format) {
    return code_kind(format) == CODES_Q8_SUB16 ? 16 : 32;
}
static inline __attribute__((always_inline)) int code_has_m(const int format) {
    return code_kind(format) != CODES_Q8_SUB16;  /* (CODES_Q8_F16 stores none: its m are zeros) */
}
static inline __attribute__((always_inline)) int code_stores_m(const int format) {
    return code_has_m(format) && format != CODES_Q8_F16;
}
static inline __attribute__((always_inline)) int code_k_multiple(const int format) {
    return code_super(format) ? CODE_SUPER_INPUTS : code_block_inputs(format);
}
/* Bytes of one block's codes (its scales aside). */
static inline __attribute__((always_inline)) int code_codes_bytes(const int format) {
    return code_block_inputs(format) * CODE_PANEL * (code_kind(format) == CODES_Q4 ? 4 : 8) / 8;
}
/* Per-block formats: bytes of scales before each block's codes. */
static inline __attribute__((always_inline)) int code_scale_bytes(const int format) {
    return (code_stores_m(format) ? 2 : 1) * CODE_PANEL * (code_f16(format) ? 2 : (int)sizeof(float));
}
/* Super-block formats: blocks per super-block, bytes of the header (base scales, then the factors). */
static inline __attribute__((always_inline)) int code_super_blocks(const int format) {
    return CODE_SUPER_INPUTS / code_block_inputs(format);
}
static inline __attribute__((always_inline)) int code_super_header_bytes(const int format) {
    const int bases = code_has_m(format) ? 2 : 1;
    return bases * CODE_PANEL * (int)sizeof(float) + bases * code_super_blocks(format) * CODE_PANEL;
}
/* The addressing below takes the codes' ``kind`` (code_kind(layout): a compile-time constant in the
 * kernels' loops, so every size is one) beside the ``layout`` (the format itself, read at run time). */
static inline __attribute__((always_inline)) int code_super_bytes(const int kind) {  /* a super-block's */
    return code_super_header_bytes(kind) + code_super_blocks(kind) * code_codes_bytes(kind);
}
/* Bytes of a panel of ``k`` inputs, and the bytes a block takes on average (what streaming it reads). */
static inline __attribute__((always_inline)) int64_t code_panel_bytes_as(int64_t k, const int kind, int layout) {
    if (code_super(layout)) return k / CODE_SUPER_INPUTS * code_super_bytes(kind);
    return k / code_block_inputs(kind) * (code_scale_bytes(layout) + code_codes_bytes(kind));
}
static inline int64_t code_panel_bytes(int64_t k, int format) {
    return code_panel_bytes_as(k, code_kind(format), format);
}
static inline __attribute__((always_inline)) int code_stream_bytes(const int kind, int layout) {
    if (code_super(layout)) return code_super_bytes(kind) / code_super_blocks(kind);
    return code_scale_bytes(layout) + code_codes_bytes(kind);
}
/* Block ``b`` of a panel: where its codes are. */
static inline __attribute__((always_inline)) const uint8_t *code_block_codes(const uint8_t *panel, int64_t b,
                                                                            const int kind, int layout) {
    if (code_super(layout)) {
        const int per = code_super_blocks(kind);
        return panel + (b / per) * code_super_bytes(kind) + code_super_header_bytes(kind) +
               (b % per) * code_codes_bytes(kind);
    }
    return panel + b * (code_scale_bytes(layout) + code_codes_bytes(kind)) + code_scale_bytes(layout);
}

/* LANES fp16 values at p as fp32. */
static inline __attribute__((always_inline)) vfloat code_f16_vector(const uint8_t *p) {
#if LANES == 16 && defined(__AVX512F__)
    return (vfloat)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif LANES == 8 && defined(__F16C__)
    return (vfloat)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vfloat out;
    for (int i = 0; i < LANES; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
        float f;
        if (exponent == 31) {
            const uint32_t u = sign | 0x7f800000u | (mantissa << 13);
            memcpy(&f, &u, 4);
        } else if (exponent == 0) {
            f = (float)mantissa * (1.0f / 16777216.0f);  /* subnormal: mantissa * 2^-24, exact */
            if (sign) f = -f;
        } else {
            const uint32_t u = sign | ((exponent + 112) << 23) | (mantissa << 13);
            memcpy(&f, &u, 4);
        }
        out[i] = f;
    }
    return out;
#endif
}

/* The ``LANES`` columns of vector ``v`` of block ``b``'s d (``which`` 0) or m (``which`` 1), as fp32:
 * m is zero where the format has none. */
static inline __attribute__((always_inline)) vfloat code_block_scale(const uint8_t *panel, int64_t b, int v,
                                                                    const int which, const int kind, int layout) {
    if (which == 1 && !code_stores_m(layout)) return (vfloat){0};
    if (code_super(layout)) {
        const int per = code_super_blocks(kind), bases = kind == CODES_Q4 ? 2 : 1;
        const uint8_t *super = panel + (b / per) * code_super_bytes(kind);
        vfloat base;
        memcpy(&base, super + (which * CODE_PANEL + v * LANES) * sizeof(float), sizeof base);
        const uint8_t *factors = super + bases * CODE_PANEL * sizeof(float) + (which * per + b % per) * CODE_PANEL;
        const uint8_t *f = factors + v * LANES;
        vint widened;  /* Q6_K's int8 sub-block scales, Q4_K's uint8 ones, widened to 32 bits */
#if LANES == 8 && defined(__AVX2__)  /* (GCC's own widening of an 8-byte vector is 8 scalar moves) */
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)f);
        widened = (vint)(kind == CODES_Q8_SUB16 ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
#elif LANES == 16 && defined(__AVX512F__)
        const __m128i bytes = _mm_loadu_si128((const __m128i *)f);
        widened = (vint)(kind == CODES_Q8_SUB16 ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
#else
        typedef uint8_t vu8 __attribute__((vector_size(LANES)));
        typedef int8_t vi8 __attribute__((vector_size(LANES)));
        if (kind == CODES_Q8_SUB16) {
            vi8 narrow;
            memcpy(&narrow, f, sizeof narrow);
            widened = __builtin_convertvector(narrow, vint);
        } else {
            vu8 narrow;
            memcpy(&narrow, f, sizeof narrow);
            widened = __builtin_convertvector(narrow, vint);
        }
#endif
        return base * __builtin_convertvector(widened, vfloat);  /* exact: the stored fp32 value itself */
    }
    const uint8_t *scales = panel + b * (code_scale_bytes(layout) + code_codes_bytes(kind));
    if (code_f16(layout)) return code_f16_vector(scales + (which * CODE_PANEL + v * LANES) * 2);
    vfloat out;
    memcpy(&out, scales + (which * CODE_PANEL + v * LANES) * sizeof(float), sizeof out);
    return out;
}

/* Input ``input`` of a block's codes: which 64-byte vector holds it and how far its bits are shifted
 * in each column's 32-bit lane. */
static inline __attribute__((always_inline)) int code_vector_index(int input, const int format) {
    return code_kind(format) == CODES_Q4 ? (input % 16) / 4 : input / 4;
}
static inline __attribute__((always_inline)) int code_shift(int input, const int format) {
    return 8 * (input % 4) + (code_kind(format) == CODES_Q4 && input >= 16 ? 4 : 0);
}

#endif
