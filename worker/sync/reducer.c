/* Bucketed, overlapped gradient all-reduce (see reducer.h). */
#include "worker/sync/reducer.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/trace.h"
#include "worker/sync/grad_dtype.h"

/* A norm block never straddles two ranks' slices. */
_Static_assert(DDP_COLL_SLICE_ELEMS % DDP_NORM_BLOCK == 0, "slices must hold whole norm blocks");

static size_t blocks_of(size_t n) { return (n + DDP_NORM_BLOCK - 1) / DDP_NORM_BLOCK; }

int ddp_reducer_init(ddp_reducer_t *r, const ddp_reducer_cfg_t *cfg)
{
    memset(r, 0, sizeof *r);
    r->world = cfg->world;
    r->arena = cfg->arena;
    size_t n = r->n = cfg->n;
    r->overlap = cfg->overlap;
    r->zero1 = cfg->zero1 && cfg->world->comm;
    r->bf16 = cfg->bf16 && cfg->world->comm;
    size_t first = (size_t)(cfg->first_bucket_mb * 1048576.0 / sizeof(float));
    size_t rest = (size_t)(cfg->bucket_mb * 1048576.0 / sizeof(float));
    if (first == 0) first = 1;
    if (rest == 0) rest = 1;
    int count = 0;
    for (size_t end = 0; end < n; count++) end += count == 0 ? first : rest;
    r->bucket_end = ddp_calloc((size_t)count + 1, sizeof *r->bucket_end);
    r->reqs = ddp_calloc((size_t)count + 1, sizeof *r->reqs);
    r->times = ddp_calloc((size_t)count + 1, sizeof *r->times);
    r->parts = ddp_calloc((size_t)count + 1, sizeof *r->parts);
    r->gathers = ddp_calloc(3 * (size_t)count + 1, sizeof *r->gathers);
    if (!r->bucket_end || !r->reqs || !r->times || !r->parts || !r->gathers) {
        ddp_reducer_close(r);
        return DDP_ENOMEM;
    }
    size_t end = 0;
    for (int b = 0; b < count; b++) {
        end += b == 0 ? first : rest;
        r->bucket_end[b] = end < n ? end : n;
    }
    r->n_buckets = count;
    for (int b = 0; b < count; b++) {
        size_t begin = b ? r->bucket_end[b - 1] : 0, len = r->bucket_end[b] - begin, lo = 0,
               hi = len;
        if (r->zero1) ddp_coll_slice(len, r->world->size, r->world->rank, &lo, &hi);
        r->parts[b] =
            (ddp_arena_part_t){begin + lo, begin + hi, r->n_norm_blocks + lo / DDP_NORM_BLOCK};
        r->n_norm_blocks += blocks_of(len);
    }
    ddp_trace_note("buckets", count); /* a trace shows every bucket of a step */
    r->norm_sums = ddp_calloc(r->n_norm_blocks + 1, sizeof *r->norm_sums);
    int staged = r->bf16 && !ddp_k_host_memory(r->world->k);
    size_t largest = 0;
    for (int b = 0; staged && b < count; b++)
        if (r->bucket_end[b] - (b ? r->bucket_end[b - 1] : 0) > largest)
            largest = r->bucket_end[b] - (b ? r->bucket_end[b - 1] : 0);
    if (staged) r->scratch = ddp_malloc(largest * sizeof(float) + 1);
    if (!r->norm_sums || (staged && !r->scratch)) {
        ddp_reducer_close(r);
        return DDP_ENOMEM;
    }
    return 0;
}

void ddp_reducer_close(ddp_reducer_t *r)
{
    if (!r) return;
    free(r->bucket_end);
    free(r->reqs);
    free(r->times);
    free(r->parts);
    free(r->gathers);
    free(r->norm_sums);
    free(r->scratch);
    memset(r, 0, sizeof *r);
}

void ddp_reducer_begin(ddp_reducer_t *r, const float *acc)
{
    r->acc = acc;
    r->ready_upto = 0;
    r->next = 0;
    r->narrowed = 0;
    r->ready_rc = 0;
    memset(r->times, 0, (size_t)r->n_buckets * sizeof *r->times);
}

/* Adds acc into the newly final part of the arena and starts complete buckets. */
static int advance(ddp_reducer_t *r, size_t done, int submit)
{
    if (done > r->n) done = r->n;
    if (done > r->ready_upto) {
        if (r->acc)
            ddp_k_add(r->world->k, r->arena + r->ready_upto, r->acc + r->ready_upto,
                      done - r->ready_upto);
        r->ready_upto = done;
    }
    int64_t now = ddp_now_ns();
    for (int b = r->next; b < r->n_buckets && r->bucket_end[b] <= done; b++)
        if (!r->times[b].ready) r->times[b].ready = now;
    if (!submit) return 0;
    /* bf16: the complete buckets narrowed in place first (on a device, copies queued on the
     * compute stream) */
    for (; r->bf16 && r->narrowed < r->n_buckets && r->bucket_end[r->narrowed] <= done;
         r->narrowed++) { /* once each, also when a submit below fails */
        int b = r->narrowed;
        size_t begin = b ? r->bucket_end[b - 1] : 0;
        DDP_CHECK(
            ddp_grad_narrow(r->world->k, r->arena + begin, r->bucket_end[b] - begin, r->scratch));
    }
    /* the adds above (and backward's last writes) are queued on the compute stream: the
     * all-reduces run on the communicator's stream, ordered after them (ddp_world_after_compute)
     * so that they read the finished gradient */
    if (r->next < r->n_buckets && r->bucket_end[r->next] <= done)
        DDP_CHECK(ddp_world_after_compute(r->world));
    ddp_dtype_t dt = r->bf16 ? DDP_DT_BF16 : DDP_DT_F32;
    while (r->next < r->n_buckets && r->bucket_end[r->next] <= done) {
        int b = r->next;
        size_t begin = b ? r->bucket_end[b - 1] : 0;
        size_t len = r->bucket_end[b] - begin;
        ddp_coll_tag_next(r->world->comm, b); /* the flight recorder's "bucket" */
        DDP_CHECK(r->zero1 ? ddp_coll_reduce_scatter(r->world->comm, r->arena + begin, len, dt,
                                                     DDP_OP_SUM, &r->reqs[b])
                           : ddp_coll_allreduce(r->world->comm, r->arena + begin, len, dt,
                                                DDP_OP_SUM, &r->reqs[b]));
        r->next++;
    }
    return 0;
}

int ddp_reducer_ready(ddp_reducer_t *r, size_t done)
{
    int rc = advance(r, done, r->overlap && r->world->comm);
    if (rc && !r->ready_rc) r->ready_rc = rc;
    return rc;
}

int ddp_reducer_finish(ddp_reducer_t *r, ddp_reducer_stats_t *stats, ddp_errinfo_t *ei)
{
    r->backward_end = ddp_now_ns();
    int rc = advance(r, r->n, r->world->comm != NULL);
    int64_t wait_begin = ddp_now_ns();
    for (int b = 0; b < r->next; b++) {
        int one = ddp_coll_wait_timed(r->reqs[b], 0, &r->times[b].start, &r->times[b].end, ei);
        r->reqs[b] = NULL;
        if (one && !rc) rc = one;
        if (r->bf16 && !rc) { /* after a failure the step is redone: the gradient is moot */
            size_t begin = b ? r->bucket_end[b - 1] : 0;
            rc =
                ddp_grad_widen(r->world->k, r->arena + begin, r->bucket_end[b] - begin, r->scratch);
        }
    }
    int64_t wait_end = ddp_now_ns();
    /* each bucket's collective on the communication thread, and the exposed wait */
    for (int b = 0; b < r->next; b++)
        ddp_trace_span(DDP_TRACE_COMM, r->times[b].start, r->times[b].end, "%s bucket %d (%.2f MB)",
                       r->zero1 ? "reduce-scatter" : "all-reduce", b,
                       (double)(r->bucket_end[b] - (b ? r->bucket_end[b - 1] : 0)) *
                           (r->bf16 ? 2 : 4) / 1e6);
    ddp_trace_span(DDP_TRACE_COMPUTE, wait_begin, wait_end, "wait for communication");
    if (stats) {
        /* Busy time of the communication thread over the step's buckets: the union of their
         * [start, end) intervals (they run one after another). */
        int64_t busy = 0, last_end = 0;
        for (int b = 0; b < r->next; b++) {
            int64_t s = r->times[b].start > last_end ? r->times[b].start : last_end;
            if (r->times[b].end > s) busy += r->times[b].end - s;
            if (r->times[b].end > last_end) last_end = r->times[b].end;
        }
        stats->comm_ms = (double)busy / 1e6;
        stats->exposed_ms = (double)(wait_end - wait_begin) / 1e6;
        stats->hidden = busy > 0 ? 1.0 - (double)(wait_end - wait_begin) / (double)busy : 1.0;
        if (stats->hidden < 0) stats->hidden = 0;
    }
    return rc ? rc : r->ready_rc;
}

int ddp_reducer_gather(ddp_reducer_t *r, float *arena, int b)
{
    size_t begin = b ? r->bucket_end[b - 1] : 0;
    if (r->n_gathers >= 3 * r->n_buckets) return DDP_EINVAL;
    ddp_coll_tag_next(r->world->comm, b);
    return ddp_coll_allgather(r->world->comm, arena + begin, r->bucket_end[b] - begin, DDP_DT_F32,
                              &r->gathers[r->n_gathers++]);
}

int ddp_reducer_gather_wait(ddp_reducer_t *r, ddp_errinfo_t *ei)
{
    int rc = 0;
    for (int i = 0; i < r->n_gathers; i++) {
        int one = ddp_coll_wait(r->gathers[i], 0, ei); /* NULL (submit failed) returns 0 */
        r->gathers[i] = NULL;
        if (one && !rc) rc = one;
    }
    r->n_gathers = 0;
    return rc;
}
