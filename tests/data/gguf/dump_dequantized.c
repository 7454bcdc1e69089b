// Dequantize every tensor of a GGUF with ggml's own to_float and print, as one JSON object per
// tensor, its name, type, element count, the sum and sum of squares (double) and 32 sampled values.
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
#include "gguf.h"

#define SAMPLES 32

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s FILE.gguf\n", argv[0]); return 2; }
    struct ggml_context * ctx = NULL;
    struct gguf_init_params params = { .no_alloc = false, .ctx = &ctx };
    struct gguf_context * g = gguf_init_from_file(argv[1], params);
    if (!g) { fprintf(stderr, "cannot read %s\n", argv[1]); return 1; }
    for (int64_t k = 0; k < gguf_get_n_tensors(g); k++) {
        struct ggml_tensor * t = ggml_get_tensor(ctx, gguf_get_tensor_name(g, k));
        int64_t n = ggml_nelements(t);
        float * out = malloc(sizeof(float) * n);
        if (t->type == GGML_TYPE_F32) {
            for (int64_t i = 0; i < n; i++) out[i] = ((float *) t->data)[i];
        } else {
            ggml_get_type_traits(t->type)->to_float(t->data, out, n);
        }
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) { sum += out[i]; sq += (double) out[i] * out[i]; }
        printf("{\"name\": \"%s\", \"type\": \"%s\", \"n\": %lld, \"sum\": %.17g, \"sumsq\": %.17g, \"samples\": [",
               t->name, ggml_type_name(t->type), (long long) n, sum, sq);
        for (int s = 0; s < SAMPLES; s++) {
            int64_t i = (n / SAMPLES) * s + (s * 7) % (n / SAMPLES);
            printf("%s[%lld, %.9g]", s ? ", " : "", (long long) i, out[i]);
        }
        printf("]}\n");
        free(out);
    }
    gguf_free(g);
    ggml_free(ctx);
    return 0;
}
