/* The MPI bootstrap: under mpirun/srun, ranks come from MPI_COMM_WORLD, the allgather is
 * MPI_Allgather, and the host id is the MPI shared-memory split (ranks that can share memory get
 * the same id). Compiled to a stub returning DDP_ENOTSUP when built without MPI.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/net.h"
#include "common/host.h"
#include "common/alloc.h"
#include "common/log.h"

#ifdef DDP_HAVE_MPI
#include <mpi.h>

static int mpi_allgather(ddp_coll_bootstrap_t *b, const void *mine, size_t len, void *all,
                         int64_t deadline_ns, ddp_errinfo_t *ei)
{
    /* MPI collectives have no deadline; mpirun kills the job when a rank dies. */
    int rc = MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int ml = 0;
        MPI_Error_string(rc, msg, &ml);
        return ddp_errinfo_set(ei, DDP_EMPI, "MPI_Allgather: %s", msg);
    }
    return 0;
}

static void mpi_bs_free(ddp_coll_bootstrap_t *b) { free(b); }

static const ddp_coll_bootstrap_ops_t mpi_bs_ops = {
    .name = "mpi",
    .allgather = mpi_allgather,
    .free = mpi_bs_free,
};

/* MPI requires MPI_Finalize before a process that called MPI_Init exits; mpirun reports an
 * abnormal termination otherwise. Registered when this bootstrap initialises MPI. */
static void finalize_at_exit(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

int ddp_coll_bootstrap_mpi(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei)
{
    if (!out) return DDP_EINVAL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        atexit(finalize_at_exit);
        int provided = 0;
        /* the mpi backend calls MPI from its communication thread only */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return ddp_errinfo_set(ei, DDP_EMPI, "MPI_Init_thread failed");
        if (provided < MPI_THREAD_SERIALIZED)
            DDP_WARN("MPI provides thread level %d < SERIALIZED; the mpi backend may misbehave",
                     provided);
    }
    ddp_coll_bootstrap_t *b = ddp_calloc(1, sizeof *b);
    if (!b) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    b->ops = &mpi_bs_ops;
    MPI_Comm_rank(MPI_COMM_WORLD, &b->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b->size);
    const char *tok = getenv("DDP_JOB_TOKEN");
    snprintf(b->token, sizeof b->token, "%s", tok && *tok ? tok : "mpi");
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &b->local_rank);
    int leader = b->local_rank == 0 ? b->rank : 0;
    MPI_Bcast(&leader, 1, MPI_INT, 0, local);
    MPI_Comm_free(&local);
    ddp_host_id(b->host_id, sizeof b->host_id);
    /* keep the netns/boot part but make the split authoritative */
    size_t hl = strlen(b->host_id);
    snprintf(b->host_id + hl, sizeof b->host_id - hl, "/mpi%d", leader);
    /* data address: the first non-loopback address is left to the ring (binds any) */
    b->data_host[0] = 0;
    *out = b;
    return 0;
}

#else

int ddp_coll_bootstrap_mpi(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei)
{
    if (out) *out = NULL;
    return ddp_errinfo_set(ei, DDP_ENOTSUP, "this build has no MPI (meson -Dmpi=enabled)");
}

#endif
