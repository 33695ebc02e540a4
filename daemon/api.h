/* The control API: a Unix socket (mode 0660) speaking JSON-RPC 2.0, one object per line.
 * Method list, parameters and error codes: see api.c's header comment and docs/running.md.
 * Loop thread only.
 */
#ifndef DDPD_API_H
#define DDPD_API_H

#include "common/err.h"
#include "daemon/ddpd.h"
#include "daemon/rpc.h"


/* Binds the socket (removing a stale one), sets 0660 and the group. Returns 0 or an error
 * with ei filled. */
int ddpd_api_start(ddpd_t *d, ddp_errinfo_t *ei);
/* Closes the listener and every session (their handles close asynchronously). NULL-safe. */
void ddpd_api_close(ddpd_t *d);

#endif
