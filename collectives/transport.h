/* The ring's transport interface: one directed link endpoint (the send side towards the next
 * rank, or the receive side from the previous one), driven only by the communication thread.
 *
 * The model is a ring of slots of `slot_bytes` each:
 *   sender:   p = send_slot(x)   -> a free slot (NULL: all in flight; poll and retry)
 *             ... write up to slot_bytes into p ...
 *             send_commit(x, len)
 *   receiver: p = recv_slot(x, &len) -> the oldest complete message (NULL: none yet)
 *             ... read (reduce) straight from p ...
 *             recv_release(x)
 * Messages arrive in commit order. Shared memory hands the peer's slot itself to the receiver
 * (peer data is read once); TCP copies through local slots, or, with the optional send_from and
 * recv_post, writes from and reads into the caller's buffer directly; the fake joins two threads.
 *
 * Failure: progress() returns DDP_EPEER when the peer died (socket EOF/hangup), or DDP_EABORTED
 * with culprit and code filled when the peer told us that rank `culprit` failed. notify_abort()
 * tells the peer, best effort, within a short bound.
 */
#ifndef DDP_COLLECTIVES_TRANSPORT_H
#define DDP_COLLECTIVES_TRANSPORT_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddp__xport ddp__xport_t;

typedef struct ddp__xport_ops {
    const char *name;
    /* Moves bytes without blocking. 0, DDP_EPEER, or DDP_EABORTED (the peer reported a failure). */
    int (*progress)(ddp__xport_t *x, int *culprit, int *code);
    void *(*send_slot)(ddp__xport_t *x);
    void (*send_commit)(ddp__xport_t *x, size_t len);
    const void *(*recv_slot)(ddp__xport_t *x, size_t *len);
    void (*recv_release)(ddp__xport_t *x);
    /* Optional (NULL: the caller copies into send_slot() and commits). Sender: queues a message
     * whose len bytes are read from p, caller memory, instead of from a slot; call only when
     * send_slot() returned a slot. p must stay valid and unchanged until the message has been
     * handed to the peer (pending() counts it) or detach() was called. */
    void (*send_from)(ddp__xport_t *x, const void *p, size_t len);
    /* Optional (NULL: every message lands in a slot). Receiver: says where the next message not
     * yet posted should land: in dst when it is exactly len bytes long, in a slot when dst is
     * NULL (or the length differs, or the message was read before its post). recv_slot() then
     * returns dst or the slot. Returns 0, or -1 when nslots messages are posted and not yet
     * released (post again later). dst is written until the message is complete or detach(). */
    int (*recv_post)(ddp__xport_t *x, void *dst, size_t len);
    /* Optional (NULL: the link never holds caller memory). Stops using caller memory: messages
     * queued by send_from() are copied into their slots, posts are dropped, and a message being
     * received into caller memory goes on into its slot (its bytes are then meaningless). Called
     * when an operation ends, so the caller may free its buffer even after a failure. */
    void (*detach)(ddp__xport_t *x);
    /* Sender: messages committed but not yet handed to the peer (TCP: not yet written). */
    int (*pending)(ddp__xport_t *x);
    /* Fills up to 2 pollfds to sleep on, given what the ring is blocked on. Returns the count. */
    int (*pollfds)(ddp__xport_t *x, struct pollfd *p, int want_send, int want_recv);
    /* Handles the revents of the pollfds it filled (drains eventfds, reads control frames). */
    int (*after_poll)(ddp__xport_t *x, const struct pollfd *p, int n, int *culprit, int *code);
    /* Best effort: tells the peer that rank `culprit` failed with `code`. */
    void (*notify_abort)(ddp__xport_t *x, int culprit, int code);
    void (*close)(ddp__xport_t *x);
} ddp__xport_ops_t;

struct ddp__xport {
    const ddp__xport_ops_t *ops;
    size_t slot_bytes;
    int peer;       /* the other rank */
    int is_send;
    _Atomic uint64_t sent; /* sender: payload bytes handed to the peer (TCP counts them; written
                            * by the communication thread, read by any) */
};

/* Link setup message, sent by the sender on a new data connection (TCP or Unix). */
#define DDP__LINK_MAGIC "DDPLINK1"
typedef struct ddp__link_hello {
    char magic[8];
    uint32_t from_rank, to_rank;
    uint64_t generation;
    char token[128];
    uint32_t nslots, slot_bytes;
} ddp__link_hello_t;

/* TCP: wraps a connected socket (takes ownership of fd). */
int ddp__tcp_xport_new(int fd, int is_send, int peer, size_t slot_bytes, int nslots,
                       ddp__xport_t **out);

/* Shared memory, sender side: creates the segment and eventfds and sends them with `hello` over
 * the connected Unix socket `usock` (ownership of usock moves to the link). */
int ddp__shm_xport_new_send(int usock, int peer, size_t slot_bytes, int nslots,
                            const ddp__link_hello_t *hello, ddp__xport_t **out);
/* Shared memory, receiver side: receives hello + descriptors from `usock` before deadline_ns.
 * Returns DDP_EAUTH/DDP_EPROTO (without taking usock) for a foreign or malformed hello, filling
 * *hello_out for the caller's checks. On success the link owns usock. */
int ddp__shm_xport_recv_hello(int usock, int64_t deadline_ns, ddp__link_hello_t *hello_out,
                              int fds_out[3]);
int ddp__shm_xport_new_recv(int usock, int peer, const ddp__link_hello_t *hello,
                            const int fds[3], ddp__xport_t **out);
/* In-memory pair over a caller-provided segment (the fake transport): no descriptors except the
 * two eventfds, no death detection. seg must hold ddp__shm_seg_bytes(); owned by the caller. */
size_t ddp__shm_seg_bytes(size_t slot_bytes, int nslots);
void ddp__shm_seg_init(void *seg, size_t slot_bytes, int nslots);
int ddp__shm_xport_new_mem(void *seg, int efd_data, int efd_space, int is_send, int peer,
                           const char *name, ddp__xport_t **out);

#endif
