/* The tail of rank 0's metrics.jsonl, which is what the daemon knows of a running job's
 * progress: the last step's record and the "done" event, read through the metrics codec
 * (proto/metrics.h); lines it cannot read are skipped. Reads the file from `off` on; never
 * writes. Loop thread only.
 */
#ifndef DDPD_JOB_TAIL_H
#define DDPD_JOB_TAIL_H

#include <stddef.h>
#include <stdint.h>

#include "proto/metrics.h"

typedef struct ddpd_tail {
    int64_t off;          /* bytes of metrics.jsonl read so far */
    char partial[8192];   /* the line being read */
    size_t partial_len;
    int has_last, has_done;
    /* the last step line (a validation line adds val_loss to it; before any step line, a
     * validation line is the record) */
    ddp_metrics_rec_t last_step;
    ddp_metrics_rec_t done;  /* the "done" event */
    int64_t first_step_ms; /* wall clock when the first step's record was read */
} ddpd_tail_t;

/* Reads what rank 0 appended to <run_dir>/metrics.jsonl since the last call (at most 64 KiB a
 * call), a regular file of uid `owner` opened as userfs.h does (a FIFO or a symlink the user
 * put there is not read). Returns 1 if a new line was parsed. */
int ddpd_tail_read(ddpd_tail_t *t, const char *run_dir, uint32_t owner);

/* Starts near the end of the file (an adopted job: the last step's record is all the view
 * needs) and reads to the end. */
void ddpd_tail_from_end(ddpd_tail_t *t, const char *run_dir, uint32_t owner);

/* Forgets the records. */
void ddpd_tail_close(ddpd_tail_t *t);

#endif
