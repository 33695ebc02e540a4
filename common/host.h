/* Which machine this process runs on, as the collectives and the coordinator compare it. */
#ifndef DDP_COMMON_HOST_H
#define DDP_COMMON_HOST_H

#include <stddef.h>

/* Writes "boot id/hostname/network namespace" to out (NUL-terminated, truncated to len): two
 * processes with equal ids share memory and see each other's pids and loopback. Any thread. */
void ddp_host_id(char *out, size_t len);

#endif
