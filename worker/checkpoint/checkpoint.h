/* Checkpoints: sharded safetensors written asynchronously and committed atomically; verified,
 * memory-light loading; initialisation from any GPT-2 safetensors directory.
 *
 * Model-agnostic: the caller describes its state as lists of named tensors (host pointers, or
 * device pointers with a copy hook) plus two JSON texts, and gets the same back. Layout of a
 * checkpoint (`dir` is checkpoint.dir of the job spec):
 *
 *   dir/step-00001200/
 *     model.safetensors                    one shard (as Hugging Face writes it), or
 *     model-00001-of-00002.safetensors ... + model.safetensors.index.json
 *                                          ({"metadata": {"total_size": N}, "weight_map": {..}})
 *     optim.safetensors | optim-0000i-of-0000K.safetensors + optim.safetensors.index.json
 *     config.json   trainer.json           the caller's texts, stored verbatim
 *     generation_config.json ...           optional further texts (ddp_ckpt_text_t: the trainer
 *                                          adds generation_config.json and data.tokenizer's
 *                                          tokenizer.json / tokenizer_config.json), verbatim
 *     MANIFEST.json                        every other file's size and CRC32C; written last
 *   dir/latest -> step-00001200            a hint; verification decides
 *   dir/.step-00001300.tmp/                a save in progress (or one that crashed: a save
 *                                          that fails removes its own)
 *   dir/.recycle/                          the newest checkpoint keep_last retired: the next
 *                                          save moves its shard files into its .tmp directory
 *                                          and writes over them in place (no block allocation,
 *                                          no discards), unless another process still has one
 *                                          open; deleted when the saver is freed
 *                                          (DDP_CKPT_RECYCLE=0: retired checkpoints are deleted)
 *
 * Tensor names are the caller's. The trainer uses Hugging Face GPT-2 names and shapes for the
 * model ("wte.weight" [V, C], "h.0.attn.c_attn.weight" [C, 3C], ..., "ln_f.bias"), so the
 * directory loads in `transformers` as it is, and names the AdamW moments
 * "exp_avg.<param name>" and "exp_avg_sq.<param name>" (PyTorch's state keys;
 * ddp_ckpt_optim_name builds them). Shards hold whole tensors in the order given, a new shard
 * starting when the next tensor would pass shard_mb (decimal megabytes); every safetensors file
 * carries __metadata__ {"format": "pt"}, which `transformers` requires.
 *
 * Saving, one writer (the default, rank 0):
 *     ddp_ckpt_save(saver, &state, &ei);   at a step boundary: copies the tensors into a reused
 *                                          host snapshot (the only stall) and returns; a writer
 *                                          thread writes .step-N.tmp/, fsyncs each file, writes
 *                                          MANIFEST.json, fsyncs, renames to step-N/, fsyncs the
 *                                          parent, swaps `latest`, prunes beyond keep_last.
 *     ... training goes on; the next ddp_ckpt_save waits for this one if it is still running
 *     (and logs that it waits) rather than dropping it.
 * A save that fails (a full file system, EDQUOT, EIO) logs one error naming the step, the
 * directory and the cause, and removes its .step-N.tmp at once; whatever it cannot remove, rank
 * 0's next save removes before writing. It never touches a committed step-N or `latest`, so
 * the last completed checkpoint still resumes, and the next save after space is freed succeeds.
 * Host tensors may skip the copy: ddp_ckpt_save_live starts the writer on the tensors
 * themselves, and ddp_ckpt_freeze, called before the caller next modifies them, copies only
 * what the writer has not read yet. Shards are written with O_DIRECT where the file system
 * allows (their data starts 4096-aligned: the header is padded with spaces), from the tensors
 * when their addresses line up with their file offsets, else through a small bounce buffer;
 * buffered otherwise. The bytes are the same either way. Where io_uring allows, the memory
 * direct writes read (the tensors of a live save, else the snapshot) is registered with it once
 * and stays registered (pinned) until the saver is freed or a save reads other memory: a caller
 * must not unmap a live save's tensors while its saver exists (DDP_CKPT_URING=0: no io_uring).
 *     ddp_ckpt_wait(saver, &ei);           at the end of training: the last save's result.
 *
 * Striped writers (checkpoint.writers N > 1; needs `dir` on a file system all writers share):
 * shard i (counting model shards, then optimizer shards) is written by rank i mod N; rank 0 also
 * writes the index, config, trainer and further text files. Each writer records what it wrote
 * in a part file (.part-RRRRR.json) in the tmp directory. Every rank < N calls, at the same step:
 *     ddp_ckpt_save(saver, &state, &ei);   snapshot + asynchronous write of its own shards
 *     ... later (before the next save, or at once):
 *     ddp_ckpt_wait(saver, &ei);           its shards are durable (or the error)
 *     barrier over the writers             ("all report durable"; the collectives do this)
 *     rank 0: ddp_ckpt_commit(saver, &ei); merges the parts, checks every planned file is there,
 *                                          writes the manifest, renames, swaps latest, prunes
 * Ranks >= N may call ddp_ckpt_save too: it does nothing. ddp_ckpt_snapshot and
 * ddp_ckpt_write_async are the two halves of ddp_ckpt_save, for a caller that wants to take the
 * snapshot at one point and start writing at another.
 *
 * Loading (every rank, at start):
 *     ddp_ckpt_find(dir, -1, &found, &ei)  newest step-* whose manifest verifies (sizes, then
 *                                          CRC32C of every file); newer ones that fail are
 *                                          logged and listed in found.skipped with the reason
 *     ddp_ckpt_load(found.path, &req, &ei) maps each shard and copies tensor by tensor (in 2 MiB
 *                                          pieces, dropping the mapped pages after each) into the
 *                                          caller's destinations; returns config and trainer text
 *     ddp_ckpt_init_from(dir, ...)          model weights only, from any GPT-2 safetensors dir
 *
 * Test hook: DDP_HOOK_CKPT_SHARD (common/test_hook.h; DDP_TEST_CKPT_SHARD_DELAY_MS=<ms> in
 * ddp-worker's environment) makes the writer sleep after each shard it writes, so a test can
 * SIGKILL a process in the middle of a save.
 *
 * Threads: a saver is used by one thread (the training thread); its writer thread is internal.
 * The load functions may be called from any thread.
 */
#ifndef DDP_WORKER_CHECKPOINT_CHECKPOINT_H
#define DDP_WORKER_CHECKPOINT_CHECKPOINT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/checkpoint/safetensors.h"

#define DDP_CKPT_DEFAULT_SHARD_MB 5000.0

/* One tensor of the caller's state. For saving `data` is read only during ddp_ckpt_snapshot
 * (ddp_ckpt_save); for loading it is the destination. nbytes must equal shape × dtype size.
 * Saving: when crc_known, crc32c is the caller's CRC32C of the nbytes at data (the CPU trainer's
 * AdamW update computes it while the bytes are in cache), and the writer folds it into the
 * file's checksum instead of reading the tensor for it; the caller vouches that the bytes do not
 * change before the save has read them. Loading ignores both. */
typedef struct ddp_ckpt_tensor {
    const char *name;
    ddp_st_dtype_t dtype;
    int ndim;
    int64_t shape[DDP_ST_MAX_DIMS];
    void *data;
    uint64_t nbytes;
    bool crc_known;
    uint32_t crc32c;
} ddp_ckpt_tensor_t;

/* Copies n bytes; returns 0 or a negative error. Saving calls it with dst in the host snapshot
 * and src = a tensor's data; loading with src in a mapped file (or a conversion buffer) and dst
 * = a tensor's data. NULL means memcpy. A GPU caller passes a cudaMemcpy wrapper. Called on
 * the thread that called the save or load function. */
typedef int (*ddp_ckpt_copy_fn)(void *dst, const void *src, size_t n, void *ctx);

typedef struct ddp_ckpt_opts {
    const char *dir;  /* checkpoints root; created if missing (copied) */
    double shard_mb;  /* decimal MB per shard; <= 0: DDP_CKPT_DEFAULT_SHARD_MB */
    int keep_last;    /* keep this many newest step-* dirs; <= 0: keep all */
    int writers;      /* ranks that write shards; <= 0: 1 */
    int rank;         /* this process's rank; rank 0 commits */
    ddp_ckpt_copy_fn copy;
    void *copy_ctx;
    /* Snapshot memory (pinned memory on GPU); NULL: page-aligned ddp_aligned_alloc / free. */
    void *(*host_alloc)(size_t n, void *ctx);
    void (*host_free)(void *p, void *ctx);
    void *alloc_ctx;
} ddp_ckpt_opts_t;

/* A further text file of a save, written by rank 0 beside config.json, listed in the manifest
 * and checked by the commit like config.json. `name` is a plain file name ending in ".json",
 * not starting with '.', and none of the saver's own (config.json, trainer.json, MANIFEST.json,
 * *.safetensors.index.json). The text is stored verbatim and not parsed (a tokenizer.json may
 * be megabytes): the caller vouches for it. */
typedef struct ddp_ckpt_text {
    const char *name;
    const char *text;
} ddp_ckpt_text_t;

/* What one save stores. Everything is read during ddp_ckpt_snapshot only. */
typedef struct ddp_ckpt_state {
    int64_t step;                    /* >= 0; names the directory */
    const ddp_ckpt_tensor_t *model;  /* n_model > 0 */
    size_t n_model;
    const ddp_ckpt_tensor_t *optim;  /* may be NULL / 0 */
    size_t n_optim;
    const char *config_json;         /* config.json text (must parse as JSON) */
    const char *trainer_json;        /* trainer.json text (must parse as JSON) */
    const ddp_ckpt_text_t *texts;    /* further text files (rank 0 writes them); may be NULL / 0 */
    size_t n_texts;
} ddp_ckpt_state_t;

typedef struct ddp_ckpt_stats {
    int64_t step;         /* of the last save started, -1 before any */
    double snapshot_s;    /* the stall of the last snapshot (including any wait for the previous) */
    double wait_s;        /* of which waiting for the previous save */
    double write_s;       /* writer thread time of the last finished save (write + commit) */
    double write_cpu_s;   /* the CPU time (user + system) the writer thread used for it */
    uint64_t bytes;       /* bytes this rank wrote in the last finished save */
    uint64_t direct_bytes; /* of the shards' bytes, those written with O_DIRECT straight from
                            * the tensors or the snapshot (the rest: buffered or bounced) */
    uint64_t fixed_bytes;  /* of direct_bytes, those written from memory registered with io_uring
                            * (no page pinning per write) */
    uint64_t crc_bytes;    /* of the tensors' bytes, those the writer read for their CRC32C (the
                            * rest came with crc_known) */
    uint64_t reused_bytes; /* the size of the retired checkpoint's shard files this save wrote
                            * over in place instead of creating new ones (keep_last) */
    double freeze_s;       /* the last ddp_ckpt_freeze: wait for the chunk in flight + copy */
    uint64_t freeze_bytes; /* what it copied into the snapshot (0: the writer was done) */
    /* (ddp_ckpt_saver_stats while a save runs races with its writer: call it after
     * ddp_ckpt_wait) */
    long saves, failures; /* finished saves, and how many of them failed */
} ddp_ckpt_stats_t;

typedef struct ddp_ckpt_saver ddp_ckpt_saver_t;

/* Creates a saver for o->dir (mkdir -p). Rank 0 removes stale .step-*.tmp directories left by a
 * crash. Returns 0, -errno, DDP_EINVAL (bad options), DDP_ENOMEM. Training thread. */
int ddp_ckpt_saver_new(const ddp_ckpt_opts_t *o, ddp_ckpt_saver_t **out, ddp_errinfo_t *ei);
/* Waits for a running save (logging its failure, if any) and frees everything, the snapshot
 * included; rank 0 deletes .recycle/. NULL-safe. Training thread. */
void ddp_ckpt_saver_free(ddp_ckpt_saver_t *s);

/* Allocates the snapshot for `bytes` (the sum of all tensors' nbytes) and touches every page, so
 * the first save's stall is a copy, not page faults (3 s for 640 MB on a slow VM). Optional; call
 * at start-up. Returns 0 or DDP_ENOMEM. Training thread. */
int ddp_ckpt_saver_reserve(ddp_ckpt_saver_t *s, size_t bytes, ddp_errinfo_t *ei);

/* ddp_ckpt_snapshot + ddp_ckpt_write_async: returns once the state is copied; the files are
 * written in the background (and committed there when writers == 1). A no-op returning 0 on a
 * rank >= writers. Returns 0 or the error of this call (a failure of the previous save is
 * logged and counted in the stats, not returned: the new save still happens). Training thread. */
int ddp_ckpt_save(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei);

/* Waits for the previous save if it is still running (logs that it waits), then copies every
 * tensor of st into the snapshot (one allocation, reused while big enough) and plans the shards.
 * Returns 0, DDP_EINVAL (bad state: names, sizes, JSON), DDP_ENOMEM, or a copy hook's error.
 * Training thread. */
int ddp_ckpt_snapshot(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei);

/* Starts the writer thread on the last snapshot: this rank's shards into .step-N.tmp/, then
 * (writers == 1) the commit. Returns 0, DDP_EINVAL (no snapshot), -errno (thread). Training
 * thread. */
int ddp_ckpt_write_async(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei);

/* A save without the copy, for host tensors (o->copy NULL; DDP_EINVAL otherwise): checks and
 * plans as ddp_ckpt_snapshot does and starts the writer at once, which reads the tensors'
 * memory itself. The caller must not modify any tensor of st until ddp_ckpt_freeze returns (or
 * the save has finished: ddp_ckpt_wait). Returns as ddp_ckpt_save. Training thread. */
int ddp_ckpt_save_live(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei);

/* Ends a live save's reading of the caller's tensors: waits for the chunk the writer is reading
 * (at most one write of 64 MiB), copies whatever the writer has not read yet into the snapshot
 * (nothing when it is past the shards) and lets it go on from there. Afterwards the caller may
 * modify its tensors. *copied (may be NULL) gets the bytes copied. A no-op when no live save
 * runs. Returns 0. Training thread. */
int ddp_ckpt_freeze(ddp_ckpt_saver_t *s, uint64_t *copied, ddp_errinfo_t *ei);

/* Blocks until no save is running; returns the result of the last finished save and clears it
 * (0 when none or it succeeded; ei gets a failure's detail). Training thread. */
int ddp_ckpt_wait(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei);

/* True while the writer thread of a save is running. Training thread. */
bool ddp_ckpt_busy(ddp_ckpt_saver_t *s);

/* Rank 0 of striped writers, after every writer's ddp_ckpt_wait returned 0 and a barrier:
 * merges the part files into MANIFEST.json (checking every planned file is listed and has its
 * size), fsyncs it, renames .step-N.tmp to step-N, fsyncs the parent, swaps `latest`, prunes.
 * Waits for this rank's own write first. Returns 0, DDP_EINVAL (not rank 0 / nothing written),
 * DDP_EFORMAT (a part or file missing: a writer did not finish), -errno. Training thread. */
int ddp_ckpt_commit(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei);

/* Copies the stats. Training thread. */
void ddp_ckpt_saver_stats(ddp_ckpt_saver_t *s, ddp_ckpt_stats_t *out);

/* Writes "<moment>.<param>" (e.g. "exp_avg.h.0.ln_1.weight") into buf; returns buf, or NULL when
 * it does not fit. Any thread. */
char *ddp_ckpt_optim_name(char *buf, size_t len, const char *moment, const char *param);

/* ---- loading ---- */

#define DDP_CKPT_MAX_SKIPPED 16

typedef struct ddp_ckpt_skip {
    int64_t step;
    int rc;
    char reason[600];
} ddp_ckpt_skip_t;

typedef struct ddp_ckpt_found {
    char path[PATH_MAX]; /* dir/step-NNNNNNNN */
    int64_t step;
    int n_skipped;       /* newer checkpoints that failed verification (first 16 kept) */
    ddp_ckpt_skip_t skipped[DDP_CKPT_MAX_SKIPPED];
} ddp_ckpt_found_t;

/* Finds the checkpoint to resume from: with step < 0 the newest step-* directory under dir
 * whose manifest verifies (each newer one that fails is logged at WARN with its reason and
 * recorded in out->skipped; where `latest` points elsewhere that is logged too); with step >= 0
 * exactly that step, verified. Returns 0; DDP_ENOTFOUND when there is none (ei says why, e.g.
 * "no checkpoint under DIR" or the last failure); -errno for an unreadable dir. Any thread. */
int ddp_ckpt_find(const char *dir, int64_t step, ddp_ckpt_found_t *out, ddp_errinfo_t *ei);

/* Verifies one checkpoint directory (see ddp_manifest_verify). Any thread. */
int ddp_ckpt_verify(const char *ckpt_path, ddp_errinfo_t *ei);

typedef struct ddp_ckpt_load {
    /* in: destinations; every tensor of the checkpoint must have one with the same dtype and
     * shape, and every destination must be found */
    ddp_ckpt_tensor_t *model;
    size_t n_model;
    ddp_ckpt_tensor_t *optim; /* NULL / 0: the optimizer files are not read */
    size_t n_optim;
    ddp_ckpt_copy_fn copy;
    void *copy_ctx;
    /* out */
    int64_t step;
    char *config_json;  /* ddp_malloc'd, NUL-terminated; the caller frees (also on error) */
    char *trainer_json; /* likewise */
} ddp_ckpt_load_t;

/* Loads checkpoint directory ckpt_path (normally ddp_ckpt_find's out->path; it is not
 * re-verified here) into req's destinations, one mapped shard at a time, tensor by tensor, in
 * pieces of 2 MiB whose pages are dropped after the copy: extra resident memory stays near
 * 2 MiB whatever the checkpoint's size. Returns 0, -errno, DDP_EFORMAT (malformed file, a tensor
 * unknown to the caller or missing, dtype or shape mismatch; ei names file and tensor),
 * DDP_ENOMEM. Any thread. */
int ddp_ckpt_load(const char *ckpt_path, ddp_ckpt_load_t *req, ddp_errinfo_t *ei);

/* Initialises model weights from a directory holding GPT-2 safetensors: model.safetensors, or
 * model.safetensors.index.json + shards (a ddpd checkpoint or a Hugging Face download). A file
 * name may carry a "transformer." prefix; file tensors that match no destination (lm_head.weight,
 * attention-mask buffers) are ignored with a debug line; every destination must be found with
 * its shape. F32 destinations accept F32, BF16 and F16 sources (converted); other dtypes must
 * match exactly. Returns 0, -errno, DDP_ENOTFOUND (no safetensors in dir), DDP_EFORMAT. Any
 * thread. */
int ddp_ckpt_init_from(const char *dir, ddp_ckpt_tensor_t *model, size_t n_model,
                       ddp_ckpt_copy_fn copy, void *copy_ctx, ddp_errinfo_t *ei);

#endif
