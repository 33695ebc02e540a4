/* JSON-RPC 2.0 helpers shared by the daemon's API and ddpctl: building responses, errors and
 * notifications as single lines, and making arbitrary bytes safe for a JSON string.
 */
#ifndef DDPD_RPC_H
#define DDPD_RPC_H

#include <jansson.h>
#include <stddef.h>

/* A response line for id (borrowed; NULL = null) with `result` (reference stolen). Caller
 * frees the returned string; NULL on out of memory. Ends with '\n'. */
char *ddpd_rpc_result(json_t *id, json_t *result);
/* An error response line; data (stolen) may be NULL. */
char *ddpd_rpc_error(json_t *id, int code, const char *message, json_t *data);
/* A notification line {"jsonrpc":"2.0","method":m,"params":params (stolen)}. */
char *ddpd_rpc_notify(const char *method, json_t *params);

/* Copies up to n bytes of possibly invalid UTF-8 into a new JSON string, replacing invalid
 * bytes with U+FFFD. When `hold_tail` is set, an incomplete sequence at the very end is left
 * out and its length returned in *held (so the caller can read it again with the next chunk).
 * Returns a new reference or NULL on out of memory. */
json_t *ddpd_rpc_text(const char *s, size_t n, int hold_tail, size_t *held);

#endif
