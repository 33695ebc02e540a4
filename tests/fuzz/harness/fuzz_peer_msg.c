/* libFuzzer harness: the peer protocol's parser (daemon/peer_msg.c), which every line of a link
 * between daemons goes through before link.c or remote.c acts on it. Each input is parsed as
 * each message a link can expect (the four handshake messages and an authenticated one), and
 * what the parser accepts must keep the header's promises: the kind asked for, strings present
 * and within their limits, ranks in range; what it refuses must say why and leave nothing to
 * free (ASan's leak check sees the rest).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/peer_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must(int cond)
{
    if (!cond) abort();
}

static void check_str(const char *s, size_t max) { must(s && strlen(s) <= max); }

static void check_ranks(const int *r, int n, int lo, int hi)
{
    must(n == 0 || r);
    for (int i = 0; i < n; i++) must(r[i] >= lo && r[i] <= hi);
}

/* The promises of peer_msg.h about an accepted message. */
static void check(const ddpd_pmsg_t *m, ddpd_pmsg_kind_t expect)
{
    must(m->root != NULL);
    if (expect != DDPD_PMSG_ANY) must(m->kind == expect || m->kind == DDPD_PMSG_REFUSED);
    else must(m->kind >= DDPD_PMSG_STATUS && m->kind <= DDPD_PMSG_UNKNOWN);
    switch (m->kind) {
    case DDPD_PMSG_HELLO: check_str(m->u.hello.node, DDPD_PMSG_NODE_MAX); break;
    case DDPD_PMSG_CHALLENGE:
        check_str(m->u.challenge.node, DDPD_PMSG_NODE_MAX);
        must(strlen(m->u.challenge.mac) == 2 * DDPD_AUTH_MACBYTES);
        break;
    case DDPD_PMSG_PROOF: must(strlen(m->u.proof.mac) == 2 * DDPD_AUTH_MACBYTES); break;
    case DDPD_PMSG_OK: check_str(m->u.ok.node, DDPD_PMSG_NODE_MAX); break;
    case DDPD_PMSG_REFUSED: check_str(m->u.refused.error, DDPD_PMSG_TEXT_MAX); break;
    case DDPD_PMSG_STATUS:
        check_str(m->u.status.node, DDPD_PMSG_NODE_MAX);
        must(m->u.status.free >= 0 && m->u.status.free <= m->u.status.slots);
        break;
    case DDPD_PMSG_START: {
        const ddpd_pmsg_start_t *s = &m->u.start;
        check_str(s->token, DDPD_PMSG_TOKEN_MAX);
        check_str(s->rdzv, DDPD_PMSG_ADDR_MAX);
        check_str(s->cwd, DDPD_PMSG_TEXT_MAX);
        must(s->spec && *s->spec && *s->token && *s->rdzv);
        must(s->n_ranks >= 1 && s->n_ranks <= s->world && s->n_ranks <= DDPD_PMSG_MAX_RANKS);
        check_ranks(s->ranks, s->n_ranks, 0, s->world - 1);
        break;
    }
    case DDPD_PMSG_KILL: check_str(m->u.kill.host_id, DDPD_PMSG_HOST_ID_MAX); break;
    case DDPD_PMSG_SIGNAL: must(m->u.signal.sig >= 1 && m->u.signal.sig <= 64); break;
    case DDPD_PMSG_STARTED: must(m->u.started.n >= 1); break;
    case DDPD_PMSG_FAILED: check_str(m->u.failed.why, DDPD_PMSG_TEXT_MAX); break;
    case DDPD_PMSG_ADOPTED:
        check_ranks(m->u.adopted.ranks, m->u.adopted.n_ranks, 0, DDPD_PMSG_MAX_WORLD - 1);
        break;
    case DDPD_PMSG_EXIT: must(m->u.exit.code >= 0 && m->u.exit.code <= 255); break;
    case DDPD_PMSG_PING: break; /* a keep-alive: nothing but its kind */
    case DDPD_PMSG_UNKNOWN: check_str(m->u.unknown.t, 64); break;
    default: abort();
    }
}

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ddpd_pmsg_kind_t expects[] = {DDPD_PMSG_ANY, DDPD_PMSG_HELLO,
                                               DDPD_PMSG_CHALLENGE, DDPD_PMSG_PROOF,
                                               DDPD_PMSG_OK};
    for (size_t i = 0; i < sizeof expects / sizeof *expects; i++) {
        ddpd_pmsg_t m;
        char why[256];
        memset(why, 'x', sizeof why);
        if (ddpd_pmsg_parse((const char *)data, size, expects[i], &m, why, sizeof why) == 0) {
            check(&m, expects[i]);
            ddpd_pmsg_close(&m);
            must(m.root == NULL);
        } else {
            must(m.root == NULL && memchr(why, '\0', sizeof why) && why[0]);
        }
    }
    return 0;
}
