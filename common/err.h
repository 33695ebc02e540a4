/* Error codes, their names and messages, and the CHECK macros.
 *
 * A fallible function returns int: 0 on success, a negative DDP_E* code, or -errno for a failed
 * system call. The DDP_E* codes start at -1000 so they never collide with -errno. The list below
 * is the single source: it yields the enum, ddp_strerror() and ddp_err_name().
 *
 * ddp_errinfo_t carries the human detail of an error (what file, which field, what offset) to a
 * caller that must show it to a person or send it over a socket; functions that take one fill it
 * on failure and leave it untouched on success. It may be NULL everywhere.
 */
#ifndef DDP_COMMON_ERR_H
#define DDP_COMMON_ERR_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* X(name, value, message) */
#define DDP_ERROR_LIST(X)                                                                    \
    X(EINVAL, -1000, "invalid argument")                                                     \
    X(ENOMEM, -1001, "out of memory")                                                        \
    X(EIO, -1002, "input/output error")                                                      \
    X(EFORMAT, -1003, "malformed file or message")                                           \
    X(ESPEC, -1004, "invalid job spec")                                                      \
    X(ETIMEDOUT, -1005, "deadline expired")                                                  \
    X(EPEER, -1006, "a peer failed or disconnected")                                         \
    X(EABORTED, -1007, "operation aborted")                                                  \
    X(ENOTSUP, -1008, "not supported by this backend or build")                              \
    X(ENODEV, -1009, "no usable device")                                                     \
    X(ECUDA, -1010, "CUDA error")                                                            \
    X(ENCCL, -1011, "NCCL error")                                                            \
    X(EMPI, -1012, "MPI error")                                                              \
    X(EAUTH, -1013, "authentication failed")                                                 \
    X(EPROTO, -1014, "protocol error")                                                       \
    X(ECLOSED, -1015, "connection closed")                                                   \
    X(ENOTFOUND, -1016, "not found")                                                         \
    X(ECHECKSUM, -1017, "checksum mismatch")                                                 \
    X(EBUSY, -1018, "resource busy")                                                         \
    X(ENUMERIC, -1019, "non-finite value (NaN or Inf)")                                      \
    X(EMISMATCH, -1020, "replicas differ")                                                   \
    X(EPERM, -1021, "permission denied")                                                     \
    X(ESQL, -1022, "database error")                                                         \
    X(EHAZARD, -1023, "device hazard: memory used without ordering (simulated device)")      \
    X(EQUOTA, -1024, "over a quota or limit")

enum {
    DDP_OK = 0,
#define DDP__ERR_ENUM(name, value, msg) DDP_##name = value,
    DDP_ERROR_LIST(DDP__ERR_ENUM)
#undef DDP__ERR_ENUM
};

/* Message for any code this project returns (DDP_E* or -errno). Never NULL; thread-safe. */
const char *ddp_strerror(int rc);
/* Symbolic name ("DDP_EINVAL", "ENOENT", "OK"). Never NULL; thread-safe. */
const char *ddp_err_name(int rc);

/* The detail of one error, for a person. `path` is a field path ("train.lr") or a file name. */
typedef struct ddp_errinfo {
    char msg[512];
    char path[256];
    int line;   /* 1-based, 0 when unknown */
    int column; /* 1-based, 0 when unknown */
    long long offset; /* byte offset in a file, -1 when unknown */
} ddp_errinfo_t;

/* Sets ei's message (printf-style); path/line/column/offset are cleared. NULL-safe. Returns rc so
 * callers can write `return ddp_errinfo_set(ei, DDP_EFORMAT, "...")`. */
int ddp_errinfo_set(ddp_errinfo_t *ei, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* ddp_errinfo_set with the arguments as a va_list (for a caller's own printf-style helper). */
int ddp_errinfo_vset(ddp_errinfo_t *ei, int rc, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* Sets the path (printf-style). NULL-safe. */
void ddp_errinfo_path(ddp_errinfo_t *ei, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Clears ei. NULL-safe. */
void ddp_errinfo_clear(ddp_errinfo_t *ei);
/* Formats "path:line:column: msg" (parts that are unknown are left out) into buf. */
const char *ddp_errinfo_str(const ddp_errinfo_t *ei, char *buf, size_t len);

/* Returns from the calling function on error. */
#define DDP_CHECK(call)                                                                      \
    do {                                                                                     \
        int ddp__rc = (call);                                                                \
        if (ddp__rc < 0) return ddp__rc;                                                     \
    } while (0)

/* Keeps the first error in rc and jumps to label. */
#define DDP_CHECK_GOTO(call, rc, label)                                                      \
    do {                                                                                     \
        int ddp__rc = (call);                                                                \
        if (ddp__rc < 0) {                                                                   \
            if ((rc) == 0) (rc) = ddp__rc;                                                   \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

/* Programmer errors only; always on. Never for bytes from a file or socket. */
#define DDP_ASSERT(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#endif
