/* The saver's state, shared by checkpoint.c (snapshot, writer thread) and checkpoint_commit.c
 * (the commit that makes a save visible, and pruning); not public. The invariants of the
 * fields are checkpoint.c's opening comment's.
 */
#ifndef DDP_WORKER_CHECKPOINT_CHECKPOINT_IMPL_H
#define DDP_WORKER_CHECKPOINT_CHECKPOINT_IMPL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "checkpoint.h"
#include "checkpoint_internal.h"
#include "manifest.h"
#include "uring.h"

/* Bytes per write; also what a freeze may wait for (16 ms at 4 GB/s, and only when the writer is
 * late). Each write costs the writer a submission, a wake-up and the block layer's setup, so
 * fewer, larger ones take less CPU from training: GPT-2 124M + AdamW (1.5 GB) over retired
 * files, writer CPU per save 17-39 ms at 8 MiB, 10-15 at 32, 8-9 at 64, 6-9 at 256
 * (bench_checkpoint --live-only --known-crcs, two rounds). */
#define WRITE_CHUNK (64u << 20)
#define DATA_ALIGN 4096        /* shard data starts here in the file, for O_DIRECT */
#define DIR_MAX (PATH_MAX - 128) /* a checkpoint dir path; leaves room for a file name */
#define RECYCLE ".recycle"       /* the retired checkpoint, whose files the next save reuses */

/* Where a tensor's bytes are: `off` in the stream (= in the snapshot), `src` the caller's
 * memory (live saves), `run_end` the stream offset where the caller's memory stops being
 * contiguous from this tensor on. */
typedef struct tsrc {
    const unsigned char *src;
    uint64_t off, run_end;
    uint32_t crc; /* the caller's (crc_known), else extended by the writer as it writes */
    bool crc_known;
} tsrc_t;

typedef struct shard {
    int optim; /* 0: model-*, 1: optim-* */
    size_t first, count;
    uint64_t bytes;
    char file[FILE_NAME_MAX];
} shard_t;

/* A further text file of the save (ddp_ckpt_text_t), copied: both strings ddp_malloc'd. */
typedef struct owned_text {
    char *name, *text;
} owned_text_t;

struct ddp_ckpt_saver {
    ddp_ckpt_opts_t o;
    char *dir;
    uint64_t shard_bytes;

    /* snapshot and plan: written by the training thread, read by the writer thread */
    unsigned char *snap;
    size_t snap_cap;
    ddp_st_tensor_t *t; /* model tensors, then optimizer tensors; data in snap */
    size_t n_t, n_model;
    char *names;
    shard_t *shards;
    size_t n_shards, n_model_shards;
    char *config, *trainer;
    owned_text_t *texts; /* rank 0's copies of the state's further texts (others: none) */
    size_t n_texts;
    int64_t step;
    int have_snapshot;
    tsrc_t *src; /* per tensor of t */
    int direct;  /* write shards with O_DIRECT where possible (DDP_CKPT_DIRECT=0: never) */
    int recycle; /* keep_last retires into RECYCLE (DDP_CKPT_RECYCLE=0: deletes at once) */
    ddp__uring_t *ring; /* direct writes from registered sources (DDP_CKPT_URING=0: none);
                         * used by the writer thread, dropped there if registration fails */

    /* live-source state (see the invariants) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int live, inflight;
    uint64_t consumed;

    /* writer thread */
    pthread_t th;
    int running;
    atomic_int done;
    int result;
    ddp_errinfo_t result_ei;
    ddp_manifest_t mine; /* files this rank wrote for `written_step` */
    int64_t written_step;
    int committed;
    char cleanup[FILE_NAME_MAX + 128]; /* what ddp__ckpt_discard did after the last failure */

    ddp_ckpt_stats_t stats;
};

/* The save's temporary directory, dir/.step-N.tmp, into buf. */
void ddp__ckpt_tmp_path(const ddp_ckpt_saver_t *s, char *buf, size_t len);
/* Rank 0: merges the writers' part manifests into MANIFEST.json, checks every expected file,
 * renames the temporary directory to step-N, points `latest` at it (each made durable in
 * order) and prunes to keep_last. Returns 0 or the error (ei). */
int ddp__ckpt_commit(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei);
/* After a failed save of s->step: removes what it left in dir/.step-N.tmp, so that a full file
 * system gets its space back at once and nothing of the failed attempt is taken for part of a
 * later save. `whole`: the directory and everything in it (the sole writer, or rank 0 once every
 * writer is done); else only the files this rank writes (its shards, its part file, rank 0's
 * texts), since other writers may still be writing theirs. Never touches a step-N directory or
 * `latest`: a save that failed after its rename has no .tmp left, and nothing is done. Writes
 * one phrase saying what it did into s->cleanup ("" when there was nothing to remove). Returns
 * 0, or the -errno of a removal that failed (what is left is then removed by rank 0 before its
 * next save writes anything). The writer thread, or the training thread while none runs. */
int ddp__ckpt_discard(ddp_ckpt_saver_t *s, bool whole);

#endif
