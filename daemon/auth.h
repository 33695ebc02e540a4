/* Mutual authentication over the cluster's shared secret (libsodium crypto_auth,
 * HMAC-SHA-512-256), and the session keys of a link between daemons.
 *
 * Version 2 (this ddpd's; link.c runs the exchange):
 *   dialer   -> {"hello": nd_name, "nonce": hex32 nd, "v": 2, "caps": ["box"]}
 *   listener -> {"node": nl_name, "nonce": hex32 nl, "v": 2, "chosen": "box",
 *                "mac": hex(HMAC(k, "ddpd-v2 server" | T))}
 *   dialer   -> {"mac": hex(HMAC(k, "ddpd-v2 client" | T))}
 *   then both sides switch to frames encrypted with secretstream (link.c) under two keys,
 *   one per direction, derived from k and T.
 * T, the transcript, binds everything either side said: both nonces, both node names, the
 * dialer's capabilities and the listener's choice (length-prefixed), so a relay cannot change a
 * name or strip a capability without the MACs failing. Both nonces are fresh per connection,
 * so no recorded exchange or message replays on another.
 *
 * Version 1 (ddpd before this one; kept for a rolling upgrade under peer_auth: allow-legacy):
 *   dialer   -> {"hello": name, "nonce": hex32}
 *   listener -> {"node": name, "nonce": hex32, "mac": hex(HMAC(k, "ddpd-server" | nd | nl))}
 *   dialer   -> {"mac": hex(HMAC(k, "ddpd-client" | nl | nd))}
 *   listener -> {"ok": true, "node": name}   (or closes, logging the refusal)
 * and plain JSON lines after it, authenticated by nothing but the TCP connection.
 * Downgrade: a version-2 node puts DDPD_AUTH_SENTINEL in the last bytes of every nonce it
 * sends. The v1 MAC covers both nonces, so a relay that strips "v" from a hello (or answers a
 * v2 hello as v1) cannot hide that the other side speaks v2: seeing the sentinel in a v1
 * exchange, a node refuses it (as TLS 1.3 does with its ServerHello.random sentinel).
 *
 * k is the BLAKE2b hash of the secret file's bytes, so any secret length works.
 * Pure functions; thread-safe.
 */
#ifndef DDPD_AUTH_H
#define DDPD_AUTH_H

#include <stddef.h>

#define DDPD_AUTH_KEYBYTES 32
#define DDPD_AUTH_NONCEBYTES 32
#define DDPD_AUTH_MACBYTES 32

/* Reads the secret file into key (hashed). Returns 0, -errno, DDP_EINVAL for an empty file, or
 * DDP_EPERM (logged) for one that is not a regular file of root or this process's user, or that
 * others may read (a group-readable one is warned about). */
int ddpd_auth_load_key(const char *path, unsigned char key[DDPD_AUTH_KEYBYTES]);
/* Derives the key from secret bytes. */
void ddpd_auth_key_from(const void *secret, size_t len, unsigned char key[DDPD_AUTH_KEYBYTES]);
/* Fresh random nonce. */
void ddpd_auth_nonce(unsigned char nonce[DDPD_AUTH_NONCEBYTES]);
/* mac = HMAC(key, role | a | b); role is "ddpd-server" or "ddpd-client". */
void ddpd_auth_mac(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                   const unsigned char a[DDPD_AUTH_NONCEBYTES],
                   const unsigned char b[DDPD_AUTH_NONCEBYTES],
                   unsigned char mac[DDPD_AUTH_MACBYTES]);
/* Constant-time check of a hex mac. Returns 1 when it matches. */
int ddpd_auth_verify_hex(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                         const unsigned char a[DDPD_AUTH_NONCEBYTES],
                         const unsigned char b[DDPD_AUTH_NONCEBYTES], const char *mac_hex);
/* ---- version 2 ---- */

#define DDPD_AUTH_SENTINEL "ddpd-v2+" /* 8 bytes at the end of a v2 node's nonces */
#define DDPD_AUTH_SENTINEL_BYTES 8
#define DDPD_AUTH_T_MAX 512 /* the transcript's largest size */

/* A fresh nonce of a v2 node: random, then the sentinel. */
void ddpd_auth_nonce_v2(unsigned char nonce[DDPD_AUTH_NONCEBYTES]);
/* 1 when nonce ends with the sentinel (its sender speaks v2). */
int ddpd_auth_is_v2_nonce(const unsigned char nonce[DDPD_AUTH_NONCEBYTES]);

/* The transcript T of a v2 handshake (see above); strings of at most 127 bytes. */
typedef struct ddpd_auth_transcript {
    unsigned char t[DDPD_AUTH_T_MAX];
    size_t len;
} ddpd_auth_transcript_t;
void ddpd_auth_transcript(ddpd_auth_transcript_t *tr,
                          const unsigned char nonce_dialer[DDPD_AUTH_NONCEBYTES],
                          const unsigned char nonce_listener[DDPD_AUTH_NONCEBYTES],
                          const char *node_dialer, const char *node_listener,
                          const char *caps_dialer, const char *chosen);
/* mac = HMAC(key, "ddpd-v2 <role>" | T); role is "server" or "client". */
void ddpd_auth_mac_v2(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                      const ddpd_auth_transcript_t *tr, unsigned char mac[DDPD_AUTH_MACBYTES]);
/* Constant-time check of a hex v2 mac. Returns 1 when it matches. */
int ddpd_auth_verify_v2_hex(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                            const ddpd_auth_transcript_t *tr, const char *mac_hex);
/* The session's two keys, one per direction: dialer -> listener and listener -> dialer. */
void ddpd_auth_session_keys(const unsigned char key[DDPD_AUTH_KEYBYTES],
                            const ddpd_auth_transcript_t *tr, unsigned char d2l[32],
                            unsigned char l2d[32]);

/* hex <-> bytes helpers: to_hex writes 2n+1 chars; from_hex returns 0 iff exactly n bytes. */
void ddpd_auth_to_hex(char *out, const unsigned char *in, size_t n);
int ddpd_auth_from_hex(unsigned char *out, size_t n, const char *hex);

#endif
