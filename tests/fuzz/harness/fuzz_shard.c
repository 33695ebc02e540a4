/* libFuzzer harness: the token-shard reader (llm.c's format) on arbitrary file contents; on a
 * shard that opens, every token is read (ASan checks the mapping bounds).
 */
#include <stdint.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "proto/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd;
    if (fuzz_as_file(data, size, path, sizeof path, &fd) != 0) return 0;
    ddp_shard_t s = {0};
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_shard_open(&s, path, &ei) == 0) {
        volatile unsigned sum = 0;
        uint32_t chunk[512];
        for (size_t i = 0; i < s.n_tokens; i += 512) {
            size_t n = s.n_tokens - i < 512 ? s.n_tokens - i : 512;
            if (ddp_shard_read(&s, i, n, chunk, &ei)) break;
            for (size_t j = 0; j < n; j++) sum += chunk[j];
        }
        (void)sum;
    }
    ddp_shard_close(&s);
    close(fd);
    return 0;
}
