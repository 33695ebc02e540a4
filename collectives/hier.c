/* The ring backend's two-level all-reduce: reduce-scatter within each host, all-reduce across
 * hosts, all-gather within each host (coll.h says when it is chosen and why).
 *
 * Topology: from the host ids the ring's setup allgathered, host h is the h-th distinct id in
 * rank order and a rank's local index l is its position among its host's ranks in rank order,
 * so any placement works (a host's ranks need not be contiguous). Every rank forms two
 * sub-communicators from the world's bootstrap, each an ordinary ring: "intra", the R ranks of
 * its host (local index = rank there; shared memory), and "inter", the H ranks with its local
 * index (host index = rank there; TCP). Their bootstrap is cut out of the world's: an allgather
 * through the world's, of which each keeps its members' entries; every rank forms intra, then
 * inter, so the world's allgathers line up.
 *
 * Slices: the buffer is cut into the world's W slices (ddp_coll_slice over W), and rank g owns
 * slice g, as on the flat ring, so ZeRO-1's slices do not depend on the algorithm. Rank (h, l)
 * therefore needs the sum of its own slice from the ranks with its local index: the intra step
 * gives local rank l the host's partial sums of T_l, the H slices of the ranks with local index
 * l (one piece per host), and the inter step reduces T_l among those ranks, each owning its own
 * slice (ddp__slicing_t says so to the ring). Operations:
 *   all-reduce      intra reduce-scatter (sum) of T_l; inter all-reduce of T_l; intra
 *                   all-gather of T_l
 *   reduce-scatter  intra reduce-scatter; inter reduce-scatter; the other hosts' pieces of T_l,
 *                   which the intra step overwrote with partial sums, are put back as they were
 *   all-gather      inter all-gather of T_l, then intra all-gather of T_l
 * An average is summed through every step and divided by W once, in the inter step's last
 * addition (as the flat ring divides by W in its last one), so a reduce-scatter's slice is
 * bitwise the all-reduce's there (the ring's reduce-scatter is its all-reduce's first half).
 * Each step's sum order is the ring's (fixed per sub-communicator), so results are a pure
 * function of the inputs and the topology: bitwise reproducible run to run, but not equal to the
 * flat ring's.
 *
 * Threads: an operation runs on the world communicator's thread, which submits each step to a
 * sub-communicator, whose own thread runs it, and sleeps until it completes (waking every
 * MIRROR_NS to copy the rank the step waits on into the world's waiting_on and flight record, so
 * a deadline names it). Steps run one after another: the operations stay asynchronous for their
 * caller, but the intra and inter steps of one operation do not overlap each other.
 *
 * Failures: a sub-communicator names and blames ranks in the world's numbering (struct ddp_coll's
 * world_rank), and so do its abort notes. A step's failure fails the operation with the step's
 * message; failing the world communicator fails both sub-communicators with the world's culprit,
 * whose notes carry it to their neighbours. Every rank is in one intra and one inter ring, so the
 * news reaches every rank: a rank that died is named by all (a stalled one, as on the flat ring,
 * by its neighbours at least; a rank further away may name the neighbour it waited on).
 */
#include <stdio.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/flight.h"
#include "collectives/ring.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#define MIRROR_NS 50000000LL /* how often a waiting step's peer is copied to the world */

struct ddp__hier {
    ddp_coll_t *intra, *inter;
    int world, hosts, per_host; /* W = H R */
    int host, local;            /* this rank's */
    int *intra_idx;             /* [R * H]: local rank l's piece h is the slice of the rank with
                                 * local index l on host h */
    int *inter_idx;             /* [H]: host h's part is the slice of its rank with this local
                                 * index */
    ddp__slicing_t intra_sl, inter_sl;
    char *keep;                 /* reduce-scatter: the other hosts' pieces, kept (comm thread) */
    size_t keep_bytes;
};

/* ---- topology -------------------------------------------------------------------------------- */

/* Each rank's host index and local index, from n host ids `stride` bytes apart; *rank_at gets
 * [H * R]: the rank with local index l on host h at h * R + l. Returns 1 when every host has the
 * same number of ranks (*hosts and *per_host set), 0 when not (or out of memory: *hosts 0). */
static int plan(const char *ids, size_t stride, int n, int *host_of, int *local_of, int *hosts,
                int *per_host, int **rank_at)
{
    int H = 0;
    for (int r = 0; r < n; r++) {
        host_of[r] = -1;
        local_of[r] = 0;
        const char *id = ids + (size_t)r * stride;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (!strcmp(ids + (size_t)q * stride, id)) host_of[r] = host_of[q];
        if (host_of[r] < 0) host_of[r] = H++;
        for (int q = 0; q < r; q++) local_of[r] += host_of[q] == host_of[r];
    }
    *hosts = H;
    *per_host = n / H;
    *rank_at = NULL;
    for (int r = 0; r < n; r++)
        if (local_of[r] >= *per_host || n % H) return 0; /* some host has more than W / H */
    *rank_at = ddp_malloc(sizeof **rank_at * (size_t)n);
    if (!*rank_at) return *hosts = 0;
    for (int r = 0; r < n; r++) (*rank_at)[host_of[r] * *per_host + local_of[r]] = r;
    return 1;
}

/* Bytes that cross from the busiest host per byte of an all-reduce: the flat ring's (each link
 * from a rank to the next rank on another host carries 2 (W-1)/W) and the two-level one's. */
static double flat_cross(const int *host_of, int n, int hosts)
{
    int most = 0;
    for (int h = 0; h < hosts; h++) {
        int links = 0;
        for (int r = 0; r < n; r++) links += host_of[r] == h && host_of[(r + 1) % n] != h;
        if (links > most) most = links;
    }
    return most * 2.0 * (n - 1) / n;
}

/* ---- a bootstrap cut out of the world's ------------------------------------------------------ */

typedef struct {
    ddp_coll_bootstrap_t pub;
    ddp_coll_bootstrap_t *world;
    const int *members; /* [pub.size]: their world ranks */
} sub_bs_t;

/* An allgather through the world's bootstrap, keeping the members' entries: every world rank
 * must make the same call at the same point (each forms its intra, then its inter ring). */
static int sub_allgather(ddp_coll_bootstrap_t *b, const void *mine, size_t len, void *all,
                         int64_t deadline_ns, ddp_errinfo_t *ei)
{
    sub_bs_t *s = (sub_bs_t *)b;
    char *every = ddp_malloc(len * (size_t)s->world->size + 1);
    if (!every) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int rc = s->world->ops->allgather(s->world, mine, len, every, deadline_ns, ei);
    for (int i = 0; rc == 0 && i < b->size; i++)
        memcpy((char *)all + (size_t)i * len, every + (size_t)s->members[i] * len, len);
    free(every);
    return rc;
}

static void sub_free(ddp_coll_bootstrap_t *b) { (void)b; /* on its maker's stack */ }

static const ddp_coll_bootstrap_ops_t sub_bs_ops = {
    .name = "two-level",
    .allgather = sub_allgather,
    .free = sub_free,
};

/* Forms the ring of `members` (n world ranks, this rank at `me`), its data port at
 * DDP_DATA_PORT + port_base + this world rank. */
static int form_sub(ddp_coll_bootstrap_t *world, const ddp_coll_opts_t *opts, const int *members,
                    int n, int me, int port_base, ddp_coll_t **out, ddp_errinfo_t *ei)
{
    sub_bs_t s = {.pub = *world, .world = world, .members = members};
    s.pub.ops = &sub_bs_ops;
    s.pub.rank = me;
    s.pub.size = n;
    s.pub.local_rank = -1;
    ddp_coll_opts_t o = {.backend = "ring", .algo = "flat"};
    if (opts) {
        o.transport = opts->transport;
        o.chunk_bytes = opts->chunk_bytes;
        o.chunk_delay_us = opts->chunk_delay_us;
        o.timeout_s = opts->timeout_s;
    }
    return ddp__coll_new_sub(&s.pub, &o, members, port_base + world->rank, out, ei);
}

/* ---- start, stop ----------------------------------------------------------------------------- */

/* "auto", "flat" or "two-level" from opts or DDP_COLL_ALGO; NULL for anything else. */
static const char *algo_wanted(const ddp_coll_opts_t *opts)
{
    const char *a = opts && opts->algo && *opts->algo ? opts->algo : getenv("DDP_COLL_ALGO");
    if (!a || !*a) return "auto";
    return !strcmp(a, "auto") || !strcmp(a, "flat") || !strcmp(a, "two-level") ? a : NULL;
}

int ddp__hier_check_algo(const ddp_coll_opts_t *opts, ddp_errinfo_t *ei)
{
    if (algo_wanted(opts)) return 0;
    return ddp_errinfo_set(ei, DDP_EINVAL,
                           "collectives algorithm '%s' is unknown (auto, flat, "
                           "two-level; opts.algo or DDP_COLL_ALGO)",
                           opts && opts->algo && *opts->algo ? opts->algo
                                                             : getenv("DDP_COLL_ALGO"));
}

void ddp__hier_free(struct ddp__hier *h)
{
    if (!h) return;
    ddp_coll_free(h->intra);
    ddp_coll_free(h->inter);
    free(h->intra_idx);
    free(h->inter_idx);
    free(h->keep);
    free(h);
}

/* Builds h's slicings and forms its rings; 0 or the first error (h is then freed by the
 * caller). */
static int form_levels(struct ddp__hier *h, ddp_coll_t *c, ddp_coll_bootstrap_t *bs,
                       const ddp_coll_opts_t *opts, const int *rank_at, ddp_errinfo_t *ei)
{
    const int H = h->hosts, R = h->per_host;
    int *intra_members = ddp_malloc(sizeof(int) * (size_t)R);
    h->intra_idx = ddp_malloc(sizeof(int) * (size_t)(R * H));
    h->inter_idx = ddp_malloc(sizeof(int) * (size_t)H);
    if (!intra_members || !h->intra_idx || !h->inter_idx) {
        free(intra_members);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    }
    for (int l = 0; l < R; l++) {
        intra_members[l] = rank_at[h->host * R + l];
        for (int k = 0; k < H; k++) h->intra_idx[l * H + k] = rank_at[k * R + l];
    }
    for (int k = 0; k < H; k++) h->inter_idx[k] = rank_at[k * R + h->local];
    h->intra_sl = (ddp__slicing_t){.world = h->world, .pieces = H, .idx = h->intra_idx};
    h->inter_sl = (ddp__slicing_t){.world = h->world, .pieces = 1, .idx = h->inter_idx};
    /* the slice of world rank g is slice g: the inter ring's members are its slices' owners */
    int rc = form_sub(bs, opts, intra_members, R, h->local, c->size, &h->intra, ei);
    if (rc == 0) rc = form_sub(bs, opts, h->inter_idx, H, h->host, 2 * c->size, &h->inter, ei);
    free(intra_members);
    return rc;
}

int ddp__hier_start(ddp_coll_t *c, ddp__ring_t *R, ddp_coll_bootstrap_t *bs,
                    const ddp_coll_opts_t *opts, const char *ids, size_t stride, int force_tcp,
                    ddp_errinfo_t *ei)
{
    const int n = c->size;
    snprintf(c->algo, sizeof c->algo, "flat ring");
    const char *algo = algo_wanted(opts); /* checked by ddp__hier_check_algo */
    if (!algo || !strcmp(algo, "flat")) return 0;
    int *host_of = ddp_malloc(sizeof(int) * (size_t)n);
    int *local_of = ddp_malloc(sizeof(int) * (size_t)n);
    int *rank_at = NULL, hosts = 0, per_host = 0, rc = 0;
    int even =
        host_of && local_of && plan(ids, stride, n, host_of, local_of, &hosts, &per_host, &rank_at);
    if (!hosts) { /* every rank must decide alike: no quiet fallback */
        rc = ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
        goto out;
    }
    const char *why = force_tcp       ? "TCP is forced"
                      : hosts == 1    ? "one host"
                      : !even         ? "hosts have different numbers of ranks"
                      : per_host == 1 ? "one rank per host"
                                      : NULL;
    double flat = why ? 0 : flat_cross(host_of, n, hosts), two = 2.0 * (hosts - 1) / hosts;
    if (!why && two >= flat) why = "it would not send fewer bytes across hosts";
    if (why) {
        if (!strcmp(algo, "two-level") && c->rank == 0)
            DDP_WARN("collectives: two-level all-reduce asked for, but %s: flat ring", why);
        goto out;
    }
    struct ddp__hier *h = ddp_calloc(1, sizeof *h);
    if (!h) {
        rc = ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
        goto out;
    }
    h->world = n;
    h->hosts = hosts;
    h->per_host = per_host;
    h->host = host_of[c->rank];
    h->local = local_of[c->rank];
    rc = form_levels(h, c, bs, opts, rank_at, ei);
    if (rc < 0) {
        ddp__hier_free(h);
        goto out;
    }
    R->hier = h;
    snprintf(c->algo, sizeof c->algo, "two-level (%d hosts x %d ranks)", hosts, per_host);
    if (c->rank == 0)
        DDP_INFO("collectives: two-level all-reduce over %d hosts x %d ranks (%s within a host, "
                 "%s across): each host sends %.2f x the buffer to other hosts, the flat ring "
                 "%.2f x",
                 hosts, per_host, ddp_coll_transport_name(h->intra),
                 ddp_coll_transport_name(h->inter), two, flat);
out:
    free(host_of);
    free(local_of);
    free(rank_at);
    return rc;
}

uint64_t ddp__hier_net_bytes(const struct ddp__hier *h)
{
    return h ? ddp_coll_net_bytes_sent(h->intra) + ddp_coll_net_bytes_sent(h->inter) : 0;
}

void ddp__hier_abort(struct ddp__hier *h, ddp_coll_t *c, int culprit)
{
    ddp_coll_t *subs[2] = {h->intra, h->inter};
    for (int i = 0; i < 2; i++) {
        ddp__ring_t *S = subs[i]->impl;
        int none = -1; /* a rank the step blamed itself stays blamed */
        if (culprit >= 0) atomic_compare_exchange_strong(&S->culprit, &none, culprit);
        ddp__coll_fail(subs[i], atomic_load(&c->err), "%s", c->errmsg);
    }
}

/* ---- operations ------------------------------------------------------------------------------ */

/* Runs one step of q on sub and waits for it; a failure fails c naming the step. */
static int step(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, ddp_coll_t *sub, const char *what,
                int kind, ddp_redop_t op, const ddp__slicing_t *sl, int avg_n)
{
    ddp_coll_req_t *r;
    char sd[96] = "";
    int rc = ddp__coll_submit_step(sub, kind, q->buf, q->count, q->dt, op, sl, avg_n, &r);
    if (rc == 0) {
        ddp__req_desc(r, sd, sizeof sd);
        while (!ddp__coll_sleep_until_done(sub, r, ddp_now_ns() + MIRROR_NS)) {
            int who = atomic_load(&sub->waiting_on); /* a world rank already */
            atomic_store(&c->waiting_on, who);
            ddp_flight_waiting(q->flight, who);
        }
        rc = ddp_coll_wait(r, 0, NULL);
    }
    if (rc == 0) return 0;
    /* the step's message without its own description ("reduce-scatter #7 (...): ") */
    const char *why = ddp_coll_last_error(sub);
    size_t sl_len = strlen(sd);
    if (sl_len && !strncmp(why, sd, sl_len) && !strncmp(why + sl_len, ": ", 2)) why += sl_len + 2;
    if (!*why) why = ddp_strerror(rc);
    ddp__ring_t *S = sub->impl;
    int none = -1; /* the world's culprit, unless the world failed first (it aborted the step) */
    atomic_compare_exchange_strong(&R->culprit, &none, atomic_load(&S->culprit));
    char d[96];
    return ddp__coll_fail(c, rc, "%s, %s: %s", ddp__req_desc(q, d, sizeof d), what, why);
}

/* Reduce-scatter: the pieces of T_l other than this rank's slice, in host order, copied out of
 * buf (save) or back into it (!save). 0 or DDP_ENOMEM. */
static int keep_others(struct ddp__hier *h, ddp_coll_req_t *q, int save)
{
    const size_t es = ddp_dtype_size(q->dt);
    size_t lo, hi, at = 0, need = 0;
    for (int k = 0; k < h->hosts; k++) {
        ddp_coll_slice(q->count, h->world, h->inter_idx[k], &lo, &hi);
        if (k != h->host) need += (hi - lo) * es;
    }
    if (save && need > h->keep_bytes) {
        char *p = realloc(h->keep, need);
        if (!p) return DDP_ENOMEM;
        h->keep = p;
        h->keep_bytes = need;
    }
    for (int k = 0; k < h->hosts; k++) {
        ddp_coll_slice(q->count, h->world, h->inter_idx[k], &lo, &hi);
        if (k == h->host || hi == lo) continue; /* h->keep may be NULL then */
        char *p = (char *)q->buf + lo * es;
        if (save)
            memcpy(h->keep + at, p, (hi - lo) * es);
        else
            memcpy(p, h->keep + at, (hi - lo) * es);
        at += (hi - lo) * es;
    }
    return 0;
}

/* 1 when T_l holds no element (a buffer too short for this local index's slices): the inter
 * ring has nothing to do. The same on every rank of that ring. */
static int part_empty(const struct ddp__hier *h, size_t count)
{
    size_t lo, hi;
    for (int k = 0; k < h->hosts; k++) {
        ddp_coll_slice(count, h->world, h->inter_idx[k], &lo, &hi);
        if (hi > lo) return 0;
    }
    return 1;
}

int ddp__hier_run(struct ddp__hier *h, ddp_coll_t *c, ddp_coll_req_t *q)
{
    ddp__ring_t *R = c->impl;
    const int skip_inter = part_empty(h, q->count);
    char intra_what[48], inter_what[48];
    snprintf(intra_what, sizeof intra_what, "step within host %d", h->host);
    snprintf(inter_what, sizeof inter_what, "step across hosts (local index %d)", h->local);
#define STEP(sub, what, kind, op, sl, avg_n)                                                       \
    DDP_CHECK(step(R, c, q, h->sub, what, kind, op, &h->sl, avg_n))
    switch (q->kind) {
    case DDP__REQ_ALLREDUCE:
        STEP(intra, intra_what, DDP__REQ_REDUCE_SCATTER, DDP_OP_SUM, intra_sl, 0);
        if (!skip_inter) STEP(inter, inter_what, DDP__REQ_ALLREDUCE, q->op, inter_sl, h->world);
        STEP(intra, intra_what, DDP__REQ_ALLGATHER, DDP_OP_SUM, intra_sl, 0);
        return 0;
    case DDP__REQ_REDUCE_SCATTER:
        if (keep_others(h, q, 1) < 0) {
            char d[96];
            return ddp__coll_fail(c, DDP_ENOMEM, "%s: out of memory for the other hosts' slices",
                                  ddp__req_desc(q, d, sizeof d));
        }
        STEP(intra, intra_what, DDP__REQ_REDUCE_SCATTER, DDP_OP_SUM, intra_sl, 0);
        if (!skip_inter)
            STEP(inter, inter_what, DDP__REQ_REDUCE_SCATTER, q->op, inter_sl, h->world);
        return keep_others(h, q, 0);
    case DDP__REQ_ALLGATHER:
        if (!skip_inter) STEP(inter, inter_what, DDP__REQ_ALLGATHER, DDP_OP_SUM, inter_sl, 0);
        STEP(intra, intra_what, DDP__REQ_ALLGATHER, DDP_OP_SUM, intra_sl, 0);
        return 0;
    }
#undef STEP
    return DDP_EINVAL;
}
