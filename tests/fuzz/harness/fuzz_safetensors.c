/* libFuzzer harness: the safetensors reader (header length, JSON header, dtypes, shapes,
 * offsets, metadata) on an in-memory image; on success every tensor and its bytes are touched
 * and the metadata looked up.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/checkpoint/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy: the reader keeps pointers into the buffer */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    ddp_st_file_t *f = NULL;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_st_parse(buf, size, "fuzz.safetensors", &f, &ei) == 0) {
        volatile uint8_t x = 0;
        for (size_t i = 0; i < ddp_st_count(f); i++) {
            const ddp_st_tensor_t *t = ddp_st_get(f, i);
            if (t->nbytes) x ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            if (ddp_st_find(f, t->name) == NULL) abort(); /* every listed name is found */
        }
        (void)ddp_st_metadata(f, "format");
        (void)x;
        ddp_st_close(f);
    }
    free(buf);
    return 0;
}
