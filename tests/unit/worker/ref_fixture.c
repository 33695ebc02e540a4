/* Reference fixtures of the model tests (see ref_fixture.h). */
#include "ref_fixture.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/file.h"

int ref_open(ref_fixture_t *r, const char *json, const char *bin)
{
    const char *root = getenv("DDP_SOURCE_ROOT");
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", json);
    json_error_t err;
    r->meta = json_load_file(path, 0, &err);
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", bin);
    r->blob = NULL;
    if (!r->meta || ddp_file_read(path, (size_t)256 << 20, &r->blob, NULL)) {
        ref_close(r);
        return -1;
    }
    return 0;
}

void ref_close(ref_fixture_t *r)
{
    json_decref(r->meta);
    free(r->blob);
    r->meta = NULL;
    r->blob = NULL;
}

const void *ref_tensor(const ref_fixture_t *r, const char *name, size_t *numel)
{
    json_t *t = json_object_get(json_object_get(r->meta, "tensors"), name);
    if (!t) fail_msg("fixture tensor %s missing", name);
    size_t n = 1, i;
    json_t *d;
    json_array_foreach(json_object_get(t, "shape"), i, d) n *= (size_t)json_integer_value(d);
    if (numel) *numel = n;
    return r->blob + json_integer_value(json_object_get(t, "offset"));
}

double ref_num(const ref_fixture_t *r, const char *key)
{
    json_t *v = json_object_get(json_object_get(r->meta, "config"), key);
    if (!v) fail_msg("fixture config %s missing", key);
    return json_number_value(v);
}

double ref_rel_norm_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}
