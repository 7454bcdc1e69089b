/* Every decoder layer of a pure decode step (one new token per sequence) in one call, fp32 or bf16.
 *
 * The model code calls seven kernels per layer (RMSNorm, the q/k/v linear, RoPE, decode attention,
 * the output linear, RMSNorm with the residual, the SwiGLU and down linears), each through ctypes
 * with its torch output allocated in Python: ~13 us per call, ~3-4 ms of a decode step on SmolLM2's
 * 30 layers, a fifth of a batch-1 step. ``decode_layers`` runs the same kernels in the same order on
 * buffers the caller allocates once per step, so its results equal the model code's bit for bit;
 * only the Python between them is gone. (hetero_core/model/fused_decode.py decides where it applies
 * and builds these structures.)
 */
#include <stdint.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

/* A linear in the layout of one of the kernels' linears: ``bits`` 0 for f32_linear's panels, a code
 * format (code_blocks.h: CODES_*) for block codes, 16 for bf16_linear's; ``bias`` fp32 in the packed
 * column order, or NULL. Block codes run coded_linear, or q8a_coded_linear with ``int8_activations``. */
struct fused_linear {
    const void *weight;
    const float *bias;
    int64_t out_features, in_features;
    int32_t bits, swiglu, int8_activations;
    int32_t tile_rows; /* int8 activations: q8a_coded_linear's tile_rows (AMX-INT8 from this many rows; 0 never) */
};

/* A projection whose row ranges may be stored in different layouts (split_linear.py: a GGUF's Q4_K q
 * and k beside a Q6_K v): ``num_parts`` linears, each writing its columns of the output in turn, as
 * SplitLinear concatenates them. One part is the plain case; only a lone part may apply SwiGLU. */
#define FUSED_MAX_PARTS 3
struct fused_projection {
    struct fused_linear part[FUSED_MAX_PARTS];
    int64_t num_parts;
};

struct fused_layer {
    const void *input_norm, *post_attention_norm; /* RMSNorm weights [hidden], the model's dtype */
    struct fused_projection qkv, gate_up; /* gate_up in parts: gate and up out, then silu_mul */
    struct fused_linear o, down;
    void *key_cache, *value_cache; /* [num_kv_heads, num_blocks, block_size, head_dim] */
};

struct fused_model {
    const struct fused_layer *layers;
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, num_blocks, block_size;
    float eps, scale;
    int32_t bf16; /* activations, norms and caches in bf16 (the linears bf16_linear's), else fp32 */
};

/* One step's rows and buffers, in the model's dtype: ``hidden`` holds the embeddings on entry and the
 * last layer's output on return, ``residual`` the residual stream beside it (the model's final norm
 * adds the two). */
struct fused_step {
    int64_t rows, max_blocks;
    void *hidden, *residual, *normed, *qkv, *attention, *activation;
    void *gate_up; /* [rows, 2 * intermediate] for a gate/up in parts (NULL where no layer has one) */
    const void *cos, *sin; /* [rows, head_dim / 2] */
    const int64_t *slots, *block_tables, *context_lens;
    int32_t num_threads;
};

/* ``linear`` over ``x`` into ``y``, whose rows are ``width`` elements apart. */
static int run_linear(const struct fused_linear *linear, const void *x, void *y, int64_t width, int64_t rows,
                      int threads, int bf16) {
    if (linear->int8_activations)  /* block codes, activations and outputs in the model's dtype */
        return q8a_coded_linear(x, linear->in_features, bf16, linear->weight, linear->bias, y, width, rows,
                                linear->out_features, linear->in_features, linear->bits, linear->swiglu, bf16,
                                linear->tile_rows, threads);
    if (linear->bits == 16)
        return bf16_linear(x, linear->in_features, linear->weight, linear->bias, y, width, rows, linear->out_features,
                           linear->in_features, 0, linear->swiglu, threads);
    if (linear->bits == 0)
        return f32_linear(x, linear->in_features, linear->weight, linear->bias, y, width, rows, linear->out_features,
                          linear->in_features, linear->swiglu, threads);
    return coded_linear(x, linear->in_features, linear->weight, linear->bias, y, width, rows, linear->out_features,
                        linear->in_features, linear->bits, linear->swiglu, threads);
}

/* Each part of ``projection`` into its columns of ``y`` (rows ``width`` elements apart). */
static int run_projection(const struct fused_projection *projection, const void *x, char *y, int64_t width,
                          int64_t rows, int threads, int bf16) {
    if (projection->num_parts < 1 || projection->num_parts > FUSED_MAX_PARTS) return -1;
    int64_t column = 0;
    for (int64_t p = 0; p < projection->num_parts; p++) {
        const struct fused_linear *part = &projection->part[p];
        if (projection->num_parts > 1 && part->swiglu) return -1;
        const int status = run_linear(part, x, y + column * (bf16 ? 2 : 4), width, rows, threads, bf16);
        if (status != 0) return status;
        column += part->out_features;
    }
    return column == (projection->part[0].swiglu ? 2 * width : width) ? 0 : -1;
}

/* A kernel's status as decode_layers reports it: 0 done, 1 shapes refused, 3 out of memory (attention's
 * refusals are 2: its inputs, not the model's shapes). */
static inline int status_of(int kernel_status) { return kernel_status == 0 ? 0 : kernel_status == -2 ? 3 : 1; }
#define CHECK(call) do { const int status = status_of(call); if (status) return status; } while (0)

/* The layers in the dtype ``bf16`` says (a constant where this is inlined: one loop per dtype). */
static inline __attribute__((always_inline)) int layers_as(const struct fused_model *model,
                                                          const struct fused_step *step, const int bf16) {
    const int64_t rows = step->rows, hidden = model->hidden, head_dim = model->head_dim;
    const int64_t q_width = model->num_heads * head_dim, kv_width = model->num_kv_heads * head_dim;
    const int64_t qkv_width = q_width + 2 * kv_width, element = bf16 ? 2 : 4;
    const int threads = step->num_threads;
    char *const qkv = step->qkv;
    if (rows < 0 || model->num_layers < 0) return 1;
    for (int64_t l = 0; l < model->num_layers; l++) {
        const struct fused_layer *layer = &model->layers[l];
        if (l == 0) { /* the residual stream starts as the embeddings */
            memcpy(step->residual, step->hidden, (size_t)(rows * hidden * element));
            CHECK((bf16 ? rms_norm_bf16 : rms_norm_f32)(step->hidden, hidden, NULL, 0, layer->input_norm, step->normed,
                                                        hidden, rows, hidden, model->eps, threads));
        } else {
            CHECK((bf16 ? rms_norm_bf16 : rms_norm_f32)(step->hidden, hidden, step->residual, hidden, layer->input_norm,
                                                        step->normed, hidden, rows, hidden, model->eps, threads));
        }
        CHECK(run_projection(&layer->qkv, step->normed, qkv, qkv_width, rows, threads, bf16));
        CHECK((bf16 ? rotary_bf16 : rotary_f32)(qkv, qkv_width, step->cos, step->sin, rows,
                                                model->num_heads + model->num_kv_heads, head_dim, threads));
        const int attention = (bf16 ? paged_decode_attention_bf16 : paged_decode_attention_f32)(
            qkv, qkv_width, qkv + q_width * element, qkv + (q_width + kv_width) * element, qkv_width, step->slots,
            layer->key_cache, layer->value_cache, step->block_tables, step->max_blocks, step->context_lens,
            step->attention, rows, model->num_heads, model->num_kv_heads, head_dim, model->num_blocks,
            model->block_size, model->scale, threads);
        if (attention != 0) return attention == -2 ? 3 : 2;
        CHECK(run_linear(&layer->o, step->attention, step->hidden, hidden, rows, threads, bf16));
        CHECK((bf16 ? rms_norm_bf16 : rms_norm_f32)(step->hidden, hidden, step->residual, hidden,
                                                    layer->post_attention_norm, step->normed, hidden, rows, hidden,
                                                    model->eps, threads));
        const int64_t intermediate = model->intermediate;
        if (layer->gate_up.num_parts == 1 && layer->gate_up.part[0].swiglu) {
            CHECK(run_projection(&layer->gate_up, step->normed, step->activation, intermediate, rows, threads, bf16));
        } else { /* gate and up apart (split), then the MLP's SiLU-and-multiply, as the model code runs it */
            if (step->gate_up == NULL) return 1;
            CHECK(run_projection(&layer->gate_up, step->normed, step->gate_up, 2 * intermediate, rows, threads, bf16));
            CHECK((bf16 ? silu_mul_bf16 : silu_mul_f32)(step->gate_up, 2 * intermediate, step->activation,
                                                        intermediate, rows, intermediate, threads));
        }
        CHECK(run_linear(&layer->down, step->activation, step->hidden, hidden, rows, threads, bf16));
    }
    return 0;
}

/* Returns 0; 1 when a kernel refused the model's shapes; 2 when attention refused its inputs (a
 * context beyond its block table, a block or slot outside the cache); 3 when a kernel could not
 * allocate its buffers: the caller raises, as the model code's kernels do. No rows: nothing to do. */
int decode_layers(const struct fused_model *model, const struct fused_step *step) {
    return model->bf16 ? layers_as(model, step, 1) : layers_as(model, step, 0);
}
