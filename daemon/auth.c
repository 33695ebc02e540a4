/* HMAC challenge–response primitives (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
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
    if (fstat(fd, &sb) == 0 && (sb.st_mode & 0077))
        DDP_WARN("auth: %s is readable by group/others (mode %03o); use chmod 600", path,
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
