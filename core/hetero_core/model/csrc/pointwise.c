/* The model's element-wise steps for the CPU, each one pass over its rows instead of the 5-7 torch
 * ops (and as many temporaries) it takes in eager mode:
 *
 * - rms_norm: optionally ``residual += x`` first (the decoder layer's skip connection, stored back
 *   as the next residual), then ``weight * (x / rms(x))``;
 * - silu_mul: ``silu(gate) * up`` of the fused gate/up projection's output;
 * - rotary: rotate-half RoPE in place on the query and key heads of the fused q/k/v output.
 *
 * The math runs in fp32 and rounds where Hugging Face's eager code rounds in bf16 (the residual
 * sum, the normalised row before the weight, silu's output), so bf16 results stay as close to it
 * as torch's own ops are; in fp32 no rounding happens. Rows are split over OpenMP threads only
 * when a call has enough of them to pay for waking the threads (prefill, not decode).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_math.h"

#define PARALLEL_ELEMENTS (1 << 15)

/* Widths (hidden, the MLP's width, head_dim / 2) are multiples of LANES: the caller checks. */

static inline __attribute__((always_inline)) void rms_norm_impl(
    void *x, int64_t x_stride, void *residual, int64_t residual_stride, const void *weight, void *out,
    int64_t out_stride, int64_t rows, int64_t hidden, float eps, int num_threads, int bf16) {
    const int64_t vectors = hidden / LANES;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * hidden >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        vfloat row[vectors];
        vfloat squares = {0};
        for (int64_t j = 0; j < vectors; j++) {
            vfloat v = vload(x, r * x_stride + j * LANES, bf16);
            if (residual != NULL) {
                v = vround_to(v + vload(residual, r * residual_stride + j * LANES, bf16), bf16);
                vstore(residual, r * residual_stride + j * LANES, v, bf16);
            }
            row[j] = v;
            squares += v * v;
        }
        const float inv_rms = 1.0f / sqrtf(sum_lanes(squares) / (float)hidden + eps);
        for (int64_t j = 0; j < vectors; j++) {
            const vfloat normed = vround_to(row[j] * inv_rms, bf16);
            vstore(out, r * out_stride + j * LANES, normed * vload(weight, j * LANES, bf16), bf16);
        }
    }
}

static inline __attribute__((always_inline)) void silu_mul_impl(
    const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows, int64_t width,
    int num_threads, int bf16) {
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * width >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < width; i += LANES) {
            const vfloat gate = vload(gate_up, r * gate_up_stride + i, bf16);
            const vfloat up = vload(gate_up, r * gate_up_stride + width + i, bf16);
            vstore(out, r * out_stride + i, vswiglu(gate, up, bf16), bf16);
        }
    }
}

/* x [tokens, heads, head_dim] (token stride x_stride, heads contiguous), cos and sin [tokens, head_dim / 2]
 * contiguous in x's dtype. */
static inline __attribute__((always_inline)) void rotary_impl(
    void *x, int64_t x_stride, const void *cos, const void *sin, int64_t tokens, int64_t heads,
    int64_t head_dim, int num_threads, int bf16) {
    const int64_t half = head_dim / 2;
    #pragma omp parallel for schedule(static) num_threads(num_threads) \
        if (tokens * heads * head_dim >= PARALLEL_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t i = 0; i < half; i += LANES) {
            const vfloat c = vload(cos, t * half + i, bf16), s = vload(sin, t * half + i, bf16);
            for (int64_t h = 0; h < heads; h++) {
                const int64_t base = t * x_stride + h * head_dim;
                const vfloat x1 = vload(x, base + i, bf16), x2 = vload(x, base + half + i, bf16);
                vstore(x, base + i, x1 * c - x2 * s, bf16);
                vstore(x, base + half + i, x2 * c + x1 * s, bf16);
            }
        }
    }
}

#define RMS_NORM_ARGS                                                                                  \
    void *x, int64_t x_stride, void *residual, int64_t residual_stride, const void *weight, void *out, \
    int64_t out_stride, int64_t rows, int64_t hidden, float eps, int num_threads
#define RMS_NORM_PASS x, x_stride, residual, residual_stride, weight, out, out_stride, rows, hidden, eps, num_threads
#define SILU_MUL_ARGS \
    const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows, int64_t width, \
    int num_threads
#define SILU_MUL_PASS gate_up, gate_up_stride, out, out_stride, rows, width, num_threads
#define ROTARY_ARGS \
    void *x, int64_t x_stride, const void *cos, const void *sin, int64_t tokens, int64_t heads, int64_t head_dim, \
    int num_threads
#define ROTARY_PASS x, x_stride, cos, sin, tokens, heads, head_dim, num_threads

void rms_norm_f32(RMS_NORM_ARGS) { rms_norm_impl(RMS_NORM_PASS, 0); }
void rms_norm_bf16(RMS_NORM_ARGS) { rms_norm_impl(RMS_NORM_PASS, 1); }
void silu_mul_f32(SILU_MUL_ARGS) { silu_mul_impl(SILU_MUL_PASS, 0); }
void silu_mul_bf16(SILU_MUL_ARGS) { silu_mul_impl(SILU_MUL_PASS, 1); }
void rotary_f32(ROTARY_ARGS) { rotary_impl(ROTARY_PASS, 0); }
void rotary_bf16(ROTARY_ARGS) { rotary_impl(ROTARY_PASS, 1); }
