/* Rank 0's metrics.jsonl, teed to TensorBoard.
 *
 * ddp_metrics_open returns a stdio stream that appends to metrics.jsonl as fopen(path, "a")
 * would, and also turns each complete line it is given into one TensorBoard event
 * (RUN_DIR/tb/, worker/tb_events.h): every number of the line becomes a scalar at the line's
 * "step" (the table in metrics_sink.c names the tags), so whatever a writer of metrics.jsonl adds
 * (a generation, a loss scale, a straggler's rank) reaches TensorBoard with no second call site.
 * A failure of the TensorBoard side is logged once and turns it off; metrics.jsonl goes on.
 */
#ifndef DDP_WORKER_METRICS_SINK_H
#define DDP_WORKER_METRICS_SINK_H

#include <stdio.h>

/* Opens path (metrics.jsonl) for appending, with the TensorBoard tee in run_dir/tb/. Returns
 * the stream (close it with fclose, which closes both) or NULL with errno set when path cannot
 * be opened. A TensorBoard file that cannot be created is logged, not fatal. Training thread. */
FILE *ddp_metrics_open(const char *run_dir, const char *path);

#endif
