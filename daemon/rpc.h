/* JSON-RPC 2.0 helpers shared by the daemon's API and ddpctl: building responses, errors and
 * notifications as single lines, validating a request line's envelope, and making arbitrary
 * bytes safe for a JSON string. Pure: no I/O, any thread.
 */
#ifndef DDPD_RPC_H
#define DDPD_RPC_H

#include <jansson.h>
#include <stddef.h>

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
    DDPD_RPC_QUOTA = 1010,        /* over a quota or limit of this daemon (ddpd.yaml) */
};

#define DDPD_MAX_LINE (1u << 20) /* the longest request or response line */

/* A response line for id (borrowed; NULL = null) with `result` (reference stolen). Caller
 * frees the returned string; NULL on out of memory. Ends with '\n'. */
char *ddpd_rpc_result(json_t *id, json_t *result);
/* An error response line; data (stolen) may be NULL. */
char *ddpd_rpc_error(json_t *id, int code, const char *message, json_t *data);
/* A notification line {"jsonrpc":"2.0","method":m,"params":params (stolen)}. */
char *ddpd_rpc_notify(const char *method, json_t *params);

/* One validated request: root owns everything; id (NULL for a notification), method and params
 * (NULL when absent or null) are borrowed from it. */
typedef struct ddpd_rpc_req {
    json_t *root;
    json_t *id;
    const char *method;
    json_t *params;
} ddpd_rpc_req_t;

/* Parses and validates one request line (without its '\n'): a JSON object with jsonrpc "2.0",
 * a string method, an integer, string or null id, and object or null params. Trailing CR and
 * blanks are ignored. Returns 0 with *req filled (free with json_decref(req->root)); 1 for a
 * blank line (nothing to answer); -1 with *error_line set to the error response to send (the
 * caller frees it; NULL on out of memory), *req zeroed. */
int ddpd_rpc_parse_request(const char *line, size_t len, ddpd_rpc_req_t *req, char **error_line);

/* Copies up to n bytes of possibly invalid UTF-8 into a new JSON string, replacing invalid
 * bytes with U+FFFD. When `hold_tail` is set, an incomplete sequence at the very end is left
 * out and its length returned in *held (so the caller can read it again with the next chunk).
 * Returns a new reference or NULL on out of memory. */
json_t *ddpd_rpc_text(const char *s, size_t n, int hold_tail, size_t *held);

#endif
