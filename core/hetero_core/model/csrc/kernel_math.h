/* Shared by the CPU kernels: bf16 <-> fp32 conversion, a vectorisable exp, typed loads and stores. */
#ifndef HETERO_KERNEL_MATH_H
#define HETERO_KERNEL_MATH_H

#include <stdint.h>
#include <string.h>

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

/* exp(x) for x <= 0 (a score minus the row's maximum), written so the compiler vectorises it:
 * 2^n * p(r) with r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6 polynomial (relative error ~2e-7).
 * Below -87 it returns ~0 (2^-126 scale); NaN stays NaN. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

static inline float load_f32(const float *p, int64_t i) { return p[i]; }
static inline float load_bf16(const uint16_t *p, int64_t i) { return bf16_to_f32(p[i]); }
static inline void store_f32(float *p, int64_t i, float v) { p[i] = v; }
static inline void store_bf16(uint16_t *p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

/* An element of a float32 (bf16 = 0) or bfloat16 (bf16 = 1) tensor; with a constant flag the branch
 * folds away where these are inlined. */
static inline float load_elem(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void store_elem(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

#endif
