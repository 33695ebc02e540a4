/* Logging: one line per call to stderr, prefixed with wall time, level and (when set) rank.
 *
 * Thread-safe: a line is formatted into a local buffer and written with one write(2), so lines
 * from threads and processes sharing a file never interleave.
 */
#ifndef DDP_COMMON_LOG_H
#define DDP_COMMON_LOG_H

typedef enum { DDP_LOG_DEBUG, DDP_LOG_INFO, DDP_LOG_WARN, DDP_LOG_ERROR } ddp_log_level_t;

/* Lines below `level` are dropped. Default INFO, or DDP_LOG_LEVEL=debug|info|warn|error. */
void ddp_log_set_level(ddp_log_level_t level);
/* Prefix every line with "[rank N]"; -1 removes it. */
void ddp_log_set_rank(int rank);
/* Writes one line. */
void ddp_log(ddp_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DDP_DEBUG(...) ddp_log(DDP_LOG_DEBUG, __VA_ARGS__)
#define DDP_INFO(...) ddp_log(DDP_LOG_INFO, __VA_ARGS__)
#define DDP_WARN(...) ddp_log(DDP_LOG_WARN, __VA_ARGS__)
#define DDP_ERROR(...) ddp_log(DDP_LOG_ERROR, __VA_ARGS__)

#endif
