/* The simulated GPU (see simdev.h): allocator, stream threads, events, vector clocks.
 *
 * Invariants (all under g.mu)
 * - g.completed[i] is the sequence number of the last op that ran on stream slot i; sequence
 *   numbers of a slot keep growing across the streams that reuse it, so old clocks stay valid.
 * - A stream's clock[j] is the newest op of slot j known complete before its next op runs; the
 *   host's clock is what the host has seen complete. Launching joins the host's clock into the
 *   stream's (the host queues the op after what it has seen).
 * - g.pending holds the ranges of queued ops that the host does not know complete yet; an entry
 *   leaves once the host's clock covers it.
 * - Device memory is PROT_NONE while g.running == 0 (and DDP_SIM_PROTECT is not 0).
 * - A reservation has committed[i] per granule i; commit and decommit give a granule's pages
 *   back (MADV_DONTNEED), so it reads zero when committed again whatever an op (reported as a
 *   hazard) wrote there meanwhile.
 */
#include "tests/sim/simdev.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

typedef struct alloc {
    struct alloc *next;
    char *base;
    size_t bytes, map_bytes;
    int device;
    size_t granule;           /* the unit of map_bytes: a page, or a reservation's granule */
    unsigned char *committed; /* a reservation's [map_bytes / granule] flags, else NULL */
} alloc_t;

typedef struct op {
    struct op *next;
    ddp_simdev_fn fn;
    void *arg;
    uint64_t seq;
    int wait_stream; /* >= 0: a wait for (wait_stream, wait_seq) instead of fn */
    uint64_t wait_seq;
} op_t;

struct ddp_simdev_stream {
    int id, device;
    char name[32];
    pthread_t thread;
    pthread_cond_t cv;
    op_t *head, *tail;
    uint64_t launched;
    uint64_t clock[DDP_SIMDEV_MAX_STREAMS];
    int stop;
};

typedef struct pending {
    struct pending *next;
    const char *lo, *hi;
    int write;
    int stream;
    uint64_t seq;
    const char *what;
} pending_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t done; /* broadcast when any op completes */
    alloc_t *allocs;
    ddp_simdev_stream_t *streams[DDP_SIMDEV_MAX_STREAMS];
    uint64_t completed[DDP_SIMDEV_MAX_STREAMS];
    uint64_t host_clock[DDP_SIMDEV_MAX_STREAMS];
    pending_t *pending;
    int running;
    int protect; /* -1 unread, 0, 1 */
    long delay_us;
    uint64_t hazards;
    char last[600];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER, .protect = -1};

/* Reads the environment once (under g.mu). */
static void read_env(void)
{
    if (g.protect >= 0) return;
    const char *p = getenv("DDP_SIM_PROTECT"), *d = getenv("DDP_SIM_DELAY_US");
    g.protect = !(p && strcmp(p, "0") == 0);
    g.delay_us = d ? atol(d) : 0;
}

static void set_protection(int prot)
{
    if (!g.protect) return;
    for (alloc_t *a = g.allocs; a; a = a->next)
        if (a->device >= 0 && mprotect(a->base, a->map_bytes, prot) != 0)
            DDP_ERROR("sim: mprotect: %s", strerror(errno));
}

static alloc_t *find(const void *p)
{
    const char *c = p;
    for (alloc_t *a = g.allocs; a; a = a->next)
        if (c >= a->base && c < a->base + (a->bytes ? a->bytes : 1)) return a;
    return NULL;
}

/* Maps and registers an allocation of `bytes` in units of `unit` bytes (a multiple of the
 * page size); a reservation when committed is not NULL (a takes it over, also on failure). */
static int add(int device, size_t bytes, size_t unit, unsigned char *committed, void **out)
{
    *out = NULL;
    alloc_t *a = calloc(1, sizeof *a);
    if (!a) {
        free(committed);
        return DDP_ENOMEM;
    }
    a->bytes = bytes;
    a->map_bytes = ((bytes ? bytes : 1) + unit - 1) / unit * unit;
    a->device = device;
    a->granule = unit;
    a->committed = committed;
    void *p = mmap(NULL, a->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(a->committed);
        free(a);
        return DDP_ENOMEM;
    }
    a->base = p;
    pthread_mutex_lock(&g.mu);
    read_env();
    if (device >= 0 && g.protect && g.running == 0) mprotect(p, a->map_bytes, PROT_NONE);
    a->next = g.allocs;
    g.allocs = a;
    pthread_mutex_unlock(&g.mu);
    *out = p;
    return 0;
}

int ddp_simdev_alloc(int device, size_t bytes, void **out)
{
    *out = NULL;
    if (device < 0 && device != DDP_SIMDEV_PINNED) return DDP_EINVAL;
    return add(device, bytes, (size_t)sysconf(_SC_PAGESIZE), NULL, out);
}

int ddp_simdev_reserve(int device, size_t bytes, size_t granule, void **out)
{
    *out = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (device < 0 || bytes == 0 || granule % page || (granule & (granule - 1)))
        return DDP_EINVAL;
    unsigned char *committed = calloc((bytes + granule - 1) / granule, 1);
    return committed ? add(device, bytes, granule, committed, out) : DDP_ENOMEM;
}

void ddp_simdev_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&g.mu);
    alloc_t **pa = &g.allocs;
    while (*pa && (*pa)->base != (char *)p) pa = &(*pa)->next;
    alloc_t *a = *pa;
    if (a) {
        *pa = a->next;
        for (pending_t **pe = &g.pending; *pe;) { /* what lay there is gone */
            pending_t *e = *pe;
            if (e->lo >= a->base && e->lo < a->base + a->map_bytes) {
                *pe = e->next;
                free(e);
            } else {
                pe = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&g.mu);
    if (!a) {
        DDP_ERROR("sim: free of %p, which is not simulated memory", p);
        return;
    }
    munmap(a->base, a->map_bytes);
    free(a->committed);
    free(a);
}

static int device_of_locked(const void *p, size_t bytes)
{
    alloc_t *a = find(p);
    return !a ? DDP_SIMDEV_HOST
              : (size_t)((const char *)p - a->base) + bytes > a->bytes ? -2 : a->device;
}

int ddp_simdev_device_of(const void *p, size_t bytes)
{
    pthread_mutex_lock(&g.mu);
    int dev = device_of_locked(p, bytes);
    pthread_mutex_unlock(&g.mu);
    return dev;
}

const void *ddp_simdev_end_of(const void *p)
{
    pthread_mutex_lock(&g.mu);
    alloc_t *a = find(p);
    const void *end = a ? a->base + a->bytes : p;
    pthread_mutex_unlock(&g.mu);
    return end;
}

/* ---- streams ---- */

static void join(uint64_t *into, const uint64_t *from)
{
    for (int i = 0; i < DDP_SIMDEV_MAX_STREAMS; i++)
        if (from[i] > into[i]) into[i] = from[i];
}

/* Drops the pending ranges the host knows complete. */
static void prune(void)
{
    for (pending_t **pe = &g.pending; *pe;) {
        pending_t *e = *pe;
        if (g.host_clock[e->stream] >= e->seq) {
            *pe = e->next;
            free(e);
        } else {
            pe = &e->next;
        }
    }
}

static void *stream_main(void *arg)
{
    ddp_simdev_stream_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&g.mu);
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &g.mu);
        op_t *op = s->head;
        if (!op) {
            pthread_mutex_unlock(&g.mu);
            break;
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        if (op->wait_stream >= 0) {
            while (g.completed[op->wait_stream] < op->wait_seq) pthread_cond_wait(&g.done, &g.mu);
            pthread_mutex_unlock(&g.mu);
        } else {
            long delay = g.delay_us;
            pthread_mutex_unlock(&g.mu);
            if (delay > 0) {
                struct timespec ts = {delay / 1000000, (delay % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
            pthread_mutex_lock(&g.mu);
            if (g.running++ == 0) set_protection(PROT_READ | PROT_WRITE);
            pthread_mutex_unlock(&g.mu);
            op->fn(op->arg);
            pthread_mutex_lock(&g.mu);
            if (--g.running == 0) set_protection(PROT_NONE);
            pthread_mutex_unlock(&g.mu);
        }
        free(op->arg);
        pthread_mutex_lock(&g.mu);
        g.completed[s->id] = op->seq;
        pthread_cond_broadcast(&g.done);
        pthread_mutex_unlock(&g.mu);
        free(op);
    }
    return NULL;
}

int ddp_simdev_stream_new(int device, const char *name, ddp_simdev_stream_t **out)
{
    *out = NULL;
    ddp_simdev_stream_t *s = calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    s->device = device;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&g.mu);
    read_env();
    s->id = -1;
    for (int i = 0; i < DDP_SIMDEV_MAX_STREAMS && s->id < 0; i++)
        if (!g.streams[i]) s->id = i;
    if (s->id < 0) {
        pthread_mutex_unlock(&g.mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return DDP_EBUSY;
    }
    g.streams[s->id] = s;
    s->launched = g.completed[s->id]; /* a reused slot goes on counting */
    memcpy(s->clock, g.host_clock, sizeof s->clock);
    pthread_mutex_unlock(&g.mu);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        pthread_mutex_lock(&g.mu);
        g.streams[s->id] = NULL;
        pthread_mutex_unlock(&g.mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return -rc;
    }
    *out = s;
    return 0;
}

void ddp_simdev_stream_free(ddp_simdev_stream_t *s)
{
    if (!s) return;
    ddp_simdev_stream_sync(s);
    pthread_mutex_lock(&g.mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&g.mu);
    g.streams[s->id] = NULL;
    pthread_mutex_unlock(&g.mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int ddp_simdev_stream_device(const ddp_simdev_stream_t *s) { return s->device; }

static const char *where(int dev, char *buf, size_t len)
{
    if (dev == DDP_SIMDEV_HOST) return "host memory";
    if (dev == DDP_SIMDEV_PINNED) return "pinned host memory";
    if (dev == -2) return "a range that runs past the end of its allocation";
    snprintf(buf, len, "memory of device %d", dev);
    return buf;
}

static void hazard(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void hazard(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.last, sizeof g.last, fmt, ap);
    va_end(ap);
    g.hazards++;
    DDP_ERROR("%s", g.last);
}

/* Queues op on s (under g.mu). */
static void push(ddp_simdev_stream_t *s, op_t *op)
{
    op->seq = ++s->launched;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
}

/* Checks one access of an op about to be queued on s (under g.mu). 0 or DDP_EHAZARD. */
static int check(ddp_simdev_stream_t *s, const char *what, const ddp_simdev_access_t *a)
{
    char b1[48];
    int dev = device_of_locked(a->p, a->bytes);
    if (a->mode & DDP_SIMDEV_HOSTSIDE) {
        if (dev >= 0 || dev == -2) {
            hazard("sim: %s on stream %s (device %d): its host buffer %p is %s", what, s->name,
                   s->device, a->p, where(dev, b1, sizeof b1));
            return DDP_EHAZARD;
        }
        return 0;
    }
    if (dev != s->device) {
        hazard("sim: %s on stream %s (device %d): buffer [%p, +%zu) is %s, not memory of device "
               "%d", what, s->name, s->device, a->p, a->bytes, where(dev, b1, sizeof b1),
               s->device);
        return DDP_EHAZARD;
    }
    const char *lo = a->p, *hi = lo + a->bytes;
    int write = (a->mode & DDP_SIMDEV_W) != 0;
    alloc_t *r = find(lo); /* not NULL: memory of s's device */
    size_t gr = r->granule;
    for (size_t i = (size_t)(lo - r->base) / gr; r->committed && r->base + i * gr < hi; i++) {
        if (r->committed[i]) continue;
        hazard("sim: %s on stream %s (device %d) %s [%p, +%zu): granule %zu [%p, +%zu) of the "
               "reservation at %p is not committed (a GPU faults on it: illegal address)", what,
               s->name, s->device, write ? "writes" : "reads", a->p, a->bytes, i,
               (void *)(r->base + i * gr), gr, (void *)r->base);
        return DDP_EHAZARD;
    }
    for (pending_t *e = g.pending; e; e = e->next) {
        if (e->stream == s->id || e->hi <= lo || e->lo >= hi || (!write && !e->write)) continue;
        if (s->clock[e->stream] >= e->seq) continue;
        ddp_simdev_stream_t *o = g.streams[e->stream];
        hazard("sim: hazard: %s on stream %s (device %d) %s [%p, +%zu), which %s (op #%llu on "
               "stream %s) %s and may not have done yet: no event or host sync orders them",
               what, s->name, s->device, write ? "writes" : "reads", a->p, a->bytes, e->what,
               (unsigned long long)e->seq, o ? o->name : "(freed)",
               e->write ? "writes" : "reads");
        return DDP_EHAZARD;
    }
    return 0;
}

/* The reservation holding all of [p, p + bytes), or NULL (under g.mu). */
static alloc_t *reservation_of(const void *p, size_t bytes)
{
    alloc_t *a = find(p);
    if (a && a->committed && bytes <= (size_t)(a->base + a->bytes - (const char *)p)) return a;
    return NULL;
}

/* Gives granule i of reservation a back: its pages read zero from now on (under g.mu). */
static void drop_pages(alloc_t *a, size_t i)
{
    if (madvise(a->base + i * a->granule, a->granule, MADV_DONTNEED) != 0)
        DDP_ERROR("sim: madvise: %s", strerror(errno));
}

int ddp_simdev_commit(const void *p, size_t bytes)
{
    if (bytes == 0) return 0;
    pthread_mutex_lock(&g.mu);
    alloc_t *a = reservation_of(p, bytes);
    if (a) {
        size_t off = (size_t)((const char *)p - a->base), gr = a->granule;
        for (size_t i = off / gr; i * gr < off + bytes; i++) {
            if (!a->committed[i]) drop_pages(a, i);
            a->committed[i] = 1;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return a ? 0 : DDP_EINVAL;
}

int ddp_simdev_decommit(const void *p, size_t bytes)
{
    if (bytes == 0) return 0;
    pthread_mutex_lock(&g.mu);
    prune();
    alloc_t *a = reservation_of(p, bytes);
    int rc = 0;
    if (!a) {
        DDP_ERROR("sim: decommit of [%p, +%zu), which is not inside one reservation", p, bytes);
        rc = DDP_EINVAL;
    } else {
        size_t off = (size_t)((const char *)p - a->base), gr = a->granule;
        size_t end = off + bytes == a->bytes ? a->map_bytes : off + bytes;
        for (size_t i = (off + gr - 1) / gr; (i + 1) * gr <= end; i++) {
            const char *lo = a->base + i * gr, *hi = lo + gr;
            for (pending_t *e = g.pending; e && rc == 0; e = e->next) {
                if (e->hi <= lo || e->lo >= hi) continue;
                ddp_simdev_stream_t *o = g.streams[e->stream];
                hazard("sim: hazard: decommit of granule %zu [%p, +%zu) of the reservation at %p, "
                       "which %s (op #%llu on stream %s) %s and may not have done yet: no host "
                       "sync orders them", i, (const void *)lo, gr, (void *)a->base, e->what,
                       (unsigned long long)e->seq, o ? o->name : "(freed)",
                       e->write ? "writes" : "reads");
                rc = DDP_EHAZARD;
            }
            if (a->committed[i]) drop_pages(a, i);
            a->committed[i] = 0;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return rc;
}

int ddp_simdev_launch(ddp_simdev_stream_t *s, const char *what, ddp_simdev_fn fn, void *arg,
                      const ddp_simdev_access_t *acc, int nacc)
{
    op_t *op = calloc(1, sizeof *op);
    pending_t **pe = calloc((size_t)(nacc > 0 ? nacc : 1), sizeof *pe);
    int rc = op && pe ? 0 : DDP_ENOMEM;
    for (int i = 0; rc == 0 && i < nacc; i++)
        if (!(pe[i] = calloc(1, sizeof **pe))) rc = DDP_ENOMEM;
    if (rc) {
        for (int i = 0; pe && i < nacc; i++) free(pe[i]);
        free(pe);
        free(op);
        free(arg);
        return rc;
    }
    op->fn = fn;
    op->arg = arg;
    op->wait_stream = -1;
    pthread_mutex_lock(&g.mu);
    join(s->clock, g.host_clock);
    prune();
    for (int i = 0; i < nacc; i++)
        if (acc[i].bytes && check(s, what, &acc[i]) < 0) rc = DDP_EHAZARD;
    push(s, op);
    for (int i = 0; i < nacc; i++) {
        if (!acc[i].bytes || (acc[i].mode & DDP_SIMDEV_HOSTSIDE)) {
            free(pe[i]);
            continue;
        }
        *pe[i] = (pending_t){g.pending, acc[i].p, (const char *)acc[i].p + acc[i].bytes,
                             (acc[i].mode & DDP_SIMDEV_W) != 0, s->id, op->seq, what};
        g.pending = pe[i];
    }
    pthread_mutex_unlock(&g.mu);
    free(pe);
    return rc;
}

int ddp_simdev_check(ddp_simdev_stream_t *s, const char *what, const ddp_simdev_access_t *acc,
                     int nacc)
{
    int rc = 0;
    pthread_mutex_lock(&g.mu);
    join(s->clock, g.host_clock);
    prune();
    for (int i = 0; i < nacc; i++)
        if (acc[i].bytes && check(s, what, &acc[i]) < 0) rc = DDP_EHAZARD;
    pthread_mutex_unlock(&g.mu);
    return rc;
}

void ddp_simdev_stream_sync(ddp_simdev_stream_t *s)
{
    pthread_mutex_lock(&g.mu);
    uint64_t upto = s->launched;
    while (g.completed[s->id] < upto) pthread_cond_wait(&g.done, &g.mu);
    join(g.host_clock, s->clock);
    if (g.host_clock[s->id] < upto) g.host_clock[s->id] = upto;
    prune();
    pthread_mutex_unlock(&g.mu);
}

void ddp_simdev_event_record(ddp_simdev_event_t *ev, ddp_simdev_stream_t *s)
{
    pthread_mutex_lock(&g.mu);
    memcpy(ev->clock, s->clock, sizeof ev->clock);
    ev->stream = s->id;
    ev->seq = s->launched;
    ev->clock[s->id] = s->launched;
    pthread_mutex_unlock(&g.mu);
}

void ddp_simdev_stream_wait_event(ddp_simdev_stream_t *s, const ddp_simdev_event_t *ev)
{
    if (ev->stream < 0) return;
    op_t *op = calloc(1, sizeof *op);
    pthread_mutex_lock(&g.mu);
    join(s->clock, ev->clock);
    if (op) {
        op->wait_stream = ev->stream;
        op->wait_seq = ev->seq;
        push(s, op);
    } else { /* cannot queue the wait: block the caller instead, which orders as much */
        while (g.completed[ev->stream] < ev->seq) pthread_cond_wait(&g.done, &g.mu);
    }
    pthread_mutex_unlock(&g.mu);
}

int ddp_simdev_event_query(const ddp_simdev_event_t *ev)
{
    if (ev->stream < 0) return 1;
    pthread_mutex_lock(&g.mu);
    int done = g.completed[ev->stream] >= ev->seq;
    if (done) {
        join(g.host_clock, ev->clock);
        prune();
    }
    pthread_mutex_unlock(&g.mu);
    return done;
}

uint64_t ddp_simdev_hazards(void)
{
    pthread_mutex_lock(&g.mu);
    uint64_t n = g.hazards;
    pthread_mutex_unlock(&g.mu);
    return n;
}

void ddp_simdev_last_hazard(char *buf, size_t len)
{
    pthread_mutex_lock(&g.mu);
    snprintf(buf, len, "%s", g.last);
    pthread_mutex_unlock(&g.mu);
}
