/* The step's vote (see vote.h): the one place that knows its floats' positions. */
#include "worker/sync/vote.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

enum { VOTE_LOSS, VOTE_STOP, VOTE_CKPT, VOTE_REGROUP = VOTE_CKPT + 2, VOTE_RANKS };
_Static_assert(VOTE_RANKS == DDP_VOTE_FIXED, "the vote's layout is a wire format");

int ddp_vote_attach(ddp_vote_t *v, const ddp_world_t *world)
{
    ddp_vote_free(v);
    v->world = world;
    v->buf = ddp_calloc(VOTE_RANKS + (size_t)world->size, sizeof *v->buf);
    return v->buf ? 0 : DDP_ENOMEM;
}

int ddp_vote_cast(ddp_vote_t *v, ddp_ballot_t *b, ddp_errinfo_t *ei)
{
    const ddp_world_t *w = v->world;
    float *f = v->buf;
    size_t n = VOTE_RANKS + (size_t)w->size;
    memset(f, 0, n * sizeof *f);
    f[VOTE_LOSS] = (float)b->loss_sum;
    f[VOTE_STOP] = (float)b->stop;
    f[VOTE_CKPT] = b->ckpt[0];
    f[VOTE_CKPT + 1] = b->ckpt[1];
    f[VOTE_REGROUP] = (float)b->regroup;
    f[VOTE_RANKS + w->rank] = (float)b->compute_ms;
    DDP_CHECK(ddp_world_allreduce(w, f, n, DDP_OP_SUM, ei));
    b->loss_sum = f[VOTE_LOSS];
    b->stop = (int)f[VOTE_STOP];
    b->ckpt[0] = f[VOTE_CKPT];
    b->ckpt[1] = f[VOTE_CKPT + 1];
    b->regroup = (int)f[VOTE_REGROUP];
    b->rank_ms = f + VOTE_RANKS;
    return 0;
}

void ddp_vote_free(ddp_vote_t *v)
{
    if (!v) return;
    free(v->buf);
    v->buf = NULL;
}
