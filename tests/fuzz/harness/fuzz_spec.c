/* libFuzzer harness: the job spec parser (YAML or JSON, detected) and validator, then the
 * serialiser on every spec that validates and the error formatter on every one that does not.
 */
#include <stdint.h>
#include <stdlib.h>

#include "proto/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ddp_spec_t spec;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_spec_parse(&spec, (const char *)data, size, "<fuzz>", &ei) == 0) {
        free(ddp_spec_to_json(&spec));
    } else {
        char buf[1024];
        ddp_spec_errstr(&ei, "<fuzz>", buf, sizeof buf);
    }
    return 0;
}
