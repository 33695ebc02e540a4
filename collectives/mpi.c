/* The mpi backend: MPI_Iallreduce / MPI_Ibcast behind the collectives vtable, for clusters that
 * launch with mpirun, and the reference of the all-reduce benchmark.
 *
 * Requests run on the engine's communication thread (the only thread that calls MPI after init,
 * hence MPI_THREAD_SERIALIZED). Open MPI makes progress only inside MPI calls, and MPI_Wait
 * busy-polls, so the thread tests the request and sleeps 20 us between tests: it never spins on a
 * core the compute threads need. bf16 sums use a user-defined MPI_Op (fp32 accumulate, round to
 * nearest even). MPI collectives cannot be cancelled: on abort or deadline the request is left
 * behind, the communicator is marked failed, and the job is expected to stop (no rejoin under
 * mpirun).
 */
#include <string.h>
#include <time.h>

#include "collectives/coll_impl.h"
#include "common/alloc.h"
#include "common/clock.h"

#ifdef DDP_HAVE_MPI
#include <mpi.h>

typedef struct {
    ddp__engine_t *eng;
    MPI_Comm comm;
    MPI_Op bf16_sum;
} mpi_impl_t;

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    ddp__reduce(DDP_DT_BF16, inout, NULL, in, inout, (size_t)*len, 1.0f);
}

static int mpi_probe(void) { return 5; }

static int mpi_run(ddp_coll_t *c, ddp_coll_req_t *q)
{
    mpi_impl_t *m = c->impl;
    if (!q || q->bytes == 0) return 0;
    MPI_Request r;
    int rc;
    void *scratch = NULL; /* a rank that only passes a transfer on (ddp_coll_transfer) */
    if (q->kind == DDP__REQ_BCAST && c->rank != q->root && !q->keep) {
        scratch = ddp_malloc(q->bytes);
        if (!scratch) return ddp__coll_fail(c, DDP_ENOMEM, "transfer of %zu bytes", q->bytes);
    }
    if (q->kind == DDP__REQ_BCAST)
        rc = MPI_Ibcast(scratch ? scratch : q->buf, (int)q->bytes, MPI_BYTE, q->root, m->comm,
                        &r);
    else
        rc = MPI_Iallreduce(MPI_IN_PLACE, q->buf, (int)q->count,
                            q->dt == DDP_DT_F32 ? MPI_FLOAT : MPI_UINT16_T,
                            q->dt == DDP_DT_F32 ? MPI_SUM : m->bf16_sum, m->comm, &r);
    char d[96];
    if (rc != MPI_SUCCESS) {
        free(scratch);
        return ddp__coll_fail(c, DDP_EMPI, "%s: MPI error %d", ddp__req_desc(q, d, sizeof d), rc);
    }
    int64_t deadline = ddp_now_ns() + ddp__coll_auto_timeout_ns(c, q->bytes);
    for (;;) {
        int done = 0;
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (done) break;
        int err = atomic_load(&c->err);
        if (err) return err; /* scratch stays: MPI may still write it */
        if (ddp_now_ns() > deadline)
            return ddp__coll_fail(c, DDP_ETIMEDOUT, "%s: not complete within the deadline (MPI "
                                  "does not say which rank is missing)",
                                  ddp__req_desc(q, d, sizeof d));
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    free(scratch);
    if (q->kind == DDP__REQ_ALLREDUCE && q->op == DDP_OP_AVG)
        ddp__scale(q->dt, q->buf, q->count, 1.0f / (float)c->size);
    return 0;
}

static int mpi_init(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                    ddp_errinfo_t *ei)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited || strcmp(bs->ops->name, "mpi"))
        return ddp_errinfo_set(ei, DDP_EINVAL, "the mpi backend needs the mpi bootstrap");
    mpi_impl_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum);
    c->impl = m;
    c->transport = "mpi";
    int rc = ddp__engine_start(&m->eng, c, mpi_run);
    if (rc < 0) {
        MPI_Op_free(&m->bf16_sum);
        MPI_Comm_free(&m->comm);
        free(m);
        c->impl = NULL;
        return ddp_errinfo_set(ei, rc, "cannot start the communication thread");
    }
    return 0;
}

static int mpi_submit(ddp_coll_t *c, ddp_coll_req_t *req)
{
    mpi_impl_t *m = c->impl;
    if (req->count > 0x7fffffff) return DDP_ENOTSUP;
    ddp__engine_submit(m->eng, req);
    return 0;
}

static int mpi_wait(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns)
{
    return ddp__engine_wait(c, req, deadline_ns);
}

static void mpi_abort(ddp_coll_t *c)
{
    mpi_impl_t *m = c->impl;
    if (m && m->eng) ddp__engine_wake(m->eng);
}

static void mpi_free(ddp_coll_t *c)
{
    mpi_impl_t *m = c->impl;
    if (!m) return;
    ddp__engine_stop(m->eng);
    if (!atomic_load(&c->err)) {
        MPI_Op_free(&m->bf16_sum);
        MPI_Comm_free(&m->comm);
    }
    free(m);
    c->impl = NULL;
}

const ddp_coll_ops_t ddp_coll_mpi_ops = {
    .name = "mpi",
    .probe = mpi_probe,
    .host_memory = 1,
    .init = mpi_init,
    .submit = mpi_submit,
    .wait = mpi_wait,
    .abort = mpi_abort,
    .free = mpi_free,
};

#else

static int mpi_probe(void) { return 0; }

const ddp_coll_ops_t ddp_coll_mpi_ops = {.name = "mpi", .probe = mpi_probe};

#endif
