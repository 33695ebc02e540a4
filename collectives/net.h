/* Socket helpers of the collectives: address parsing, listeners, connects and exact-length
 * transfers with absolute deadlines (host identity: common/host.h).
 *
 * All descriptors are close-on-exec. Functions return 0 or a negative code (-errno,
 * DDP_ETIMEDOUT, DDP_ECLOSED when the peer closed). Any thread.
 */
#ifndef DDP_COLLECTIVES_NET_H
#define DDP_COLLECTIVES_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Splits "host:port" (host may be "[v6]"); port 0..65535. DDP_EINVAL when malformed. */
int ddp__net_parse(const char *addr, char *host, size_t hostlen, int *port);
/* A listening TCP socket on host:port (host "" or NULL = any; port 0 = ephemeral), non-blocking.
 * *port_out (may be NULL) receives the bound port. Returns the fd or a negative code. */
int ddp__net_listen(const char *host, int port, int *port_out);
/* Connects to host:port, retrying refused connections until deadline_ns. Returns a blocking fd
 * with TCP_NODELAY, or a negative code. */
int ddp__net_connect(const char *host, int port, int64_t deadline_ns);
/* Accepts one connection if ready within deadline_ns (0 = don't wait). Returns fd, -EAGAIN. */
int ddp__net_accept(int lfd, int64_t deadline_ns, char *peer, size_t peerlen);
/* Sends/receives exactly len bytes before deadline_ns. */
int ddp__net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
int ddp__net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns);
/* Numeric local address of a connected socket ("10.0.0.2"). */
int ddp__net_local_host(int fd, char *host, size_t len);
/* Constant-time comparison of two NUL-terminated strings of at most n bytes: 1 equal. */
int ddp__net_token_eq(const char *a, const char *b, size_t n);
/* Sets O_NONBLOCK on or off. */
int ddp__net_nonblock(int fd, int on);

#endif
