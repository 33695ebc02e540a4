/* A run's curves read from its metrics.jsonl: training loss, tokens/s, MFU and generation per step,
 * validation loss per validation. Used by `ddpctl plot` (the whole file) and the status page
 * (the file's tail, so a page costs the same however long the run).
 *
 * Lines the metrics codec (proto/metrics.h) cannot read, and lines without a "step" or a
 * number to draw, are skipped (a line being written, a generation event, an older writer's
 * "nan"); a step line without "tokens_per_s" or "generation" gets NAN / -1 there.
 */
#ifndef DDPD_SERIES_H
#define DDPD_SERIES_H

#include <stddef.h>
#include <sys/types.h>

typedef struct ddpd_series {
    size_t n;          /* step lines */
    long *step;        /* [n] */
    double *loss;      /* [n] */
    double *tps;       /* [n] tokens/s, NAN when absent */
    double *mfu;       /* [n] model FLOPs utilisation (a fraction), NAN when absent */
    long *gen;         /* [n] generation, -1 when absent */
    size_t n_val;      /* validation lines */
    long *val_step;    /* [n_val] */
    double *val_loss;  /* [n_val] */
    size_t cap, cap_val;
} ddpd_series_t;

/* Reads path (a metrics.jsonl) into s (zeroed first). tail > 0: only its last `tail` bytes
 * (the first, partial line skipped). Returns 0, -errno (cannot open), DDP_ENOMEM. Any thread;
 * blocking file I/O. */
int ddpd_series_read(const char *path, off_t tail, ddpd_series_t *s);
/* The same from an open file descriptor (ownership moves: it is closed). */
int ddpd_series_read_fd(int fd, off_t tail, ddpd_series_t *s);

/* Frees the arrays. NULL-safe. */
void ddpd_series_free(ddpd_series_t *s);

#endif
