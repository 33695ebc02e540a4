/* Unit tests of the peer protocol's parser (daemon/peer_msg.c): every message kind parses to
 * its fields, and a table of malformed lines (wrong types, missing fields, out-of-range
 * numbers, overlong strings, trailing garbage) is refused with the field named. One cmocka
 * group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "daemon/peer_msg.h"

#define HEX32 "abababababababababababababababababababababababababababababababab"
#define MAC32 "efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"

/* Parses line as expect and asserts it is accepted as kind. */
static void parse_ok(const char *line, ddpd_pmsg_kind_t expect, ddpd_pmsg_kind_t kind,
                     ddpd_pmsg_t *m)
{
    char why[256] = "";
    int rc = ddpd_pmsg_parse(line, strlen(line), expect, m, why, sizeof why);
    if (rc != 0) fail_msg("refused %s: %s", line, why);
    assert_int_equal(m->kind, kind);
}

static void test_handshake(void **state)
{
    (void)state;
    ddpd_pmsg_t m;
    parse_ok("{\"hello\":\"node-a\",\"nonce\":\"" HEX32 "\"}", DDPD_PMSG_HELLO, DDPD_PMSG_HELLO,
             &m);
    assert_string_equal(m.u.hello.node, "node-a");
    assert_int_equal(m.u.hello.nonce[0], 0xab);
    assert_int_equal(m.u.hello.nonce[DDPD_AUTH_NONCEBYTES - 1], 0xab);
    ddpd_pmsg_close(&m);
    assert_null(m.root);

    parse_ok("{\"node\":\"node-b\",\"nonce\":\"" HEX32 "\",\"mac\":\"" MAC32 "\"}",
             DDPD_PMSG_CHALLENGE, DDPD_PMSG_CHALLENGE, &m);
    assert_string_equal(m.u.challenge.node, "node-b");
    assert_string_equal(m.u.challenge.mac, MAC32);
    assert_int_equal(m.u.challenge.nonce[5], 0xab);
    ddpd_pmsg_close(&m);

    parse_ok("{\"mac\":\"" MAC32 "\"}", DDPD_PMSG_PROOF, DDPD_PMSG_PROOF, &m);
    assert_string_equal(m.u.proof.mac, MAC32);
    ddpd_pmsg_close(&m);

    parse_ok("{\"ok\":true,\"node\":\"node-b\"}", DDPD_PMSG_OK, DDPD_PMSG_OK, &m);
    assert_string_equal(m.u.ok.node, "node-b");
    ddpd_pmsg_close(&m);

    /* a listener's refusal arrives in place of whatever the dialer expects */
    parse_ok("{\"error\":\"authentication failed\"}", DDPD_PMSG_OK, DDPD_PMSG_REFUSED, &m);
    assert_string_equal(m.u.refused.error, "authentication failed");
    ddpd_pmsg_close(&m);
    parse_ok("{\"error\":\"x\"}", DDPD_PMSG_CHALLENGE, DDPD_PMSG_REFUSED, &m);
    ddpd_pmsg_close(&m);
}

static void test_authenticated(void **state)
{
    (void)state;
    ddpd_pmsg_t m;
    parse_ok("{\"t\":\"status\",\"node\":\"b\",\"slots\":8,\"free\":3}", DDPD_PMSG_ANY,
             DDPD_PMSG_STATUS, &m);
    assert_string_equal(m.u.status.node, "b");
    assert_int_equal(m.u.status.slots, 8);
    assert_int_equal(m.u.status.free, 3);
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"start\",\"job\":12,\"name\":\"tiny\",\"ranks\":[2,3],\"world\":4,"
             "\"rdzv\":\"10.0.0.1:29500\",\"token\":\"tok\",\"spec\":\"{}\",\"cwd\":\"/home/u\","
             "\"uid\":1000,\"gid\":-2,\"threads\":2,\"elastic\":true,\"max_restarts\":3,"
             "\"newer\":[1]}",
             DDPD_PMSG_ANY, DDPD_PMSG_START, &m);
    const ddpd_pmsg_start_t *s = &m.u.start;
    assert_int_equal(s->job, 12);
    assert_string_equal(s->name, "tiny");
    assert_int_equal(s->n_ranks, 2);
    assert_int_equal(s->ranks[0], 2);
    assert_int_equal(s->ranks[1], 3);
    assert_int_equal(s->world, 4);
    assert_string_equal(s->rdzv, "10.0.0.1:29500");
    assert_string_equal(s->token, "tok");
    assert_string_equal(s->spec, "{}");
    assert_string_equal(s->cwd, "/home/u");
    assert_int_equal(s->uid, 1000);
    assert_int_equal(s->gid, 4294967294u); /* sent as a C int */
    assert_int_equal(s->threads, 2);
    assert_int_equal(s->elastic, 1);
    assert_int_equal(s->max_restarts, 3);
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"kill\",\"job\":12,\"pid\":4242,\"host_id\":\"boot/b\"}", DDPD_PMSG_ANY,
             DDPD_PMSG_KILL, &m);
    assert_int_equal(m.u.kill.job, 12);
    assert_int_equal(m.u.kill.pid, 4242);
    assert_string_equal(m.u.kill.host_id, "boot/b");
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"signal\",\"job\":12,\"sig\":15}", DDPD_PMSG_ANY, DDPD_PMSG_SIGNAL, &m);
    assert_int_equal(m.u.signal.job, 12);
    assert_int_equal(m.u.signal.sig, 15);
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"started\",\"job\":12,\"n\":2}", DDPD_PMSG_ANY, DDPD_PMSG_STARTED, &m);
    assert_int_equal(m.u.started.job, 12);
    assert_int_equal(m.u.started.n, 2);
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"failed\",\"job\":12,\"why\":\"no room\"}", DDPD_PMSG_ANY,
             DDPD_PMSG_FAILED, &m);
    assert_int_equal(m.u.failed.job, 12);
    assert_string_equal(m.u.failed.why, "no room");
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"adopted\",\"job\":12,\"ranks\":[5,1]}", DDPD_PMSG_ANY, DDPD_PMSG_ADOPTED,
             &m);
    assert_int_equal(m.u.adopted.job, 12);
    assert_int_equal(m.u.adopted.n_ranks, 2);
    assert_int_equal(m.u.adopted.ranks[0], 5);
    assert_int_equal(m.u.adopted.ranks[1], 1);
    ddpd_pmsg_close(&m);
    parse_ok("{\"t\":\"adopted\",\"job\":12,\"ranks\":[]}", DDPD_PMSG_ANY, DDPD_PMSG_ADOPTED, &m);
    assert_int_equal(m.u.adopted.n_ranks, 0);
    ddpd_pmsg_close(&m);

    parse_ok("{\"t\":\"exit\",\"job\":12,\"rank\":3,\"code\":1,\"sig\":9}", DDPD_PMSG_ANY,
             DDPD_PMSG_EXIT, &m);
    assert_int_equal(m.u.exit.job, 12);
    assert_int_equal(m.u.exit.rank, 3);
    assert_int_equal(m.u.exit.code, 1);
    assert_int_equal(m.u.exit.sig, 9);
    ddpd_pmsg_close(&m);

    /* a newer peer's kind is passed over, not refused */
    parse_ok("{\"t\":\"rebalance\",\"x\":1}", DDPD_PMSG_ANY, DDPD_PMSG_UNKNOWN, &m);
    assert_string_equal(m.u.unknown.t, "rebalance");
    ddpd_pmsg_close(&m);
    ddpd_pmsg_close(&m); /* twice, and NULL: both harmless */
    ddpd_pmsg_close(NULL);
}

typedef struct {
    ddpd_pmsg_kind_t expect;
    const char *line;
    const char *why; /* a part of the refusal: the field and what is wrong with it */
} bad_t;

#define START_HEAD "{\"t\":\"start\",\"job\":1,\"name\":\"n\",\"world\":2,\"rdzv\":\"h:1\","
#define START_TAIL "\"cwd\":\"/\",\"uid\":0,\"gid\":0,\"threads\":0,\"elastic\":false,\"max_restarts\":0"

static void test_malformed(void **state)
{
    (void)state;
    static char long_node[200], long_token[400];
    snprintf(long_node, sizeof long_node, "{\"hello\":\"%064d\",\"nonce\":\"" HEX32 "\"}", 0);
    snprintf(long_token, sizeof long_token,
             START_HEAD "\"token\":\"%0128d\",\"spec\":\"{}\"," START_TAIL ",\"ranks\":[0]}", 0);
    const bad_t bad[] = {
        /* not an object, or not JSON */
        {DDPD_PMSG_ANY, "", "not JSON"},
        {DDPD_PMSG_ANY, "[1,2]", "not a JSON object"},
        {DDPD_PMSG_HELLO, "\"hello\"", "hello: not JSON"},
        {DDPD_PMSG_PROOF, "[]", "proof: not a JSON object"},
        {DDPD_PMSG_ANY, "{\"t\":\"signal\",\"job\":1,\"sig\":9} x", "not JSON"},
        {DDPD_PMSG_ANY, "{\"t\":\"signal\",\"job\":1,\"sig\":9}{}", "not JSON"},
        {DDPD_PMSG_ANY, "{\"t\":\"signal\",\"t\":\"kill\",\"job\":1,\"sig\":9}", "not JSON"},
        /* "t" */
        {DDPD_PMSG_ANY, "{\"job\":1}", "field 't': missing"},
        {DDPD_PMSG_ANY, "{\"t\":7}", "field 't': not a string"},
        {DDPD_PMSG_ANY, "{\"t\":\"\"}", "field 't': empty"},
        /* handshake */
        {DDPD_PMSG_HELLO, "{\"nonce\":\"" HEX32 "\"}", "hello: field 'hello': missing"},
        {DDPD_PMSG_HELLO, "{\"hello\":\"a\",\"nonce\":\"abc\"}", "field 'nonce': not 64 hex"},
        {DDPD_PMSG_HELLO, "{\"hello\":\"a\",\"nonce\":\"" MAC32 "zz\"}", "field 'nonce'"},
        {DDPD_PMSG_HELLO, long_node, "field 'hello': 64 bytes long, more than 63"},
        {DDPD_PMSG_CHALLENGE, "{\"node\":\"b\",\"nonce\":\"" HEX32 "\"}", "field 'mac': missing"},
        {DDPD_PMSG_CHALLENGE, "{\"node\":\"b\",\"nonce\":\"" HEX32 "\",\"mac\":7}",
         "field 'mac': not a string"},
        {DDPD_PMSG_PROOF, "{\"mac\":\"xyz\"}", "proof: field 'mac': not 64 hex digits"},
        {DDPD_PMSG_OK, "{\"ok\":false,\"node\":\"b\"}", "ok: field 'ok': false"},
        {DDPD_PMSG_OK, "{\"ok\":1,\"node\":\"b\"}", "field 'ok': not true or false"},
        {DDPD_PMSG_OK, "{\"ok\":true}", "field 'node': missing"},
        {DDPD_PMSG_OK, "{\"error\":5}", "refused: field 'error': not a string"},
        /* status */
        {DDPD_PMSG_ANY, "{\"t\":\"status\",\"node\":\"b\",\"slots\":\"8\",\"free\":1}",
         "status: field 'slots': not an integer"},
        {DDPD_PMSG_ANY, "{\"t\":\"status\",\"node\":\"b\",\"slots\":2,\"free\":3}",
         "field 'free': 3 is out of range [0, 2]"},
        {DDPD_PMSG_ANY, "{\"t\":\"status\",\"node\":\"b\",\"slots\":-1,\"free\":0}",
         "field 'slots': -1 is out of range"},
        {DDPD_PMSG_ANY, "{\"t\":\"status\",\"node\":\"b\",\"slots\":2.0,\"free\":0}",
         "field 'slots': not an integer"},
        /* start */
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\"," START_TAIL ",\"ranks\":[0]}",
         "start: field 'spec': missing"},
        {DDPD_PMSG_ANY, long_token, "field 'token': 128 bytes long, more than 127"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"\",\"spec\":\"{}\"," START_TAIL ",\"ranks\":[0]}",
         "field 'token': empty"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\",\"spec\":\"{}\"," START_TAIL ",\"ranks\":[]}",
         "field 'ranks': empty"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\",\"spec\":\"{}\"," START_TAIL
                        ",\"ranks\":[0,1,1]}",
         "field 'ranks': 3 ranks, more than 2"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\",\"spec\":\"{}\"," START_TAIL
                        ",\"ranks\":[0,2]}",
         "field 'ranks[1]': 2 is out of range [0, 1]"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\",\"spec\":\"{}\"," START_TAIL
                        ",\"ranks\":[\"0\"]}",
         "field 'ranks[0]': not an integer"},
        {DDPD_PMSG_ANY, START_HEAD "\"token\":\"t\",\"spec\":\"{}\"," START_TAIL ",\"ranks\":7}",
         "field 'ranks': not an array"},
        {DDPD_PMSG_ANY,
         "{\"t\":\"start\",\"job\":1,\"name\":\"n\",\"world\":0,\"rdzv\":\"h:1\",\"token\":\"t\","
         "\"spec\":\"{}\"," START_TAIL ",\"ranks\":[0]}",
         "field 'world': 0 is out of range [1, 1048576]"},
        {DDPD_PMSG_ANY,
         "{\"t\":\"start\",\"job\":-1,\"name\":\"n\",\"world\":2,\"rdzv\":\"h:1\"}",
         "field 'job': -1 is out of range"},
        {DDPD_PMSG_ANY,
         START_HEAD "\"token\":\"t\",\"spec\":\"{}\",\"cwd\":\"/\",\"uid\":0,\"gid\":0,"
                    "\"threads\":0,\"elastic\":\"yes\",\"max_restarts\":0,\"ranks\":[0]}",
         "field 'elastic': not true or false"},
        /* the rest */
        {DDPD_PMSG_ANY, "{\"t\":\"kill\",\"job\":1,\"pid\":-5,\"host_id\":\"\"}",
         "kill: field 'pid': -5 is out of range"},
        {DDPD_PMSG_ANY, "{\"t\":\"kill\",\"job\":1,\"pid\":5}", "field 'host_id': missing"},
        {DDPD_PMSG_ANY, "{\"t\":\"signal\",\"job\":1,\"sig\":0}",
         "signal: field 'sig': 0 is out of range [1, 64]"},
        {DDPD_PMSG_ANY, "{\"t\":\"signal\",\"job\":99999999999999999999,\"sig\":9}", "not JSON"},
        {DDPD_PMSG_ANY, "{\"t\":\"started\",\"job\":1,\"n\":0}", "started: field 'n': 0 is out"},
        {DDPD_PMSG_ANY, "{\"t\":\"failed\",\"job\":1,\"why\":null}",
         "failed: field 'why': not a string"},
        {DDPD_PMSG_ANY, "{\"t\":\"adopted\",\"job\":1,\"ranks\":[-1]}",
         "adopted: field 'ranks[0]': -1 is out of range"},
        {DDPD_PMSG_ANY, "{\"t\":\"exit\",\"job\":1,\"rank\":0,\"code\":256,\"sig\":0}",
         "exit: field 'code': 256 is out of range [0, 255]"},
        {DDPD_PMSG_ANY, "{\"t\":\"exit\",\"job\":1,\"rank\":0,\"code\":0}",
         "exit: field 'sig': missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ddpd_pmsg_t m;
        char why[256] = "";
        int rc = ddpd_pmsg_parse(bad[i].line, strlen(bad[i].line), bad[i].expect, &m, why,
                                 sizeof why);
        if (rc != DDP_EPROTO || !strstr(why, bad[i].why))
            fail_msg("line %zu %s: rc %d, why \"%s\", want \"%s\"", i, bad[i].line, rc, why,
                     bad[i].why);
        assert_null(m.root);
    }
}

/* The object form takes its reference on success and on failure alike (ASan sees a leak). */
static void test_from_json(void **state)
{
    (void)state;
    ddpd_pmsg_t m;
    char why[128];
    json_t *o = json_pack("{ss sI si}", "t", "started", "job", (json_int_t)4, "n", 1);
    assert_int_equal(ddpd_pmsg_from_json(o, DDPD_PMSG_ANY, &m, why, sizeof why), 0);
    assert_int_equal(m.kind, DDPD_PMSG_STARTED);
    ddpd_pmsg_close(&m);
    o = json_pack("{ss sI si}", "t", "started", "job", (json_int_t)4, "n", -1);
    assert_int_equal(ddpd_pmsg_from_json(o, DDPD_PMSG_ANY, &m, why, sizeof why), DDP_EPROTO);
    assert_non_null(strstr(why, "field 'n'"));
    assert_int_equal(ddpd_pmsg_from_json(NULL, DDPD_PMSG_ANY, &m, why, sizeof why), DDP_EPROTO);
    assert_string_equal(ddpd_pmsg_kind_name(DDPD_PMSG_ADOPTED), "adopted");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake),
        cmocka_unit_test(test_authenticated),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_from_json),
    };
    return cmocka_run_group_tests_name("peer_msg", tests, NULL, NULL);
}
