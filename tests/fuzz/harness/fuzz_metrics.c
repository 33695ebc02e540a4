/* libFuzzer harness: the metrics record's codec (proto/metrics.h) on arbitrary metrics.jsonl
 * contents. The input is split at '\n' as the readers split the file; each line goes through
 * ddp_metrics_parse, and a line that parses must format within DDP_METRICS_LINE_MAX, parse
 * again to the same line (format is idempotent over parse), and give its values and its JSON.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/metrics.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char line1[DDP_METRICS_LINE_MAX], line2[DDP_METRICS_LINE_MAX];

static void one_line(const char *p, size_t n)
{
    ddp_metrics_rec_t r, again;
    ddp_errinfo_t ei;
    int rc = ddp_metrics_parse(p, n, &r, &ei);
    if (rc == DDP_EFORMAT) {
        if (strncmp(ei.msg, "metrics line: ", 14) != 0) abort(); /* a clear message */
        return;
    }
    if (rc) return; /* out of memory */
    size_t n1 = 0, n2 = 0;
    if (ddp_metrics_format(&r, line1, sizeof line1, &n1) != 0) abort();
    if (ddp_metrics_parse(line1, n1, &again, NULL) != 0) abort(); /* the codec reads its own */
    if (again.kind != r.kind || again.has != r.has) abort();
    if (ddp_metrics_format(&again, line2, sizeof line2, &n2) != 0) abort();
    if (n1 != n2 || memcmp(line1, line2, n1) != 0) abort();
    ddp_metrics_value_t v[DDP_MF_COUNT];
    int nv = ddp_metrics_values(&r, v);
    if (nv < 0 || nv > DDP_MF_COUNT) abort();
    json_t *o = ddp_metrics_to_json(&r);
    if (!o) abort(); /* (no allocation fails under libFuzzer's default limits) */
    json_decref(o);
}

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    size_t n = size;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        one_line(p, take);
        if (!nl) break;
        p += take + 1;
        n -= take + 1;
    }
    return 0;
}
