/* Rank 0's metrics.jsonl, teed to TensorBoard (and read back on an elastic rejoin).
 *
 * The trainer hands each record (proto/metrics.h) to ddp_metrics_sink_write, which writes its
 * line to metrics.jsonl (the codec's bytes and a newline, in one write(2) on an O_APPEND file, so
 * a reader never sees half a line unless the process died inside that call) and then turns the
 * same record into one TensorBoard event (RUN_DIR/tb/, worker/tb_events.h): every number and
 * boolean of the line becomes a scalar at the line's "step", with the value the line states (the
 * table in metrics_sink.c names the tags), so whatever a writer adds to a record reaches
 * TensorBoard with no second call site. A line without a step, and null values, make no scalar.
 * A failure of the TensorBoard side is logged once and turns it off; metrics.jsonl goes on.
 * One sink per file; the training thread only.
 */
#ifndef DDP_WORKER_METRICS_SINK_H
#define DDP_WORKER_METRICS_SINK_H

#include "proto/metrics.h"

typedef struct ddp_metrics_sink ddp_metrics_sink_t;

/* Opens path (metrics.jsonl) for appending, with the TensorBoard tee in run_dir/tb/. Returns 0
 * with *out set, -errno when path cannot be opened, DDP_ENOMEM (*out NULL). A TensorBoard file
 * that cannot be created is logged, not fatal. Caller closes with ddp_metrics_sink_close. */
int ddp_metrics_sink_open(const char *run_dir, const char *path, ddp_metrics_sink_t **out);

/* Appends r's line to the file, then its scalars to TensorBoard. Returns 0, an error of the
 * codec (ddp_metrics_format), or -errno of write(2) (logged once; the caller goes on). s NULL:
 * nothing, 0. */
int ddp_metrics_sink_write(ddp_metrics_sink_t *s, const ddp_metrics_rec_t *r);

/* The highest step of path's step lines, read through the codec (-1: none, or no file). Lines
 * the codec cannot read (one being written when a rank died, an old version's `nan`) are
 * skipped. Blocking file reads; any thread. */
long ddp_metrics_sink_last_step(const char *path);

/* Closes both files and frees s. NULL-safe. */
void ddp_metrics_sink_close(ddp_metrics_sink_t *s);

#endif
