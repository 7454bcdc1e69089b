/* Shared by the CPU kernels: bf16 <-> fp32 conversion, a vectorisable exp, typed loads and stores. */
#ifndef HETERO_KERNEL_MATH_H
#define HETERO_KERNEL_MATH_H

#include <stdint.h>
#include <string.h>

#if !defined(__GNUC__) || defined(__clang__)
#error "the CPU kernels need GCC (its vector extensions: __builtin_shuffle, vector comparisons); set CC=gcc"
#endif

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* fp32 lanes of one vector register, as GCC's vector extension: 16 with AVX-512, 8 with AVX, 4
 * otherwise (SSE, NEON). A wider vector than the registers has no register of its own, and GCC's
 * code for 16 lanes on AVX2 was up to 15x slower. Buffers of them are 64-byte aligned and hold
 * head_dim padded to a multiple of LANES. REGISTERS: how many vectors the ISA has. */
#if defined(__AVX512F__)
#define LANES 16
#define REGISTERS 32
#elif defined(__AVX__)
#define LANES 8
#define REGISTERS 16
#else
#define LANES 4
#define REGISTERS 16
#endif
typedef float vfloat __attribute__((vector_size(LANES * sizeof(float))));

static inline int64_t padded_dim(int64_t head_dim) { return (head_dim + LANES - 1) / LANES * LANES; }

/* a * b + c, lane by lane, with one rounding where the ISA has fused multiply-adds and two where it
 * has none; written out, never left to the compiler's contraction, so every kernel that chains
 * vfma in the same order gets the same bits (the kernels are built without -fassociative-math:
 * what is written is what runs). */
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) {
#if LANES == 16 && defined(__AVX512F__)
    return (vfloat)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif LANES == 8 && defined(__FMA__)
    return (vfloat)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif LANES == 4 && defined(__FMA__)
    return (vfloat)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
#else
    return a * b + c;
#endif
}

static inline vfloat vsplat(float x) { return (vfloat){0} + x; }

typedef int32_t vint __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint32_t vuint __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef uint16_t vbf16 __attribute__((vector_size(LANES * sizeof(uint16_t))));

/* An element of a float32 (bf16 = 0) or bfloat16 (bf16 = 1) tensor; with a constant flag the branch
 * folds away where these are inlined. */
static inline float load_elem(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void store_elem(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* LANES elements from index i of a float32 (bf16 = 0) or bfloat16 (bf16 = 1) array, as fp32. */
static inline vfloat vload(const void *p, int64_t i, int bf16) {
    vfloat f;
    if (bf16) {
        vbf16 h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        const vuint u = __builtin_convertvector(h, vuint) << 16;
        memcpy(&f, &u, sizeof f);
    } else {
        memcpy(&f, (const float *)p + i, sizeof f);
    }
    return f;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

/* The bf16 bit patterns of v, in the high halves: VCVTNEPS2BF16 (round to nearest even, NaN stays
 * NaN; it treats bf16 denormals as zero, which activations never are in practice). */
static inline vuint bf16_bits(vfloat v) {
    const __m512i halves = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)v));
    return (vuint)_mm512_slli_epi32(halves, 16);
}

static inline void vstore(void *p, int64_t i, vfloat v, int bf16) {
    if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), (__m256i)_mm512_cvtneps_pbh((__m512)v));
    else memcpy((float *)p + i, &v, sizeof v);
}
#else

/* The bf16 bit patterns of v, in the high halves (round to nearest even, NaN stays NaN). */
static inline vuint bf16_bits(vfloat v) {
    vuint u;
    memcpy(&u, &v, sizeof u);
    const vuint rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const vuint nan = (u | 0x400000u) & 0xffff0000u;
    const vuint is_nan = (vuint)((u & 0x7fffffffu) > 0x7f800000u);
    return (nan & is_nan) | (rounded & ~is_nan);
}

static inline void vstore(void *p, int64_t i, vfloat v, int bf16) {
    if (bf16) {
        const vbf16 h = __builtin_convertvector(bf16_bits(v) >> 16, vbf16);
        memcpy((uint16_t *)p + i, &h, sizeof h);
    } else {
        memcpy((float *)p + i, &v, sizeof v);
    }
}
#endif

/* The first ``count`` (< LANES) elements from index i, as vload (the other lanes 0), and their
 * store, rounded as vstore rounds: a row's tail goes through the same vector arithmetic as the rest. */
static inline vfloat vload_part(const void *p, int64_t i, int64_t count, int bf16) {
    vfloat f = {0};
    for (int64_t j = 0; j < count; j++) f[j] = load_elem(p, i + j, bf16);
    return f;
}

static inline void vstore_part(void *p, int64_t i, vfloat v, int64_t count, int bf16) {
    if (bf16) {
        const vuint bits = bf16_bits(v) >> 16;
        for (int64_t j = 0; j < count; j++) ((uint16_t *)p)[i + j] = (uint16_t)bits[j];
    } else {
        for (int64_t j = 0; j < count; j++) ((float *)p)[i + j] = v[j];
    }
}

/* v rounded to the nearest bf16 (bf16 = 1) or left as it is. */
static inline vfloat vround_to(vfloat v, int bf16) {
    if (!bf16) return v;
    const vuint u = bf16_bits(v);
    vfloat f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline vfloat vselect(vint mask, vfloat a, vfloat b) { /* mask ? a : b, lane by lane */
    vint ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    const vint r = (ai & mask) | (bi & ~mask);
    vfloat f;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* exp(x) for x <= 0 (a score minus the row's maximum), LANES at a time: 2^n * p(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2] (n rounded half away from zero) and a degree-6 polynomial
 * (relative error ~2e-7). Below -87 it returns ~0 (2^-126 scale); NaN stays NaN. */
static inline vfloat vexp_nonpositive(vfloat x) {
    const vfloat floor_value = (vfloat){0} - 87.0f;
    x = vselect(x < floor_value, floor_value, x);
    const vint n = __builtin_convertvector(vfma(x, vsplat(1.44269504088896341f), vsplat(-0.5f)), vint);
    const vfloat nf = __builtin_convertvector(n, vfloat);
    const vfloat r = vfma(nf, vsplat(2.12194440e-4f), vfma(nf, vsplat(-0.693359375f), x));  /* x - n ln2 */
    vfloat p = vsplat(1.0f / 720.0f);  /* exp(r): Taylor to degree 6, Horner's rule in vfma */
    p = vfma(p, r, vsplat(1.0f / 120.0f));
    p = vfma(p, r, vsplat(1.0f / 24.0f));
    p = vfma(p, r, vsplat(1.0f / 6.0f));
    p = vfma(p, r, vsplat(0.5f));
    p = vfma(p, r, vsplat(1.0f));
    p = vfma(p, r, vsplat(1.0f));
    const vint bits = (n + 127) << 23;
    vfloat scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline vfloat vsilu(vfloat x) { /* x * sigmoid(x), with exp(-|x|) only (no overflow) */
    const vint negative = x < (vfloat){0};
    const vfloat e = vexp_nonpositive(vselect(negative, x, -x));
    return x * vselect(negative, e, (vfloat){0} + 1.0f) / (1.0f + e);
}

/* SwiGLU's activation of one vector of gate and up sums: silu(gate) * up, rounded where Hugging
 * Face's eager bf16 code rounds (the projections' outputs, silu's output, the product). */
static inline vfloat vswiglu(vfloat gate, vfloat up, int bf16) {
    gate = vround_to(gate, bf16);
    return vround_to(vround_to(vsilu(gate), bf16) * vround_to(up, bf16), bf16);
}

static inline float sum_lanes(vfloat v) {
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++) sum += v[i];
    return sum;
}

/* The shapes every linear kernel takes (f32_linear.c, bf16_linear.c), checked at its entry: any
 * number of rows m >= 0 (none: nothing to do), N >= 0 output columns in whole 16-column panels (pairs
 * of them, N a multiple of 32, with swiglu), K >= 0 inputs a multiple of ``k_multiple`` (K = 0: y is
 * the bias), row strides that hold a row. True when they are refused. */
static inline int linear_refuses(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, int swiglu,
                                 int64_t k_multiple) {
    return m < 0 || n < 0 || k < 0 || n % (swiglu ? 32 : 16) != 0 || k % k_multiple != 0 || ldx < k
           || ldy < (swiglu ? n / 2 : n);
}

#endif
