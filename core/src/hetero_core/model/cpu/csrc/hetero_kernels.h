/* The kernels library's ABI, written once: every .c here includes it (so the compiler checks each
 * definition against its prototype), and kernels.py reads the first section at load to type the
 * ctypes calls (kernel_abi.py: int64_t -> c_int64, int -> c_int, float -> c_float, any pointer ->
 * c_void_p; every call returns int, a status: 0 done, -1 refused, -2 out of memory, or a 0/1 answer).
 * One prototype per symbol, each on its own lines, ending in ");"; no macros in this section.
 */
#ifndef HETERO_KERNELS_H
#define HETERO_KERNELS_H

#include <stdint.h>

struct fused_model; /* decode_layers.c */
struct fused_step;
struct q8a_rows; /* q8a_rows.h */

/* paged_kv_write.c */
int paged_kv_write(const char *key, int64_t key_token_stride, const char *value, int64_t value_token_stride,
                   char *key_cache, char *value_cache, const int64_t *slots, int64_t num_tokens,
                   int64_t num_kv_heads, int64_t head_dim, int64_t slots_per_head, int64_t element_size,
                   int num_threads);

/* paged_decode_attention.c */
int paged_decode_attention_f32(const void *query, int64_t query_token_stride, const void *new_key,
                               const void *new_value, int64_t new_token_stride, const int64_t *new_slots,
                               void *key_cache, void *value_cache, const int64_t *block_tables,
                               int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                               int64_t block_size, float scale, int num_threads);
int paged_decode_attention_bf16(const void *query, int64_t query_token_stride, const void *new_key,
                                const void *new_value, int64_t new_token_stride, const int64_t *new_slots,
                                void *key_cache, void *value_cache, const int64_t *block_tables,
                                int64_t max_blocks, const int64_t *context_lens, void *out, int64_t num_seqs,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                                int64_t block_size, float scale, int num_threads);

/* paged_prefill_attention.c */
int paged_prefill_attention_f32(const void *query, int64_t query_token_stride, const void *key_cache,
                                const void *value_cache, const int64_t *block_tables, int64_t max_blocks,
                                const int64_t *query_start, const int64_t *query_len,
                                const int64_t *context_lens, void *out, int64_t out_token_stride,
                                int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t num_blocks, int64_t block_size, float scale, int num_threads);
int paged_prefill_attention_bf16(const void *query, int64_t query_token_stride, const void *key_cache,
                                 const void *value_cache, const int64_t *block_tables, int64_t max_blocks,
                                 const int64_t *query_start, const int64_t *query_len,
                                 const int64_t *context_lens, void *out, int64_t out_token_stride,
                                 int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                 int64_t num_blocks, int64_t block_size, float scale, int num_threads);

/* pointwise.c */
int rms_norm_f32(void *x, int64_t x_stride, void *residual, int64_t residual_stride, const void *weight,
                 void *out, int64_t out_stride, int64_t rows, int64_t hidden, float eps, int num_threads);
int rms_norm_bf16(void *x, int64_t x_stride, void *residual, int64_t residual_stride, const void *weight,
                  void *out, int64_t out_stride, int64_t rows, int64_t hidden, float eps, int num_threads);
int silu_mul_f32(const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows,
                 int64_t width, int num_threads);
int silu_mul_bf16(const void *gate_up, int64_t gate_up_stride, void *out, int64_t out_stride, int64_t rows,
                  int64_t width, int num_threads);
int rotary_f32(void *x, int64_t x_stride, const void *cos, const void *sin, int64_t tokens, int64_t heads,
               int64_t head_dim, int num_threads);
int rotary_bf16(void *x, int64_t x_stride, const void *cos, const void *sin, int64_t tokens, int64_t heads,
                int64_t head_dim, int num_threads);

/* bf16_linear.c */
int bf16_linear(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads);
int bf16_linear_native(void);

/* f32_linear.c */
int swiglu_pair_columns(void);
int f32_linear(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, int swiglu, int num_threads);
int coded_linear(const float *x, int64_t ldx, const uint8_t *packed, const float *bias, float *y, int64_t ldy,
                 int64_t m, int64_t n, int64_t k, int bits, int swiglu, int num_threads);

/* q8a_coded_linear.c */
int q8a_coded_linear(const void *x, int64_t ldx, int x_bf16, const uint8_t *packed, const float *bias, void *y,
                     int64_t ldy, int64_t m, int64_t n, int64_t k, int format, int swiglu, int out_bf16,
                     int64_t tile_rows, int num_threads);
int q8a_coded_linear_path(void);

/* q8a_coded_linear_amx.c */
int q8a_tiles_build(void);
int q8a_tiles_request(void);

/* decode_layers.c */
int decode_layers(const struct fused_model *model, const struct fused_step *step);

/* bf16_linear_amx.c */
int amx_request_permission(void);
int bf16_linear_amx_granted(void);

/* int8_linear.c */
int int8_linear(const void *x, int64_t ldx, int x_bf16, const int8_t *packed, const float *scale,
                const float *bias, void *y, int64_t ldy, int64_t m, int64_t n, int64_t k, int64_t group_size,
                int out_bf16, int num_threads);
int w8a8_linear(const void *x, int64_t ldx, int x_bf16, const int8_t *packed, const float *scale,
                const int32_t *colsum, const float *bias, void *y, int64_t ldy, int64_t m, int64_t n,
                int64_t k, int64_t group_size, int out_bf16, int num_threads);
int w8a8_linear_vnni(void);

/* END OF THE PYTHON ABI: below, calls between the translation units that Python does not make. */

/* bf16_linear_amx.c, for bf16_linear (its tiles run only in the AMX variant, HETERO_AMX) */
int bf16_linear_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const float *bias, void *y,
                    int64_t ldy, int64_t m, int64_t n, int64_t k, int out_f32, int swiglu, int num_threads);

/* q8a_coded_linear_amx.c, for q8a_coded_linear (live once q8a_tiles_request is granted) */
int q8a_tiles_granted(void);
int q8a_tiles_linear(const struct q8a_rows *a, const uint8_t *packed, const float *bias, void *y, int64_t ldy,
                     int64_t m, int64_t n, int format, int swiglu, int out_bf16, int num_threads);

#endif
