/* The control API: a Unix socket (mode 0660) speaking JSON-RPC 2.0, one object per line.
 * Method list, parameters and error codes: see api.c's header comment and README.
 * Loop thread only.
 */
#ifndef DDPD_API_H
#define DDPD_API_H

#include "common/err.h"
#include "daemon/ddpd.h"

/* Application error codes (JSON-RPC's own are -32700, -32600, -32601, -32602, -32603). */
enum {
    DDPD_RPC_PARSE = -32700,
    DDPD_RPC_INVALID = -32600,
    DDPD_RPC_METHOD = -32601,
    DDPD_RPC_PARAMS = -32602,
    DDPD_RPC_INTERNAL = -32603,
    DDPD_RPC_BAD_SPEC = 1001,     /* data: {path, line, column, origin} */
    DDPD_RPC_NOT_FOUND = 1002,    /* no job with that id */
    DDPD_RPC_DENIED = 1003,       /* not the submitter or root */
    DDPD_RPC_FINISHED = 1004,     /* the job already ended */
    DDPD_RPC_NO_CAPACITY = 1005,  /* more ranks than the cluster has slots */
    DDPD_RPC_SPEC_IO = 1006,      /* spec file unreadable; data: {path} */
    DDPD_RPC_STOPPING = 1007,     /* daemon shutting down */
    DDPD_RPC_STORE = 1008,        /* the job store failed */
    DDPD_RPC_NO_LOG = 1009,       /* the rank's log is not on this node */
};

#define DDPD_MAX_LINE (1u << 20)

/* Binds the socket (removing a stale one), sets 0660 and the group. Returns 0 or an error
 * with ei filled. */
int ddpd_api_start(ddpd_t *d, ddp_errinfo_t *ei);
/* Closes the listener and every session (their handles close asynchronously). NULL-safe. */
void ddpd_api_close(ddpd_t *d);
/* A job changed state (terminal or not) or reported a step: forwards to its watchers. */
void ddpd_api_job_event(ddpd_t *d, ddpd_job_t *j);

#endif
