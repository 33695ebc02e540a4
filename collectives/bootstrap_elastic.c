/* The worker's connection to an elastic job's coordinator (see elastic.h and elastic_proto.h).
 *
 * The socket stays blocking; the connection's thread polls it with a timeout of one heartbeat
 * period, so it both reads promptly and heartbeats on time. Writes from the caller's thread
 * (join, allgather, done) and the connection's thread (heartbeats) are serialised by send_mu,
 * which also guards the descriptor: only the connection's thread replaces it, when it
 * reconnects. Everything the connection's thread learns is published under mu and signalled on
 * cv.
 *
 * A connection that closes (the coordinator's daemon restarted) is not the end: once a member,
 * the worker redials for the "reconnect_s" the coordinator gave it, training on meanwhile, and
 * says where it stands ("rejoin" inside a generation, "join" again while it waits for one). A
 * coordinator that goes silent instead is a partition: this side stops.
 */
#include "collectives/elastic.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/coll_impl.h"
#include "collectives/elastic_proto.h"
#include "collectives/flight.h"
#include "collectives/net.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/host.h"
#include "common/log.h"

struct ddp_elastic {
    int fd; /* under send_mu; -1 while reconnecting */
    int hint;
    char host[256];
    int port;
    char token[128];
    char host_id[160];
    char data_host[64];
    pthread_t thread;
    int thread_started;
    pthread_mutex_t send_mu;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int stop;
    long step;
    uint64_t cur_gen;     /* the generation this worker is in (0: none) */
    uint64_t state_gen;   /* the last generation it was given: its state is that generation's
                           * (0: none yet; "sgen" in a join) */
    int cur_rank, cur_size;
    int joining;          /* a join is outstanding: no "gen" answered it yet */
    int attached;         /* the current generation's communicator is formed (ddp_elastic_watch) */
    ddp_coll_t *watched;
    json_t *gen_msg;      /* a "gen" not yet taken by join */
    json_t *ag_msg;       /* an "ag" result not yet taken */
    int regroup;          /* the current generation ends at the next boundary (or has ended) */
    uint64_t regroup_gen; /* a regroup that came for a generation not attached yet (the
                           * coordinator may send it right behind the gen message) */
    int lost;             /* the job is over for this worker */
    int64_t silence_ns;   /* give the coordinator up after this long unheard (0: not yet known) */
    int64_t reconnect_ns; /* redial a closed connection for this long (0: not yet a member) */
    int job_done;         /* ... because it finished before this worker was admitted */
    char lost_why[512];
};

typedef struct {
    ddp_coll_bootstrap_t pub;
    ddp_elastic_t *e;
} elastic_bs_t;

/* Sends msg (consumed) as one line. */
static int send_msg(ddp_elastic_t *e, json_t *msg)
{
    char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!s) return DDP_ENOMEM;
    size_t n = strlen(s);
    s[n] = '\n';
    pthread_mutex_lock(&e->send_mu);
    int rc = e->fd < 0 ? DDP_EPEER
                       : ddp__net_send_all(e->fd, s, n + 1, ddp_now_ns() + 10000000000LL);
    pthread_mutex_unlock(&e->send_mu);
    free(s);
    return rc;
}

/* Caller holds mu. The watched communicator fails at once with why. */
static void abort_watched(ddp_elastic_t *e, int rc, const char *why)
{
    if (e->watched) ddp_coll_abort(e->watched, rc, why);
}

static void set_lost(ddp_elastic_t *e, const char *why)
{
    pthread_mutex_lock(&e->mu);
    if (!e->lost) {
        e->lost = 1;
        snprintf(e->lost_why, sizeof e->lost_why, "%s", why);
    }
    e->regroup = 1;
    abort_watched(e, DDP_EABORTED, why);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* The flight recorder's sink (flight.h): each dump goes to the coordinator, which lines the
 * ranks' dumps up (daemon/coord.c). The oldest records are left out of a dump too long for a
 * line. Any thread but a signal handler. */
static void flight_sink(void *arg, json_t *dump)
{
    ddp_elastic_t *e = arg;
    json_t *d = json_deep_copy(dump), *recs = json_object_get(d, "records");
    char *s;
    while ((s = json_dumps(d, JSON_COMPACT)) && strlen(s) > DDP_ELASTIC_MAX_LINE - 64 &&
           json_array_size(recs) > 0) {
        free(s);
        json_array_remove(recs, 0);
    }
    free(s);
    if (d && send_msg(e, json_pack("{s:s, s:o}", "t", "flight", "dump", d)) < 0)
        DDP_WARN("flight recorder: the coordinator is away: the dump stays in its file");
}

static void on_message(ddp_elastic_t *e, json_t *m)
{
    const char *t = json_string_value(json_object_get(m, "t"));
    uint64_t g = (uint64_t)json_integer_value(json_object_get(m, "gen"));
    const char *why = json_string_value(json_object_get(m, "why"));
    char buf[512];
    if (!t) return;
    if (!strcmp(t, "dump")) { /* on this thread, which no collective holds; sent by the sink */
        DDP_WARN("flight recorder: the coordinator asks for a dump: %s", why ? why : "?");
        json_decref(ddp_flight_dump("coordinator"));
        return;
    }
    pthread_mutex_lock(&e->mu);
    if (!strcmp(t, "gen")) {
        e->silence_ns = (int64_t)(json_number_value(json_object_get(m, "hb_timeout_s")) * 1e9);
        e->reconnect_ns = (int64_t)(json_number_value(json_object_get(m, "reconnect_s")) * 1e9);
        json_decref(e->gen_msg);
        e->gen_msg = json_deep_copy(m); /* a copy: no reference count shared between threads */
    } else if (!strcmp(t, "ag")) {
        if (g == e->cur_gen) {
            json_decref(e->ag_msg);
            e->ag_msg = json_deep_copy(m);
        }
    } else if (!strcmp(t, "reform")) {
        if (g == e->cur_gen) {
            e->regroup = 1;
            snprintf(buf, sizeof buf, "generation %llu ended by the coordinator: %s",
                     (unsigned long long)g, why ? why : "?");
            abort_watched(e, DDP_EABORTED, buf);
        }
    } else if (!strcmp(t, "regroup")) {
        /* before its generation is attached (it may come right behind the gen message) it
         * waits for ddp_elastic_watch: the formation's allgathers must not end for it */
        if (g == e->cur_gen && e->attached) e->regroup = 1;
        else if (g >= e->cur_gen) e->regroup_gen = g;
    } else if (!strcmp(t, "adopted")) {
        DDP_INFO("elastic: the coordinator is back and adopted generation %llu",
                 (unsigned long long)g);
    } else if (!strcmp(t, "exit")) {
        snprintf(buf, sizeof buf, "the coordinator ended this worker's part in the job: %s",
                 why ? why : "?");
        e->job_done = json_is_true(json_object_get(m, "done"));
        pthread_mutex_unlock(&e->mu);
        set_lost(e, buf);
        return;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static json_t *join_msg(ddp_elastic_t *e, long step)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i, s:I, s:I}", "t", "join", "token", e->token, "pid",
                     (json_int_t)getpid(), "host_id", e->host_id, "hint", e->hint, "step",
                     (json_int_t)step, "sgen", (json_int_t)(step >= 0 ? e->state_gen : 0));
}

/* The connection's thread, after its connection closed: redials for reconnect_ns and tells the
 * new coordinator where this worker stands. Returns 1 when connected again, 0 when the worker
 * must leave (never a member yet, stopped, or the window passed). */
static int reconnect(ddp_elastic_t *e)
{
    pthread_mutex_lock(&e->mu);
    int64_t window = e->reconnect_ns;
    int stop = e->stop;
    pthread_mutex_unlock(&e->mu);
    if (window <= 0 || stop) return 0;
    pthread_mutex_lock(&e->send_mu);
    close(e->fd);
    e->fd = -1;
    pthread_mutex_unlock(&e->send_mu);
    DDP_WARN("elastic: the connection to the coordinator closed: redialling for up to %.1f s; "
             "training goes on meanwhile", (double)window / 1e9);
    int64_t start = ddp_now_ns(), deadline = start + window;
    int fd = -1;
    while (fd < 0 && !stop && ddp_now_ns() < deadline) {
        int64_t slice = ddp_now_ns() + 1000000000LL; /* re-check stop every second */
        fd = ddp__net_connect(e->host, e->port, slice < deadline ? slice : deadline);
        pthread_mutex_lock(&e->mu);
        stop = e->stop;
        pthread_mutex_unlock(&e->mu);
    }
    if (fd < 0) return 0;
    ddp__net_nonblock(fd, 0);
    pthread_mutex_lock(&e->send_mu);
    e->fd = fd;
    pthread_mutex_unlock(&e->send_mu);
    /* where this worker stands: inside a running generation it rejoins it; a generation still
     * forming cannot be finished with a coordinator that never saw it, so it ends here and the
     * caller joins again; an outstanding join is repeated */
    json_t *hello = NULL;
    pthread_mutex_lock(&e->mu);
    if (e->cur_gen && e->attached && !e->regroup) {
        hello = json_pack("{s:s, s:s, s:I, s:s, s:i, s:I, s:I, s:i, s:i}", "t", "rejoin", "token",
                          e->token, "pid", (json_int_t)getpid(), "host_id", e->host_id, "hint",
                          e->hint, "step", (json_int_t)e->step, "gen", (json_int_t)e->cur_gen,
                          "rank", e->cur_rank, "size", e->cur_size);
    } else if (e->cur_gen) {
        e->regroup = 1;
        abort_watched(e, DDP_EABORTED, "the coordinator restarted while the generation formed");
        pthread_cond_broadcast(&e->cv);
    } else if (e->joining) {
        hello = join_msg(e, e->step);
    }
    pthread_mutex_unlock(&e->mu);
    DDP_INFO("elastic: reconnected to the coordinator after %.2f s",
             (double)(ddp_now_ns() - start) / 1e9);
    return !hello || send_msg(e, hello) == 0;
}

static void *conn_main(void *arg)
{
    ddp_elastic_t *e = arg;
    char *line = NULL;
    size_t len = 0, cap = 0;
    char buf[65536];
    int64_t next_hb = 0, heard = ddp_now_ns();
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int stop = e->stop;
        long step = e->step;
        int64_t silence = e->silence_ns;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        int64_t now = ddp_now_ns();
        if (silence > 0 && now - heard > silence) {
            char why[160];
            snprintf(why, sizeof why, "the coordinator has not been heard for %.1f s (cut off "
                     "from it: this side stops)", (double)(now - heard) / 1e9);
            set_lost(e, why);
            break;
        }
        if (now >= next_hb) {
            if (send_msg(e, json_pack("{s:s, s:I}", "t", "hb", "step", (json_int_t)step)) < 0) {
                if (reconnect(e)) {
                    heard = ddp_now_ns();
                    len = 0;
                    continue;
                }
                set_lost(e, "lost the connection to the coordinator (heartbeat failed)");
                break;
            }
            next_hb = now + DDP_ELASTIC_HB_MS * 1000000LL;
        }
        struct pollfd p = {.fd = e->fd, .events = POLLIN};
        int pr = poll(&p, 1, DDP_ELASTIC_HB_MS);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        ssize_t n = read(e->fd, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n > 0) heard = ddp_now_ns();
        if (n <= 0) {
            if (reconnect(e)) {
                heard = ddp_now_ns();
                len = 0;
                continue;
            }
            pthread_mutex_lock(&e->mu);
            stop = e->stop;
            pthread_mutex_unlock(&e->mu);
            if (!stop) set_lost(e, "lost the connection to the coordinator");
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') {
                if (len + 1 > cap) {
                    size_t nc = cap ? cap * 2 : 4096;
                    char *nl = nc <= DDP_ELASTIC_MAX_LINE * 2 ? ddp_realloc(line, nc) : NULL;
                    if (!nl) {
                        set_lost(e, "the coordinator sent a line that is too long");
                        goto out;
                    }
                    line = nl;
                    cap = nc;
                }
                line[len++] = buf[i];
                continue;
            }
            json_t *m = json_loadb(line ? line : "", len, 0, NULL);
            len = 0;
            if (json_is_object(m)) on_message(e, m);
            json_decref(m);
        }
    }
out:
    free(line);
    return NULL;
}

int ddp_elastic_connect(const char *addr, const char *token, int hint, double timeout_s,
                        ddp_elastic_t **out, ddp_errinfo_t *ei)
{
    char host[256];
    int port = 0;
    if (!addr || ddp__net_parse(addr, host, sizeof host, &port) < 0)
        return ddp_errinfo_set(ei, DDP_EINVAL, "coordinator address '%s' is not host:port",
                               addr ? addr : "(null)");
    if (!token || !*token || strlen(token) >= 128)
        return ddp_errinfo_set(ei, DDP_EINVAL, "elastic: a job token (< 128 bytes) is needed");
    ddp_elastic_t *e = ddp_calloc(1, sizeof *e);
    if (!e) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    e->hint = hint;
    e->step = -1;
    snprintf(e->host, sizeof e->host, "%s", host);
    e->port = port;
    snprintf(e->token, sizeof e->token, "%s", token);
    ddp_host_id(e->host_id, sizeof e->host_id);
    int64_t deadline = ddp_now_ns() + (int64_t)((timeout_s > 0 ? timeout_s : 60) * 1e9);
    e->fd = ddp__net_connect(host, port, deadline);
    if (e->fd < 0) {
        int rc = e->fd;
        free(e);
        return ddp_errinfo_set(ei, rc == DDP_ETIMEDOUT ? rc : DDP_EPEER,
                               "elastic: cannot reach the coordinator at %s (%s)", addr,
                               ddp_strerror(rc));
    }
    ddp__net_nonblock(e->fd, 0);
    ddp__net_local_host(e->fd, e->data_host, sizeof e->data_host);
    pthread_mutex_init(&e->send_mu, NULL);
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca; /* deadlines are CLOCK_MONOTONIC (ddp_now_ns) */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&e->thread, NULL, conn_main, e) != 0) {
        ddp_elastic_free(e);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "elastic: cannot start the connection's thread");
    }
    e->thread_started = 1;
    ddp_flight_set_sink(flight_sink, e);
    *out = e;
    return 0;
}

/* Waits under mu until *slot holds a message, the job is lost, or the deadline passes.
 * Returns the message (owned by the caller) or NULL with rc set. */
static json_t *take(ddp_elastic_t *e, json_t **slot, int64_t deadline, int *rc)
{
    json_t *m = NULL;
    *rc = 0;
    while (!*slot && !e->lost) {
        struct timespec ts = {.tv_sec = deadline / 1000000000LL, .tv_nsec = deadline % 1000000000LL};
        int w = pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        if (w == ETIMEDOUT && !*slot) {
            *rc = DDP_ETIMEDOUT;
            return NULL;
        }
    }
    if (*slot) {
        m = *slot;
        *slot = NULL;
    } else {
        *rc = DDP_EABORTED;
    }
    return m;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

static int elastic_allgather(ddp_coll_bootstrap_t *b, const void *mine, size_t len, void *all,
                             int64_t deadline_ns, ddp_errinfo_t *ei)
{
    ddp_elastic_t *e = ((elastic_bs_t *)b)->e;
    if (!deadline_ns) deadline_ns = ddp_now_ns() + 60000000000LL;
    char *hex = ddp_malloc(2 * len + 1);
    if (!hex) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) sprintf(hex + 2 * i, "%02x", ((const unsigned char *)mine)[i]);
    hex[2 * len] = 0;
    int rc = send_msg(e, json_pack("{s:s, s:I, s:s}", "t", "ag", "gen", (json_int_t)b->generation,
                                   "data", hex));
    free(hex);
    if (rc < 0) return ddp_errinfo_set(ei, DDP_EPEER, "elastic allgather: coordinator gone");
    pthread_mutex_lock(&e->mu);
    json_t *m = NULL;
    while (!e->regroup && !(m = take(e, &e->ag_msg, deadline_ns, &rc)) && rc == 0) {
    }
    if (e->regroup && !m) rc = DDP_EABORTED;
    const char *why = e->lost ? e->lost_why : "the generation ended while it formed";
    pthread_mutex_unlock(&e->mu);
    if (!m)
        return ddp_errinfo_set(ei, rc, "elastic allgather of generation %llu: %s",
                               (unsigned long long)b->generation,
                               rc == DDP_ETIMEDOUT ? "deadline expired" : why);
    json_t *arr = json_object_get(m, "all");
    rc = json_is_array(arr) && json_array_size(arr) == (size_t)b->size ? 0 : DDP_EPROTO;
    for (int r = 0; rc == 0 && r < b->size; r++) {
        const char *s = json_string_value(json_array_get(arr, (size_t)r));
        if (!s || strlen(s) != 2 * len) {
            rc = DDP_EPROTO;
            break;
        }
        unsigned char *dst = (unsigned char *)all + (size_t)r * len;
        for (size_t i = 0; i < len; i++) {
            int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                rc = DDP_EPROTO;
                break;
            }
            dst[i] = (unsigned char)(hi << 4 | lo);
        }
    }
    json_decref(m);
    if (rc) return ddp_errinfo_set(ei, rc, "elastic allgather: malformed answer");
    return 0;
}

static void elastic_bs_free(ddp_coll_bootstrap_t *b) { free(b); }

static const ddp_coll_bootstrap_ops_t elastic_bs_ops = {
    .name = "elastic",
    .allgather = elastic_allgather,
    .free = elastic_bs_free,
};

int ddp_elastic_join(ddp_elastic_t *e, long step, ddp_elastic_gen_t *gen,
                     ddp_coll_bootstrap_t **bs, ddp_errinfo_t *ei)
{
    pthread_mutex_lock(&e->mu);
    e->step = step;
    e->cur_gen = 0;
    e->regroup = 0;
    e->joining = 1;
    e->attached = 0;
    json_decref(e->ag_msg);
    e->ag_msg = NULL;
    int lost = e->lost;
    pthread_mutex_unlock(&e->mu);
    if (lost) return ddp_errinfo_set(ei, DDP_EABORTED, "%s", e->lost_why);
    /* a failed send is not the end: the connection's thread sees the connection close, and
     * repeats this join once it reconnects (or gives the job up) */
    int rc = send_msg(e, join_msg(e, step));
    pthread_mutex_lock(&e->mu);
    json_t *m = take(e, &e->gen_msg, INT64_MAX / 2, &rc);
    if (m) {
        e->cur_gen = (uint64_t)json_integer_value(json_object_get(m, "gen"));
        e->state_gen = e->cur_gen;
        e->cur_rank = (int)json_integer_value(json_object_get(m, "rank"));
        e->cur_size = (int)json_integer_value(json_object_get(m, "size"));
        e->regroup = 0; /* a regroup that came already applies once attached (watch) */
        e->joining = 0;
    }
    pthread_mutex_unlock(&e->mu);
    if (!m)
        return ddp_errinfo_set(ei, e->job_done ? DDP_ECLOSED : DDP_EABORTED, "%s", e->lost_why);
    memset(gen, 0, sizeof *gen);
    gen->gen = (uint64_t)json_integer_value(json_object_get(m, "gen"));
    gen->rank = (int)json_integer_value(json_object_get(m, "rank"));
    gen->size = (int)json_integer_value(json_object_get(m, "size"));
    gen->source = (int)json_integer_value(json_object_get(m, "source"));
    gen->sync = json_is_true(json_object_get(m, "sync"));
    gen->step = (long)json_integer_value(json_object_get(m, "step"));
    gen->receive = json_is_true(json_object_get(m, "receive"));
    const char *why = json_string_value(json_object_get(m, "why"));
    snprintf(gen->why, sizeof gen->why, "%s", why ? why : "");
    json_t *kept = json_object_get(m, "kept");
    if (json_array_size(kept) == (size_t)gen->size && gen->size <= DDP_ELASTIC_KEPT_MAX) {
        gen->kept_from = gen->gen - 1;
        for (int r = 0; r < gen->size; r++)
            gen->kept[r] = (int)json_integer_value(json_array_get(kept, (size_t)r));
    }
    json_decref(m);
    if (gen->size < 1 || gen->rank < 0 || gen->rank >= gen->size || gen->source < 0 ||
        gen->source >= gen->size)
        return ddp_errinfo_set(ei, DDP_EPROTO, "elastic: the coordinator sent a bad generation");
    elastic_bs_t *b = ddp_calloc(1, sizeof *b);
    if (!b) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    b->e = e;
    b->pub.ops = &elastic_bs_ops;
    b->pub.rank = gen->rank;
    b->pub.size = gen->size;
    b->pub.generation = gen->gen;
    snprintf(b->pub.token, sizeof b->pub.token, "%s", e->token);
    snprintf(b->pub.data_host, sizeof b->pub.data_host, "%s", e->data_host);
    snprintf(b->pub.host_id, sizeof b->pub.host_id, "%s", e->host_id);
    b->pub.local_rank = gen->rank;
    rc = gen->size > 1 ? ddp__bootstrap_learn_hosts(&b->pub, 0, ei) : 0;
    if (rc) {
        free(b);
        return rc;
    }
    *bs = &b->pub;
    return 0;
}

void ddp_elastic_watch(ddp_elastic_t *e, ddp_coll_t *comm)
{
    pthread_mutex_lock(&e->mu);
    e->watched = comm;
    e->attached = 1; /* a world of one has no communicator, but is formed all the same */
    if (comm && e->regroup) ddp_coll_abort(comm, DDP_EABORTED, "the generation already ended");
    if (e->cur_gen && e->regroup_gen == e->cur_gen) e->regroup = 1; /* at the first boundary */
    pthread_mutex_unlock(&e->mu);
}

void ddp_elastic_set_step(ddp_elastic_t *e, long step)
{
    pthread_mutex_lock(&e->mu);
    e->step = step;
    pthread_mutex_unlock(&e->mu);
}

int ddp_elastic_regroup_wanted(ddp_elastic_t *e)
{
    pthread_mutex_lock(&e->mu);
    int r = e->regroup;
    pthread_mutex_unlock(&e->mu);
    return r;
}

int ddp_elastic_lost(ddp_elastic_t *e, const char **why)
{
    pthread_mutex_lock(&e->mu);
    int r = e->lost;
    pthread_mutex_unlock(&e->mu);
    if (why) *why = e->lost_why;
    return r;
}

int ddp_elastic_done(ddp_elastic_t *e, long step)
{
    if (send_msg(e, json_pack("{s:s, s:I}", "t", "done", "step", (json_int_t)step)) < 0)
        DDP_WARN("elastic: the coordinator is away at the end of the job; its daemon learns of "
                 "the end from this process's exit");
    return 0;
}

void ddp_elastic_free(ddp_elastic_t *e)
{
    if (!e) return;
    if (e->thread_started) {
        ddp_flight_set_sink(NULL, NULL); /* waits for a dump being sent */
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->send_mu);
        if (e->fd >= 0) shutdown(e->fd, SHUT_RDWR);
        pthread_mutex_unlock(&e->send_mu);
        pthread_join(e->thread, NULL);
    }
    if (e->fd >= 0) close(e->fd);
    json_decref(e->gen_msg);
    json_decref(e->ag_msg);
    pthread_mutex_destroy(&e->send_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
