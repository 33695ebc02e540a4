/* ddp-prep's BPE path (see prep_bpe.h): read, cut at line starts, encode in parallel, hand on
 * in order.
 *
 * Invariants: buf[0, len) holds the file's bytes from offset base on that are not yet handed
 * on; a chunk is cut only where the next byte is known (or at the end of the file), so the cuts
 * depend on the file alone, never on the number of threads or on read sizes.
 */
#include "worker/prep/prep_bpe.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"

#define CHUNK (1u << 18)
#define CHUNKS_PER_THREAD 4

typedef struct chunk {
    size_t start, end; /* in buf */
    size_t bad;        /* offset of invalid UTF-8 in the chunk, or SIZE_MAX */
    int rc;
    ddp_tok_ids_t ids;
} chunk_t;

struct ddp__prep_bpe {
    const ddp_tok_t *t;
    int threads;
    uint32_t bos, eos;
    ddp_tok_enc_t **enc; /* [threads] */
    chunk_t *chunks;     /* [threads * CHUNKS_PER_THREAD] */
    size_t max_chunks;
    /* one batch */
    const unsigned char *buf;
    size_t n_chunks;
    atomic_size_t next;
};

int ddp__prep_bpe_new(const ddp_tok_t *t, int threads, uint32_t bos, uint32_t eos,
                      ddp__prep_bpe_t **out)
{
    *out = NULL;
    ddp__prep_bpe_t *p = ddp_calloc(1, sizeof *p);
    if (!p) return DDP_ENOMEM;
    p->t = t;
    p->threads = threads < 1 ? 1 : threads;
    p->bos = bos;
    p->eos = eos;
    p->max_chunks = (size_t)p->threads * CHUNKS_PER_THREAD;
    p->enc = ddp_calloc((size_t)p->threads, sizeof *p->enc);
    p->chunks = ddp_calloc(p->max_chunks, sizeof *p->chunks);
    int rc = p->enc && p->chunks ? 0 : DDP_ENOMEM;
    for (int i = 0; !rc && i < p->threads; i++) rc = ddp_tok_enc_new(t, &p->enc[i]);
    if (rc) {
        ddp__prep_bpe_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void ddp__prep_bpe_free(ddp__prep_bpe_t *p)
{
    if (!p) return;
    if (p->enc)
        for (int i = 0; i < p->threads; i++) ddp_tok_enc_free(p->enc[i]);
    if (p->chunks)
        for (size_t i = 0; i < p->max_chunks; i++) free(p->chunks[i].ids.ids);
    free(p->enc);
    free(p->chunks);
    free(p);
}

typedef struct worker_arg {
    ddp__prep_bpe_t *p;
    int tid;
} worker_arg_t;

/* Encodes chunks until none is left; any thread. */
static void *encode_chunks(void *arg)
{
    worker_arg_t *w = arg;
    ddp__prep_bpe_t *p = w->p;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_chunks) break;
        chunk_t *c = &p->chunks[i];
        const unsigned char *s = p->buf + c->start;
        size_t n = c->end - c->start;
        c->ids.len = 0;
        c->rc = 0;
        size_t bad = ddp_tok_utf8_check(s, n);
        c->bad = bad < n ? bad : SIZE_MAX;
        if (c->bad == SIZE_MAX) c->rc = ddp_tok_encode(p->enc[w->tid], (const char *)s, n, &c->ids);
    }
    return NULL;
}

static int run_batch(ddp__prep_bpe_t *p)
{
    atomic_store(&p->next, 0);
    int extra = p->threads - 1;
    if ((size_t)extra > p->n_chunks - 1) extra = (int)p->n_chunks - 1;
    pthread_t th[256];
    worker_arg_t args[257];
    if (extra > 256) extra = 256;
    int started = 0;
    for (int i = 0; i < extra; i++) {
        args[i + 1] = (worker_arg_t){p, i + 1};
        if (pthread_create(&th[i], NULL, encode_chunks, &args[i + 1]) != 0) break;
        started++;
    }
    args[0] = (worker_arg_t){p, 0};
    encode_chunks(&args[0]);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    return 0;
}

/* A line start: buf[pos - 1] is '\n' and buf[pos] a printable ASCII character, not space. */
static int safe_cut(const unsigned char *buf, size_t pos)
{
    return buf[pos - 1] == '\n' && buf[pos] > 0x20 && buf[pos] < 0x7f;
}

/* The first cut at or after `from` (and after `start`) that can be known from buf[0, len):
 * len itself at the end of the file, SIZE_MAX when more bytes are needed. */
static size_t find_cut(const unsigned char *buf, size_t start, size_t from, size_t len, int eof)
{
    size_t pos = from > start + 1 ? from : start + 1;
    while (pos < len) {
        const unsigned char *nl = memchr(buf + pos - 1, '\n', len - (pos - 1));
        if (!nl) break;
        pos = (size_t)(nl - buf) + 1;
        if (pos >= len) break;
        if (safe_cut(buf, pos)) return pos;
        pos++;
    }
    return eof ? len : SIZE_MAX;
}

int ddp__prep_bpe_file(ddp__prep_bpe_t *p, const char *path, size_t val_from,
                       ddp__prep_sink_fn sink, void *ctx, size_t *bytes)
{
    *bytes = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        fprintf(stderr, "ddp-prep: cannot open %s: %s\n", path, strerror(errno));
        return rc;
    }
    size_t cap = p->max_chunks * CHUNK + CHUNK, len = 0, base = 0;
    unsigned char *buf = ddp_malloc(cap);
    int rc = buf ? 0 : DDP_ENOMEM;
    int eof = 0, first = 1, last_val = val_from == 0;
    size_t want = p->max_chunks * CHUNK;
    while (!rc) {
        while (!eof && len < want) {
            if (len == cap) {
                unsigned char *nb = ddp_realloc(buf, cap * 2);
                if (!nb) {
                    rc = DDP_ENOMEM;
                    break;
                }
                buf = nb;
                cap *= 2;
            }
            ssize_t r = read(fd, buf + len, cap - len);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                rc = -errno;
                fprintf(stderr, "ddp-prep: cannot read %s: %s\n", path, strerror(errno));
                break;
            }
            if (r == 0) eof = 1;
            len += (size_t)r;
        }
        if (rc) break;
        /* cut the batch into chunks */
        size_t s = 0;
        p->n_chunks = 0;
        while (p->n_chunks < p->max_chunks && s < len) {
            size_t target = s + CHUNK;
            if (base + s < val_from && base + target > val_from) target = val_from - base;
            size_t e = find_cut(buf, s, target, len, eof);
            if (e == SIZE_MAX) break;
            chunk_t *c = &p->chunks[p->n_chunks++];
            c->start = s;
            c->end = e;
            s = e;
        }
        if (p->n_chunks == 0) {
            if (eof) break;
            want = len * 2; /* one long stretch without a cut: read more */
            continue;
        }
        want = p->max_chunks * CHUNK;
        p->buf = buf;
        run_batch(p);
        for (size_t i = 0; i < p->n_chunks && !rc; i++) {
            chunk_t *c = &p->chunks[i];
            if (c->bad != SIZE_MAX) {
                size_t at = base + c->start + c->bad;
                fprintf(stderr,
                        "ddp-prep: %s: byte offset %zu: invalid UTF-8 (byte 0x%02x); "
                        "a tokenizer reads UTF-8 text only\n",
                        path, at, buf[c->start + c->bad]);
                rc = DDP_EFORMAT;
                break;
            }
            if (c->rc) {
                fprintf(stderr, "ddp-prep: %s: cannot tokenize bytes %zu..%zu: %s\n", path,
                        base + c->start, base + c->end, ddp_strerror(c->rc));
                rc = c->rc;
                break;
            }
            int val = base + c->start >= val_from;
            if (first && p->bos != UINT32_MAX) rc = sink(ctx, val, &p->bos, 1);
            first = 0;
            if (!rc) rc = sink(ctx, val, c->ids.ids, c->ids.len);
            last_val = val;
        }
        memmove(buf, buf + s, len - s);
        base += s;
        len -= s;
        if (eof && len == 0) break;
    }
    if (!rc && first && p->bos != UINT32_MAX) rc = sink(ctx, last_val, &p->bos, 1);
    if (!rc && p->eos != UINT32_MAX) rc = sink(ctx, last_val, &p->eos, 1);
    *bytes = base + len;
    free(buf);
    close(fd);
    return rc;
}
