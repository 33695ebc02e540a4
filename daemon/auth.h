/* Mutual HMAC challenge–response over the cluster's shared secret (libsodium crypto_auth,
 * HMAC-SHA-512-256), used on every TCP link between daemons.
 *
 *   dialer   -> {"hello": name, "nonce": hex32}
 *   listener -> {"node": name, "nonce": hex32, "mac": hex(HMAC(k, "ddpd-server" | nd | nl))}
 *   dialer   -> {"mac": hex(HMAC(k, "ddpd-client" | nl | nd))}
 *   listener -> {"ok": true, "node": name}   (or closes, logging the refusal)
 * k is the BLAKE2b hash of the secret file's bytes, so any secret length works. Both sides
 * prove knowledge of k; nonces are fresh per connection so a recorded exchange cannot be
 * replayed. Pure functions; thread-safe.
 */
#ifndef DDPD_AUTH_H
#define DDPD_AUTH_H

#include <stddef.h>

#define DDPD_AUTH_KEYBYTES 32
#define DDPD_AUTH_NONCEBYTES 32
#define DDPD_AUTH_MACBYTES 32

/* Reads the secret file into key (hashed). Returns 0, -errno, or DDP_EINVAL for an empty file
 * or one readable by others (mode must not grant group/other read... warn only). */
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
/* hex <-> bytes helpers: to_hex writes 2n+1 chars; from_hex returns 0 iff exactly n bytes. */
void ddpd_auth_to_hex(char *out, const unsigned char *in, size_t n);
int ddpd_auth_from_hex(unsigned char *out, size_t n, const char *hex);

#endif
