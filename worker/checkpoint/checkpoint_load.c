/* Checkpoint loading: choosing the newest verified checkpoint, copying shards tensor by tensor
 * into the caller's destinations, and initialising weights from any GPT-2 safetensors directory.
 *
 * Memory: a shard is mapped (not read), each tensor is copied in COPY_CHUNK pieces and the pages
 * of each piece are dropped from this process right after (ddp_st_release), and the shard is
 * unmapped before the next is opened; so the resident set grows by about one piece, not by a
 * tensor, a shard or the checkpoint.
 */
#include "checkpoint.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "common/alloc.h"
#include "common/log.h"
#include "manifest.h"

#define COPY_CHUNK (2u << 20) /* small: it bounds the resident growth of a load */
#define MAX_TEXT (64u << 20)

int ddp_ckpt_verify(const char *ckpt_path, ddp_errinfo_t *ei)
{
    return ddp_manifest_verify(ckpt_path, NULL, ei);
}

int ddp_ckpt_find(const char *dir, int64_t step, ddp_ckpt_found_t *out, ddp_errinfo_t *ei)
{
    memset(out, 0, sizeof *out);
    out->step = -1;
    int64_t *steps;
    size_t n;
    int rc = ddp__ckpt_list_steps(dir, &steps, &n);
    if (rc < 0) return ddp_errinfo_set(ei, rc, "%s: cannot list: %s", dir, ddp_strerror(rc));
    int found = 0, tried = 0;
    ddp_errinfo_t last;
    ddp_errinfo_clear(&last);
    for (size_t k = n; k-- > 0 && !found;) {
        if (step >= 0 && steps[k] != step) continue;
        char path[PATH_MAX];
        ddp_errinfo_t e;
        ddp_errinfo_clear(&e);
        snprintf(path, sizeof path, "%s/" DDP__CKPT_STEP_FMT, dir, (long long)steps[k]);
        tried++;
        int vr = ddp_ckpt_verify(path, &e);
        if (vr == 0) {
            snprintf(out->path, sizeof out->path, "%s", path);
            out->step = steps[k];
            found = 1;
            break;
        }
        if (vr == DDP_ENOMEM) { /* not the checkpoint's fault: do not skip it */
            free(steps);
            if (ei) *ei = e;
            return vr;
        }
        if (vr == -ENOENT && !strstr(e.msg, DDP_MANIFEST_NAME))
            ddp_errinfo_set(&e, vr, "%s/%s: missing", path, DDP_MANIFEST_NAME);
        DDP_WARN("checkpoint %s skipped: %s", path, e.msg);
        if (out->n_skipped < DDP_CKPT_MAX_SKIPPED) {
            ddp_ckpt_skip_t *sk = &out->skipped[out->n_skipped++];
            sk->step = steps[k];
            sk->rc = vr;
            snprintf(sk->reason, sizeof sk->reason, "%s", e.msg);
        }
        last = e;
    }
    free(steps);
    if (!found) {
        if (step >= 0 && !tried)
            return ddp_errinfo_set(ei, DDP_ENOTFOUND, "%s: no checkpoint for step %lld", dir,
                                   (long long)step);
        if (!tried) return ddp_errinfo_set(ei, DDP_ENOTFOUND, "%s: no checkpoint", dir);
        return ddp_errinfo_set(ei, DDP_ENOTFOUND, "%s: no checkpoint verifies (%d tried; last: %s)",
                               dir, tried, last.msg);
    }
    char lp[PATH_MAX], target[PATH_MAX];
    snprintf(lp, sizeof lp, "%s/latest", dir);
    ssize_t tl = readlink(lp, target, sizeof target - 1);
    if (tl > 0) {
        target[tl] = 0;
        if (step < 0 && strcmp(target, strrchr(out->path, '/') + 1) != 0)
            DDP_WARN("checkpoint: %s points to %s, but the newest that verifies is %s", lp, target,
                     out->path);
    }
    return 0;
}

/* ---------------------------------------------------------------- copying */

typedef struct load_ctx {
    const char *dir;
    const char *base; /* "model" or "optim" */
    ddp_ckpt_tensor_t *dst;
    size_t n;
    ddp_ckpt_copy_fn copy;
    void *copy_ctx;
    int lenient;   /* init_from: prefixes, extra tensors and dtype conversion allowed */
    char *found;   /* per destination */
    float *bounce; /* conversion buffer, COPY_CHUNK bytes */
    json_t *weight_map;
} load_ctx_t;

static int do_copy(load_ctx_t *c, void *dst, const void *src, size_t n)
{
    if (c->copy) return c->copy(dst, src, n, c->copy_ctx);
    memcpy(dst, src, n);
    return 0;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int shape_eq(const ddp_ckpt_tensor_t *d, const ddp_st_tensor_t *s)
{
    if (d->ndim != s->ndim) return 0;
    for (int i = 0; i < d->ndim; i++)
        if (d->shape[i] != s->shape[i]) return 0;
    return 1;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int copy_tensor(load_ctx_t *c, const ddp_st_file_t *f, const ddp_st_tensor_t *s,
                       ddp_ckpt_tensor_t *d, ddp_errinfo_t *ei)
{
    const char *path = ddp_st_path(f);
    if (!shape_eq(d, s)) {
        char a[128], b[128];
        shape_str(s->ndim, s->shape, a, sizeof a);
        shape_str(d->ndim, d->shape, b, sizeof b);
        return ddp_errinfo_set(ei, DDP_EFORMAT, "%s: tensor '%s' has shape %s, the model wants %s",
                               path, s->name, a, b);
    }
    int convert = 0;
    if (s->dtype != d->dtype) {
        if (!c->lenient || d->dtype != DDP_ST_F32 ||
            (s->dtype != DDP_ST_BF16 && s->dtype != DDP_ST_F16))
            return ddp_errinfo_set(ei, DDP_EFORMAT, "%s: tensor '%s' is %s, the model wants %s",
                                   path, s->name, ddp_st_dtype_name(s->dtype),
                                   ddp_st_dtype_name(d->dtype));
        convert = 1;
        if (!c->bounce && !(c->bounce = ddp_malloc(COPY_CHUNK)))
            return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    }
    const unsigned char *src = s->data;
    unsigned char *dst = d->data;
    if (s->nbytes && !dst)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: tensor '%s' has no destination",
                               d->name);
    if (!convert) {
        for (uint64_t off = 0; off < s->nbytes; off += COPY_CHUNK) {
            size_t n = s->nbytes - off < COPY_CHUNK ? (size_t)(s->nbytes - off) : COPY_CHUNK;
            int rc = do_copy(c, dst + off, src + off, n);
            if (rc < 0)
                return ddp_errinfo_set(ei, rc, "%s: copying tensor '%s': %s", path, s->name,
                                       ddp_strerror(rc));
            ddp_st_release(f, src + off, n);
        }
        return 0;
    }
    uint64_t count = s->nbytes / 2, per = COPY_CHUNK / 4;
    for (uint64_t i = 0; i < count; i += per) {
        size_t k = count - i < per ? (size_t)(count - i) : (size_t)per;
        const unsigned char *p = src + 2 * i;
        for (size_t j = 0; j < k; j++) {
            uint16_t h = (uint16_t)(p[2 * j] | (p[2 * j + 1] << 8));
            if (s->dtype == DDP_ST_BF16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&c->bounce[j], &bits, 4);
            } else {
                c->bounce[j] = half_to_float(h);
            }
        }
        int rc = do_copy(c, dst + 4 * i, c->bounce, 4 * k);
        if (rc < 0)
            return ddp_errinfo_set(ei, rc, "%s: copying tensor '%s': %s", path, s->name,
                                   ddp_strerror(rc));
        ddp_st_release(f, p, 2 * k);
    }
    return 0;
}

static ddp_ckpt_tensor_t *lookup(load_ctx_t *c, const char *name, size_t *idx)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->dst[i].name, name)) {
            *idx = i;
            return &c->dst[i];
        }
    return NULL;
}

static int load_file(load_ctx_t *c, const char *file, ddp_errinfo_t *ei)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    ddp_st_file_t *f;
    DDP_CHECK(ddp_st_open(path, &f, ei));
    int rc = 0;
    for (size_t k = 0; k < ddp_st_count(f) && rc == 0; k++) {
        const ddp_st_tensor_t *s = ddp_st_get(f, k);
        const char *name = s->name;
        if (c->lenient && !strncmp(name, "transformer.", 12)) name += 12;
        if (c->weight_map && !c->lenient) {
            const char *wf = json_string_value(json_object_get(c->weight_map, s->name));
            if (!wf || strcmp(wf, file) != 0) {
                rc = ddp_errinfo_set(ei, DDP_EFORMAT,
                                     "%s: tensor '%s' is not listed for this file in the index",
                                     path, s->name);
                break;
            }
        }
        size_t idx = 0;
        ddp_ckpt_tensor_t *d = lookup(c, name, &idx);
        if (!d) {
            if (c->lenient) {
                DDP_DEBUG("init_from %s: ignoring tensor '%s'", path, s->name);
                continue;
            }
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: tensor '%s' is not in the model's state",
                                 path, s->name);
            break;
        }
        if (c->found[idx]) {
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: tensor '%s' appears twice", path, s->name);
            break;
        }
        rc = copy_tensor(c, f, s, d, ei);
        c->found[idx] = 1;
    }
    if (rc < 0 && ei && !ei->path[0]) ddp_errinfo_path(ei, "%s", path);
    ddp_st_close(f);
    return rc;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Loads every file of `base` (single file or index + shards) in c->dir. */
static int load_kind(load_ctx_t *c, ddp_errinfo_t *ei)
{
    char path[PATH_MAX], single[128];
    int rc = 0;
    const char **files = NULL;
    json_t *index = NULL;
    c->found = ddp_calloc(c->n ? c->n : 1, 1);
    if (!c->found) return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    snprintf(single, sizeof single, "%s.safetensors", c->base);
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", c->dir, c->base);
    struct stat st;
    if (stat(path, &st) == 0) {
        json_error_t je;
        index = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!index && json_error_code(&je) == json_error_out_of_memory) goto nomem;
        c->weight_map = index ? json_object_get(index, "weight_map") : NULL;
        if (!json_is_object(c->weight_map)) {
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: not an index (%s)", path,
                                 index ? "no weight_map object" : je.text);
            goto out;
        }
        size_t nw = json_object_size(c->weight_map), nf = 0;
        files = ddp_calloc(nw ? nw : 1, sizeof *files);
        if (!files) goto nomem;
        const char *k;
        json_t *v;
        json_object_foreach(c->weight_map, k, v)
        {
            const char *fn = json_string_value(v);
            if (!fn || strchr(fn, '/') || !strcmp(fn, "..")) {
                rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: bad file for tensor '%s'", path, k);
                goto out;
            }
            files[nf++] = fn;
        }
        qsort(files, nf, sizeof *files, cmp_cstr);
        for (size_t i = 0; i < nf && rc == 0; i++)
            if (i == 0 || strcmp(files[i], files[i - 1]) != 0) rc = load_file(c, files[i], ei);
        if (rc < 0) goto out;
    } else {
        snprintf(path, sizeof path, "%s/%s", c->dir, single);
        if (stat(path, &st) < 0) {
            rc = ddp_errinfo_set(ei, DDP_ENOTFOUND, "%s: no %s or %s.safetensors.index.json",
                                 c->dir, single, c->base);
            goto out;
        }
        DDP_CHECK_GOTO(load_file(c, single, ei), rc, out);
    }
    for (size_t i = 0; i < c->n; i++)
        if (!c->found[i]) {
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: tensor '%s' is missing (%s files)", c->dir,
                                 c->dst[i].name, c->base);
            goto out;
        }
    goto out;
nomem:
    rc = ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
out:
    free(files);
    json_decref(index);
    c->weight_map = NULL;
    free(c->found);
    c->found = NULL;
    free(c->bounce);
    c->bounce = NULL;
    return rc;
}

int ddp_ckpt_load(const char *ckpt_path, ddp_ckpt_load_t *req, ddp_errinfo_t *ei)
{
    req->config_json = req->trainer_json = NULL;
    req->step = -1;
    char path[PATH_MAX];
    ddp_manifest_t m;
    snprintf(path, sizeof path, "%s/%s", ckpt_path, DDP_MANIFEST_NAME);
    int rc = ddp_manifest_read(path, &m, ei);
    ddp_manifest_close(&m);
    if (rc < 0) return rc;
    req->step = m.step;
    load_ctx_t c = {.dir = ckpt_path, .base = "model", .dst = req->model, .n = req->n_model,
                    .copy = req->copy, .copy_ctx = req->copy_ctx};
    DDP_CHECK(load_kind(&c, ei));
    if (req->n_optim) {
        load_ctx_t o = c;
        o.base = "optim";
        o.dst = req->optim;
        o.n = req->n_optim;
        DDP_CHECK(load_kind(&o, ei));
    }
    snprintf(path, sizeof path, "%s/config.json", ckpt_path);
    DDP_CHECK(ddp__ckpt_read_text(path, MAX_TEXT, &req->config_json, ei));
    snprintf(path, sizeof path, "%s/trainer.json", ckpt_path);
    DDP_CHECK(ddp__ckpt_read_text(path, MAX_TEXT, &req->trainer_json, ei));
    return 0;
}

int ddp_ckpt_init_from(const char *dir, ddp_ckpt_tensor_t *model, size_t n_model,
                       ddp_ckpt_copy_fn copy, void *copy_ctx, ddp_errinfo_t *ei)
{
    load_ctx_t c = {.dir = dir, .base = "model", .dst = model, .n = n_model, .copy = copy,
                    .copy_ctx = copy_ctx, .lenient = 1};
    int rc = load_kind(&c, ei);
    if (rc == 0) DDP_INFO("init_from %s: %zu tensors loaded", dir, n_model);
    return rc;
}
