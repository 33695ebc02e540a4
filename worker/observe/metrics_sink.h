/* Rank 0's metrics.jsonl, teed to TensorBoard (and read back on an elastic rejoin).
 *
 * The trainer hands each record (proto/metrics.h) to ddp_metrics_sink_write, which writes its
 * line to metrics.jsonl (the codec's bytes and a newline, in one write(2) on an O_APPEND file, so
 * a reader never sees half a line unless the process died inside that call) and then turns the
 * same record into one TensorBoard event (RUN_DIR/tb/, tb_events.h): every number and
 * boolean of the line becomes a scalar at the line's "step", with the value the line states (the
 * table in metrics_sink.c names the tags), so whatever a writer adds to a record reaches
 * TensorBoard with no second call site. A line without a step, and null values, make no scalar.
 * A failure of the TensorBoard side is logged once and turns it off; metrics.jsonl goes on.
 *
 * Caps (limits.metrics_bytes, limits.tensorboard_bytes, lowered by the daemon's per-user limits:
 * worker/main.c): metrics.jsonl's bytes are counted from its size at open (a respawned rank 0
 * appends), and a line that would cross the cap is not written, nor any after it, so readers
 * see whole lines only; the event files of RUN_DIR/tb/ likewise (tb_events.h). Each cap,
 * once reached, is logged once, with the file, the cap and where it came from; training goes on.
 * One sink per file; the training thread only.
 */
#ifndef DDP_WORKER_OBSERVE_METRICS_SINK_H
#define DDP_WORKER_OBSERVE_METRICS_SINK_H

#include <stdint.h>

#include "proto/metrics.h"

typedef struct ddp_metrics_sink ddp_metrics_sink_t;

/* The caps of the sinks a process opens; 0 = none. `*_from` says where a cap came from, for the
 * warning ("limits.metrics_bytes", "the daemon's per-user limit"). */
typedef struct ddp_metrics_caps {
    uint64_t metrics_bytes;     /* metrics.jsonl */
    uint64_t tensorboard_bytes; /* RUN_DIR/tb/'s event files together */
    char metrics_from[96], tensorboard_from[96];
} ddp_metrics_caps_t;

/* Sets the caps of every sink opened after this call (copied; NULL: none). Process-wide because
 * the sink is opened deep in the trainer (and again at each elastic generation), while the caps
 * are configuration: worker/main.c sets them once, beside the spec and the environment, before
 * the trainer starts. Main thread, before any sink opens. */
void ddp_metrics_sink_set_caps(const ddp_metrics_caps_t *caps);

/* Opens path (metrics.jsonl) for appending, with the TensorBoard tee in run_dir/tb/, under the
 * caps of ddp_metrics_sink_set_caps. Returns 0 with *out set, -errno when path cannot be opened,
 * DDP_ENOMEM (*out NULL). A TensorBoard file that cannot be created (or whose directory is at its
 * cap already) is logged, not fatal. Caller closes with ddp_metrics_sink_close. */
int ddp_metrics_sink_open(const char *run_dir, const char *path, ddp_metrics_sink_t **out);

/* Appends r's line to the file, then its scalars to TensorBoard. Returns 0 (also when a cap
 * keeps the line or the event out: logged once), an error of the codec (ddp_metrics_format), or
 * -errno of write(2) (logged once; the caller goes on). s NULL: nothing, 0. */
int ddp_metrics_sink_write(ddp_metrics_sink_t *s, const ddp_metrics_rec_t *r);

/* The highest step of path's step lines, read through the codec (-1: none, or no file). Lines
 * the codec cannot read (one being written when a rank died, an old version's `nan`) are
 * skipped. Blocking file reads; any thread. */
long ddp_metrics_sink_last_step(const char *path);

/* Closes both files and frees s. NULL-safe. */
void ddp_metrics_sink_close(ddp_metrics_sink_t *s);

#endif
