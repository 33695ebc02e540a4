/* Memory figures of the test process itself, for tests that bound what an operation leaves
 * resident. */
#ifndef DDP_TESTS_PROC_STATUS_H
#define DDP_TESTS_PROC_STATUS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value in kB of field `key` of /proc/self/status ("VmRSS", "VmHWM", "RssFile", ...), or -1
 * when it cannot be read. */
static inline long proc_status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t n = strlen(key);
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = atol(line + n + 1);
            break;
        }
    if (f) fclose(f);
    return v;
}

#endif
