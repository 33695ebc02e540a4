/* The flight recorder's ring, its async-signal-safe dump and its triggers (see flight.h).
 *
 * Invariants: `ring` and `cap` are set once (setup, or the first record) and never freed, so a
 * signal handler can read them at any time; a record's `ver` is odd while a writer is inside it;
 * a record's `id` is the global count of records at its queueing, so id % cap is its slot and a
 * later writer of an overwritten record sees a different id and does nothing.
 */
#include "collectives/flight.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/clock.h"
#include "common/log.h"

typedef struct rec {
    _Atomic uint32_t ver;
    _Atomic uint64_t id; /* 0: empty */
    uint64_t gen, seq, bytes;
    const char *kind;
    int rank, size, bucket, peer, state, rc;
    int64_t t_queued, t_started, t_finished;
} rec_t;

static rec_t *ring;
static size_t cap;
static _Atomic uint64_t next_id;
static _Atomic int cur_rank = -1;
static int off;
static char path_prefix[4096]; /* "RUN_DIR/flight/rank-"; "" without a run directory */
static char *raw_buf;          /* the signal handler's dump buffer */
static size_t raw_len;
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static void (*sink_fn)(void *, json_t *);
static void *sink_arg;
static pthread_once_t lazy_once = PTHREAD_ONCE_INIT;

/* Bytes a dump of one record takes at most, and of the header. */
#define REC_TEXT 400
#define HEAD_TEXT 256

static int alloc_ring(size_t n)
{
    rec_t *r = ddp_calloc(n, sizeof *r);
    char *b = ddp_calloc(1, HEAD_TEXT + n * REC_TEXT);
    if (!r || !b) {
        free(r);
        free(b);
        return DDP_ENOMEM;
    }
    raw_buf = b;
    raw_len = HEAD_TEXT + n * REC_TEXT;
    ring = r;
    cap = n;
    return 0;
}

static void lazy_alloc(void)
{
    if (!ring && !off) (void)alloc_ring(DDP_FLIGHT_DEFAULT_RECORDS);
}

int ddp_flight_setup(const ddp_flight_cfg_t *cfg)
{
    if (!cfg) return DDP_EINVAL;
    if (cfg->rank >= 0) atomic_store(&cur_rank, cfg->rank);
    ddp_flight_set_sink(cfg->sink, cfg->sink_arg);
    if (cfg->records == 0) {
        off = 1;
    } else if (!ring) {
        size_t n = cfg->records < 0 ? DDP_FLIGHT_DEFAULT_RECORDS : (size_t)cfg->records;
        DDP_CHECK(alloc_ring(n));
    }
    if (cfg->run_dir && *cfg->run_dir && !off) {
        char dir[4096];
        if ((size_t)snprintf(dir, sizeof dir, "%s/flight", cfg->run_dir) >= sizeof dir - 32)
            return DDP_EINVAL;
        if (mkdir(cfg->run_dir, 0755) != 0 && errno != EEXIST) return -errno;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -errno;
        memcpy(path_prefix, dir, strlen(dir));
        memcpy(path_prefix + strlen(dir), "/rank-", 7);
    }
    return 0;
}

void ddp_flight_set_sink(void (*sink)(void *arg, json_t *dump), void *arg)
{
    pthread_mutex_lock(&sink_mu);
    sink_fn = sink;
    sink_arg = arg;
    pthread_mutex_unlock(&sink_mu);
}

/* ---- writers ------------------------------------------------------------------------------- */

/* Fields are written and read with relaxed atomic accesses (the seqlock orders them), so that a
 * reader racing a writer is defined behaviour (and quiet under TSan). */
#define WR(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)
#define RD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* Makes the version odd; two writers of one record (the communication thread finishing it while
 * the waiter that gave up marks it failed) take turns. Never called from a signal handler. */
static void enter(rec_t *r)
{
    uint32_t v = atomic_load_explicit(&r->ver, memory_order_relaxed);
    for (;;) {
        if (v & 1) {
            v = atomic_load_explicit(&r->ver, memory_order_relaxed);
            continue;
        }
        /* acquire: the field stores after it stay after it (no fence: GCC's TSan has none) */
        if (atomic_compare_exchange_weak_explicit(&r->ver, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_relaxed))
            break;
    }
}

static void leave(rec_t *r) { atomic_fetch_add_explicit(&r->ver, 1, memory_order_release); }

/* The record of id, or NULL when off, 0, or overwritten since. */
static rec_t *find(uint64_t id)
{
    if (!id || !ring) return NULL;
    rec_t *r = &ring[id % cap];
    return atomic_load_explicit(&r->id, memory_order_acquire) == id ? r : NULL;
}

uint64_t ddp_flight_queued(uint64_t generation, uint64_t seq, int rank, int size,
                           const char *kind, uint64_t bytes, int bucket)
{
    if (off) return 0;
    pthread_once(&lazy_once, lazy_alloc); /* always: it orders this thread after the allocation */
    if (!ring) return 0;
    uint64_t id = atomic_fetch_add(&next_id, 1) + 1;
    rec_t *r = &ring[id % cap];
    enter(r);
    WR(r->gen, generation);
    WR(r->seq, seq);
    WR(r->bytes, bytes);
    WR(r->kind, kind);
    WR(r->rank, rank);
    WR(r->size, size);
    WR(r->bucket, bucket);
    WR(r->peer, -1);
    WR(r->state, DDP_FLIGHT_QUEUED);
    WR(r->rc, 0);
    WR(r->t_queued, ddp_now_ns());
    WR(r->t_started, 0);
    WR(r->t_finished, 0);
    atomic_store_explicit(&r->id, id, memory_order_release);
    leave(r);
    atomic_store(&cur_rank, rank);
    return id;
}

void ddp_flight_started(uint64_t id)
{
    rec_t *r = find(id);
    if (!r) return;
    enter(r);
    WR(r->state, DDP_FLIGHT_STARTED);
    WR(r->t_started, ddp_now_ns());
    leave(r);
}

void ddp_flight_waiting(uint64_t id, int peer)
{
    rec_t *r = find(id);
    if (!r || RD(r->peer) == peer) return;
    enter(r);
    WR(r->peer, peer);
    leave(r);
}

void ddp_flight_finished(uint64_t id, int rc)
{
    rec_t *r = find(id);
    if (!r || RD(r->state) >= DDP_FLIGHT_FINISHED) return;
    enter(r);
    if (!RD(r->t_started)) WR(r->t_started, ddp_now_ns()); /* a backend without the engine (nccl) */
    WR(r->state, rc < 0 ? DDP_FLIGHT_FAILED : DDP_FLIGHT_FINISHED);
    WR(r->rc, rc < 0 ? rc : 0);
    WR(r->t_finished, ddp_now_ns());
    leave(r);
}

/* ---- the async-signal-safe formatter ------------------------------------------------------- */

typedef struct {
    char *p, *end;
} out_t;

static void put_s(out_t *o, const char *s)
{
    while (*s && o->p < o->end) *o->p++ = *s++;
}

static void put_i(out_t *o, long long v)
{
    char t[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        t[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) t[n++] = '-';
    while (n && o->p < o->end) *o->p++ = t[--n];
}

static void put_kv(out_t *o, const char *key, long long v)
{
    put_s(o, ",\"");
    put_s(o, key);
    put_s(o, "\":");
    put_i(o, v);
}

static const char *state_name(int s)
{
    static const char *const n[] = {"queued", "started", "finished", "failed"};
    return s >= 0 && s <= 3 ? n[s] : "unknown";
}

/* Copies record i when it is stable (not being written); 0 when empty or torn three times. */
static int snapshot(size_t i, rec_t *dst)
{
    rec_t *r = &ring[i];
    for (int tries = 0; tries < 3; tries++) {
        uint32_t v0 = atomic_load_explicit(&r->ver, memory_order_acquire);
        if (v0 & 1) continue;
        uint64_t id = atomic_load_explicit(&r->id, memory_order_relaxed);
        dst->gen = RD(r->gen);
        dst->seq = RD(r->seq);
        dst->bytes = RD(r->bytes);
        dst->kind = RD(r->kind);
        dst->rank = RD(r->rank);
        dst->size = RD(r->size);
        dst->bucket = RD(r->bucket);
        dst->peer = RD(r->peer);
        dst->state = RD(r->state);
        dst->rc = RD(r->rc);
        dst->t_queued = RD(r->t_queued);
        dst->t_started = RD(r->t_started);
        dst->t_finished = RD(r->t_finished);
        /* the field loads before it stay before it: a read-modify-write that changes nothing,
         * with release order, in place of an acquire fence (GCC's TSan has no fences) */
        if (atomic_fetch_add_explicit(&r->ver, 0, memory_order_acq_rel) != v0) continue;
        atomic_store_explicit(&dst->id, id, memory_order_relaxed);
        return id != 0;
    }
    return 0;
}

size_t ddp_flight_format(char *buf, size_t len, const char *trigger)
{
    if (!buf || len < 2) return 0;
    out_t o = {buf, buf + len - 1};
    put_s(&o, "{\"flight_recorder\":1");
    put_kv(&o, "rank", atomic_load(&cur_rank));
    put_kv(&o, "pid", (long long)getpid());
    put_s(&o, ",\"trigger\":\"");
    put_s(&o, trigger ? trigger : "");
    put_s(&o, "\"");
    put_kv(&o, "now_ns", ddp_now_ns());
    put_kv(&o, "records_max", (long long)cap);
    put_s(&o, ",\"records\":[");
    uint64_t last = atomic_load(&next_id);
    uint64_t first = last > cap ? last - cap + 1 : 1;
    int n = 0;
    for (uint64_t id = first; ring && id <= last; id++) {
        rec_t r;
        if (!snapshot(id % cap, &r) || atomic_load_explicit(&r.id, memory_order_relaxed) != id)
            continue;
        if (o.end - o.p < REC_TEXT + 4) break; /* keep the text valid JSON */
        put_s(&o, n++ ? ",{" : "{");
        put_s(&o, "\"generation\":");
        put_i(&o, (long long)r.gen);
        put_kv(&o, "seq", (long long)r.seq);
        put_kv(&o, "rank", r.rank);
        put_kv(&o, "size", r.size);
        put_s(&o, ",\"kind\":\"");
        put_s(&o, r.kind ? r.kind : "?");
        put_s(&o, "\"");
        put_kv(&o, "bytes", (long long)r.bytes);
        put_kv(&o, "bucket", r.bucket);
        put_s(&o, ",\"state\":\"");
        put_s(&o, state_name(r.state));
        put_s(&o, "\"");
        put_kv(&o, "peer", r.peer);
        put_kv(&o, "rc", r.rc);
        put_kv(&o, "t_queued_ns", r.t_queued);
        put_kv(&o, "t_started_ns", r.t_started);
        put_kv(&o, "t_finished_ns", r.t_finished);
        put_s(&o, "}");
    }
    put_s(&o, "]}\n");
    *o.p = 0;
    return (size_t)(o.p - buf);
}

/* Writes text to RUN_DIR/flight/rank-R.json with open/write/close only. */
static int write_file(const char *text, size_t n)
{
    if (!path_prefix[0]) return DDP_EINVAL;
    char path[sizeof path_prefix + 32];
    out_t o = {path, path + sizeof path - 1};
    put_s(&o, path_prefix);
    put_i(&o, atomic_load(&cur_rank));
    put_s(&o, ".json");
    *o.p = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -errno;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int rc = w < 0 ? -errno : DDP_EIO;
            close(fd);
            return rc;
        }
        done += (size_t)w;
    }
    return close(fd) == 0 ? 0 : -errno;
}

int ddp_flight_write_raw(const char *trigger)
{
    if (!raw_buf) return DDP_EINVAL;
    size_t n = ddp_flight_format(raw_buf, raw_len, trigger);
    return write_file(raw_buf, n);
}

json_t *ddp_flight_dump(const char *trigger)
{
    size_t len = HEAD_TEXT + (cap ? cap : 1) * REC_TEXT;
    char *text = ddp_malloc(len);
    if (!text) return NULL;
    size_t n = ddp_flight_format(text, len, trigger);
    if (path_prefix[0]) {
        int rc = write_file(text, n);
        if (rc < 0) DDP_WARN("flight recorder: cannot write %s%d.json: %s", path_prefix,
                             atomic_load(&cur_rank), ddp_strerror(rc));
    }
    json_error_t jerr;
    json_t *dump = json_loadb(text, n, 0, &jerr);
    free(text);
    if (!dump) return NULL;
    pthread_mutex_lock(&sink_mu); /* held across the call: set_sink(NULL) waits for it */
    if (sink_fn) sink_fn(sink_arg, dump);
    pthread_mutex_unlock(&sink_mu);
    return dump;
}

/* ---- triggers ------------------------------------------------------------------------------ */

static const int fatal_sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
static struct sigaction prev_sa[sizeof fatal_sigs / sizeof fatal_sigs[0]];
static volatile sig_atomic_t in_fatal;

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    size_t i = 0;
    while (i < sizeof fatal_sigs / sizeof fatal_sigs[0] && fatal_sigs[i] != sig) i++;
    if (!in_fatal) { /* a crash inside the dump itself goes straight on */
        in_fatal = 1;
        static const char *const names[] = {"signal SIGSEGV", "signal SIGBUS", "signal SIGABRT",
                                            "signal SIGFPE", "signal SIGILL"};
        (void)ddp_flight_write_raw(i < 5 ? names[i] : "signal");
    }
    if (i == sizeof fatal_sigs / sizeof fatal_sigs[0]) return;
    struct sigaction *p = &prev_sa[i];
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction) p->sa_sigaction(sig, si, uc);
        return;
    }
    if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
        p->sa_handler(sig);
        return;
    }
    /* the default action: restore it and raise again (the signal is blocked until we return) */
    signal(sig, SIG_DFL);
    raise(sig);
}

void ddp_flight_catch_fatal(void)
{
    for (size_t i = 0; i < sizeof fatal_sigs / sizeof fatal_sigs[0]; i++) {
        struct sigaction sa = {.sa_sigaction = on_fatal, .sa_flags = SA_SIGINFO | SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        sigaction(fatal_sigs[i], &sa, &prev_sa[i]);
    }
}

static int wake_fd[2] = {-1, -1};

/* Any thread may receive SIGUSR2 (libraries start threads before main): the handler only wakes
 * the dump thread. */
static void on_sigusr2(int sig)
{
    (void)sig;
    int saved = errno;
    char b = 1;
    ssize_t w = write(wake_fd[1], &b, 1);
    (void)w;
    errno = saved;
}

static void *sigusr2_main(void *arg)
{
    (void)arg;
    for (;;) {
        char b[16];
        ssize_t n = read(wake_fd[0], b, sizeof b);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        DDP_INFO("flight recorder: dump requested (SIGUSR2)");
        json_decref(ddp_flight_dump("request"));
    }
}

int ddp_flight_listen_sigusr2(void)
{
    if (wake_fd[0] >= 0) return 0;
    if (pipe2(wake_fd, O_CLOEXEC) != 0) return -errno;
    fcntl(wake_fd[1], F_SETFL, O_NONBLOCK); /* a burst of signals never blocks the handler */
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, sigusr2_main, NULL);
    pthread_attr_destroy(&at);
    if (rc) return -rc;
    struct sigaction sa = {.sa_handler = on_sigusr2, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGUSR2, &sa, NULL) == 0 ? 0 : -errno;
}
