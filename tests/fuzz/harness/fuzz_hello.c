/* libFuzzer harness: rank 0's check of a rendezvous hello (collectives/rdzv_hello.c), the
 * first bytes the TCP bootstrap reads from anyone who connects. The expectation is fixed (a
 * world of 4 at generation 7, token "fuzz-token", rank 2 already joined; the seeds in
 * tests/fuzz/corpus/hello/ are built for it), and the verdict on the input and on every prefix
 * of it must be consistent: a prefix is never accepted, a refused prefix stays refused, and an
 * accepted hello is exactly one whole hello with the right token and a free rank in range.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/rdzv_hello.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const int fds[4] = {-1, -1, 5, -1};
    ddp__rdzv_expect_t e = {.token = "fuzz-token", .size = 4, .generation = 7, .fds = fds};
    ddp__rdzv_verdict_t v;
    int refused = 0;
    for (size_t len = 0; len <= size; len++) {
        int rk = ddp__rdzv_hello_check(data, len, &e, &v);
        if (rk != v.rank) abort();
        if (refused && rk >= 0) abort(); /* more bytes never mend a refusal */
        if (rk < 0) {
            if (!v.why || !*v.why) abort();
            refused = 1;
        } else if (rk > 0) {
            ddp__rdzv_hello_t h;
            memcpy(&h, data, sizeof h);
            if (len != sizeof h || rk == 2 || rk >= 4 || h.generation != 7 ||
                strncmp(h.token, "fuzz-token", sizeof h.token) != 0)
                abort();
        } else if (len >= sizeof(ddp__rdzv_hello_t)) {
            abort(); /* a whole hello gets a verdict */
        }
    }
    /* the hello a rank builds passes its own check */
    ddp__rdzv_hello_t h;
    ddp__rdzv_hello_make(&h, 3, 4, 7, "fuzz-token");
    if (ddp__rdzv_hello_check(&h, sizeof h, &e, &v) != 3) abort();
    return 0;
}
