/* Bounded randomized test of the control API: a few thousand mutations of valid requests
 * (byte flips, insertions, deletions, truncations, type swaps, huge numbers, deep nesting)
 * sent over several connections to a real ddpd. Passes when the daemon answers every
 * connection afterwards and exits 0 on SIGTERM (under ASan a leak or a memory error makes it
 * abort instead). DDPD_FUZZ_N sets the count (default 3000), DDPD_FUZZ_SEED the seed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/client.h"
#include "tests/integration/harness.h"

static const char *const seeds[] = {
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"daemon.status\"}",
    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"job.list\",\"params\":{\"limit\":5}}",
    "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"job.list\",\"params\":{\"state\":\"failed\"}}",
    "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"job.get\",\"params\":{\"id\":1}}",
    "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"job.cancel\",\"params\":{\"id\":2}}",
    "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"job.logs\",\"params\":{\"id\":1,\"rank\":0}}",
    "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"node.list\"}",
    "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"job.watch\",\"params\":{\"id\":1}}",
    "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"stream.cancel\",\"params\":{\"id\":8}}",
    "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"job.submit\",\"params\":{\"spec\":\"name: f\\n"
    "data: {train: x}\\ntrain: {steps: 2, lr: 0.001}\\nddp: {workers: 1}\\n\"}}",
    "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"job.submit\",\"params\":{\"spec\":{\"name\":"
    "\"g\",\"data\":{\"train\":\"x\"},\"train\":{\"steps\":1}}}}",
    "{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"job.logs\",\"params\":{\"id\":1,\"follow\":"
    "true}}",
};
#define N_SEEDS (sizeof seeds / sizeof seeds[0])

static const char *const tokens[] = {"null", "true", "-1", "1e308", "9223372036854775807",
                                     "\"\"", "[]", "{}", "\"\\u0000\"", "[[[[[[[[[[]]]]]]]]]]",
                                     "\"job.submit\"", "0", "\"\\ud800\"", "{\"a\":"};

static uint64_t rng;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One mutated request line into out (no newline inside); returns its length. */
static size_t mutate(char *out, size_t cap)
{
    const char *s = seeds[next() % N_SEEDS];
    size_t n = strlen(s);
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    int k = 1 + (int)(next() % 4);
    for (int i = 0; i < k; i++) {
        size_t pos = n ? next() % n : 0;
        switch (next() % 6) {
        case 0: out[pos] = (char)(next() & 0xff); break;          /* flip a byte */
        case 1: if (n > 1) { memmove(out + pos, out + pos + 1, n - pos - 1); n--; } break;
        case 2: n = pos; break;                                     /* truncate */
        case 3: {                                                   /* insert a token */
            const char *t = tokens[next() % (sizeof tokens / sizeof tokens[0])];
            size_t tl = strlen(t);
            if (n + tl < cap) {
                memmove(out + pos + tl, out + pos, n - pos);
                memcpy(out + pos, t, tl);
                n += tl;
            }
            break;
        }
        case 4: if (n > 0 && n + 1 < cap) { memmove(out + pos + 1, out + pos, n - pos); out[pos] = out[next() % n]; n++; } break;
        default: {                                                  /* replace a digit run */
            for (size_t j = pos; j < n; j++)
                if (out[j] >= '0' && out[j] <= '9') { out[j] = "0-9x"[next() % 4]; break; }
        }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\n') out[i] = ' ';
    return n;
}

static void drain(ddpd_client_t *c)
{
    json_t *m;
    while (ddpd_client_recv(c, &m, 0) == 0) json_decref(m);
}

int main(void)
{
    long total = getenv("DDPD_FUZZ_N") ? atol(getenv("DDPD_FUZZ_N")) : 3000;
    rng = getenv("DDPD_FUZZ_SEED") ? strtoull(getenv("DDPD_FUZZ_SEED"), NULL, 10) : 0x9e3779b97f4a7c15ULL;
    if (!rng) rng = 1;
    printf("# %ld mutations, seed %llu\n", total, (unsigned long long)rng);
    const char *extra[] = {"--worker-bin", "/bin/true", "--slots", "1", NULL};
    ddpd_test_daemon_t D;
    if (ddpd_test_start(&D, extra) != 0) {
        printf("1..0 # SKIP ddpd did not start\n");
        return 77; /* a skip (meson's 77), not a failure */
    }
    enum { NC = 4 };
    ddpd_client_t c[NC];
    int up = 1;
    for (int i = 0; i < NC; i++) up &= ddpd_client_connect(&c[i], D.socket) == 0;
    tap_ok(up, "%d clients connected", NC);
    char line[8192];
    long sent = 0, reconnects = 0;
    for (long i = 0; i < total; i++) {
        int k = (int)(next() % NC);
        size_t n = mutate(line, sizeof line - 1);
        line[n++] = '\n';
        if (ddpd_client_send_raw(&c[k], line, n) != 0) {
            /* the daemon may close a connection (e.g. on a write error): reconnect */
            ddpd_client_close(&c[k]);
            if (ddpd_client_connect(&c[k], D.socket) != 0) break;
            reconnects++;
            continue;
        }
        sent++;
        if (i % 16 == 0) drain(&c[k]);
    }
    tap_ok(sent > total * 9 / 10, "sent %ld of %ld mutated requests (%ld reconnects)", sent,
           total, reconnects);
    int answering = 0;
    for (int i = 0; i < NC; i++) {
        ddpd_client_t fresh;
        json_t *r = NULL, *e = NULL;
        /* a connection may hold a half-sent mutated line: ask on a fresh one as well */
        if (ddpd_client_connect(&fresh, D.socket) == 0 &&
            ddpd_client_call(&fresh, "daemon.status", NULL, &r, &e, 20000) == 0)
            answering++;
        json_decref(r);
        json_decref(e);
        ddpd_client_close(&fresh);
        ddpd_client_close(&c[i]);
    }
    tap_ok(answering == NC, "the daemon still answers (%d/%d)", answering, NC);
    int st = ddpd_test_stop(&D);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "ddpd exits 0 on SIGTERM, no crash or sanitizer abort (status 0x%x)", st);
    return tap_done();
}
