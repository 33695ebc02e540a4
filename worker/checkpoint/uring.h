/* Checkpoint writes from registered memory through io_uring; not public.
 *
 * Why: an O_DIRECT write(2) pins every page of the caller's memory for the I/O and unpins it
 * afterwards (get_user_pages): for a GPT-2 124M save, 366k pages, about three quarters of the
 * writer's CPU time once the checksums come from the update (perf: gup_fast_fallback,
 * bio_iov_iter_get_pages, bio_add_page), taken from training on a machine whose cores all
 * train. Memory registered with io_uring is pinned once, and a write from it (WRITE_FIXED)
 * hands the kernel the pinned pages as they are. liburing is the kernel project's own wrapper.
 *
 * Registration pins the memory while it stays registered and counts against RLIMIT_MEMLOCK
 * unless the process has CAP_IPC_LOCK (root, or LimitMEMLOCK=infinity in deploy/ddpd.service).
 * Where io_uring or the registration is refused (an old kernel, seccomp,
 * kernel.io_uring_disabled, the limit), callers write with pwrite(2) as before: the bytes are the
 * same either way.
 *
 * Threads: one ddp__uring_t is used by one thread at a time.
 */
#ifndef DDP_WORKER_CHECKPOINT_URING_H
#define DDP_WORKER_CHECKPOINT_URING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct ddp__uring ddp__uring_t;

/* A ring of a few entries. Returns 0, -errno (io_uring refused), DDP_ENOMEM. */
int ddp__uring_new(ddp__uring_t **out);
/* Unregisters and frees. NULL-safe. */
void ddp__uring_free(ddp__uring_t *u);

/* Registers the memory of regions[0..n) (any addresses; pages are rounded outwards), replacing
 * what was registered before; a no-op when the same regions are registered already. Returns 0
 * or -errno (e.g. -ENOMEM over RLIMIT_MEMLOCK; nothing is registered then). */
int ddp__uring_register(ddp__uring_t *u, const struct iovec *regions, int n);

/* Writes up to n bytes from p to fd at offset off with one WRITE_FIXED when p lies in registered
 * memory (stopping at the end of the registered buffer p is in: the caller loops). Returns the
 * bytes written, -ENOENT when p is not in registered memory (nothing was done), or -errno. */
ssize_t ddp__uring_pwrite(ddp__uring_t *u, int fd, const void *p, size_t n, uint64_t off);

#endif
