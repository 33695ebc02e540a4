/* The flight recorder: the last N collective operations of this process, for diagnosing hangs.
 *
 * Every operation submitted through coll.c gets one record in a fixed ring of N records (N =
 * DDP_FLIGHT_RECORDER_SIZE, default 64, read by ddp-worker's main; 0 turns the recorder off),
 * with the fields of PyTorch's Flight Recorder: generation, sequence number (per communicator,
 * the same on every rank), kind, bytes, the gradient bucket (ddp_coll_tag_next), the rank and
 * size of the communicator, the state (queued, started, finished, failed), the three times
 * (CLOCK_MONOTONIC ns) and the peer the operation last waited on.
 *
 * Writers: the thread that submits (queued) and the communication thread (started, waiting,
 * finished). A record is a seqlock: a writer makes its version odd, writes, makes it even; a reader
 * copies it and retries when the version moved. No lock, no allocation after ddp_flight_setup.
 *
 * Dumps: the same text everywhere (one JSON object, rank-R.json), produced by one formatter that
 * is async-signal-safe (no malloc, no stdio, no locks: integers formatted by hand, write(2)), so
 * that a fatal signal's handler can write it too. The triggers (worker/main.c and bootstrap
 * elastic): a collective timeout, the coordinator's request (before an eviction, or when another
 * rank timed out), SIGUSR2 (ddpctl dump) on a dedicated thread, and SIGSEGV/SIGBUS/SIGABRT/
 * SIGFPE/SIGILL (chained to the previous handler). docs/observability.md describes the format.
 */
#ifndef DDP_COLLECTIVES_FLIGHT_H
#define DDP_COLLECTIVES_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define DDP_FLIGHT_DEFAULT_RECORDS 64

typedef enum {
    DDP_FLIGHT_QUEUED = 0,
    DDP_FLIGHT_STARTED = 1,
    DDP_FLIGHT_FINISHED = 2,
    DDP_FLIGHT_FAILED = 3,
} ddp_flight_state_t;

/* Where dumps go and who this process is. Copied by ddp_flight_setup. */
typedef struct ddp_flight_cfg {
    int records;         /* ring size; 0 = off, < 0 = DDP_FLIGHT_DEFAULT_RECORDS */
    const char *run_dir; /* dumps go to RUN_DIR/flight/rank-R.json; NULL: no files */
    int rank;            /* R until the first communicator names one (the launcher's rank) */
    /* Called with each dump made by ddp_flight_dump (borrowed), e.g. to send it to the job's
     * coordinator; never from a signal handler. NULL: none. */
    void (*sink)(void *arg, json_t *dump);
    void *sink_arg;
} ddp_flight_cfg_t;

/* Allocates the ring and sets the configuration; creates RUN_DIR/flight. Call once, from the
 * main thread before any communicator exists. Without it the recorder allocates a default ring
 * at the first record and writes no file. Returns 0, DDP_ENOMEM, or -errno of mkdir. */
int ddp_flight_setup(const ddp_flight_cfg_t *cfg);
/* Replaces the sink (NULL: none); waits for a call of the old one in progress. Any thread but
 * the sink's own. */
void ddp_flight_set_sink(void (*sink)(void *arg, json_t *dump), void *arg);

/* Records the submission of an operation; returns its record id (0: recorder off). kind is a
 * name with static storage ("allreduce"); bucket -1 when none. Submitting thread. */
uint64_t ddp_flight_queued(uint64_t generation, uint64_t seq, int rank, int size,
                           const char *kind, uint64_t bytes, int bucket);
/* The operation began on the communication thread. Ignored when id is 0 or was overwritten. */
void ddp_flight_started(uint64_t id);
/* The operation now waits on rank `peer`. Same rules. */
void ddp_flight_waiting(uint64_t id, int peer);
/* The operation ended with rc (0 finished, < 0 failed); a second call is ignored. Same rules. */
void ddp_flight_finished(uint64_t id, int rc);

/* Writes the dump as JSON text into buf (at most len - 1 bytes, NUL-terminated; records that do
 * not fit are left out, oldest first kept). trigger names why ("timeout", "signal 11", ...;
 * static). Returns the length. Async-signal-safe; any thread. */
size_t ddp_flight_format(char *buf, size_t len, const char *trigger);
/* Writes the dump to RUN_DIR/flight/rank-R.json (write(2) on a preallocated buffer; the file is
 * written in place, not renamed). Returns 0 or -errno; DDP_EINVAL without a run directory.
 * Async-signal-safe: what a fatal signal's handler calls. */
int ddp_flight_write_raw(const char *trigger);
/* The dump as a JSON object: writes the file (when there is a run directory), calls the sink,
 * and returns the object (owned by the caller; NULL on ENOMEM). Not async-signal-safe: call it
 * from a thread that is not stuck (the waiter that saw a timeout, the signal thread, the
 * coordinator connection's thread). */
json_t *ddp_flight_dump(const char *trigger);

/* Installs handlers of SIGSEGV, SIGBUS, SIGABRT, SIGFPE and SIGILL that write the dump
 * (ddp_flight_write_raw) and then give the signal to the handler that was there before (the
 * default one: the process dies as it would have). Main thread, once. */
void ddp_flight_catch_fatal(void);
/* Starts a detached thread that answers each SIGUSR2 with ddp_flight_dump("request"); the
 * signal's handler (SA_RESTART; whichever thread takes it) only writes a byte to a pipe that the
 * thread reads, so a stuck thread never dumps. Returns 0 or -errno. Main thread, once. */
int ddp_flight_listen_sigusr2(void);

/* The diagnosis over the ranks' dumps (objects as ddp_flight_dump returns; n of them, any
 * order, NULL entries skipped): lines the records up by (generation, sequence number), never by
 * clock, finds the first operation of the newest stuck generation that some rank has not
 * finished and writes one line into out (len bytes, NUL-terminated), such as
 * "rank 3 never started allreduce #1842 (bucket 7, 25 MiB) of generation 1; ranks 0-2 wait on
 * it". Returns 1 when something is stuck, 0 when every rank finished every operation it
 * recorded, DDP_EINVAL when no dump holds a record. Pure; any thread. */
int ddp_flight_diagnose(json_t *const *dumps, size_t n, char *out, size_t len);

#endif
