/* The arithmetic of one query row of attention, shared by the decode and the prefill kernel, so a
 * row gets the same bits whichever of them runs it, however the step is batched, chunked or split
 * over threads (batch invariance: a one-token prefill chunk and a decode run the decode kernel,
 * longer chunks the prefill kernel).
 *
 * For a row q (already scaled) over its context keys 0 .. L - 1:
 *
 * 1. Scores: s_t = q . k_t as LANES lane partials, partial[l] = sum over d = l, l + LANES, ... of
 *    q[d] k_t[d], one vfma chain per lane in increasing d from zero, then the lanes summed in a fixed
 *    halving tree, LANES keys at a time (``tree_lanes``): lane l + LANES / 2 onto lane l, then
 *    l + LANES / 4, ... down to lane 0.
 * 2. Online softmax over chunks of KEY_CHUNK keys aligned at context positions 0, KEY_CHUNK, ...
 *    (``softmax_chunk``): the running maximum m and sum l, alpha = exp(m_old - m_new), the chunk's
 *    weights e_t = exp(s_t - m_new) and l = l * alpha + (their sum, in a fixed order).
 * 3. Values: acc = acc * alpha, then acc = vfma(e_t, v_t, acc) for each key of the chunk in order.
 * 4. The row's output is acc * (1 / l), stored with ``vstore``.
 *
 * Every step is written out (vfma, no -fassociative-math), so the compiler cannot order it
 * differently in the two kernels.
 */
#ifndef HETERO_ATTENTION_MATH_H
#define HETERO_ATTENTION_MATH_H

#include <math.h>

#include "kernel_math.h"

#define KEY_CHUNK 64 /* keys per online-softmax step (a multiple of LANES) */

/* The halving tree over the lanes of each of LANES vectors at once, with shuffles: lane i of the
 * result is the sum of the lanes of p[i] (key i's lane partials). */
#if LANES == 16
static inline vfloat tree_lanes(const vfloat *p) {
    const vint lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vint hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vint lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const vint hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const vint lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const vint hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const vint even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const vint odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    vfloat r8[8], r4[4], r2[2];
    for (int i = 0; i < 8; i++)  /* lanes 0-7: lane l + lane l + 8 of key 2i, lanes 8-15: of key 2i+1 */
        r8[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], lo8) + __builtin_shuffle(p[2 * i], p[2 * i + 1], hi8);
    for (int i = 0; i < 4; i++)  /* 4 lanes per key (l + l + 4), keys 4i .. 4i+3 */
        r4[i] = __builtin_shuffle(r8[2 * i], r8[2 * i + 1], lo4) + __builtin_shuffle(r8[2 * i], r8[2 * i + 1], hi4);
    for (int i = 0; i < 2; i++)  /* 2 lanes per key (l + l + 2), keys 8i .. 8i+7 */
        r2[i] = __builtin_shuffle(r4[2 * i], r4[2 * i + 1], lo2) + __builtin_shuffle(r4[2 * i], r4[2 * i + 1], hi2);
    return __builtin_shuffle(r2[0], r2[1], even) + __builtin_shuffle(r2[0], r2[1], odd);
}
#elif LANES == 8
static inline vfloat tree_lanes(const vfloat *p) {
    const vint lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    const vint lo2 = {0, 1, 4, 5, 8, 9, 12, 13}, hi2 = {2, 3, 6, 7, 10, 11, 14, 15};
    const vint even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
    vfloat r4[4], r2[2];
    for (int i = 0; i < 4; i++)  /* lanes 0-3: lane l + lane l + 4 of key 2i, lanes 4-7: of key 2i+1 */
        r4[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], lo4) + __builtin_shuffle(p[2 * i], p[2 * i + 1], hi4);
    for (int i = 0; i < 2; i++)  /* 2 lanes per key (l + l + 2), keys 4i .. 4i+3 */
        r2[i] = __builtin_shuffle(r4[2 * i], r4[2 * i + 1], lo2) + __builtin_shuffle(r4[2 * i], r4[2 * i + 1], hi2);
    return __builtin_shuffle(r2[0], r2[1], even) + __builtin_shuffle(r2[0], r2[1], odd);
}
#else
static inline vfloat tree_lanes(const vfloat *p) {
    const vint lo2 = {0, 1, 4, 5}, hi2 = {2, 3, 6, 7}, even = {0, 2, 4, 6}, odd = {1, 3, 5, 7};
    const vfloat r0 = __builtin_shuffle(p[0], p[1], lo2) + __builtin_shuffle(p[0], p[1], hi2);
    const vfloat r1 = __builtin_shuffle(p[2], p[3], lo2) + __builtin_shuffle(p[2], p[3], hi2);
    return __builtin_shuffle(r0, r1, even) + __builtin_shuffle(r0, r1, odd);
}
#endif

/* One online-softmax step of a row: ``scores`` [KEY_CHUNK] hold the chunk's n (1..KEY_CHUNK) scores
 * (the rest is ignored); they become the weights e_t (0 beyond n), ``row_max`` and ``row_sum``
 * advance, and the factor the row's accumulator must be scaled by is returned. The maximum skips
 * NaNs (a NaN score still makes a NaN weight, so the row ends up NaN). */
static inline float softmax_chunk(float *scores, int64_t n, float *row_max, float *row_sum) {
    vfloat top_v = vsplat(*row_max);
    vfloat lane = {0};
    for (int l = 0; l < LANES; l++) lane[l] = (float)l;
    for (int64_t i = 0; i < KEY_CHUNK; i += LANES) {
        vfloat s;
        memcpy(&s, scores + i, sizeof s);
        const vint live = lane + (float)i < vsplat((float)n);
        top_v = vselect(live & (s > top_v), s, top_v);
    }
    float top = *row_max;
    for (int l = 0; l < LANES; l++) top = top_v[l] > top ? top_v[l] : top;
    const float alpha = vexp_nonpositive(vsplat(*row_max - top))[0];
    vfloat sum = {0};
    for (int64_t i = 0; i < KEY_CHUNK; i += LANES) {
        vfloat s;
        memcpy(&s, scores + i, sizeof s);
        const vint live = lane + (float)i < vsplat((float)n);
        const vfloat e = vselect(live, vexp_nonpositive(s - top), (vfloat){0});
        memcpy(scores + i, &e, sizeof e);
        sum = sum + e;
    }
    *row_max = top;
    *row_sum = vfma(vsplat(*row_sum), vsplat(alpha), vsplat(sum_lanes(sum)))[0];
    return alpha;
}

#endif
