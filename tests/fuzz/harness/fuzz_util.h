/* Helpers shared by the libFuzzer harnesses: the input as a file (for readers that take a
 * path), and a scratch directory per process. Harnesses are single-threaded.
 */
#ifndef DDP_FUZZ_UTIL_H
#define DDP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd and returns its /proc/self/fd path in path (the fd in *fd; the
 * caller closes it). Returns 0, or -1 when the file cannot be made. */
static inline int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t n, int *fd)
{
    *fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (*fd < 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(*fd, data + off, size - off);
        if (w <= 0) {
            close(*fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, n, "/proc/self/fd/%d", *fd);
    return 0;
}

/* A scratch directory for this process (made once, under TMPDIR or /tmp). */
static inline const char *fuzz_scratch(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ddp-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

#endif
