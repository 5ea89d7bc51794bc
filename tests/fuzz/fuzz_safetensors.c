/* libFuzzer target for the safetensors header parser (sn_st_open_mem takes
 * the same path as a file on disk, minus the mmap).
 *
 * Build with `make fuzz`, run from the repository root:
 *   mkdir -p build/fuzz-corpus/st && build/fuzz/fuzz_safetensors -max_total_time=60 build/fuzz-corpus/st
 *
 * Every accepted file is walked: each tensor's first and last byte is read
 * (ASan catches a view that escapes the buffer) and each name is looked up. */
#include <stdint.h>
#include <string.h>

#include "sanctum/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sn_st *st = NULL;
    if (sn_st_open_mem(data, size, "fuzz.safetensors", &st) != SN_OK) {
        /* a rejection must always say why */
        if (sn_errmsg()[0] == 0) __builtin_trap();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < sn_st_count(st); i++) {
        const sn_st_tensor *t = sn_st_at(st, i);
        if (sn_st_find(st, t->name) != t) __builtin_trap();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            if (p < data || p + t->nbytes > data + size) __builtin_trap();
            sink ^= p[0] ^ p[t->nbytes - 1];
        }
        if ((size_t)sn_st_numel(t) * sn_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
    }
    (void)sink;
    (void)sn_st_metadata(st, "format");
    sn_st_close(st);
    return 0;
}
