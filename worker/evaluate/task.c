/* Multiple-choice rows from JSONL (task.h): the two row shapes, the harness's HellaSwag
 * preprocessing, and the string helpers its scores need (Python's capitalize, strip, len). */
#include "worker/evaluate/task.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "common/alloc.h"
#include "common/file.h"
#include "worker/data/tokenizer.h"

/* A JSONL task file may be large (HellaSwag's validation split is 11 MB). */
#define TASK_MAX_BYTES ((size_t)1 << 30)

/* Python's str.isspace for one code point. */
static int py_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The code point at s[0, len) and its length in bytes (1 for a bad byte, taken as itself). */
static int next_cp(const char *s, size_t len, int32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &c);
    if (n <= 0) {
        *cp = (unsigned char)s[0];
        return 1;
    }
    *cp = c;
    return (int)n;
}

size_t ddp_mc_codepoints(const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p & 0xc0) != 0x80) n++;
    return n;
}

size_t ddp_mc_trailing_space(const char *s, size_t len)
{
    size_t end = len;
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && ((unsigned char)s[start] & 0xc0) == 0x80) start--;
        int32_t c;
        next_cp(s + start, end - start, &c);
        if (!py_space(c)) break;
        end = start;
    }
    return len - end;
}

/* Bytes of Python's whitespace at the start of s[0, len). */
static size_t leading_space(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        int32_t c;
        int n = next_cp(s + i, len - i, &c);
        if (!py_space(c)) break;
        i += (size_t)n;
    }
    return i;
}

char *ddp_mc_preprocess(const char *s)
{
    size_t len = strlen(s), lead = leading_space(s, len);
    s += lead;
    len -= lead;
    len -= ddp_mc_trailing_space(s, len);
    /* " [title]" -> ". " never lengthens the text: every step below writes at most len bytes */
    char *a = ddp_malloc(len + 1), *b = ddp_malloc(len + 1);
    if (!a || !b) {
        free(a);
        free(b);
        return NULL;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (len - i >= 8 && memcmp(s + i, " [title]", 8) == 0) {
            a[n++] = '.';
            a[n++] = ' ';
            i += 8;
        } else {
            a[n++] = s[i++];
        }
    }
    /* r"\[.*?\]": from a '[', the first ']' with no line break between; else the '[' stays */
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if (a[i] == '[') {
            size_t j = i + 1;
            while (j < n && a[j] != ']' && a[j] != '\n') j++;
            if (j < n && a[j] == ']') {
                i = j + 1;
                continue;
            }
        }
        b[m++] = a[i++];
    }
    /* "  " -> " ", non-overlapping from the left: three spaces become two */
    n = 0;
    for (size_t i = 0; i < m;) {
        if (i + 1 < m && b[i] == ' ' && b[i + 1] == ' ') {
            a[n++] = ' ';
            i += 2;
        } else {
            a[n++] = b[i++];
        }
    }
    a[n] = 0;
    free(b);
    return a;
}

char *ddp_mc_capitalize(const char *s)
{
    size_t len = strlen(s);
    char *out = ddp_malloc(4 * len + 1); /* a case mapping may take up to 4 bytes per code point */
    if (!out) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int32_t c;
        int k = next_cp(s + i, len - i, &c);
        int32_t d = i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c);
        n += (size_t)utf8proc_encode_char(d, (utf8proc_uint8_t *)out + n);
        i += (size_t)k;
    }
    out[n] = 0;
    return out;
}

int ddp_mc_row_error(ddp_errinfo_t *ei, const char *path, long line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ddp_errinfo_vset(ei, DDP_EFORMAT, fmt, ap);
    va_end(ap);
    if (ei) {
        ddp_errinfo_path(ei, "%s", path ? path : "");
        ei->line = (int)line;
        ei->column = 1; /* the row */
    }
    return rc;
}

/* A string field that must be present and valid UTF-8 (borrowed from the JSON). */
static int text_field(json_t *row, const char *key, const char *path, long line, const char **out,
                      ddp_errinfo_t *ei)
{
    json_t *v = json_object_get(row, key);
    if (!v) return ddp_mc_row_error(ei, path, line, "%s: missing", key);
    if (!json_is_string(v)) return ddp_mc_row_error(ei, path, line, "%s: expected a string", key);
    *out = json_string_value(v);
    return 0;
}

static int parse_label(json_t *row, const char *path, long line, int n_choices, int *label,
                       ddp_errinfo_t *ei)
{
    json_t *v = json_object_get(row, "label");
    if (!v) return ddp_mc_row_error(ei, path, line, "label: missing");
    long long x = -1;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!*s || strlen(s) > 9)
            return ddp_mc_row_error(ei, path, line, "label: '%s' is not a digit string", s);
        for (const char *p = s; *p; p++)
            if (!isdigit((unsigned char)*p))
                return ddp_mc_row_error(ei, path, line, "label: '%s' is not a digit string", s);
        x = atoll(s);
    } else {
        return ddp_mc_row_error(ei, path, line, "label: expected an integer or a digit string");
    }
    if (x < 0 || x >= n_choices)
        return ddp_mc_row_error(ei, path, line, "label: %lld is out of range for %d choices", x,
                         n_choices);
    *label = (int)x;
    return 0;
}

void ddp_mc_example_free(ddp_mc_example_t *ex)
{
    if (!ex) return;
    free(ex->context);
    for (int i = 0; ex->choices && i < ex->n_choices; i++) free(ex->choices[i]);
    free(ex->choices);
    memset(ex, 0, sizeof *ex);
}

/* HellaSwag's context, built as the harness's process_docs does. */
static char *hellaswag_query(const char *label, const char *ctx_a, const char *ctx_b)
{
    char *cap = ddp_mc_capitalize(ctx_b);
    if (!cap) return NULL;
    size_t n = strlen(label) + strlen(ctx_a) + strlen(cap) + 4;
    char *raw = ddp_malloc(n);
    if (raw) snprintf(raw, n, "%s: %s %s", label, ctx_a, cap);
    free(cap);
    char *q = raw ? ddp_mc_preprocess(raw) : NULL;
    free(raw);
    return q;
}

int ddp_mc_parse_row(const char *text, size_t len, const char *path, long line,
                     ddp_mc_example_t *ex, ddp_errinfo_t *ei)
{
    memset(ex, 0, sizeof *ex);
    ex->line = line;
    json_error_t je;
    json_t *row = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!row)
        return ddp_mc_row_error(ei, path, line, "malformed JSON: %s (column %d)", je.text, je.column);
    int rc = 0;
    if (!json_is_object(row)) {
        rc = ddp_mc_row_error(ei, path, line, "expected a JSON object");
        goto out;
    }
    int hella = json_object_get(row, "endings") != NULL;
    const char *list_key = hella ? "endings" : "choices";
    if (!hella && !json_object_get(row, "context")) {
        rc = ddp_mc_row_error(ei, path, line, "context: missing (or endings, for a HellaSwag row)");
        goto out;
    }
    json_t *list = json_object_get(row, list_key);
    if (!list) {
        rc = ddp_mc_row_error(ei, path, line, "%s: missing", list_key);
        goto out;
    }
    if (!json_is_array(list) || json_array_size(list) < 1 ||
        json_array_size(list) > DDP_MC_MAX_CHOICES) {
        rc = ddp_mc_row_error(ei, path, line, "%s: expected a list of 1 to %d strings", list_key,
                       DDP_MC_MAX_CHOICES);
        goto out;
    }
    int n = (int)json_array_size(list);
    ex->choices = ddp_calloc((size_t)n, sizeof *ex->choices);
    if (!ex->choices) {
        rc = DDP_ENOMEM;
        goto out;
    }
    ex->n_choices = n;
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(list, (size_t)i);
        if (!json_is_string(c)) {
            rc = ddp_mc_row_error(ei, path, line, "%s[%d]: expected a string", list_key, i);
            goto out;
        }
        const char *s = json_string_value(c);
        ex->choices[i] = hella ? ddp_mc_preprocess(s) : ddp_strdup(s);
        if (!ex->choices[i]) {
            rc = DDP_ENOMEM;
            goto out;
        }
        if (!ex->choices[i][0]) {
            rc = ddp_mc_row_error(ei, path, line, "%s[%d]: empty%s", list_key, i,
                           hella && s[0] ? " after preprocessing" : "");
            goto out;
        }
    }
    if (hella) {
        const char *al = NULL, *a = NULL, *b = NULL;
        if ((rc = text_field(row, "activity_label", path, line, &al, ei)) ||
            (rc = text_field(row, "ctx_a", path, line, &a, ei)) ||
            (rc = text_field(row, "ctx_b", path, line, &b, ei)))
            goto out;
        ex->context = hellaswag_query(al, a, b);
    } else {
        const char *c = NULL;
        if ((rc = text_field(row, "context", path, line, &c, ei))) goto out;
        ex->context = ddp_strdup(c);
    }
    if (!ex->context) {
        rc = DDP_ENOMEM;
        goto out;
    }
    rc = parse_label(row, path, line, n, &ex->label, ei);
out:
    json_decref(row);
    if (rc) ddp_mc_example_free(ex);
    return rc;
}

int64_t ddp_mc_task_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    /* a row is at least a dozen bytes: {"context"...} */
    return 2 * (int64_t)st.st_size + (int64_t)st.st_size / 12 * (int64_t)sizeof(ddp_mc_example_t);
}

void ddp_mc_task_close(ddp_mc_task_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) ddp_mc_example_free(&t->ex[i]);
    free(t->ex);
    memset(t, 0, sizeof *t);
}

int ddp_mc_task_load(ddp_mc_task_t *t, const char *path, long limit, const char *delim,
                     ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    snprintf(t->delim, sizeof t->delim, "%s", delim);
    char *buf = NULL;
    size_t len = 0;
    int rc = ddp_file_read(path, TASK_MAX_BYTES, &buf, &len);
    if (rc) {
        ddp_errinfo_set(ei, rc, "cannot read the task: %s", ddp_strerror(rc));
        ddp_errinfo_path(ei, "%s", path);
        return rc;
    }
    size_t bad = ddp_tok_utf8_check((const unsigned char *)buf, len);
    size_t cap = 0;
    long line = 0;
    for (size_t i = 0; i < len && (limit <= 0 || (long)t->n < limit);) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        line++;
        size_t a = i, b = end;
        while (a < b && isspace((unsigned char)buf[a])) a++;
        if (a < b) {
            if (bad >= i && bad < end) {
                rc = ddp_mc_row_error(ei, path, line, "not valid UTF-8 (byte %zu of the line)",
                               bad - i + 1);
                break;
            }
            if (t->n == cap) {
                cap = cap ? 2 * cap : 256;
                ddp_mc_example_t *ex = ddp_realloc(t->ex, cap * sizeof *ex);
                if (!ex) {
                    rc = DDP_ENOMEM;
                    break;
                }
                t->ex = ex;
            }
            if ((rc = ddp_mc_parse_row(buf + a, b - a, path, line, &t->ex[t->n], ei))) break;
            t->n++;
        }
        i = end + 1;
    }
    if (rc == 0 && t->n == 0) rc = ddp_mc_row_error(ei, path, line, "no rows");
    free(buf);
    return rc;
}
