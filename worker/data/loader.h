/* Training and validation batches from token shards, in an order independent of world size.
 *
 * The dataset is the concatenation of its token shards cut into windows of T + 1 tokens (inputs are
 * the first T, targets the last T), window w of a token shard starting at token w * T. Sample j of
 * the run (a global index over all epochs) is window perm_e(j mod S) of epoch e = j / S, where
 * S is the number of windows and perm_e a seeded pseudo-random permutation of [0, S) keyed by
 * (seed, e). So the order is a pure function of (seed, epoch, global sample index).
 *
 * Optimizer step s covers samples [s G, (s + 1) G), G = sequences per global batch, in M = G / B
 * micro-batches of B sequences; micro-batch g (0 <= g < M) starts at sample s G + g B. They are
 * dealt round-robin: rank r of W takes g = r, r + W, r + 2 W, ... (its micro-step a is
 * g = a W + r), so every rank reads a disjoint part, the union over ranks is the same whatever
 * W, and a world that does not divide M gets the extra micro-batches on its lowest ranks.
 * A loader thread prepares the next micro-batch while the current one trains.
 *
 * A mixture (data.train as a list of sources, data/mixture.h) keeps the global sample index j:
 * sample j of the run is sequence k of source d, where (d, k) is the mixture's assignment of j,
 * and sequence k of a source is window perm_e(k mod S_d) of its own epoch e = k / S_d (its own
 * shuffle per epoch). Every rank computes the assignment of a whole step from the same counts, so
 * the deal and the world size change nothing about which samples a step trains on.
 *
 * Each micro-batch handed to the trainer is logged at debug level with a hash of its samples'
 * ids (the sum over its samples of a mix of (j, source, window)), so a test can add up a step's
 * hashes over the ranks and compare worlds ("loader: step S samples [j, j + B) ids H"; a mixture's line goes on
 * with "source:sequence d:k ..." per sample, so a test can count each source's sequences).
 */
#ifndef DDP_WORKER_DATA_LOADER_H
#define DDP_WORKER_DATA_LOADER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/shard.h"
#include "worker/data/mixture.h"

typedef struct ddp_dataset {
    ddp_shard_t *shards;
    size_t n_shards;
    size_t *first_window; /* [n_shards + 1]: prefix sums of windows per shard */
    size_t n_windows;     /* S */
    int T;
    int vocab_size; /* tokens >= this are a data error */
    uint64_t seed;
} ddp_dataset_t;

/* Opens every token shard matching glob with windows of T+1 tokens. Fails with DDP_EFORMAT (ei
 * names the file) for a bad token shard, DDP_ENOTFOUND for no match, DDP_EINVAL when the shards
 * hold no complete window. */
int ddp_dataset_open(ddp_dataset_t *d, const char *glob, int T, int vocab_size, uint64_t seed,
                     ddp_errinfo_t *ei);
void ddp_dataset_close(ddp_dataset_t *d); /* NULL-safe */

/* The window index of global sample j (shuffled: train order; see above). */
size_t ddp_dataset_sample(const ddp_dataset_t *d, uint64_t j);

/* Copies `count` consecutive global samples starting at j into inputs[count,T] and
 * targets[count,T]. With shuffle = 0 sample j is window j mod S (validation). Returns 0, or
 * DDP_EFORMAT when a token is >= vocab_size (ei names the file and offset). */
int ddp_dataset_fill(const ddp_dataset_t *d, uint64_t j, int count, int shuffle, int32_t *inputs,
                     int32_t *targets, ddp_errinfo_t *ei);

/* Copies window w (0 <= w < S) into inputs[T] and targets[T]; errors as ddp_dataset_fill. */
int ddp_dataset_fill_window(const ddp_dataset_t *d, size_t w, int32_t *inputs, int32_t *targets,
                            ddp_errinfo_t *ei);

/* A mixture's sources as the loader reads them (see above). */
typedef struct ddp_loader_mix {
    const ddp_dataset_t *sets; /* [m.n]: source d's dataset (borrowed) */
    ddp_mixture_t m;
    ddp_mixture_state_t at; /* where the run is: any sample >= at.base_seq */
} ddp_loader_mix_t;

/* The trainer's copy of a mixture's position at the end of step `step` (1-based): advances s past
 * the step's G samples, sets drawn[d] (may be NULL) to the sequences source d gave the step, and,
 * when log is nonzero, logs each source that wraps into a new epoch (named by sources[d].name).
 * Pure but for the log; the training thread. */
void ddp_loader_mix_step(const ddp_loader_mix_t *mix, ddp_mixture_state_t *s, int64_t G,
                         int64_t *drawn, const ddp_data_source_t *sources, long step, int log);

/* A prefetching reader of one rank's micro-batches. */
typedef struct ddp_loader {
    const ddp_dataset_t *d;
    int B; /* sequences per micro-batch */
    int rank, world;
    int n_micro; /* M: micro-batches per optimizer step, all ranks */
    int accum;   /* this rank's share of them */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *buf[2][2];  /* [slot][inputs|targets], B*T each */
    int64_t slot_key[2]; /* micro-batch key held by a slot, -1 empty */
    int slot_rc[2];
    ddp_errinfo_t slot_ei[2];
    char slot_note[2][1200]; /* the debug line of the micro-batch a slot holds (see above) */
    int64_t want; /* next key the consumer asked for */
    int stop;
    int started;
    /* a mixture (has_mix), the loader thread's: the assignment of step mix_step's samples */
    int has_mix;
    ddp_loader_mix_t mix;
    int64_t mix_step; /* -1: none yet */
    int *mix_src;     /* [G] source of each sample of the step */
    uint64_t *mix_k;  /* [G] its sequence within the source */
} ddp_loader_t;

/* Starts the loader thread for rank/world with n_micro micro-batches per optimizer step over
 * all ranks (this rank's share: ddp_loader_accum); keys are step * accum + micro. */
int ddp_loader_start(ddp_loader_t *l, const ddp_dataset_t *d, int B, int rank, int world,
                     int n_micro);
/* The same over a mixture's sources (copied; mix->sets borrowed until ddp_loader_stop). */
int ddp_loader_start_mix(ddp_loader_t *l, const ddp_loader_mix_t *mix, int B, int rank, int world,
                         int n_micro);
/* Micro-steps rank r of world takes of n_micro: those g < n_micro with g mod world = r. */
static inline int ddp_loader_accum(int n_micro, int rank, int world)
{
    return rank < n_micro ? (n_micro - rank + world - 1) / world : 0;
}
/* Blocks until micro-batch (step, micro) is ready and returns pointers valid until the next
 * call; starts preparing the following one. Returns 0 or the data error. Caller thread only. */
int ddp_loader_next(ddp_loader_t *l, long step, int micro, const int32_t **inputs,
                    const int32_t **targets, ddp_errinfo_t *ei);
/* Stops the thread and frees buffers. NULL-safe. */
void ddp_loader_stop(ddp_loader_t *l);

#endif
