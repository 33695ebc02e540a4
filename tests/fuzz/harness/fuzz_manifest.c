/* libFuzzer harness: MANIFEST.json (the checkpoint's list of files, sizes and CRC32Cs) read
 * from arbitrary bytes; on success every entry is looked up again by name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "worker/checkpoint/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd;
    if (fuzz_as_file(data, size, path, sizeof path, &fd) != 0) return 0;
    ddp_manifest_t m;
    ddp_manifest_init(&m, 0);
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_manifest_read(path, &m, &ei) == 0) {
        for (size_t i = 0; i < m.n; i++)
            if (!ddp_manifest_find(&m, m.e[i].name)) abort();
    }
    ddp_manifest_close(&m);
    close(fd);
    return 0;
}
