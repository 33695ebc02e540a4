/* libFuzzer harness: what a peer daemon's link parses before it trusts anything, reached
 * without I/O: the challenge-response message (a JSON line carrying hex nonces and a hex
 * HMAC, checked with daemon/auth.c's hex decoder and constant-time verifier). The parser of
 * every peer message has its own harness (fuzz_peer_msg.c), and so has the rendezvous hello's
 * check (fuzz_hello.c).
 */
#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char key[DDPD_AUTH_KEYBYTES];
    static int ready;
    if (!ready) {
        if (sodium_init() < 0) abort();
        ddpd_auth_key_from("fuzz-secret", 11, key);
        ready = 1;
    }
    json_t *m = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!m) return 0;
    const char *nonce_hex = json_string_value(json_object_get(m, "nonce"));
    const char *peer_hex = json_string_value(json_object_get(m, "peer_nonce"));
    const char *mac_hex = json_string_value(json_object_get(m, "mac"));
    unsigned char a[DDPD_AUTH_NONCEBYTES] = {0}, b[DDPD_AUTH_NONCEBYTES] = {0};
    /* as link.c does: the fields go to the decoder as they are, NULL when absent */
    (void)ddpd_auth_verify_hex(key, "ddpd-server", a, a, mac_hex);
    if (ddpd_auth_from_hex(a, sizeof a, nonce_hex) == 0) {
        char back[2 * DDPD_AUTH_NONCEBYTES + 1];
        ddpd_auth_to_hex(back, a, sizeof a);
        if (strlen(back) != 2 * sizeof a) abort();
        if (ddpd_auth_from_hex(b, sizeof b, peer_hex) == 0) {
            int ok = ddpd_auth_verify_hex(key, "ddpd-client", a, b, mac_hex);
            /* the right mac must verify, whatever the fuzzer sent */
            unsigned char mac[DDPD_AUTH_MACBYTES];
            char mhex[2 * DDPD_AUTH_MACBYTES + 1];
            ddpd_auth_mac(key, "ddpd-client", a, b, mac);
            ddpd_auth_to_hex(mhex, mac, sizeof mac);
            if (!ddpd_auth_verify_hex(key, "ddpd-client", a, b, mhex)) abort();
            (void)ok;
        }
    }
    json_decref(m);
    return 0;
}
