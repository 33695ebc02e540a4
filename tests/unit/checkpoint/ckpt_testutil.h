/* Shared helpers for the checkpoint tests and the format-check helper: a small GPT-2-shaped
 * state with Hugging Face names, deterministic contents, temporary directories. Header-only
 * (static functions) so each test binary stays one file plus this. */
#ifndef DDP_TESTS_UNIT_CHECKPOINT_TESTUTIL_H
#define DDP_TESTS_UNIT_CHECKPOINT_TESTUTIL_H

#include <dirent.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/test_hook.h"
#include "worker/checkpoint/checkpoint.h"

typedef struct tstate {
    ddp_ckpt_tensor_t *model, *optim;
    size_t n_model, n_optim;
    char **names; /* owned strings */
    size_t n_names;
    uint64_t bytes;
} tstate_t;

/* Writes n bytes of p to path; aborts the test program when it cannot. */
static inline void tu_write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        abort();
    }
    fclose(f);
}

/* path's size in bytes, or -1. */
static inline long long tu_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static inline uint32_t tu_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static inline char *tu_name(tstate_t *ts, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline char *tu_name(tstate_t *ts, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ts->names = realloc(ts->names, (ts->n_names + 1) * sizeof *ts->names);
    return ts->names[ts->n_names++] = strdup(buf);
}

static inline void tu_tensor(ddp_ckpt_tensor_t *t, const char *name, int ndim, int64_t d0, int64_t d1)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = DDP_ST_F32;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = 4 * (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1);
}

/* GPT-2 with HF names: wte [V,C], wpe [T,C], per layer ln_1, attn.c_attn [C,3C], attn.c_proj,
 * ln_2, mlp.c_fc [C,4C], mlp.c_proj [4C,C], then ln_f; moments exp_avg.* and exp_avg_sq.*
 * when `optim`. Contents from `seed`. */
static inline void tu_make(tstate_t *ts, int V, int T, int C, int L, int optim, uint64_t seed)
{
    memset(ts, 0, sizeof *ts);
    size_t cap = 2 + 12 * (size_t)L + 2;
    ts->model = calloc(cap, sizeof *ts->model);
    size_t n = 0;
    tu_tensor(&ts->model[n++], "wte.weight", 2, V, C);
    tu_tensor(&ts->model[n++], "wpe.weight", 2, T, C);
    for (int l = 0; l < L; l++) {
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.ln_1.weight", l), 1, C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.ln_1.bias", l), 1, C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.attn.c_attn.weight", l), 2, C, 3 * C);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.attn.c_attn.bias", l), 1, 3 * C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.attn.c_proj.weight", l), 2, C, C);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.attn.c_proj.bias", l), 1, C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.ln_2.weight", l), 1, C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.ln_2.bias", l), 1, C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.mlp.c_fc.weight", l), 2, C, 4 * C);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.mlp.c_fc.bias", l), 1, 4 * C, 0);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.mlp.c_proj.weight", l), 2, 4 * C, C);
        tu_tensor(&ts->model[n++], tu_name(ts, "h.%d.mlp.c_proj.bias", l), 1, C, 0);
    }
    tu_tensor(&ts->model[n++], "ln_f.weight", 1, C, 0);
    tu_tensor(&ts->model[n++], "ln_f.bias", 1, C, 0);
    ts->n_model = n;
    if (optim) {
        ts->optim = calloc(2 * n, sizeof *ts->optim);
        for (int m = 0; m < 2; m++)
            for (size_t i = 0; i < n; i++) {
                ddp_ckpt_tensor_t *t = &ts->optim[m * n + i];
                *t = ts->model[i];
                t->name = tu_name(ts, "%s.%s", m ? "exp_avg_sq" : "exp_avg", ts->model[i].name);
            }
        ts->n_optim = 2 * n;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++) {
        ddp_ckpt_tensor_t *t = i < n ? &ts->model[i] : &ts->optim[i - n];
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        float *f = t->data;
        for (uint64_t k = 0; k < t->nbytes / 4; k++)
            f[k] = (float)((int32_t)tu_rng(&s) - (1 << 30)) / (float)(1 << 30);
        ts->bytes += t->nbytes;
    }
}

/* Same names and shapes as `src`, zeroed data (destinations for a load). */
static inline void tu_like(tstate_t *dst, const tstate_t *src)
{
    memset(dst, 0, sizeof *dst);
    dst->n_model = src->n_model;
    dst->n_optim = src->n_optim;
    dst->model = calloc(src->n_model & 0xffffff, sizeof *dst->model);
    dst->optim = src->n_optim ? calloc(src->n_optim, sizeof *dst->optim) : NULL;
    for (size_t i = 0; i < src->n_model + src->n_optim; i++) {
        const ddp_ckpt_tensor_t *s = i < src->n_model ? &src->model[i] : &src->optim[i - src->n_model];
        ddp_ckpt_tensor_t *d = i < src->n_model ? &dst->model[i] : &dst->optim[i - src->n_model];
        *d = *s;
        d->data = calloc(1, s->nbytes ? s->nbytes : 1);
        dst->bytes += s->nbytes;
    }
}

static inline void tu_free(tstate_t *ts)
{
    for (size_t i = 0; i < ts->n_model; i++) free(ts->model[i].data);
    for (size_t i = 0; i < ts->n_optim; i++) free(ts->optim[i].data);
    for (size_t i = 0; i < ts->n_names; i++) free(ts->names[i]);
    free(ts->names);
    free(ts->model);
    free(ts->optim);
    memset(ts, 0, sizeof *ts);
}

static inline int tu_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

static inline void tu_rmrf(const char *path) { nftw(path, tu_rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static inline char *tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    size_t n = strlen(base) + 32;
    char *p = malloc(n);
    if (!p) abort();
    snprintf(p, n, "%s/ddp-ckpt-XXXXXX", base);
    if (!mkdtemp(p)) abort();
    return p;
}

static inline ddp_ckpt_state_t tu_state(const tstate_t *ts, int64_t step, const char *trainer)
{
    ddp_ckpt_state_t st = {.step = step, .model = ts->model, .n_model = ts->n_model,
                           .optim = ts->optim, .n_optim = ts->n_optim,
                           .config_json = "{\"model_type\": \"gpt2\", \"n_layer\": 2}",
                           .trainer_json = trainer};
    return st;
}

/* Moves the model tensors into one arena and each moment (when there are moments) into another,
 * tensor after tensor, allocated as the CPU trainer allocates its arenas (ddp_alloc_big), so
 * writes can span tensors and go O_DIRECT. Returns 0 or -1 (out of memory). Free them with
 * tu_arenas_free before tu_free. */
static inline int tu_arenas(tstate_t *ts, void *arenas[3])
{
    size_t n = ts->n_model;
    for (int a = 0; a < 3; a++) arenas[a] = NULL;
    for (int a = 0; a < (ts->n_optim ? 3 : 1); a++) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) bytes += ts->model[i].nbytes;
        unsigned char *base = ddp_alloc_big(bytes);
        if (!base) return -1;
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            ddp_ckpt_tensor_t *t = a == 0 ? &ts->model[i] : &ts->optim[(size_t)(a - 1) * n + i];
            memcpy(base + off, t->data, t->nbytes);
            free(t->data);
            t->data = base + off;
            off += t->nbytes;
        }
        arenas[a] = base;
    }
    return 0;
}

/* Gives the tensors back small heap blocks (so tu_free can free them) and frees the arenas. */
static inline void tu_arenas_free(tstate_t *ts, void *arenas[3])
{
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++)
        (i < ts->n_model ? &ts->model[i] : &ts->optim[i - ts->n_model])->data = malloc(1);
    for (int a = 0; a < 3; a++) free(arenas[a]);
}

/* Reads a whole file into *buf (malloc'd; the caller frees). Returns 0, or -1. */
static inline int tu_read_file(const char *path, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(*len ? *len : 1);
    size_t got = fread(*buf, 1, *len, f);
    fclose(f);
    return got == *len ? 0 : -1;
}

/* Copies every tensor of `ts` into ref (same names/shapes). */
static inline void tu_copy(tstate_t *ref, const tstate_t *ts)
{
    tu_like(ref, ts);
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++) {
        const ddp_ckpt_tensor_t *a = i < ts->n_model ? &ts->model[i] : &ts->optim[i - ts->n_model];
        ddp_ckpt_tensor_t *b = i < ts->n_model ? &ref->model[i] : &ref->optim[i - ts->n_model];
        memcpy(b->data, a->data, a->nbytes);
    }
}

/* Entries of dir that a save in progress (or one that failed or crashed) leaves: .step-*.tmp
 * directories and a .latest.tmp link, their names joined by spaces into buf ("" when none).
 * Returns how many. */
static inline int tu_stale_entries(const char *dir, char *buf, size_t len)
{
    int n = 0;
    size_t used = 0;
    buf[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        bool tmp = !strncmp(e->d_name, ".step-", 6) && l > 4 && !strcmp(e->d_name + l - 4, ".tmp");
        if (!tmp && strcmp(e->d_name, ".latest.tmp")) continue;
        int w = snprintf(buf + used, len - used, "%s%s", n ? " " : "", e->d_name);
        if (w > 0 && used + (size_t)w < len) used += (size_t)w;
        n++;
    }
    closedir(d);
    return n;
}

/* Captures this process's stderr (where the log goes) in memory from tu_capture_begin until
 * tu_capture_end, which restores it and returns what was written (malloc'd; the caller frees),
 * echoing it to the restored stderr so that a failing test still shows it. */
static inline int tu_capture_begin(void)
{
    int fd = memfd_create("stderr", MFD_CLOEXEC);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    if (fd < 0 || saved < 0 || dup2(fd, STDERR_FILENO) < 0) abort();
    close(fd);
    return saved;
}

static inline char *tu_capture_end(int saved)
{
    fflush(stderr);
    off_t n = lseek(STDERR_FILENO, 0, SEEK_END);
    char *text = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (!text) abort();
    ssize_t got = n > 0 ? pread(STDERR_FILENO, text, (size_t)n, 0) : 0;
    text[got > 0 ? got : 0] = 0;
    if (dup2(saved, STDERR_FILENO) < 0) abort();
    close(saved);
    fputs(text, stderr);
    return text;
}

/* Counts the error-level lines of a captured log ("HH:MM:SS.mmm error ..."), cutting each at its
 * newline; *last gets the last one's text after the level (NULL when none). */
static inline int tu_error_lines(char *log, const char **last)
{
    int n = 0;
    *last = NULL;
    for (char *line = log; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (strlen(line) > 19 && !strncmp(line + 12, " error ", 7)) {
            n++;
            *last = line + 19;
        }
        line = nl ? nl + 1 : NULL;
    }
    return n;
}

#ifdef cmocka_unit_test /* for test binaries that include cmocka.h first */
/* A saver (keep_last 0) that pauses delay_ms after each shard it writes (the test hook, on
 * until tu_slow_saver_free). */
static inline ddp_ckpt_saver_t *tu_slow_saver(const char *dir, double shard_mb, const char *delay_ms)
{
    ddp_test_hooks_set(&(ddp_test_hooks_t){.ckpt_shard_delay_ms = atol(delay_ms)});
    ddp_ckpt_opts_t o = {.dir = dir, .shard_mb = shard_mb, .keep_last = 0};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
    return s;
}

/* Frees a saver of tu_slow_saver and switches its pause off. */
static inline void tu_slow_saver_free(ddp_ckpt_saver_t *s)
{
    ddp_ckpt_saver_free(s);
    ddp_test_hooks_set(NULL);
}

static inline void tu_assert_same_state(const tstate_t *a, const tstate_t *b)
{
    assert_int_equal(a->n_model, b->n_model);
    assert_int_equal(a->n_optim, b->n_optim);
    for (size_t i = 0; i < a->n_model + a->n_optim; i++) {
        const ddp_ckpt_tensor_t *x = i < a->n_model ? &a->model[i] : &a->optim[i - a->n_model];
        const ddp_ckpt_tensor_t *y = i < b->n_model ? &b->model[i] : &b->optim[i - b->n_model];
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->nbytes, y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes) != 0) fail_msg("tensor %s differs", x->name);
    }
}
#endif

#endif
