/* data.tokenizer of a run (see run_tokenizer.h). */
#include "worker/data/run_tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"

#define MAX_TOKENIZER_BYTES ((size_t)1 << 30) /* Llama 3's is 9 MB */

/* A refusal of data.tokenizer: DDP_ESPEC (or rc when it is DDP_ENOMEM), the field as ei's path
 * and the message (which names the file). */
static int refuse(ddp_errinfo_t *ei, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refuse(ddp_errinfo_t *ei, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rc = ddp_errinfo_vset(ei, rc == DDP_ENOMEM ? rc : DDP_ESPEC, fmt, ap);
    va_end(ap);
    ddp_errinfo_path(ei, "data.tokenizer");
    return rc;
}

/* Reads a text file whole; a NUL inside is refused (the checkpoint stores it as a C string).
 * Returns 0, or a refusal naming the file. */
static int read_text(const char *path, char **out, size_t *len, ddp_errinfo_t *ei)
{
    int rc = ddp_file_read(path, MAX_TOKENIZER_BYTES, out, len);
    if (rc < 0)
        return refuse(ei, rc, "%s: cannot read: %s", path,
                      rc == -EFBIG ? "larger than 1 GiB" : ddp_strerror(rc));
    if (strlen(*out) != *len)
        return refuse(ei, DDP_EFORMAT, "%s: holds a NUL byte at offset %zu: not JSON", path,
                      strlen(*out));
    return 0;
}

/* The tokenizer_config.json beside `path`, into buf. */
static void config_path(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(buf, len, "%.*s/tokenizer_config.json", (int)(slash - path), path);
    else
        snprintf(buf, len, "tokenizer_config.json");
}

/* The id of tokenizer_config.json's `key` (bos_token / eos_token): -1 when absent or null. */
static int config_id(const ddp_run_tokenizer_t *rt, json_t *root, const char *cfg, const char *key,
                     long *id, ddp_errinfo_t *ei)
{
    *id = -1;
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return refuse(ei, DDP_EFORMAT,
                      "%s: %s: not a string, an object with \"content\" or "
                      "null",
                      cfg, key);
    uint32_t u;
    if (ddp_tok_find(rt->tok, json_string_value(v), &u) < 0)
        return refuse(ei, DDP_EFORMAT, "%s: %s '%s' is not a token of the tokenizer beside it", cfg,
                      key, json_string_value(v));
    *id = (long)u;
    return 0;
}

/* The first of names[] that is a token of the tokenizer, or -1. */
static long known_id(const ddp_run_tokenizer_t *rt, const char *const *names)
{
    uint32_t u;
    for (; *names; names++)
        if (ddp_tok_find(rt->tok, *names, &u) == 0) return (long)u;
    return -1;
}

/* BOS and EOS: tokenizer_config.json's when it is there, else the well-known ones. */
static int find_ids(ddp_run_tokenizer_t *rt, const char *path, ddp_errinfo_t *ei)
{
    char cfg[PATH_MAX + 32];
    config_path(path, cfg, sizeof cfg);
    int rc = ddp_file_read(cfg, MAX_TOKENIZER_BYTES, &rt->config_json, &rt->config_len);
    if (rc == -ENOENT) {
        static const char *const bos[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>", NULL};
        static const char *const eos[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", NULL};
        rt->ids = (ddp_hf_ids_t){known_id(rt, bos), known_id(rt, eos)};
        return 0;
    }
    if (rc < 0) return refuse(ei, rc, "%s: cannot read: %s", cfg, ddp_strerror(rc));
    if (strlen(rt->config_json) != rt->config_len)
        return refuse(ei, DDP_EFORMAT, "%s: holds a NUL byte: not JSON", cfg);
    json_error_t je;
    json_t *root = json_loads(rt->config_json, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return refuse(ei, DDP_EFORMAT, "%s: not a JSON object (line %d: %s)", cfg, je.line,
                      root ? "another value" : je.text);
    }
    rc = config_id(rt, root, cfg, "bos_token", &rt->ids.bos, ei);
    if (rc == 0) rc = config_id(rt, root, cfg, "eos_token", &rt->ids.eos, ei);
    json_decref(root);
    return rc;
}

int ddp_run_tokenizer_open(const char *path, int vocab_size, ddp_run_tokenizer_t **out,
                           ddp_errinfo_t *ei)
{
    *out = NULL;
    if (!path || !path[0]) return 0;
    ddp_run_tokenizer_t *rt = ddp_calloc(1, sizeof *rt);
    if (!rt) return refuse(ei, DDP_ENOMEM, "%s: out of memory", path);
    int rc = read_text(path, &rt->json, &rt->json_len, ei);
    if (rc == 0) {
        ddp_errinfo_t tei;
        ddp_errinfo_clear(&tei);
        rc = ddp_tok_load(path, &rt->tok, &tei);
        if (rc < 0) rc = refuse(ei, rc, "%s: %s", path, tei.msg[0] ? tei.msg : ddp_strerror(rc));
    }
    if (rc == 0 && ddp_tok_vocab_size(rt->tok) > (uint32_t)vocab_size)
        rc = refuse(ei, DDP_EFORMAT, "%s has %u tokens, more than model.vocab_size %d", path,
                    ddp_tok_vocab_size(rt->tok), vocab_size);
    if (rc == 0) rc = find_ids(rt, path, ei);
    if (rc < 0) {
        ddp_run_tokenizer_free(rt);
        return rc;
    }
    *out = rt;
    return 0;
}

/* dir/name from text[0, len): a temporary file, fsync, rename over name. */
static int write_atomic(const char *dir, const char *name, const char *text, size_t len,
                        ddp_errinfo_t *ei)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path ||
        (size_t)snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= sizeof tmp)
        return ddp_errinfo_set(ei, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    int fd = ddp_file_create(tmp, ei);
    if (fd < 0) return fd;
    int rc = 0;
    for (size_t off = 0; off < len && rc == 0;) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0)
            rc = ddp_errinfo_set(ei, -errno, "%s: write: %s", tmp, strerror(errno));
        else
            off += (size_t)w;
    }
    rc = ddp_file_sync_close(fd, tmp, rc, ei);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = ddp_errinfo_set(ei, -errno, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc < 0) (void)unlink(tmp);
    return rc;
}

int ddp_run_tokenizer_save(const ddp_run_tokenizer_t *rt, const char *dir, ddp_errinfo_t *ei)
{
    DDP_CHECK(write_atomic(dir, "tokenizer.json", rt->json, rt->json_len, ei));
    if (rt->config_json)
        DDP_CHECK(write_atomic(dir, "tokenizer_config.json", rt->config_json, rt->config_len, ei));
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ddp_errinfo_set(ei, -errno, "%s: open: %s", dir, strerror(errno));
    return ddp_file_sync_close(fd, dir, 0, ei); /* the renames are durable */
}

void ddp_run_tokenizer_free(ddp_run_tokenizer_t *rt)
{
    if (!rt) return;
    ddp_tok_free(rt->tok);
    free(rt->json);
    free(rt->config_json);
    free(rt);
}
