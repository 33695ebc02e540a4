/* `ddpctl trace`: the ranks' timeline traces of a run merged into one Chrome trace file. */
#ifndef DDPD_CTL_TRACE_H
#define DDPD_CTL_TRACE_H

/* ddpctl trace JOB|RUN_DIR [-o FILE.json]: reads RUN_DIR/trace/rank-*.json (train.trace) and
 * writes one trace-event file with a process row per rank (default job-N-trace.json or
 * trace.json). Returns a ddpctl exit code (CTL_*). */
int ddpctl_trace(int argc, char **argv, const char *socket_path);

#endif
