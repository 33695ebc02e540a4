/* MANIFEST.json writer, reader and verifier, and the small durable-file helpers that the
 * checkpoint writer shares with it. See manifest.h for the format.
 */
#include "manifest.h"

#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/alloc.h"
#include "manifest_internal.h"

#define READ_CHUNK (1u << 20)

void ddp_manifest_init(ddp_manifest_t *m, int64_t step)
{
    memset(m, 0, sizeof *m);
    m->step = step;
}

void ddp_manifest_close(ddp_manifest_t *m)
{
    if (!m) return;
    free(m->e);
    m->e = NULL;
    m->n = m->cap = 0;
}

static int plain_name(const char *s)
{
    size_t n = strlen(s);
    return n && n <= DDP_MANIFEST_MAX_NAME && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

const ddp_manifest_entry_t *ddp_manifest_find(const ddp_manifest_t *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->e[i].name, name) == 0) return &m->e[i];
    return NULL;
}

int ddp_manifest_add(ddp_manifest_t *m, const char *name, uint64_t size, uint32_t crc32c)
{
    if (!plain_name(name)) return DDP_EINVAL;
    ddp_manifest_entry_t *e = (ddp_manifest_entry_t *)ddp_manifest_find(m, name);
    if (!e) {
        if (m->n == m->cap) {
            size_t cap = m->cap ? 2 * m->cap : 16;
            void *p = ddp_realloc(m->e, cap * sizeof *m->e);
            if (!p) return DDP_ENOMEM;
            m->e = p;
            m->cap = cap;
        }
        e = &m->e[m->n++];
        snprintf(e->name, sizeof e->name, "%s", name);
    }
    e->size = size;
    e->crc32c = crc32c;
    return 0;
}

int ddp__fsync_path(const char *path, ddp_errinfo_t *ei)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        return ddp_errinfo_set(ei, rc, "%s: open for fsync: %s", path, strerror(errno));
    }
    int rc = 0;
    if (fsync(fd) < 0) {
        rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: fsync: %s", path, strerror(errno));
    }
    close(fd);
    return rc;
}

int ddp__write_durable(const char *dir, const char *name, const void *data, size_t len,
                       uint32_t *crc, ddp_errinfo_t *ei)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return ddp_errinfo_set(ei, DDP_EINVAL, "%s/%s: path too long", dir, name);
    int fd = ddp_file_create(path, ei);
    if (fd < 0) return fd;
    int rc = 0;
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            rc = -errno;
            ddp_errinfo_set(ei, rc, "%s: write: %s", path, strerror(errno));
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    rc = ddp_file_sync_close(fd, path, rc, ei);
    if (rc == 0 && crc) *crc = ddp_crc32c_update(0, data, len);
    return rc;
}

int ddp_manifest_write(const ddp_manifest_t *m, const char *dir, const char *name, int sync_dir,
                       ddp_errinfo_t *ei)
{
    int rc = 0;
    char *text = NULL;
    json_t *files = json_object();
    json_t *root = json_pack("{s:s, s:i, s:I, s:s}", "format", "ddpd-checkpoint", "version", 1,
                             "step", (json_int_t)m->step, "checksum", "crc32c");
    if (!files || !root) goto nomem;
    for (size_t i = 0; i < m->n; i++) {
        char hex[9];
        snprintf(hex, sizeof hex, "%08" PRIx32, m->e[i].crc32c);
        json_t *o = json_pack("{s:I, s:s}", "size", (json_int_t)m->e[i].size, "crc32c", hex);
        if (!o || json_object_set_new(files, m->e[i].name, o) < 0) goto nomem;
    }
    if (json_object_set(root, "files", files) < 0) goto nomem;
    text = json_dumps(root, JSON_INDENT(1));
    if (!text) goto nomem;
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room: replace the NUL, length + 1 */
    rc = ddp__write_durable(dir, name, text, len + 1, NULL, ei);
    if (rc == 0 && sync_dir) rc = ddp__fsync_path(dir, ei);
    goto out;
nomem:
    rc = ddp_errinfo_set(ei, DDP_ENOMEM, "%s/%s: out of memory", dir, name);
out:
    free(text);
    json_decref(files);
    json_decref(root);
    return rc;
}

static int bad(ddp_errinfo_t *ei, const char *path, const char *what)
{
    ddp_errinfo_set(ei, DDP_EFORMAT, "%s: %s", path, what);
    ddp_errinfo_path(ei, "%s", path);
    return DDP_EFORMAT;
}

int ddp_manifest_read(const char *path, ddp_manifest_t *m, ddp_errinfo_t *ei)
{
    ddp_manifest_init(m, 0);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (access(path, F_OK) < 0 && errno == ENOENT) {
            ddp_errinfo_set(ei, -ENOENT, "%s: missing", path);
            ddp_errinfo_path(ei, "%s", path);
            return -ENOENT;
        }
        if (json_error_code(&je) == json_error_out_of_memory)
            return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", path);
        ddp_errinfo_set(ei, DDP_EFORMAT, "%s: not valid JSON at line %d: %s", path, je.line,
                        je.text);
        ddp_errinfo_path(ei, "%s", path);
        if (ei) ei->line = je.line;
        return DDP_EFORMAT;
    }
    int rc = 0;
    json_t *files = json_object_get(root, "files");
    json_t *fmt = json_object_get(root, "format");
    json_t *step = json_object_get(root, "step");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "ddpd-checkpoint") != 0) {
        rc = bad(ei, path, "\"format\" is not \"ddpd-checkpoint\"");
        goto out;
    }
    if (!json_is_integer(json_object_get(root, "version")) ||
        json_integer_value(json_object_get(root, "version")) != 1) {
        rc = bad(ei, path, "unsupported \"version\" (this build reads 1)");
        goto out;
    }
    if (!json_is_integer(step) || !json_is_object(files)) {
        rc = bad(ei, path, "\"step\" or \"files\" missing");
        goto out;
    }
    m->step = json_integer_value(step);
    const char *k;
    json_t *v;
    json_object_foreach(files, k, v)
    {
        json_t *sz = json_object_get(v, "size"), *cs = json_object_get(v, "crc32c");
        char *end = NULL;
        const char *hex = json_string_value(cs);
        unsigned long crc = hex ? strtoul(hex, &end, 16) : 0;
        if (!json_is_integer(sz) || json_integer_value(sz) < 0 || !hex || strlen(hex) != 8 ||
            *end || !plain_name(k)) {
            char what[DDP_MANIFEST_MAX_NAME + 64];
            snprintf(what, sizeof what, "bad entry for file '%s'", k);
            rc = bad(ei, path, what);
            goto out;
        }
        rc = ddp_manifest_add(m, k, (uint64_t)json_integer_value(sz), (uint32_t)crc);
        if (rc < 0) {
            ddp_errinfo_set(ei, rc, "%s: out of memory", path);
            goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

int ddp_file_crc32c(const char *path, uint64_t *size, uint32_t *crc32c, ddp_errinfo_t *ei)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: cannot open: %s", path, strerror(errno));
        ddp_errinfo_path(ei, "%s", path);
        return rc;
    }
    char *buf = ddp_malloc(READ_CHUNK);
    if (!buf) {
        close(fd);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", path);
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int rc = 0;
    uint64_t at = 0;
    uint32_t c = 0;
    for (;;) {
        ssize_t r = pread(fd, buf, READ_CHUNK, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = -errno;
            ddp_errinfo_set(ei, rc, "%s: read at offset %llu: %s", path, (unsigned long long)at,
                            strerror(errno));
            break;
        }
        if (r == 0) break;
        c = ddp_crc32c_update(c, buf, (size_t)r);
        at += (uint64_t)r;
    }
    free(buf);
    close(fd);
    if (rc == 0) {
        *size = at;
        *crc32c = c;
    }
    return rc;
}

int ddp_manifest_verify(const char *dir, ddp_manifest_t *out, ddp_errinfo_t *ei)
{
    char path[PATH_MAX];
    ddp_manifest_t m;
    snprintf(path, sizeof path, "%s/%s", dir, DDP_MANIFEST_NAME);
    int rc = ddp_manifest_read(path, &m, ei);
    if (rc < 0) goto out;
    for (size_t i = 0; i < m.n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, m.e[i].name);
        if (stat(path, &st) < 0) {
            rc = DDP_EFORMAT;
            ddp_errinfo_set(ei, rc, "%s: listed in the manifest but missing", path);
            ddp_errinfo_path(ei, "%s", path);
            goto out;
        }
        if ((uint64_t)st.st_size != m.e[i].size) {
            rc = DDP_EFORMAT;
            ddp_errinfo_set(ei, rc, "%s: %llu bytes, the manifest says %llu (%s)", path,
                            (unsigned long long)st.st_size, (unsigned long long)m.e[i].size,
                            (uint64_t)st.st_size < m.e[i].size ? "truncated" : "grown");
            ddp_errinfo_path(ei, "%s", path);
            goto out;
        }
    }
    for (size_t i = 0; i < m.n; i++) {
        uint64_t size;
        uint32_t crc;
        snprintf(path, sizeof path, "%s/%s", dir, m.e[i].name);
        rc = ddp_file_crc32c(path, &size, &crc, ei);
        if (rc < 0) goto out;
        if (size != m.e[i].size || crc != m.e[i].crc32c) {
            rc = DDP_ECHECKSUM;
            ddp_errinfo_set(ei, rc, "%s: checksum mismatch (crc32c %08" PRIx32
                                    ", the manifest says %08" PRIx32 ")",
                            path, crc, m.e[i].crc32c);
            ddp_errinfo_path(ei, "%s", path);
            goto out;
        }
    }
out:
    if (rc == 0 && out)
        *out = m;
    else
        ddp_manifest_close(&m);
    return rc;
}
