/* The metrics record: one line of a run's metrics.jsonl, and the one codec that writes and
 * reads it.
 *
 * Rank 0 of the trainer appends one JSON object per line to RUN_DIR/metrics.jsonl; the trainer
 * reads it back on resume, the daemon follows it (job view, Prometheus, status page), `ddpctl
 * plot` draws it, and the TensorBoard tee turns it into events. All of them go through this
 * file. The kinds of line (every writer of metrics.jsonl, inventoried):
 *
 *   step            {"step":N,"steps":..,"loss":..,"lr":..,...,"wall_ms":..}   once per step
 *                   (then, optional: "skipped":"loss" on a skipped step, "skips":N)
 *   validation      {"step":N,"val_loss":..}                                   after a validation
 *   generation      {"event":"generation","generation":..,"world":..,"step":..,"cause":"..",...}
 *   state_transfer  {"event":"state_transfer","generation":..,"step":..,"mode":"..",...}
 *   done            {"event":"done","step":N,"final_loss":..}                  the run's end
 *   eval            {"event":"eval","step":N,"task":"..","examples":..,"acc":..,"acc_norm":..,
 *                    "acc_tok":..,"eval_ms":..,"tokens":..}                   after an evaluation
 *
 * and, for reading only, an event this version does not know (a newer writer's).
 *
 * Invariants of a line ddp_metrics_format writes, byte for byte those the hand-made fprintfs
 * wrote before this module (tests and users grep them; older files are read on resume):
 * compact; "event" first for an event; then the kind's fields in the kind's order (the table in
 * metrics.c), each present field once; then any other present field in DDP_MF_* order; every
 * real in its field's printf format (%.6f for a loss, %.6g for lr and the gradient norm, %.2f
 * for a step's milliseconds, ...); a non-finite real as null; integers in decimal; strings
 * escaped by jansson (quote, backslash and control characters escaped; UTF-8 kept as it is).
 * Two differences, both where the old bytes were wrong: a non-finite loss (only grad_norm was
 * guarded) is null, no longer `nan`, which no JSON reader loads; and a generation's cause keeps
 * its quotes, backslashes and control characters, escaped, where the old writer dropped them.
 *
 * ddp_metrics_parse accepts any line such a writer ever produced: keys in any order or
 * missing, keys it does not know ignored (an older "sync_mb"), whitespace, an integer where a
 * real belongs (`"loss_scale":65536`, written by %g), null for a real (NAN). A known key of the
 * wrong type, a line that is not a JSON object, or a line with neither "event" nor "step" is a
 * clear error (DDP_EFORMAT with the key as the path), never a crash.
 *
 * Pure functions on caller-owned memory; any thread.
 */
#ifndef DDP_PROTO_METRICS_H
#define DDP_PROTO_METRICS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* A buffer of this size holds any line ddp_metrics_format can write (every field present, every
 * real as long as %.6f makes it, every string escaped at six bytes per byte): 16 KiB for the
 * fields, 984 bytes for each of the DDP_METRICS_MAX_NAMED named values (metrics.c checks). */
#define DDP_METRICS_MAX_NAMED 24
#define DDP_METRICS_LINE_MAX 40960

typedef enum ddp_metrics_kind {
    DDP_METRICS_STEP,     /* a completed step (no "event"; has "loss" or no "val_loss") */
    DDP_METRICS_VAL,      /* a validation (no "event"; "val_loss" without "loss") */
    DDP_METRICS_GENERATION, /* "event":"generation": a generation formed */
    DDP_METRICS_TRANSFER, /* "event":"state_transfer": a joiner received the job's state */
    DDP_METRICS_DONE,     /* "event":"done": the run completed */
    DDP_METRICS_EVAL,     /* "event":"eval": a multiple-choice task scored (worker/evaluate.c) */
    DDP_METRICS_EVENT,    /* another "event" (its name in rec.event): read, never written here */
    DDP_METRICS_KINDS
} ddp_metrics_kind_t;

/* The fields, by their bit in ddp_metrics_rec_t.has. The JSON key is the member's name. */
enum ddp_metrics_field {
    DDP_MF_STEP,
    DDP_MF_STEPS,
    DDP_MF_LOSS,
    DDP_MF_LR,
    DDP_MF_GRAD_NORM,
    DDP_MF_TOKENS_PER_S,
    DDP_MF_STEP_MS,
    DDP_MF_COMPUTE_MS,
    DDP_MF_COMM_MS,
    DDP_MF_EXPOSED_COMM_MS,
    DDP_MF_HIDDEN,
    DDP_MF_OPTIM_MS,
    DDP_MF_TOKENS,
    DDP_MF_WORLD,
    DDP_MF_GENERATION,
    DDP_MF_STRAGGLER,
    DDP_MF_LOSS_SCALE,
    DDP_MF_WALL_MS,
    DDP_MF_VAL_LOSS,
    DDP_MF_CAUSE,
    DDP_MF_RECONFIG_MS,
    DDP_MF_FORM_MS,
    DDP_MF_ATTACH_MS,
    DDP_MF_STATE_MS,
    DDP_MF_RECEIVERS,
    DDP_MF_SOURCE,
    DDP_MF_SHRUNK,
    DDP_MF_MODE,
    DDP_MF_MB,
    DDP_MF_MS,
    DDP_MF_MB_PER_S,
    DDP_MF_FINAL_LOSS,
    DDP_MF_MFU,
    DDP_MF_SKIPPED,
    DDP_MF_SKIPS,
    DDP_MF_TASK,
    DDP_MF_EXAMPLES,
    DDP_MF_ACC,
    DDP_MF_ACC_NORM,
    DDP_MF_ACC_TOK,
    DDP_MF_EVAL_MS,
    DDP_MF_COUNT
};
#define DDP_MF(name) (UINT64_C(1) << DDP_MF_##name)

/* One line. Reals are NAN when not finite (written null); strings are NUL-terminated within
 * their arrays (a longer string read from a line is cut at a character boundary). Which kind
 * carries which field is the table in metrics.c; ddp_metrics_init marks them present. */
typedef struct ddp_metrics_rec {
    ddp_metrics_kind_t kind;
    uint64_t has;   /* DDP_MF() bits of the fields present */
    char event[32]; /* DDP_METRICS_EVENT: the event's name */
    /* every kind */
    int64_t step;   /* the step the line is about (an event: the last completed step) */
    /* step lines */
    int64_t steps;  /* the run's total */
    double loss;    /* the step's mean training loss over all ranks */
    double lr, grad_norm; /* learning rate; gradient norm before clipping (NAN: skipped step) */
    double tokens_per_s, step_ms, compute_ms, comm_ms, exposed_comm_ms;
    double hidden;  /* fraction of the communication hidden behind compute */
    double optim_ms;
    int64_t tokens; /* trained on so far, all ranks (an eval: the tokens its forwards ran) */
    int64_t world, generation;
    int64_t straggler; /* the rank named a straggler, -1: none */
    double loss_scale; /* fp16's dynamic loss scale (1 otherwise) */
    double wall_ms;    /* since the run (this process's ddp_trainer_run) started */
    double mfu;        /* model FLOPs utilisation of a rank, a fraction (worker/observe/mfu.h) */
    /* validation lines */
    double val_loss;
    /* generation events (also generation, world, comm_ms) */
    char cause[256];
    double reconfig_ms, form_ms, attach_ms, state_ms;
    int64_t receivers, source; /* ranks receiving the state; the rank sending it (-1: none) */
    bool shrunk;               /* the communicator is the last one shrunk */
    /* state_transfer events (also generation, receivers, source) */
    char mode[16]; /* "overlap" or "pause" */
    double mb, ms, mb_per_s;
    /* done events */
    double final_loss;
    /* step lines, optional (after the kind's fields, present only when set): a step whose
     * update was skipped says why ("nonfinite", "loss" or "norm": worker/sync/spikes.h), and
     * once any was, every step line counts the run's skipped updates */
    char skipped[16];
    int64_t skips;
    /* eval events (also step): the task's name, examples scored, the fractions right */
    char task[64];
    int64_t examples;
    double acc, acc_norm, acc_tok; /* lm-evaluation-harness's acc, acc_norm; llm.c's per token */
    double eval_ms;
    /* Named values, after every field above, each a key of its own holding a number: a data
     * mixture's "tokens/<source>" (an integer: tokens trained on from that source so far) in a
     * step line, a validation list's "val_loss/<set>" in a validation line. Any key with a '/'
     * and a number reads back here (the first DDP_METRICS_MAX_NAMED of them). */
    int n_named;
    struct ddp_metrics_named {
        char key[96]; /* "tokens/web" */
        bool integer; /* printed as an integer, else %.6f (null when not finite) */
        double num;
    } named[DDP_METRICS_MAX_NAMED];
} ddp_metrics_rec_t;

typedef enum ddp_metrics_type {
    DDP_METRICS_INT,
    DDP_METRICS_REAL,
    DDP_METRICS_BOOL,
    DDP_METRICS_STR
} ddp_metrics_type_t;

/* One field of a line as the line states it (ddp_metrics_values). */
typedef struct ddp_metrics_value {
    const char *key;         /* "loss" (static storage) */
    int field;               /* DDP_MF_* */
    ddp_metrics_type_t type;
    double num;              /* INT, REAL, BOOL (0/1): the value a reader of the line gets, i.e. a
                                real rounded to its printed digits; NAN for null */
    const char *str;         /* STR: the record's string (points into the record), else NULL */
} ddp_metrics_value_t;

/* Zeroes *r and makes it a `kind` line with every field of that kind marked present (writers
 * then set the values); DDP_METRICS_EVENT marks none (name the event in r->event, mark the
 * fields with DDP_MF). Any thread. */
void ddp_metrics_init(ddp_metrics_rec_t *r, ddp_metrics_kind_t kind);

/* Writes r's line into buf (cap bytes; DDP_METRICS_LINE_MAX always suffices): the JSON object,
 * NUL-terminated, without a newline; *len (may be NULL) gets its length. Returns 0, DDP_EINVAL
 * (no r or buf, a kind out of range, or cap too small: buf then holds no line), DDP_ENOMEM.
 * A string that is not valid UTF-8 is written with '?' for each byte that is not. Any thread. */
int ddp_metrics_format(const ddp_metrics_rec_t *r, char *buf, size_t cap, size_t *len);

/* Parses one line (len bytes, no NUL needed; surrounding whitespace and the newline allowed)
 * into *out. Returns 0, or DDP_EFORMAT with ei set ("metrics line: ...", the offending key as
 * the path, jansson's column for a syntax error) and *out zeroed; DDP_ENOMEM. Any thread. */
int ddp_metrics_parse(const char *line, size_t len, ddp_metrics_rec_t *out, ddp_errinfo_t *ei);

/* r's fields in the order its line holds them, as the line states them, into out; returns how
 * many (at most DDP_MF_COUNT). What the TensorBoard tee turns into scalars. Any thread. */
int ddp_metrics_values(const ddp_metrics_rec_t *r, ddp_metrics_value_t out[DDP_MF_COUNT]);

/* The JSON object of r's line (a new reference, for the daemon's job view), or NULL (r invalid,
 * no memory). Any thread. */
json_t *ddp_metrics_to_json(const ddp_metrics_rec_t *r);

/* Appends a named value (see ddp_metrics_rec_t) "prefix/name"; returns 0, or DDP_EINVAL when
 * the record holds DDP_METRICS_MAX_NAMED already (nothing added). Any thread. */
int ddp_metrics_add_named(ddp_metrics_rec_t *r, const char *prefix, const char *name, double num,
                          bool integer);

/* The name of a kind ("step", "validation", "generation", "state_transfer", "done", "event"). */
const char *ddp_metrics_kind_name(ddp_metrics_kind_t kind);

#endif
