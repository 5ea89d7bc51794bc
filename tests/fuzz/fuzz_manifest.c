/* libFuzzer target: the manifest parser (untrusted file bytes).
 *
 * Build with `make fuzz`, run from the repository root:
 *   build/fuzz/fuzz_manifest -max_total_time=60 -max_len=4096
 *
 * Beyond "no crash", every accepted entry must satisfy the path rules the
 * gate relies on to stay inside the model directory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sanctum/manifest.h"

static void require(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sn_manifest *m = NULL;
    sn_status st = sn_manifest_parse((const char *)data, size, "fuzz", &m);
    if (st != SN_OK) {
        require(m == NULL);
        require(sn_errmsg()[0] != 0);   /* every refusal says why */
        return 0;
    }
    require(m && m->n > 0);
    for (size_t i = 0; i < m->n; i++) {
        const char *p = m->entries[i].path;
        size_t n = strlen(p);
        require(n > 0 && p[0] != '/');
        require(strncmp(p, "./", 2) != 0);
        require(strstr(p, "//") == NULL && p[n - 1] != '/');
        require(strcmp(p, "..") != 0 && strncmp(p, "../", 3) != 0 && strstr(p, "/../") == NULL);
        require(!(n >= 3 && strcmp(p + n - 3, "/..") == 0));
        require(strchr(p, '\\') == NULL && strchr(p, '\n') == NULL);
        require(m->entries[i].line >= 1);
        for (size_t j = 0; j < i; j++)
            require(strcmp(m->entries[j].path, p) != 0);
        (void)sn_manifest_is_weight_file(p);
    }
    sn_manifest_free(m);
    return 0;
}
