/* Logging: one line per call to stderr, prefixed with wall time, level and (when set) rank.
 *
 * Thread-safe: a line is formatted into a local buffer and written with one write(2), so lines
 * from threads and processes sharing a file never interleave.
 *
 * A cap (ddp_log_set_limit) bounds the log's file: a line that would cross it is not written;
 * one closing line is, and from then on fds 1 and 2 go to /dev/null, so that everything the
 * process writes there (ddp_log, stdio, libraries) is discarded. A rank's log is the file at
 * fd 2 (and usually fd 1): RUN_DIR/rank-R.log under ddpd.
 */
#ifndef DDP_COMMON_LOG_H
#define DDP_COMMON_LOG_H

#include <stdint.h>

typedef enum { DDP_LOG_DEBUG, DDP_LOG_INFO, DDP_LOG_WARN, DDP_LOG_ERROR } ddp_log_level_t;

/* Lines below `level` are dropped. Default INFO, or DDP_LOG_LEVEL=debug|info|warn|error. */
void ddp_log_set_level(ddp_log_level_t level);
/* Prefix every line with "[rank N]"; -1 removes it. */
void ddp_log_set_rank(int rank);
/* Writes one line. */
void ddp_log(ddp_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Caps the log at `bytes` (0: no cap). When stderr is a regular file the count starts at its
 * size now (an earlier process of this rank may have appended to it), else at 0; a file already
 * past the cap is closed at once, silently (the earlier process wrote the closing line). From
 * then on a line of ddp_log that would cross the cap is not written: instead one closing line
 * "log cap of N bytes reached (SOURCE): further output of this rank is discarded" is, and fds 2
 * and 1 are redirected to /dev/null (fd 1 when it is the same file as fd 2, or not a regular
 * file), so the file ends there: at most `bytes` plus that line, as far as ddp_log counts (see
 * ddp_log_check_limit for what others write). `source` says where the cap comes from
 * ("limits.log_bytes"); copied. Meant to be called once, by the main thread, before other
 * threads log; a later call starts over (tests). */
void ddp_log_set_limit(uint64_t bytes, const char *source);

/* Brings in what was written to fds 1 and 2 without ddp_log (stdio, OpenBLAS, oneDNN, CUDA), which
 * the cap's count cannot see: when stderr is a regular file its size (one fstat) replaces the
 * count when larger, and at or past the cap the log is closed as above. Cheap; the training loop
 * calls it once per step. Returns 1 when the log is closed (now or before), else 0 (also without
 * a cap). Any thread. */
int ddp_log_check_limit(void);

#define DDP_DEBUG(...) ddp_log(DDP_LOG_DEBUG, __VA_ARGS__)
#define DDP_INFO(...) ddp_log(DDP_LOG_INFO, __VA_ARGS__)
#define DDP_WARN(...) ddp_log(DDP_LOG_WARN, __VA_ARGS__)
#define DDP_ERROR(...) ddp_log(DDP_LOG_ERROR, __VA_ARGS__)

#endif
