/* HMAC challenge–response primitives (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

void ddpd_auth_key_from(const void *secret, size_t len, unsigned char key[DDPD_AUTH_KEYBYTES])
{
    crypto_generichash(key, DDPD_AUTH_KEYBYTES, secret, len, (const unsigned char *)"ddpd-v1", 7);
}

int ddpd_auth_load_key(const char *path, unsigned char key[DDPD_AUTH_KEYBYTES])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (sb.st_mode & 0007) ||
        (sb.st_uid != 0 && sb.st_uid != geteuid())) {
        DDP_ERROR("auth: %s must be a regular file of root or this daemon's user that others "
                  "cannot read (chmod 600); it is mode %03o, uid %u", path,
                  (unsigned)(sb.st_mode & 0777), (unsigned)sb.st_uid);
        close(fd);
        return DDP_EPERM;
    }
    if (sb.st_mode & 0070)
        DDP_WARN("auth: %s is readable by its group (mode %03o); chmod 600 keeps it root's", path,
                 (unsigned)(sb.st_mode & 0777));
    unsigned char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    int err = errno;
    close(fd);
    if (n < 0) return -err;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    if (n == 0) return DDP_EINVAL;
    ddpd_auth_key_from(buf, (size_t)n, key);
    sodium_memzero(buf, sizeof buf);
    return 0;
}

void ddpd_auth_nonce(unsigned char nonce[DDPD_AUTH_NONCEBYTES])
{
    randombytes_buf(nonce, DDPD_AUTH_NONCEBYTES);
}

void ddpd_auth_mac(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                   const unsigned char a[DDPD_AUTH_NONCEBYTES],
                   const unsigned char b[DDPD_AUTH_NONCEBYTES],
                   unsigned char mac[DDPD_AUTH_MACBYTES])
{
    unsigned char msg[16 + 2 * DDPD_AUTH_NONCEBYTES];
    size_t rl = strlen(role);
    if (rl > 16) rl = 16;
    memset(msg, 0, 16);
    memcpy(msg, role, rl);
    memcpy(msg + 16, a, DDPD_AUTH_NONCEBYTES);
    memcpy(msg + 16 + DDPD_AUTH_NONCEBYTES, b, DDPD_AUTH_NONCEBYTES);
    crypto_auth(mac, msg, sizeof msg, key);
}

void ddpd_auth_to_hex(char *out, const unsigned char *in, size_t n)
{
    sodium_bin2hex(out, 2 * n + 1, in, n);
}

int ddpd_auth_from_hex(unsigned char *out, size_t n, const char *hex)
{
    size_t got = 0;
    if (!hex || strlen(hex) != 2 * n) return -1;
    if (sodium_hex2bin(out, n, hex, 2 * n, NULL, &got, NULL) != 0 || got != n) return -1;
    return 0;
}

int ddpd_auth_verify_hex(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                         const unsigned char a[DDPD_AUTH_NONCEBYTES],
                         const unsigned char b[DDPD_AUTH_NONCEBYTES], const char *mac_hex)
{
    unsigned char want[DDPD_AUTH_MACBYTES], got[DDPD_AUTH_MACBYTES];
    if (ddpd_auth_from_hex(got, sizeof got, mac_hex) != 0) return 0;
    ddpd_auth_mac(key, role, a, b, want);
    return sodium_memcmp(want, got, sizeof want) == 0;
}

/* ---- version 2 ---- */

void ddpd_auth_nonce_v2(unsigned char nonce[DDPD_AUTH_NONCEBYTES])
{
    randombytes_buf(nonce, DDPD_AUTH_NONCEBYTES - DDPD_AUTH_SENTINEL_BYTES);
    memcpy(nonce + DDPD_AUTH_NONCEBYTES - DDPD_AUTH_SENTINEL_BYTES, DDPD_AUTH_SENTINEL,
           DDPD_AUTH_SENTINEL_BYTES);
}

int ddpd_auth_is_v2_nonce(const unsigned char nonce[DDPD_AUTH_NONCEBYTES])
{
    return !memcmp(nonce + DDPD_AUTH_NONCEBYTES - DDPD_AUTH_SENTINEL_BYTES, DDPD_AUTH_SENTINEL,
                   DDPD_AUTH_SENTINEL_BYTES);
}

/* Appends one length-prefixed string (at most 127 bytes: one length byte). */
static void put_str(ddpd_auth_transcript_t *tr, const char *s)
{
    size_t n = strlen(s);
    if (n > 127) n = 127;
    tr->t[tr->len++] = (unsigned char)n;
    memcpy(tr->t + tr->len, s, n);
    tr->len += n;
}

void ddpd_auth_transcript(ddpd_auth_transcript_t *tr,
                          const unsigned char nonce_dialer[DDPD_AUTH_NONCEBYTES],
                          const unsigned char nonce_listener[DDPD_AUTH_NONCEBYTES],
                          const char *node_dialer, const char *node_listener,
                          const char *caps_dialer, const char *chosen)
{
    tr->len = 0;
    memcpy(tr->t, "ddpd-v2", 8); /* with its NUL: a version tag of fixed size */
    tr->len = 8;
    memcpy(tr->t + tr->len, nonce_dialer, DDPD_AUTH_NONCEBYTES);
    tr->len += DDPD_AUTH_NONCEBYTES;
    memcpy(tr->t + tr->len, nonce_listener, DDPD_AUTH_NONCEBYTES);
    tr->len += DDPD_AUTH_NONCEBYTES;
    put_str(tr, node_dialer);
    put_str(tr, node_listener);
    put_str(tr, caps_dialer);
    put_str(tr, chosen);
}

void ddpd_auth_mac_v2(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                      const ddpd_auth_transcript_t *tr, unsigned char mac[DDPD_AUTH_MACBYTES])
{
    crypto_auth_hmacsha512256_state st;
    char label[32];
    int n = snprintf(label, sizeof label, "ddpd-v2 %s", role);
    crypto_auth_hmacsha512256_init(&st, key, DDPD_AUTH_KEYBYTES);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)label, (size_t)n + 1);
    crypto_auth_hmacsha512256_update(&st, tr->t, tr->len);
    crypto_auth_hmacsha512256_final(&st, mac);
}

int ddpd_auth_verify_v2_hex(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *role,
                            const ddpd_auth_transcript_t *tr, const char *mac_hex)
{
    unsigned char want[DDPD_AUTH_MACBYTES], got[DDPD_AUTH_MACBYTES];
    if (ddpd_auth_from_hex(got, sizeof got, mac_hex) != 0) return 0;
    ddpd_auth_mac_v2(key, role, tr, want);
    return sodium_memcmp(want, got, sizeof want) == 0;
}

/* BLAKE2b keyed with k over a direction's label and T. */
static void session_key(const unsigned char key[DDPD_AUTH_KEYBYTES], const char *label,
                        const ddpd_auth_transcript_t *tr, unsigned char out[32])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, DDPD_AUTH_KEYBYTES, 32);
    crypto_generichash_update(&st, (const unsigned char *)label, strlen(label) + 1);
    crypto_generichash_update(&st, tr->t, tr->len);
    crypto_generichash_final(&st, out, 32);
}

void ddpd_auth_session_keys(const unsigned char key[DDPD_AUTH_KEYBYTES],
                            const ddpd_auth_transcript_t *tr, unsigned char d2l[32],
                            unsigned char l2d[32])
{
    session_key(key, "ddpd-v2 dialer->listener", tr, d2l);
    session_key(key, "ddpd-v2 listener->dialer", tr, l2d);
}
