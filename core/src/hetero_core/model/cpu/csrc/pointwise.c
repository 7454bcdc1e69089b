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

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

#include "kernel_math.h"

#define PARALLEL_ELEMENTS (1 << 15)

/* Any width: a row's last width % LANES elements go through the same vector code (vload_part,
 * vstore_part). Every row is computed alone, in one order, so its result does not depend on how
 * many rows come with it. Each kernel returns 0, or -1 for sizes it refuses (nothing written). */

static inline __attribute__((always_inline)) int rms_norm_impl(
    void *x, int64_t x_stride, void *residual, int64_t residual_stride, const void *weight, void *out,
    int64_t out_stride, int64_t rows, int64_t hidden, float eps, int num_threads, int bf16) {
    if (rows < 0 || hidden < 1) return -1;
    const int64_t vectors = (hidden + LANES - 1) / LANES, tail = hidden % LANES;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * hidden >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        vfloat row[vectors];
        vfloat squares = {0};
        for (int64_t j = 0; j < vectors; j++) {
            const int64_t count = tail != 0 && j == vectors - 1 ? tail : LANES;
            vfloat v = count == LANES ? vload(x, r * x_stride + j * LANES, bf16)
                                      : vload_part(x, r * x_stride + j * LANES, count, bf16);
            if (residual != NULL) {
                const int64_t at = r * residual_stride + j * LANES;
                v = vround_to(v + (count == LANES ? vload(residual, at, bf16) : vload_part(residual, at, count, bf16)),
                              bf16);
                if (count == LANES) vstore(residual, at, v, bf16);
                else vstore_part(residual, at, v, count, bf16);
            }
            row[j] = v;
            squares = vfma(v, v, squares);
        }
        const float inv_rms = 1.0f / sqrtf(sum_lanes(squares) / (float)hidden + eps);
        for (int64_t j = 0; j < vectors; j++) {
            const int64_t count = tail != 0 && j == vectors - 1 ? tail : LANES;
            const vfloat normed = vround_to(row[j] * inv_rms, bf16);
            if (count == LANES) {
                vstore(out, r * out_stride + j * LANES, normed * vload(weight, j * LANES, bf16), bf16);
            } else {
                vstore_part(out, r * out_stride + j * LANES, normed * vload_part(weight, j * LANES, count, bf16), count,
                            bf16);
            }
        }
    }
    return 0;
}

static inline __attribute__((always_inline)) int silu_mul_impl(
    const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows, int64_t width,
    int num_threads, int bf16) {
    if (rows < 0 || width < 0) return -1;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * width >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = 0;
        for (; i + LANES <= width; i += LANES) {
            const vfloat gate = vload(gate_up, r * gate_up_stride + i, bf16);
            const vfloat up = vload(gate_up, r * gate_up_stride + width + i, bf16);
            vstore(out, r * out_stride + i, vswiglu(gate, up, bf16), bf16);
        }
        if (i < width) {
            const vfloat gate = vload_part(gate_up, r * gate_up_stride + i, width - i, bf16);
            const vfloat up = vload_part(gate_up, r * gate_up_stride + width + i, width - i, bf16);
            vstore_part(out, r * out_stride + i, vswiglu(gate, up, bf16), width - i, bf16);
        }
    }
    return 0;
}

/* x [tokens, heads, head_dim] (token stride x_stride, heads contiguous), cos and sin [tokens, head_dim / 2]
 * contiguous in x's dtype; head_dim even. */
static inline __attribute__((always_inline)) int rotary_impl(
    void *x, int64_t x_stride, const void *cos, const void *sin, int64_t tokens, int64_t heads,
    int64_t head_dim, int num_threads, int bf16) {
    if (tokens < 0 || heads < 0 || head_dim < 2 || head_dim % 2 != 0) return -1;
    const int64_t half = head_dim / 2;
    #pragma omp parallel for schedule(static) num_threads(num_threads) \
        if (tokens * heads * head_dim >= PARALLEL_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t i = 0; i < half; i += LANES) {
            const int64_t count = half - i < LANES ? half - i : LANES;
            const vfloat c = count == LANES ? vload(cos, t * half + i, bf16) : vload_part(cos, t * half + i, count, bf16);
            const vfloat s = count == LANES ? vload(sin, t * half + i, bf16) : vload_part(sin, t * half + i, count, bf16);
            for (int64_t h = 0; h < heads; h++) {
                const int64_t first = t * x_stride + h * head_dim + i, second = first + half;
                if (count == LANES) {
                    const vfloat x1 = vload(x, first, bf16), x2 = vload(x, second, bf16);
                    vstore(x, first, vfma(x1, c, -(x2 * s)), bf16);
                    vstore(x, second, vfma(x2, c, x1 * s), bf16);
                } else {
                    const vfloat x1 = vload_part(x, first, count, bf16), x2 = vload_part(x, second, count, bf16);
                    vstore_part(x, first, vfma(x1, c, -(x2 * s)), count, bf16);
                    vstore_part(x, second, vfma(x2, c, x1 * s), count, bf16);
                }
            }
        }
    }
    return 0;
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

int rms_norm_f32(RMS_NORM_ARGS) { return rms_norm_impl(RMS_NORM_PASS, 0); }
int rms_norm_bf16(RMS_NORM_ARGS) { return rms_norm_impl(RMS_NORM_PASS, 1); }
int silu_mul_f32(SILU_MUL_ARGS) { return silu_mul_impl(SILU_MUL_PASS, 0); }
int silu_mul_bf16(SILU_MUL_ARGS) { return silu_mul_impl(SILU_MUL_PASS, 1); }
int rotary_f32(ROTARY_ARGS) { return rotary_impl(ROTARY_PASS, 0); }
int rotary_bf16(ROTARY_ARGS) { return rotary_impl(ROTARY_PASS, 1); }
