/* safetensors format codec: header builder, streaming writer with CRC32C, mmap'ing validating
 * reader. Free of training logic (see safetensors.h for the format and the checks made).
 *
 * Invariant of a ddp_st_file_t: every tensor it hands out has been checked to lie inside the
 * data section, in order, without gaps or overlaps, with a size that matches its dtype and shape.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/alloc.h"
#include "common/file.h"

#define WRITE_CHUNK (8u << 20) /* bytes per write(2); CRC'd just before, while in cache */

struct ddp_st_file {
    char *path;
    const unsigned char *base; /* whole file */
    size_t len;
    int mapped;
    uint64_t data_start; /* 8 + N */
    json_t *root;        /* owns the name strings */
    json_t *meta;        /* borrowed from root, may be NULL */
    size_t n;
    ddp_st_tensor_t *t; /* ascending data offsets */
    size_t *by_name;    /* indices into t, sorted by name */
};

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    {NULL, 0},
#define DDP__ST_DT_ROW(name, size) {#name, size},
    DDP_ST_DTYPE_LIST(DDP__ST_DT_ROW)
#undef DDP__ST_DT_ROW
};

#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const char *ddp_st_dtype_name(ddp_st_dtype_t dt)
{
    return (dt > 0 && (size_t)dt < N_DTYPES) ? dtypes[dt].name : NULL;
}

ddp_st_dtype_t ddp_st_dtype_parse(const char *s)
{
    if (!s) return DDP_ST_INVALID;
    for (size_t i = 1; i < N_DTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0) return (ddp_st_dtype_t)i;
    return DDP_ST_INVALID;
}

size_t ddp_st_dtype_size(ddp_st_dtype_t dt)
{
    return (dt > 0 && (size_t)dt < N_DTYPES) ? dtypes[dt].size : 0;
}

int ddp_st_tensor_bytes(ddp_st_dtype_t dt, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t b = ddp_st_dtype_size(dt);
    if (!b || ndim < 0 || ndim > DDP_ST_MAX_DIMS) return DDP_EINVAL;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return DDP_EINVAL;
        if (shape[i] && b > UINT64_MAX / (uint64_t)shape[i]) return DDP_EINVAL;
        b *= (uint64_t)shape[i];
    }
    *out = b;
    return 0;
}

/* ---------------------------------------------------------------- writing */

static json_t *shape_json(const ddp_st_tensor_t *t)
{
    json_t *a = json_array();
    if (!a) return NULL;
    for (int d = 0; d < t->ndim; d++)
        if (json_array_append_new(a, json_integer(t->shape[d])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

int ddp_st_header_build(const ddp_st_tensor_t *t, size_t n, const char *const *meta, size_t nmeta,
                        char **out, size_t *out_len, ddp_errinfo_t *ei)
{
    return ddp_st_header_build_aligned(t, n, meta, nmeta, 8, out, out_len, ei);
}

int ddp_st_header_build_aligned(const ddp_st_tensor_t *t, size_t n, const char *const *meta,
                                size_t nmeta, size_t align, char **out, size_t *out_len,
                                ddp_errinfo_t *ei)
{
    if (align < 8 || align % 8)
        return ddp_errinfo_set(ei, DDP_EINVAL, "safetensors header: alignment %zu is not a "
                                               "multiple of 8", align);
    int rc = 0;
    char *text = NULL;
    json_t *root = json_object();
    if (!root) return ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: out of memory");
    if (nmeta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) < 0) {
            rc = ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: out of memory");
            goto out;
        }
        for (size_t i = 0; i < nmeta; i++) {
            if (!meta[2 * i] || !meta[2 * i + 1]) {
                rc = ddp_errinfo_set(ei, DDP_EINVAL, "safetensors header: NULL metadata");
                goto out;
            }
            if (json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1])) < 0) {
                rc = ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: bad metadata '%s'",
                                     meta[2 * i]);
                goto out;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb;
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0) {
            rc = ddp_errinfo_set(ei, DDP_EINVAL, "safetensors header: tensor %zu has no valid name",
                                 i);
            goto out;
        }
        if (ddp_st_tensor_bytes(t[i].dtype, t[i].ndim, t[i].shape, &nb) < 0 || nb != t[i].nbytes) {
            rc = ddp_errinfo_set(ei, DDP_EINVAL,
                                 "safetensors header: tensor '%s': dtype/shape do not match its "
                                 "%llu bytes",
                                 t[i].name, (unsigned long long)t[i].nbytes);
            goto out;
        }
        if (json_object_get(root, t[i].name)) {
            rc = ddp_errinfo_set(ei, DDP_EINVAL, "safetensors header: duplicate tensor '%s'",
                                 t[i].name);
            goto out;
        }
        json_t *o = json_object();
        json_t *offs = json_array();
        json_t *sh = shape_json(&t[i]);
        int bad = !o || !offs || !sh;
        bad = bad || json_array_append_new(offs, json_integer((json_int_t)off)) < 0;
        bad = bad || json_array_append_new(offs, json_integer((json_int_t)(off + nb))) < 0;
        if (!bad) {
            bad = json_object_set_new(o, "dtype", json_string(ddp_st_dtype_name(t[i].dtype))) < 0;
            bad = bad || json_object_set_new(o, "shape", sh) < 0;
            sh = NULL;
            bad = bad || json_object_set_new(o, "data_offsets", offs) < 0;
            offs = NULL;
            bad = bad || json_object_set_new(root, t[i].name, o) < 0;
            o = NULL;
        }
        json_decref(o);
        json_decref(offs);
        json_decref(sh);
        if (bad) {
            rc = ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: out of memory");
            goto out;
        }
        off += nb;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        rc = ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: out of memory");
        goto out;
    }
    size_t len = strlen(text);
    /* spaces up to where the data starts aligned (the format allows space padding) */
    size_t padded = (8 + len + align - 1) / align * align - 8;
    char *buf = ddp_malloc(8 + padded);
    if (!buf) {
        rc = ddp_errinfo_set(ei, DDP_ENOMEM, "safetensors header: out of memory");
        goto out;
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    *out = buf;
    *out_len = 8 + padded;
out:
    free(text);
    json_decref(root);
    return rc;
}

static int write_all(int fd, const char *path, const void *buf, size_t n, uint64_t at,
                     ddp_errinfo_t *ei)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            int rc = -errno;
            ddp_errinfo_set(ei, rc, "%s: write at offset %llu: %s", path, (unsigned long long)at,
                            strerror(errno));
            ddp_errinfo_path(ei, "%s", path);
            if (ei) ei->offset = (long long)at;
            return rc;
        }
        p += w;
        n -= (size_t)w;
        at += (uint64_t)w;
    }
    return 0;
}

int ddp_st_write_fd(int fd, const char *path, const ddp_st_tensor_t *t, size_t n,
                    const char *const *meta, size_t nmeta, bool hint_writeback, uint32_t *crc,
                    uint64_t *bytes_written, ddp_errinfo_t *ei)
{
    char *hdr = NULL;
    size_t hlen = 0;
    DDP_CHECK(ddp_st_header_build(t, n, meta, nmeta, &hdr, &hlen, ei));
    if (crc) *crc = ddp_crc32c_update(*crc, hdr, hlen);
    int rc = write_all(fd, path, hdr, hlen, 0, ei);
    free(hdr);
    if (rc < 0) return rc;
    uint64_t at = hlen, synced = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = t[i].data;
        uint64_t left = t[i].nbytes;
        if (left && !p)
            return ddp_errinfo_set(ei, DDP_EINVAL, "%s: tensor '%s' has no data", path, t[i].name);
        while (left) {
            size_t c = left < WRITE_CHUNK ? (size_t)left : WRITE_CHUNK;
            if (crc) *crc = ddp_crc32c_update(*crc, p, c);
            DDP_CHECK(write_all(fd, path, p, c, at, ei));
            p += c;
            left -= c;
            at += c;
            if (hint_writeback && at - synced >= WRITE_CHUNK) {
                /* Start writeback of what is written so far; the final fsync then waits for
                 * far less. Failure here is harmless (fsync reports real errors). */
                (void)sync_file_range(fd, (off_t)synced, (off_t)(at - synced),
                                      SYNC_FILE_RANGE_WRITE);
                synced = at;
            }
        }
    }
    if (bytes_written) *bytes_written = at;
    return 0;
}

int ddp_st_write_file(const char *path, const ddp_st_tensor_t *t, size_t n,
                      const char *const *meta, size_t nmeta, ddp_errinfo_t *ei)
{
    int fd = ddp_file_create(path, ei);
    if (fd < 0) return fd;
    int rc = ddp_st_write_fd(fd, path, t, n, meta, nmeta, true, NULL, NULL, ei);
    return ddp_file_sync_close(fd, path, rc, ei);
}

/* ---------------------------------------------------------------- reading */

static int fmt_err(ddp_errinfo_t *ei, const char *path, long long off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fmt_err(ddp_errinfo_t *ei, const char *path, long long off, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (off >= 0)
        ddp_errinfo_set(ei, DDP_EFORMAT, "%s: %s (file offset %lld)", path, msg, off);
    else
        ddp_errinfo_set(ei, DDP_EFORMAT, "%s: %s", path, msg);
    ddp_errinfo_path(ei, "%s", path);
    if (ei) ei->offset = off;
    return DDP_EFORMAT;
}

static int cmp_offset(const void *a, const void *b)
{
    const ddp_st_tensor_t *x = a, *y = b;
    if (x->data != y->data) return (uintptr_t)x->data < (uintptr_t)y->data ? -1 : 1;
    /* Equal begins: the empty tensor first, so a non-empty one after it is still contiguous. */
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_name(const void *a, const void *b, void *ctx)
{
    const ddp_st_file_t *f = ctx;
    return strcmp(f->t[*(const size_t *)a].name, f->t[*(const size_t *)b].name);
}

/* Reads a non-negative JSON integer. */
static int get_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_tensor(ddp_st_file_t *f, const char *name, json_t *o, ddp_st_tensor_t *t,
                        uint64_t data_len, ddp_errinfo_t *ei)
{
    const char *p = f->path;
    long long hoff = 8; /* errors inside the header point at its start */
    if (!json_is_object(o)) return fmt_err(ei, p, hoff, "tensor '%s': entry is not an object", name);
    json_t *dt = json_object_get(o, "dtype"), *sh = json_object_get(o, "shape");
    json_t *offs = json_object_get(o, "data_offsets");
    if (!json_is_string(dt)) return fmt_err(ei, p, hoff, "tensor '%s': missing dtype", name);
    t->name = name;
    t->dtype = ddp_st_dtype_parse(json_string_value(dt));
    if (t->dtype == DDP_ST_INVALID)
        return fmt_err(ei, p, hoff, "tensor '%s': unknown dtype '%s'", name,
                       json_string_value(dt));
    if (!json_is_array(sh)) return fmt_err(ei, p, hoff, "tensor '%s': missing shape", name);
    if (json_array_size(sh) > DDP_ST_MAX_DIMS)
        return fmt_err(ei, p, hoff, "tensor '%s': %zu dimensions (at most %d)", name,
                       json_array_size(sh), DDP_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (get_u64(json_array_get(sh, (size_t)d), &v) < 0 || v > INT64_MAX)
            return fmt_err(ei, p, hoff, "tensor '%s': shape[%d] is not a non-negative integer",
                           name, d);
        t->shape[d] = (int64_t)v;
    }
    uint64_t b, e, nb;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        get_u64(json_array_get(offs, 0), &b) < 0 || get_u64(json_array_get(offs, 1), &e) < 0)
        return fmt_err(ei, p, hoff, "tensor '%s': data_offsets is not [begin, end]", name);
    if (b > e)
        return fmt_err(ei, p, (long long)(f->data_start + b),
                       "tensor '%s': data_offsets [%llu, %llu] has begin > end", name,
                       (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return fmt_err(ei, p, (long long)(f->data_start + b),
                       "tensor '%s': data_offsets [%llu, %llu] past the end of the data "
                       "(%llu bytes)",
                       name, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)data_len);
    if (ddp_st_tensor_bytes(t->dtype, t->ndim, t->shape, &nb) < 0 || nb != e - b)
        return fmt_err(ei, p, (long long)(f->data_start + b),
                       "tensor '%s': shape and dtype %s give %llu bytes but data_offsets [%llu, "
                       "%llu] hold %llu",
                       name, ddp_st_dtype_name(t->dtype), (unsigned long long)nb,
                       (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b));
    t->data = f->base + f->data_start + b;
    t->nbytes = nb;
    return 0;
}

static int parse(ddp_st_file_t *f, ddp_errinfo_t *ei)
{
    const char *p = f->path;
    if (f->len < 8) return fmt_err(ei, p, 0, "file of %zu bytes is shorter than the 8-byte header "
                                             "length", f->len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | f->base[i];
    if (hn > DDP_ST_MAX_HEADER)
        return fmt_err(ei, p, 0, "header length %llu exceeds the limit of %u bytes",
                       (unsigned long long)hn, DDP_ST_MAX_HEADER);
    if (hn > f->len - 8)
        return fmt_err(ei, p, 0, "header length %llu exceeds the file (%zu bytes)",
                       (unsigned long long)hn, f->len);
    if (hn < 2 || f->base[8] != '{')
        return fmt_err(ei, p, 8, "header does not start with '{'");
    f->data_start = 8 + hn;
    uint64_t data_len = f->len - f->data_start;
    json_error_t je;
    f->root = json_loadb((const char *)f->base + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &je);
    if (!f->root && json_error_code(&je) == json_error_out_of_memory)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", p);
    if (!f->root)
        return fmt_err(ei, p, 8 + (long long)(je.position > 0 ? je.position : 0),
                       "header is not valid JSON: %s", je.text);
    if (!json_is_object(f->root)) return fmt_err(ei, p, 8, "header is not a JSON object");
    size_t count = json_object_size(f->root);
    f->meta = json_object_get(f->root, "__metadata__");
    if (f->meta) {
        if (!json_is_object(f->meta))
            return fmt_err(ei, p, 8, "__metadata__ is not an object");
        const char *k;
        json_t *v;
        json_object_foreach(f->meta, k, v)
        {
            if (!json_is_string(v))
                return fmt_err(ei, p, 8, "__metadata__ value of '%s' is not a string", k);
        }
        count--;
    }
    f->t = ddp_calloc(count ? count : 1, sizeof *f->t);
    f->by_name = ddp_calloc(count ? count : 1, sizeof *f->by_name);
    if (!f->t || !f->by_name) return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", p);
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(f->root, k, v)
    {
        if (v == f->meta) continue;
        DDP_CHECK(parse_tensor(f, k, v, &f->t[i], data_len, ei));
        f->by_name[i] = i;
        i++;
    }
    f->n = i;
    qsort(f->t, f->n, sizeof *f->t, cmp_offset);
    uint64_t expect = 0;
    for (i = 0; i < f->n; i++) {
        uint64_t b = (uint64_t)((const unsigned char *)f->t[i].data - f->base) - f->data_start;
        if (b != expect)
            return fmt_err(ei, p, (long long)(f->data_start + b),
                           "tensor '%s': data_offsets begin %llu, expected %llu (%s)",
                           f->t[i].name, (unsigned long long)b, (unsigned long long)expect,
                           b > expect ? "gap before it" : "overlaps the previous tensor");
        expect = b + f->t[i].nbytes;
    }
    if (expect != data_len)
        return fmt_err(ei, p, (long long)(f->data_start + expect),
                       "%llu bytes after the last tensor's data (trailing bytes or a missing "
                       "tensor)",
                       (unsigned long long)(data_len - expect));
    qsort_r(f->by_name, f->n, sizeof *f->by_name, cmp_name, f);
    return 0;
}

static int new_file(const char *path, ddp_st_file_t **out, ddp_errinfo_t *ei)
{
    ddp_st_file_t *f = ddp_calloc(1, sizeof *f);
    if (!f) return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", path);
    f->path = ddp_strdup(path);
    if (!f->path) {
        free(f);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", path);
    }
    *out = f;
    return 0;
}

int ddp_st_parse(const void *buf, size_t len, const char *name, ddp_st_file_t **out,
                 ddp_errinfo_t *ei)
{
    ddp_st_file_t *f = NULL;
    DDP_CHECK(new_file(name ? name : "<buffer>", &f, ei));
    f->base = buf;
    f->len = len;
    int rc = parse(f, ei);
    if (rc < 0) {
        ddp_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int ddp_st_open(const char *path, ddp_st_file_t **out, ddp_errinfo_t *ei)
{
    ddp_st_file_t *f = NULL;
    DDP_CHECK(new_file(path, &f, ei));
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: cannot open: %s", path, strerror(errno));
        ddp_errinfo_path(ei, "%s", path);
        goto fail;
    }
    f->len = (size_t)st.st_size;
    if (f->len) {
        /* No MAP_POPULATE: pages come in as tensors are copied and leave with ddp_st_release. */
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = -errno;
            ddp_errinfo_set(ei, rc, "%s: mmap: %s", path, strerror(errno));
            goto fail;
        }
        f->base = m;
        f->mapped = 1;
        (void)madvise(m, f->len, MADV_SEQUENTIAL);
    } else {
        f->base = (const unsigned char *)"";
    }
    close(fd);
    fd = -1;
    rc = parse(f, ei);
    if (rc < 0) goto fail;
    *out = f;
    return 0;
fail:
    if (fd >= 0) close(fd);
    ddp_st_close(f);
    return rc;
}

void ddp_st_close(ddp_st_file_t *f)
{
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, f->len);
    json_decref(f->root);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

size_t ddp_st_count(const ddp_st_file_t *f) { return f->n; }

const ddp_st_tensor_t *ddp_st_get(const ddp_st_file_t *f, size_t i)
{
    return i < f->n ? &f->t[i] : NULL;
}

const ddp_st_tensor_t *ddp_st_find(const ddp_st_file_t *f, const char *name)
{
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ddp_st_tensor_t *t = &f->t[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *ddp_st_metadata(const ddp_st_file_t *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

const char *ddp_st_path(const ddp_st_file_t *f) { return f->path; }

uint64_t ddp_st_data_start(const ddp_st_file_t *f) { return f->data_start; }

void ddp_st_release(const ddp_st_file_t *f, const void *p, size_t n)
{
    if (!f->mapped || !n) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = (uintptr_t)p & ~(pg - 1); /* the partial first page too: clean file pages
                                              * come back on the next touch */
    uintptr_t e = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
    uintptr_t lo = (uintptr_t)f->base, hi = lo + f->len;
    if (b < (lo & ~(pg - 1))) b = lo & ~(pg - 1);
    if (e > ((hi + pg - 1) & ~(pg - 1))) e = (hi + pg - 1) & ~(pg - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
}
