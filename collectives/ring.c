/* The ring backend's algorithms, written once over the transport interface (transport.h).
 *
 * All-reduce: every rank's slice of the buffer (ddp_coll_slice) is a segment; the segments are
 * cut into rounds of at most C elements each (C = elements per slot), and each round runs the
 * bandwidth-optimal ring: n-1 reduce-scatter steps then n-1 all-gather steps, one slot-sized
 * message per step on the link to the next rank. The segment that starts at rank s + 1 ends its
 * reduce-scatter at rank s, so after the reduce-scatter steps each rank holds the sum of its own
 * slice: a reduce-scatter is the first half of the schedule and an all-gather the second, and
 * the slice a reduce-scatter leaves is bitwise what the all-reduce gives there. Slices are cut
 * at DDP_COLL_SLICE_ELEMS elements, so a buffer shorter than n of those fills fewer than n
 * segments and carries less in parallel: the price of that equality (gradient buckets are far
 * larger; the small all-reduces are latency-bound anyway).
 * Steps are fused so peer data is read once: a received partial sum is added to the local data
 * and written straight into the next send slot; the final sum (scaled by 1/n for an average) is
 * stored locally and sent in one pass; gathered segments are copied and forwarded in one pass.
 * While the last message of a round is awaited, the first message of the next round is already
 * sent, which keeps both directions busy. Over a link that can send from the caller's memory
 * (TCP's send_from), a partial or final sum of an all-reduce is written into the local buffer
 * and sent from there, and a link that can receive into it (TCP's recv_post) has each
 * all-gather message posted to its final place in advance, so a segment crosses the socket with
 * no memcpy on either side; a partial sum left in the local buffer is overwritten by the
 * all-gather (the same operands in the same order as through slots). A reduce-scatter keeps its
 * partial sums in the slots: it leaves the rest of the buffer as it was. Each segment is always
 * summed starting at the same rank and going around the ring, so the result is a pure function
 * of the inputs and the world size: bitwise identical run to run.
 * A step of a two-level operation (hier.c) runs the same schedule on a sub-communicator with the
 * world's slices (q->slicing): each rank's part is then one or several of the world's slices,
 * and a round takes C elements of one of them; an average then divides by the world's size
 * (q->avg_n), not the sub-communicator's.
 *
 * Everything here runs on the communicator's communication thread (engine.c). It sleeps in poll()
 * on the transports' fds and the engine's eventfd, after a spin of DDP__SPIN_NS. A failure is named: the rank
 * whose link broke, the rank another rank reported, or the rank waited for when the automatic
 * deadline expired. The first failure is sent to both neighbours so it travels around the ring.
 * Ranks are named in the world's numbering (ddp__world_rank: a sub-communicator's own numbering
 * is not the one its caller knows).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/coll_impl.h"
#include "collectives/flight.h"
#include "collectives/ring.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/test_hook.h" /* DDP_COLL_DELAY_US */

static int mod(long a, int n) { return (int)(((a % n) + n) % n); }

typedef struct {
    size_t off, len;
} seg_t;

/* The schedule's geometry for one request: rank s's part of the buffer is `pieces` slices
 * (ddp_coll_slice over n ranks, or over the world's for a step of a two-level operation:
 * q->slicing), and each piece takes rpp rounds of at most C elements. */
typedef struct {
    const ddp__slicing_t *sl;
    size_t count, C, rpp;
    int n, pieces;
} geom_t;

static geom_t geom_of(const ddp_coll_req_t *q, int n, size_t C)
{
    geom_t g = {.sl = q->slicing, .count = q->count, .C = C, .n = n,
                .pieces = q->slicing ? q->slicing->pieces : 1};
    size_t lo, hi;
    ddp_coll_slice(q->count, g.sl ? g.sl->world : n, 0, &lo, &hi); /* the first is the longest */
    g.rpp = (hi - lo + C - 1) / C;
    return g;
}

/* Round `round` of segment s: the round's C elements of the part of rank s - 1 (the rank the
 * segment's reduce-scatter ends at): piece round / rpp, elements from (round % rpp) * C; empty
 * past the piece's end. */
static seg_t seg_of(const geom_t *g, size_t round, int s)
{
    const int owner = mod(s - 1, g->n);
    const size_t piece = round / g->rpp, j = round % g->rpp;
    size_t lo, hi;
    if (g->sl)
        ddp_coll_slice(g->count, g->sl->world, g->sl->idx[owner * g->pieces + (int)piece], &lo,
                       &hi);
    else
        ddp_coll_slice(g->count, g->n, owner, &lo, &hi);
    size_t o = lo + j * g->C < hi ? lo + j * g->C : hi;
    return (seg_t){o, hi - o < g->C ? hi - o : g->C};
}

/* Before each chunk sent: the caller's delay (opts.chunk_delay_us), else the test hook's. */
static void delay(ddp__ring_t *R)
{
    if (R->delay_us <= 0) {
        ddp_test_hook(DDP_HOOK_RING_SEND, 0, -1); /* every rank alike */
        return;
    }
    struct timespec ts = {R->delay_us / 1000000, (long)(R->delay_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Names a failure seen on a link and records it on c. Returns the error in force. Ranks are
 * named, blamed and reported in the world's numbering (ddp__world_rank): the culprit of an abort
 * note is one already, so a sub-communicator of a two-level operation can pass on a rank that
 * is not among its own. */
static int link_failed(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, ddp__xport_t *x,
                       int rc, int culprit, int code)
{
    char d[96];
    ddp__req_desc(q, d, sizeof d);
    const int me = ddp__world_rank(c, c->rank), peer = ddp__world_rank(c, x->peer);
    if (rc == DDP_EABORTED && culprit == me) {
        /* A peer blames this rank, which is alive and was itself waiting on someone: that
         * peer timed out behind it. Name the rank this one was waiting on instead. */
        int who = atomic_load(&c->waiting_on);
        if (who >= 0 && who != me) {
            R->culprit = who;
            return ddp__coll_fail(c, code ? code : DDP_EPEER,
                                  "%s: rank %d did not arrive (this rank waited on it; rank %d "
                                  "gave up on this one)", d, who, peer);
        }
    }
    if (rc == DDP_EABORTED) {
        R->culprit = culprit;
        if (culprit == peer)
            return ddp__coll_fail(c, code ? code : DDP_EABORTED, "%s: rank %d aborted (%s)", d,
                                  culprit, ddp_err_name(code));
        return ddp__coll_fail(c, code ? code : DDP_EPEER,
                              "%s: rank %d did not arrive (%s, reported by rank %d)", d, culprit,
                              ddp_err_name(code), peer);
    }
    R->culprit = peer;
    return ddp__coll_fail(c, DDP_EPEER, "%s: rank %d did not arrive: its %s link closed (process "
                          "died or left)", d, peer, x->ops->name);
}

/* A link whose peer has gone (DDP_EPEER) is only remembered here: data the peer sent before it
 * left is still consumed, and a peer that finished the operation and freed its communicator is
 * no failure. It becomes one when the ring blocks on that link (block()). */
static int progress_links(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q)
{
    ddp__xport_t *xs[2] = {R->send, R->recv};
    for (int i = 0; i < 2; i++) {
        int culprit = -1, code = 0;
        int rc = xs[i]->ops->progress(xs[i], &culprit, &code);
        if (rc == DDP_EPEER) {
            R->dead[i] = 1;
        } else if (rc < 0) {
            return link_failed(R, c, q, xs[i], rc, culprit, code);
        }
    }
    return 0;
}

/* Sleeps until a link or the engine has news, or the deadline. */
static int block(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int want_send, int want_recv,
                 int64_t *deadlinep)
{
    int64_t deadline = *deadlinep;
    int who = ddp__world_rank(c, want_recv ? R->recv->peer : R->send->peer);
    atomic_store(&c->waiting_on, who);
    if (q) ddp_flight_waiting(q->flight, who);
    if (want_recv && R->dead[1]) return link_failed(R, c, q, R->recv, DDP_EPEER, -1, 0);
    if (want_send && R->dead[0]) return link_failed(R, c, q, R->send, DDP_EPEER, -1, 0);
    struct pollfd p[5];
    int n = 0;
    p[n++] = (struct pollfd){.fd = ddp__engine_wakefd(R->eng), .events = POLLIN};
    int ns = R->send->ops->pollfds(R->send, p + n, want_send, 0);
    n += ns;
    int nr = R->recv->ops->pollfds(R->recv, p + n, 0, want_recv);
    n += nr;
    int64_t left = deadline - ddp_now_ns();
    if (left <= 0 && want_recv && !R->grace) {
        /* The previous rank may itself be waiting on a stalled rank further up the ring: give
         * its report a moment to arrive, so the rank named is the one that stalled. */
        R->grace = 1;
        *deadlinep = deadline = ddp_now_ns() + 1000000000LL;
        left = deadline - ddp_now_ns();
    }
    if (left <= 0) {
        char d[96];
        R->culprit = who;
        return ddp__coll_fail(c, DDP_ETIMEDOUT, "%s: rank %d did not arrive within %.1f s",
                              ddp__req_desc(q, d, sizeof d), who,
                              (double)(ddp_now_ns() - q->t_start) * 1e-9);
    }
    /* A short spin first (yielding the core): over loopback and shared memory the news is
     * usually microseconds away, and a sleeping thread takes far longer to wake. */
    int rc = poll(p, (nfds_t)n, 0);
    for (int64_t end = ddp_now_ns() + DDP__SPIN_NS; rc == 0 && ddp_now_ns() < end;) {
        sched_yield();
        rc = poll(p, (nfds_t)n, 0);
    }
    if (rc == 0) rc = poll(p, (nfds_t)n, (int)(left / 1000000) + 1);
    if (rc < 0 && errno != EINTR) return -errno;
    if (rc <= 0) return 0;
    if (p[0].revents) ddp__engine_drain(R->eng);
    int culprit = -1, code = 0;
    int e = R->send->ops->after_poll(R->send, p + 1, ns, &culprit, &code);
    if (e == DDP_EPEER)
        R->dead[0] = 1;
    else if (e < 0)
        return link_failed(R, c, q, R->send, e, culprit, code);
    e = R->recv->ops->after_poll(R->recv, p + 1 + ns, nr, &culprit, &code);
    if (e == DDP_EPEER)
        R->dead[1] = 1;
    else if (e < 0)
        return link_failed(R, c, q, R->recv, e, culprit, code);
    return 0;
}

int ddp__ring_check_links(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int fail_on_hangup)
{
    int err = atomic_load(&c->err);
    if (err) return err;
    struct pollfd p[5];
    int n = 0;
    p[n++] = (struct pollfd){.fd = ddp__engine_wakefd(R->eng), .events = POLLIN};
    int ns = R->send->ops->pollfds(R->send, p + n, 0, 0);
    n += ns;
    int nr = R->recv->ops->pollfds(R->recv, p + n, 0, 0);
    n += nr;
    if (poll(p, (nfds_t)n, 0) > 0) {
        if (p[0].revents) ddp__engine_drain(R->eng);
        ddp__xport_t *xs[2] = {R->send, R->recv};
        const struct pollfd *ps[2] = {p + 1, p + 1 + ns};
        int cnt[2] = {ns, nr};
        for (int i = 0; i < 2; i++) {
            int culprit = -1, code = 0;
            int e = xs[i]->ops->after_poll(xs[i], ps[i], cnt[i], &culprit, &code);
            if (e == DDP_EPEER)
                R->dead[i] = 1;
            else if (e < 0)
                return link_failed(R, c, q, xs[i], e, culprit, code);
        }
    }
    DDP_CHECK(progress_links(R, c, q));
    for (int i = 0; fail_on_hangup && i < 2; i++)
        if (R->dead[i])
            return link_failed(R, c, q, i ? R->recv : R->send, DDP_EPEER, -1, 0);
    err = atomic_load(&c->err);
    return err;
}

static int bad_len(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, size_t got, size_t want)
{
    char d[96];
    R->culprit = ddp__world_rank(c, R->recv->peer);
    return ddp__coll_fail(c, DDP_EPROTO, "%s: rank %d sent a chunk of %zu bytes, expected %zu",
                          ddp__req_desc(q, d, sizeof d), R->culprit, got, want);
}

/* Queues [p, p + len) of the caller's buffer on the send link, whose send_slot() returned `slot`:
 * straight from the buffer where the link can, through the slot otherwise. */
static void send_buf(ddp__ring_t *R, void *slot, const char *p, size_t len)
{
    delay(R);
    if (R->send->ops->send_from) {
        R->send->ops->send_from(R->send, p, len);
    } else {
        memcpy(slot, p, len);
        R->send->ops->send_commit(R->send, len);
    }
}

static void detach(ddp__ring_t *R)
{
    if (R->send->ops->detach) R->send->ops->detach(R->send);
    if (R->recv->ops->detach) R->recv->ops->detach(R->recv);
}

/* All-reduce, reduce-scatter or all-gather: steps [t0, t1) of each round's schedule (module
 * comment). Step t < n - 1 receives a partial sum of segment r - t - 1; step t >= n - 1
 * receives the final sum of segment r - (t - n + 1). */
static int run_elementwise(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline)
{
    const int n = c->size, r = c->rank;
    const int t0 = q->kind == DDP__REQ_ALLGATHER ? n - 1 : 0;
    const int t1 = q->kind == DDP__REQ_REDUCE_SCATTER ? n - 1 : 2 * (n - 1);
    const int T = t1 - t0;
    /* the first message of a round: this rank's data, or for an all-gather its final slice */
    const int first = q->kind == DDP__REQ_ALLGATHER ? r + 1 : r;
    const size_t es = ddp_dtype_size(q->dt);
    const geom_t g = geom_of(q, n, (R->slot_bytes / es) & ~(size_t)15);
    const size_t nrounds = g.rpp * (size_t)g.pieces;
    const float scale = q->op == DDP_OP_AVG ? 1.0f / (float)(q->avg_n ? q->avg_n : n) : 1.0f;
    char *buf = q->buf;
    const int zsend = R->send->ops->send_from != NULL && q->kind != DDP__REQ_REDUCE_SCATTER;
    /* messages this rank receives: T per round, the all-gather's to their final place */
    const uint64_t nmsg = (uint64_t)nrounds * (uint64_t)T;
    uint64_t posted = R->recv->ops->recv_post ? 0 : nmsg;
    size_t round = 0;
    int t = t0, sent0 = 0, sent0_next = 0;
    while (round < nrounds) {
        int err = atomic_load(&c->err);
        if (err) return err;
        for (; posted < nmsg; posted++) {
            int pt = t0 + (int)(posted % (uint64_t)T);
            char *dst = NULL;
            size_t dlen = 0;
            if (pt >= n - 1) {
                seg_t s = seg_of(&g, (size_t)(posted / (uint64_t)T),
                                 mod((long)r - (pt - (n - 1)), n));
                dst = buf + s.off * es;
                dlen = s.len * es;
            }
            if (R->recv->ops->recv_post(R->recv, dst, dlen) < 0) break;
        }
        DDP_CHECK(progress_links(R, c, q));
        int moved = 0, want_send = 0, want_recv = 0;
        if (!sent0) {
            void *p = R->send->ops->send_slot(R->send);
            if (p) {
                seg_t s = seg_of(&g, round, mod(first, n));
                send_buf(R, p, buf + s.off * es, s.len * es);
                sent0 = moved = 1;
            } else {
                want_send = 1;
            }
        }
        if (sent0 && t == t1 - 1 && round + 1 < nrounds && !sent0_next) {
            void *p = R->send->ops->send_slot(R->send);
            if (p) {
                seg_t s = seg_of(&g, round + 1, mod(first, n));
                send_buf(R, p, buf + s.off * es, s.len * es);
                sent0_next = moved = 1;
            }
        }
        if (sent0) {
            size_t len = 0;
            const void *rp = R->recv->ops->recv_slot(R->recv, &len);
            int need_send = t < t1 - 1;
            void *sp = (rp && need_send) ? R->send->ops->send_slot(R->send) : NULL;
            if (!rp) {
                want_recv = 1;
            } else if (need_send && !sp) {
                want_send = 1;
            } else {
                char *local;
                if (t < n - 1) {
                    seg_t s = seg_of(&g, round, mod((long)r - t - 1, n));
                    if (len != s.len * es) return bad_len(R, c, q, len, s.len * es);
                    local = buf + s.off * es;
                    float sc = t < n - 2 ? 1.0f : scale;
                    if (zsend) /* a partial sum in place: the all-gather overwrites it */
                        ddp__reduce(q->dt, local, NULL, rp, local, s.len, sc);
                    else if (t < n - 2)
                        ddp__reduce(q->dt, sp, NULL, rp, local, s.len, 1.0f);
                    else
                        ddp__reduce(q->dt, local, sp, rp, local, s.len, scale);
                } else {
                    seg_t s = seg_of(&g, round, mod((long)r - (t - (n - 1)), n));
                    if (len != s.len * es) return bad_len(R, c, q, len, s.len * es);
                    local = buf + s.off * es;
                    if (rp != local) memcpy(local, rp, len); /* not received in place */
                    if (sp && !zsend) memcpy(sp, rp, len);
                }
                R->recv->ops->recv_release(R->recv);
                if (sp && zsend) {
                    delay(R);
                    R->send->ops->send_from(R->send, local, len);
                } else if (sp) {
                    delay(R);
                    R->send->ops->send_commit(R->send, len);
                }
                moved = 1;
                if (++t == t1) {
                    t = t0;
                    round++;
                    sent0 = sent0_next;
                    sent0_next = 0;
                }
            }
        }
        if (!moved) DDP_CHECK(block(R, c, q, want_send, want_recv, &deadline));
    }
    return 0;
}

/* A broadcast, or a transfer to some ranks (ddp_coll_transfer): the data goes from the root
 * along the ring to the rank `span` hops away; the ranks between forward it, and write it into
 * their buf only when they keep it. */
static int run_bcast(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline)
{
    char *buf = q->buf;
    size_t done = 0, S = R->slot_bytes;
    const int hops = (c->rank - q->root + c->size) % c->size;
    if (hops > q->span || q->span == 0) return 0; /* past the last receiver */
    const int forward = hops < q->span;
    while (done < q->bytes) {
        int err = atomic_load(&c->err);
        if (err) return err;
        DDP_CHECK(progress_links(R, c, q));
        size_t want = q->bytes - done < S ? q->bytes - done : S;
        if (c->rank == q->root) {
            void *p = R->send->ops->send_slot(R->send);
            if (p) {
                memcpy(p, buf + done, want);
                delay(R);
                R->send->ops->send_commit(R->send, want);
                done += want;
                continue;
            }
            DDP_CHECK(block(R, c, q, 1, 0, &deadline));
            continue;
        }
        size_t len = 0;
        const void *rp = R->recv->ops->recv_slot(R->recv, &len);
        void *sp = (rp && forward) ? R->send->ops->send_slot(R->send) : NULL;
        if (rp && (!forward || sp)) {
            if (len != want) return bad_len(R, c, q, len, want);
            if (q->keep) memcpy(buf + done, rp, len);
            if (sp) memcpy(sp, rp, len);
            R->recv->ops->recv_release(R->recv);
            if (sp) {
                delay(R);
                R->send->ops->send_commit(R->send, len);
            }
            done += len;
            continue;
        }
        DDP_CHECK(block(R, c, q, rp != NULL, rp == NULL, &deadline));
    }
    return 0;
}

/* Waits until every committed message has left this process, so that a free() right after the
 * operation cannot cut the next rank off. */
static int flush(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline)
{
    while (R->send->ops->pending(R->send) > 0) {
        int err = atomic_load(&c->err);
        if (err) return err;
        DDP_CHECK(progress_links(R, c, q));
        if (R->send->ops->pending(R->send) == 0) break;
        DDP_CHECK(block(R, c, q, 1, 0, &deadline));
    }
    return 0;
}

static int ring_run(ddp_coll_t *c, ddp_coll_req_t *q)
{
    ddp__ring_t *R = c->impl;
    if (!q) {
        if (R->send) {
            int code = atomic_load(&c->err);
            int culprit = R->culprit >= 0 ? R->culprit : ddp__world_rank(c, c->rank);
            R->send->ops->notify_abort(R->send, culprit, code);
            R->recv->ops->notify_abort(R->recv, culprit, code);
        }
        return 0;
    }
    if (c->size == 1 || q->bytes == 0) return 0; /* average over one rank: x * 1 == x */
    if (R->hier && q->kind != DDP__REQ_BCAST && !q->barrier) return ddp__hier_run(R->hier, c, q);
    int64_t deadline = ddp_now_ns() + ddp__coll_auto_timeout_ns(c, q->bytes);
    R->grace = 0;
    if (q->impl || (q->barrier && R->direct)) return ddp__direct_run(R, c, q, deadline);
    int rc = q->kind == DDP__REQ_BCAST ? run_bcast(R, c, q, deadline)
                                       : run_elementwise(R, c, q, deadline);
    if (rc >= 0) rc = flush(R, c, q, deadline);
    detach(R); /* after a failure too: the caller may free q->buf once it completes */
    return rc;
}

static int ring_probe(void) { return 10; }

static uint64_t ring_net_bytes(const ddp_coll_t *c)
{
    const ddp__ring_t *R = c->impl;
    if (!R) return 0;
    uint64_t n = R->send && !strcmp(R->send->ops->name, "tcp") ? atomic_load(&R->send->sent) : 0;
    return n + ddp__hier_net_bytes(R->hier);
}

static int ring_submit(ddp_coll_t *c, ddp_coll_req_t *req)
{
    ddp__ring_t *R = c->impl;
    if (R->direct && req->kind != DDP__REQ_BCAST && !req->slicing) {
        ddp__mem_t *m = ddp__mem_find(c, req->buf, req->bytes);
        if (m && m->peer) req->impl = m; /* shared on every rank: the single-pass path */
    }
    ddp__engine_submit(R->eng, req);
    return 0;
}

static int ring_wait(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns)
{
    return ddp__engine_wait(c, req, deadline_ns);
}

static void ring_abort(ddp_coll_t *c)
{
    ddp__ring_t *R = c->impl;
    if (R && R->hier) ddp__hier_abort(R->hier, c, R->culprit);
    if (R && R->eng) ddp__engine_wake(R->eng);
}

static void ring_free(ddp_coll_t *c)
{
    ddp__ring_t *R = c->impl;
    if (!R) return;
    if (!atomic_load(&c->err) && c->outstanding) {
        /* requests still queued: they must not run on freed links */
        ddp__coll_fail(c, DDP_EABORTED, "communicator freed with operations pending");
    }
    ddp__engine_stop(R->eng);
    ddp__hier_free(R->hier); /* after the thread that drove it */
    ddp__direct_free(R, c->size);
    if (R->send) R->send->ops->close(R->send);
    if (R->recv) R->recv->ops->close(R->recv);
    free(R);
    c->impl = NULL;
}

int ddp__ring_start(ddp_coll_t *c, ddp__xport_t *send, ddp__xport_t *recv,
                    const ddp_coll_opts_t *opts, size_t slot_bytes)
{
    ddp__ring_t *R = ddp_calloc(1, sizeof *R);
    if (!R) return DDP_ENOMEM;
    R->send = send;
    R->recv = recv;
    R->slot_bytes = slot_bytes;
    R->culprit = -1;
    R->delay_us = opts && opts->chunk_delay_us > 0 ? opts->chunk_delay_us : 0;
    c->impl = R;
    int rc = ddp__engine_start(&R->eng, c, ring_run);
    if (rc < 0) {
        free(R);
        c->impl = NULL;
    }
    return rc;
}

const ddp_coll_ops_t ddp_coll_ring_ops = {
    .name = "ring",
    .probe = ring_probe,
    .slices_anywhere = 1,
    .host_memory = 1,
    .init = ddp__ring_init,
    .submit = ring_submit,
    .wait = ring_wait,
    .test = NULL,
    .abort = ring_abort,
    .free = ring_free,
    .mem_map = ddp__direct_mem_map,
    .mem_unmap = ddp__direct_mem_unmap,
    .net_bytes = ring_net_bytes,
};
