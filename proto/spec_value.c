/* One value of a job spec's field, read strictly and stored in the spec (proto/spec_int.h).
 *
 * A scalar is read by the field's type, never by its looks: YAML plain text is an integer, a
 * number or a boolean only where the field is one, and then strictly ("12abc", "1.5" for an
 * integer, hex, inf and nan are refused); JSON keeps the types JSON gave. A value out of the
 * field's range, or not one of its choices, is refused with what is allowed ("must be an
 * integer >= 1, got -2") at the value's line and column. A list field's value goes on to
 * spec_list.c.
 *
 * Invariants: a conversion reads only its node and writes only into dst (a preset also into
 * ps->spec->model; a list's count and form are spec_list.c's to write).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/spec.h"
#include "proto/spec_int.h"
#include "proto/spec_tree.h"

typedef ddp__sfield_t field_t;
typedef ddp__spec_pstate_t pstate_t;
#define NO_MAX DDP__SPEC_NO_MAX

/* What is allowed: "an integer >= 1", "a number > 0 and <= 10". A large upper bound (a sanity
 * limit, not a real constraint) is shown only to a value that breaks it. `v` is the value given,
 * NAN when it is not a number. */
static void describe(const field_t *f, double v, char *buf, size_t len)
{
    const char *what = f->type == DDP__FT_INT ? "an integer" : "a number";
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.15g", f->lo);
    snprintf(hi, sizeof hi, "%.15g", f->hi);
    bool big = f->hi >= 65536;
    if (big && !isnan(v) && v > f->lo)
        snprintf(buf, len, "%s %s %s", what, f->hi_open ? "<" : "<=", hi);
    else if (big)
        snprintf(buf, len, "%s %s %s", what, f->lo_open ? ">" : ">=", lo);
    else if (f->type == DDP__FT_INT)
        snprintf(buf, len, "%s in %s..%s", what, lo, hi);
    else
        snprintf(buf, len, "%s %s %s and %s %s", what, f->lo_open ? ">" : ">=", lo,
                 f->hi_open ? "<" : "<=", hi);
}

/* ---- scalar conversion --------------------------------------------------------------------- */

/* Strict integer: JSON integer, an integral JSON real, or YAML plain text that is a decimal
 * integer or an integral number written with an exponent (5e5). */
static bool to_integer(const ddp__snode_t *n, long long *out)
{
    if (n->kind != DDP__SN_SCALAR) return false;
    if (n->stype == DDP__SC_INT) {
        *out = n->ival;
        return true;
    }
    double d;
    if (n->stype == DDP__SC_REAL) {
        d = n->rval;
    } else if (n->stype == DDP__SC_PLAIN) {
        const char *s = n->text;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end != s && !*end && errno == 0) {
            *out = v;
            return true;
        }
        if (!strpbrk(s, "eE") || strpbrk(s, "xXnN")) return false;
        d = strtod(s, &end);
        if (end == s || *end) return false;
    } else {
        return false;
    }
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) return false;
    *out = (long long)d;
    return true;
}

/* Strict finite number: JSON number, or YAML plain decimal text (no hex, inf or nan). */
static bool to_number(const ddp__snode_t *n, double *out)
{
    if (n->kind != DDP__SN_SCALAR) return false;
    if (n->stype == DDP__SC_INT) {
        *out = (double)n->ival;
        return true;
    }
    if (n->stype == DDP__SC_REAL) {
        *out = n->rval;
        return true;
    }
    if (n->stype != DDP__SC_PLAIN || strpbrk(n->text, "xXnNiI")) return false;
    char *end;
    double d = strtod(n->text, &end);
    if (end == n->text || *end || !isfinite(d)) return false;
    *out = d;
    return true;
}

static bool to_bool(const ddp__snode_t *n, int *out)
{
    if (n->kind != DDP__SN_SCALAR) return false;
    if (n->stype == DDP__SC_BOOL) {
        *out = n->bval;
        return true;
    }
    if (n->stype != DDP__SC_PLAIN) return false;
    static const char *const T[] = {"true", "yes", "on"}, *const F[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(n->text, T[i])) return (*out = 1), true;
        if (!strcasecmp(n->text, F[i])) return (*out = 0), true;
    }
    return false;
}

/* Text of a string field: any scalar but a JSON/YAML bool or number typed by JSON is accepted as
 * its text (YAML `name: 123` is the name "123"); null is "". */
bool ddp__spec_to_text(const ddp__snode_t *n, const char **out)
{
    if (n->kind != DDP__SN_SCALAR || n->stype == DDP__SC_BOOL) return false;
    *out = n->stype == DDP__SC_NULL ? "" : n->text;
    return true;
}

int ddp_spec_parse_bytes(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || errno || !(x >= 0)) return DDP_EINVAL;
    while (*end == ' ') end++;
    static const struct {
        const char *unit;
        double mult;
    } U[] = {{"", 1},          {"B", 1},          {"kB", 1e3},          {"KB", 1e3},
             {"KiB", 1024.0},  {"k", 1024.0},     {"K", 1024.0},        {"MB", 1e6},
             {"MiB", 1 << 20}, {"M", 1 << 20},    {"GB", 1e9},          {"GiB", 1 << 30},
             {"G", 1 << 30},   {"TB", 1e12},      {"TiB", 1099511627776.0}, {"T", 1099511627776.0}};
    for (size_t i = 0; i < sizeof U / sizeof U[0]; i++)
        if (!strcmp(end, U[i].unit)) {
            double b = x * U[i].mult;
            if (b >= 9.2e18) return DDP_EINVAL;
            *out = (int64_t)b;
            return 0;
        }
    return DDP_EINVAL;
}

/* A byte count: an integer, or a string that ddp_spec_parse_bytes reads. */
static bool to_bytes(const ddp__snode_t *n, int64_t *out)
{
    long long v;
    if (to_integer(n, &v)) {
        *out = v;
        return v >= 0;
    }
    const char *s;
    return ddp__spec_to_text(n, &s) && ddp_spec_parse_bytes(s, out) == 0;
}

static void store_int(void *p, size_t size, long long v)
{
    if (size == sizeof(int))
        *(int *)p = (int)v;
    else
        *(long *)p = (long)v;
}

static bool in_range(const field_t *f, double v)
{
    if (f->lo_open ? !(v > f->lo) : !(v >= f->lo)) return false;
    if (f->hi >= NO_MAX) return true;
    return f->hi_open ? v < f->hi : v <= f->hi;
}

/* Converts one value of field f (named `path` in errors, at the value's mark) into dst. */
int ddp__spec_convert(pstate_t *ps, const field_t *f, const char *path, char *dst,
                      const ddp__snode_t *n)
{
    char rb[96], want[128];
#define BAD(...) ddp__spec_field_error(ps, path, n->line, n->column, __VA_ARGS__)

    switch (f->type) {
    case DDP__FT_INT: {
        long long v;
        bool ok = to_integer(n, &v);
        describe(f, ok ? (double)v : NAN, want, sizeof want);
        if (!ok || !in_range(f, (double)v))
            return BAD("must be %s, got %s", want, ddp__spec_repr(n, rb, sizeof rb));
        store_int(dst, f->size, v);
        return 0;
    }
    case DDP__FT_SEED: {
        long long v;
        if (!to_integer(n, &v) || v < 0)
            return BAD("must be an integer >= 0, got %s", ddp__spec_repr(n, rb, sizeof rb));
        *(uint64_t *)dst = (uint64_t)v;
        return 0;
    }
    case DDP__FT_NUM: {
        double v;
        bool ok = to_number(n, &v);
        describe(f, ok ? v : NAN, want, sizeof want);
        if (!ok || !in_range(f, v))
            return BAD("must be %s, got %s", want, ddp__spec_repr(n, rb, sizeof rb));
        *(double *)dst = v;
        return 0;
    }
    case DDP__FT_PAIR: {
        double v[2];
        if (n->kind != DDP__SN_SEQ || n->n != 2)
            return BAD("must be a sequence of two numbers >= 0 and < 1 "
                       "([beta1, beta2]), got %s",
                       ddp__spec_repr(n, rb, sizeof rb));
        for (int k = 0; k < 2; k++) {
            const ddp__snode_t *e = n->entries[k].val;
            if (!to_number(e, &v[k]) || !(v[k] >= 0 && v[k] < 1))
                return ddp__spec_field_error(ps, path, e->line, e->column,
                                             "entry %d must be a number >= 0 and < 1, got %s", k,
                                             ddp__spec_repr(e, rb, sizeof rb));
        }
        memcpy(dst, v, sizeof v);
        return 0;
    }
    case DDP__FT_BOOL: {
        int v;
        if (!to_bool(n, &v))
            return BAD("must be true or false, got %s", ddp__spec_repr(n, rb, sizeof rb));
        *(int *)dst = v;
        return 0;
    }
    case DDP__FT_STR: {
        const char *s;
        if (!ddp__spec_to_text(n, &s))
            return BAD("must be a string, got %s", ddp__spec_repr(n, rb, sizeof rb));
        if (strlen(s) >= f->size)
            return BAD("must be at most %zu bytes long, got %zu", f->size - 1,
                             strlen(s));
        snprintf(dst, f->size, "%s", s);
        return 0;
    }
    case DDP__FT_ENUM:
    case DDP__FT_CHOICE: {
        const char *s = NULL;
        ddp__spec_list_choices(f->choices, want, sizeof want);
        if (ddp__spec_to_text(n, &s))
            for (int k = 0; f->choices[k]; k++)
                if (!strcmp(s, f->choices[k])) {
                    if (f->type == DDP__FT_ENUM)
                        *(int *)dst = k;
                    else
                        snprintf(dst, f->size, "%s", s);
                    return 0;
                }
        return BAD("must be one of %s; got %s", want, ddp__spec_repr(n, rb, sizeof rb));
    }
    case DDP__FT_BYTES:
        if (!to_bytes(n, (int64_t *)dst))
            return BAD("must be a size in bytes >= 0, as a number or with a unit "
                       "(\"8GiB\", \"512MB\"), got %s",
                       ddp__spec_repr(n, rb, sizeof rb));
        return 0;
    case DDP__FT_PRESET: {
        const char *s = NULL;
        if (ddp__spec_to_text(n, &s) && ddp_spec_preset(s, &ps->spec->model) == 0) {
            snprintf(dst, f->size, "%s", s);
            return 0;
        }
        char names[160];
        size_t k = 0;
        names[0] = '\0';
        for (size_t p = 0; p < ddp__spec_n_presets; p++)
            k += snprintf(names + k, sizeof names - k, "%s%s", p ? ", " : "",
                          ddp__spec_presets[p].name);
        return BAD("must be one of %s; got %s", names, ddp__spec_repr(n, rb, sizeof rb));
    }
    case DDP__FT_LIST: return ddp__spec_set_list(ps, f, path, dst, n);
    }
#undef BAD
    return 0;
}
