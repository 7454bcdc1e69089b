/* Writes a step's new keys and values into the paged KV cache: for each token, each KV head's
 * head_dim elements go to that head's slot ([num_kv_heads, num_blocks * block_size, head_dim],
 * contiguous). The source rows may be strided (K and V are slices of the fused q/k/v projection).
 * Element-size generic: the bytes are copied as they are. */
#include <stdint.h>
#include <string.h>

#include "hetero_kernels.h" /* the ABI: every exported call's prototype */

/* Returns 0, or -1 (nothing written) when a slot lies outside the cache. */
int paged_kv_write(const char *key, int64_t key_token_stride, const char *value, int64_t value_token_stride,
                   char *key_cache, char *value_cache, const int64_t *slots, int64_t num_tokens,
                   int64_t num_kv_heads, int64_t head_dim, int64_t slots_per_head, int64_t element_size,
                   int num_threads) {
    for (int64_t t = 0; t < num_tokens; t++)
        if (slots[t] < 0 || slots[t] >= slots_per_head) return -1;
    const int64_t row = head_dim * element_size;
    const int parallel = num_tokens * num_kv_heads * row >= (1 << 16);
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
    for (int64_t t = 0; t < num_tokens; t++) {
        for (int64_t h = 0; h < num_kv_heads; h++) {
            const int64_t target = (h * slots_per_head + slots[t]) * row;
            memcpy(key_cache + target, key + t * key_token_stride * element_size + h * row, (size_t)row);
            memcpy(value_cache + target, value + t * value_token_stride * element_size + h * row, (size_t)row);
        }
    }
    return 0;
}
