/* Unit tests of the daemon's pure parts: config file parsing and overrides, host:port
 * splitting, the HMAC challenge-response, JSON-RPC line builders and UTF-8 repair, the slot
 * count's bounds, and the SQLite store (insert, transitions, list/get, recovery after a crash). One cmocka group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/auth.h"
#include "daemon/config.h"
#include "daemon/http.h"
#include "daemon/rpc.h"
#include "daemon/slots.h"
#include "daemon/store.h"

static char tmpdir[256];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_config_file(void **state)
{
    (void)state;
    ddpd_config_t cfg;
    ddpd_config_defaults(&cfg, NULL);
    char path[300];
    snprintf(path, sizeof path, "%s/c.yaml", tmpdir);
    write_file(path, "node_name: n1\nsocket: /tmp/x.sock\nslots: 3\ngrace_s: 2.5\n"
                     "listen: 0.0.0.0:7450\nadvertise: 10.0.0.1\nsecret_file: /etc/s\n"
                     "peers:\n  - {name: b, addr: \"10.0.0.2:7450\"}\n  - {addr: \"c:1\"}\n");
    ddp_errinfo_t ei;
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), 0);
    assert_int_equal(ddpd_config_finish(&cfg, &ei), 0);
    assert_string_equal(cfg.node_name, "n1");
    assert_string_equal(cfg.socket_path, "/tmp/x.sock");
    assert_int_equal(cfg.slots, 3);
    assert_true(fabs(cfg.grace_s - 2.5) < 1e-9);
    assert_int_equal(cfg.n_peers, 2);
    assert_string_equal(cfg.peers[0].name, "b");
    assert_string_equal(cfg.peers[1].addr, "c:1");
    assert_string_equal(cfg.advertise, "10.0.0.1");
}

static void test_config_errors(void **state)
{
    (void)state;
    ddpd_config_t cfg;
    ddpd_config_defaults(&cfg, NULL);
    ddp_errinfo_t ei;
    char path[300];
    snprintf(path, sizeof path, "%s/bad.yaml", tmpdir);
    write_file(path, "slots: 2\nsloots: 3\n");
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.path, "bad.yaml"));
    assert_non_null(strstr(ei.msg, "2:1: sloots: unknown key"));
    assert_int_equal(cfg.slots, 0); /* nothing of a bad file is taken */
    write_file(path, "peers:\n  - {name: b}\n");
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.msg, "peers[0]: addr is required"));
    write_file(path, "slots: 2\n  bad: [\n");
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), DDP_EFORMAT);
    write_file(path, "slots: [1]\n");
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), DDP_EFORMAT);
    write_file(path, "slots: -2\n");
    assert_int_equal(ddpd_config_load(&cfg, path, &ei), DDP_EFORMAT);
    assert_true(ddpd_config_load(&cfg, "/nonexistent/x.yaml", &ei) < 0);
    /* peers without a secret are refused at finish */
    ddpd_config_defaults(&cfg, NULL);
    cfg.n_peers = 1;
    snprintf(cfg.peers[0].addr, sizeof cfg.peers[0].addr, "h:1");
    assert_int_equal(ddpd_config_finish(&cfg, &ei), DDP_EINVAL);
    ddpd_config_defaults(&cfg, NULL);
    snprintf(cfg.listen, sizeof cfg.listen, "nonsense");
    assert_int_equal(ddpd_config_finish(&cfg, &ei), DDP_EINVAL);
}

static void test_hostport(void **state)
{
    (void)state;
    char h[64];
    int p;
    assert_int_equal(ddpd_split_hostport("10.1.2.3:99", h, sizeof h, &p), 0);
    assert_string_equal(h, "10.1.2.3");
    assert_int_equal(p, 99);
    assert_int_equal(ddpd_split_hostport("[::1]:7", h, sizeof h, &p), 0);
    assert_string_equal(h, "::1");
    assert_int_equal(ddpd_split_hostport(":5", h, sizeof h, &p), 0);
    assert_string_equal(h, "0.0.0.0");
    assert_int_equal(ddpd_split_hostport("host", h, sizeof h, &p), DDP_EINVAL);
    assert_int_equal(ddpd_split_hostport("host:70000", h, sizeof h, &p), DDP_EINVAL);
    assert_int_equal(ddpd_split_hostport("host:", h, sizeof h, &p), DDP_EINVAL);
}

static void test_auth(void **state)
{
    (void)state;
    unsigned char k1[32], k2[32], na[32], nb[32], mac[32];
    ddpd_auth_key_from("secret", 6, k1);
    ddpd_auth_key_from("Secret", 6, k2);
    ddpd_auth_nonce(na);
    ddpd_auth_nonce(nb);
    assert_memory_not_equal(na, nb, 32);
    ddpd_auth_mac(k1, "ddpd-client", na, nb, mac);
    char hex[65];
    ddpd_auth_to_hex(hex, mac, 32);
    assert_true(ddpd_auth_verify_hex(k1, "ddpd-client", na, nb, hex));
    assert_false(ddpd_auth_verify_hex(k2, "ddpd-client", na, nb, hex)); /* wrong secret */
    assert_false(ddpd_auth_verify_hex(k1, "ddpd-server", na, nb, hex)); /* role reflected */
    assert_false(ddpd_auth_verify_hex(k1, "ddpd-client", nb, na, hex)); /* nonces swapped */
    assert_false(ddpd_auth_verify_hex(k1, "ddpd-client", na, nb, "zz"));
    assert_false(ddpd_auth_verify_hex(k1, "ddpd-client", na, nb, NULL));
    char path[300];
    snprintf(path, sizeof path, "%s/secret", tmpdir);
    write_file(path, "secret\n");
    unsigned char k3[32];
    chmod(path, 0644); /* others may read it: refused */
    assert_int_equal(ddpd_auth_load_key(path, k3), DDP_EPERM);
    chmod(path, 0600);
    assert_int_equal(ddpd_auth_load_key(path, k3), 0);
    assert_memory_equal(k1, k3, 32); /* trailing newline ignored */
    write_file(path, "\n");
    assert_int_equal(ddpd_auth_load_key(path, k3), DDP_EINVAL);
}

/* Version 2: the MACs bind the whole transcript (both nonces, both names, the capabilities and
 * the choice), the roles cannot be swapped, and the two directions get different keys that
 * both sides derive alike. */
static void test_auth_v2(void **state)
{
    (void)state;
    unsigned char k[32], nd[32], nl[32], mac[32];
    char hex[65];
    ddpd_auth_key_from("secret", 6, k);
    ddpd_auth_nonce_v2(nd);
    ddpd_auth_nonce_v2(nl);
    assert_true(ddpd_auth_is_v2_nonce(nd));
    ddpd_auth_nonce(nl);
    nl[31] ^= (unsigned char)(nl[31] == 'x' ? 1 : 0) | 0x80; /* not the sentinel's last byte */
    assert_false(ddpd_auth_is_v2_nonce(nl));
    ddpd_auth_transcript_t t, other;
    ddpd_auth_transcript(&t, nd, nl, "node-a", "node-b", "box", "box");
    ddpd_auth_mac_v2(k, "server", &t, mac);
    ddpd_auth_to_hex(hex, mac, 32);
    assert_true(ddpd_auth_verify_v2_hex(k, "server", &t, hex));
    assert_false(ddpd_auth_verify_v2_hex(k, "client", &t, hex)); /* role reflected */
    ddpd_auth_transcript(&other, nd, nl, "node-a", "node-c", "box", "box"); /* a name changed */
    assert_false(ddpd_auth_verify_v2_hex(k, "server", &other, hex));
    ddpd_auth_transcript(&other, nd, nl, "node-a", "node-b", "", "box"); /* a cap stripped */
    assert_false(ddpd_auth_verify_v2_hex(k, "server", &other, hex));
    ddpd_auth_transcript(&other, nl, nd, "node-a", "node-b", "box", "box"); /* nonces swapped */
    assert_false(ddpd_auth_verify_v2_hex(k, "server", &other, hex));
    /* "ab"+"c" and "a"+"bc" are different transcripts (the strings are length-prefixed) */
    ddpd_auth_transcript(&t, nd, nl, "ab", "c", "box", "box");
    ddpd_auth_transcript(&other, nd, nl, "a", "bc", "box", "box");
    assert_true(t.len == other.len && memcmp(t.t, other.t, t.len) != 0);
    unsigned char d2l[32], l2d[32], d2l_b[32], l2d_b[32];
    ddpd_auth_session_keys(k, &t, d2l, l2d);
    ddpd_auth_session_keys(k, &t, d2l_b, l2d_b);
    assert_memory_equal(d2l, d2l_b, 32);
    assert_memory_equal(l2d, l2d_b, 32);
    assert_memory_not_equal(d2l, l2d, 32);
    ddpd_auth_session_keys(k, &other, d2l_b, l2d_b);
    assert_memory_not_equal(d2l, d2l_b, 32);
}

static void test_rpc(void **state)
{
    (void)state;
    json_t *id = json_integer(7);
    char *l = ddpd_rpc_error(id, -32601, "nope", json_pack("{ss}", "method", "x"));
    assert_non_null(l);
    assert_int_equal(l[strlen(l) - 1], '\n');
    json_t *o = json_loads(l, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(o, "id")), 7);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "error"), "code")),
                     -32601);
    json_decref(o);
    free(l);
    l = ddpd_rpc_result(NULL, json_integer(1));
    assert_non_null(strstr(l, "\"id\":null"));
    free(l);
    json_decref(id);
    /* invalid UTF-8 is repaired; an incomplete tail is held back */
    size_t held;
    json_t *t = ddpd_rpc_text("ok\xff\xc3", 4, 1, &held);
    assert_non_null(t);
    assert_int_equal(held, 1);
    assert_string_equal(json_string_value(t), "ok\xef\xbf\xbd");
    json_decref(t);
    t = ddpd_rpc_text("\xc3\xa9\xed\xa0\x80", 5, 0, &held); /* é, then a surrogate */
    assert_string_equal(json_string_value(t), "\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(t);
}

static void test_store(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/store", tmpdir);
    ddpd_store_t *s;
    assert_int_equal(ddpd_store_open(&s, dir), 0);
    int64_t id1, id2, id3;
    ddpd_jobrec_t r = {.name = "a", .uid = 1000, .world = 2, .spec_json = "{\"name\":\"a\"}",
                       .run_dir = "/r", .cwd = "/c", .token = "t1", .submitted_ms = 1};
    assert_int_equal(ddpd_store_job_insert(s, &r, &id1), 0);
    r.name = "b";
    r.token = "t2";
    assert_int_equal(ddpd_store_job_insert(s, &r, &id2), 0);
    r.name = "c";
    assert_int_equal(ddpd_store_job_insert(s, &r, &id3), 0);
    assert_true(id2 > id1);
    assert_int_equal(ddpd_store_job_transition(s, id1, "queued", "starting", "placed", 2), 0);
    assert_int_equal(ddpd_store_job_transition(s, id1, "starting", "running", "go", 3), 0);
    assert_int_equal(ddpd_store_job_transition(s, id1, "running", "succeeded", "ok", 4), 0);
    assert_int_equal(ddpd_store_job_result(s, id1, 0, 10, 10, 1.5), 0);
    assert_int_equal(ddpd_store_job_transition(s, id2, "queued", "starting", "placed", 5), 0);
    assert_int_equal(ddpd_store_job_transition(s, id2, "starting", "running", "go", 6), 0);
    json_t *o;
    assert_int_equal(ddpd_store_job_get(s, id1, 1, &o), 0);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "succeeded");
    assert_string_equal(json_string_value(json_object_get(o, "run_dir")), "/r/job-1");
    assert_int_equal(json_array_size(json_object_get(o, "transitions")), 4);
    assert_true(json_is_object(json_object_get(o, "spec")));
    assert_true(fabs(json_real_value(json_object_get(o, "final_loss")) - 1.5) < 1e-12);
    json_decref(o);
    assert_int_equal(ddpd_store_job_get(s, 999, 0, &o), DDP_ENOTFOUND);
    /* a restart: the running job comes back with its runtime record, the queued one too */
    assert_int_equal(ddpd_store_job_runtime(s, id2, "{\"rdzv\":\"h:1\"}"), 0);
    ddpd_store_close(s);
    assert_int_equal(ddpd_store_open(&s, dir), 0);
    json_t *live, *queued;
    assert_int_equal(ddpd_store_unfinished(s, &live, &queued), 0);
    assert_int_equal(json_array_size(live), 1);
    json_t *l0 = json_array_get(live, 0);
    assert_string_equal(json_string_value(json_object_get(l0, "token")), "t2");
    assert_string_equal(json_string_value(json_object_get(l0, "state")), "running");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(l0, "runtime"), "rdzv")), "h:1");
    assert_int_equal(json_array_size(queued), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(queued, 0), "id")), id3);
    json_decref(live);
    json_decref(queued);
    /* what the daemon then decides is an ordinary transition */
    assert_int_equal(ddpd_store_job_transition(s, id2, "running", "failed", "daemon died", 7), 0);
    json_t *arr;
    assert_int_equal(ddpd_store_job_list(s, NULL, -1, 0, &arr), 0);
    assert_int_equal(json_array_size(arr), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(arr, 0), "id")), id3);
    json_decref(arr);
    assert_int_equal(ddpd_store_job_list(s, "failed", -1, 0, &arr), 0);
    assert_int_equal(json_array_size(arr), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "reason")),
                        "daemon died");
    json_decref(arr);
    assert_int_equal(ddpd_store_job_counts(s, &o), 0);
    assert_int_equal(json_integer_value(json_object_get(o, "succeeded")), 1);
    json_decref(o);
    ddpd_store_close(s);
}

static int setup(void **state)
{
    (void)state;
    if (sodium_init() < 0) return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ddpd-unit.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A version-1 file (before `runtime`) opens, keeps its jobs and gains the column. */
static void test_store_upgrade(void **state)
{
    (void)state;
    char dir[300], path[320];
    snprintf(dir, sizeof dir, "%s/v1", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db,
                     "CREATE TABLE jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,"
                     " uid INTEGER NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',"
                     " world INTEGER NOT NULL, nodes TEXT NOT NULL DEFAULT '', pgid INTEGER NOT "
                     "NULL DEFAULT 0, spec TEXT NOT NULL, run_dir TEXT NOT NULL, cwd TEXT NOT "
                     "NULL, token TEXT NOT NULL, submitted_ms INTEGER NOT NULL, started_ms "
                     "INTEGER, ended_ms INTEGER, exit_code INTEGER, step INTEGER, steps INTEGER,"
                     " final_loss REAL);"
                     "INSERT INTO jobs(name,uid,state,world,spec,run_dir,cwd,token,submitted_ms)"
                     " VALUES('old',0,'running',2,'{}','/r/job-1','','tok',1);"
                     "PRAGMA user_version=1;",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    ddpd_store_t *s;
    assert_int_equal(ddpd_store_open(&s, dir), 0);
    assert_int_equal(ddpd_store_job_runtime(s, 1, "{}"), 0);
    json_t *live, *queued;
    assert_int_equal(ddpd_store_unfinished(s, &live, &queued), 0);
    assert_int_equal(json_array_size(live), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(live, 0), "name")), "old");
    json_decref(live);
    json_decref(queued);
    ddpd_store_close(s);
}

/* The HTTP port routes by path: /metrics, the status page at / (a query string ignored), 404
 * for anything else, 405 for anything but GET, and a truncated request line is no route. */
static void test_http_route(void **state)
{
    (void)state;
    static const struct {
        const char *req;
        ddpd_http_route_t want;
    } cases[] = {
        {"GET /metrics HTTP/1.1\r\n\r\n", DDPD_HTTP_METRICS},
        {"GET / HTTP/1.0\r\n\r\n", DDPD_HTTP_STATUS_PAGE},
        {"GET /?refresh=5 HTTP/1.0\r\n\r\n", DDPD_HTTP_STATUS_PAGE},
        {"GET /index.html HTTP/1.0\r\n\r\n", DDPD_HTTP_STATUS_PAGE},
        {"GET /metricsx HTTP/1.0\r\n\r\n", DDPD_HTTP_NOT_FOUND},
        {"GET /favicon.ico HTTP/1.1\r\n\r\n", DDPD_HTTP_NOT_FOUND},
        {"POST /metrics HTTP/1.1\r\n\r\n", DDPD_HTTP_BAD_METHOD},
        {"GET", DDPD_HTTP_BAD_METHOD},
        {"GET ", DDPD_HTTP_NOT_FOUND},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (ddpd_http_route(cases[i].req, strlen(cases[i].req)) != cases[i].want)
            fail_msg("route of '%s': got %d, want %d", cases[i].req,
                     (int)ddpd_http_route(cases[i].req, strlen(cases[i].req)), (int)cases[i].want);
}

/* The slot count: free is what a new rank may take (never negative, even when adopted ranks
 * hold more than the configured slots), and a give past zero stops at zero. */
static void test_slots(void **state)
{
    (void)state;
    ddpd_t d = {.cfg.slots = 3};
    assert_int_equal(ddpd_slots_used(&d), 0);
    assert_int_equal(ddpd_slots_free(&d), 3);
    ddpd_slots_take(&d, 2, "test");
    assert_int_equal(ddpd_slots_used(&d), 2);
    assert_int_equal(ddpd_slots_free(&d), 1);
    ddpd_slots_take(&d, 2, "test: more than configured");
    assert_int_equal(ddpd_slots_used(&d), 4);
    assert_int_equal(ddpd_slots_free(&d), 0);
    ddpd_slots_give(&d, 3, "test");
    assert_int_equal(ddpd_slots_used(&d), 1);
    assert_int_equal(ddpd_slots_free(&d), 2);
    ddpd_slots_give(&d, 2, "test: one more than taken");
    assert_int_equal(ddpd_slots_used(&d), 0);
    assert_int_equal(ddpd_slots_free(&d), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_file), cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_http_route),
        cmocka_unit_test(test_hostport),    cmocka_unit_test(test_auth),
        cmocka_unit_test(test_auth_v2),
        cmocka_unit_test(test_rpc),         cmocka_unit_test(test_store),
        cmocka_unit_test(test_store_upgrade), cmocka_unit_test(test_slots),
    };
    return cmocka_run_group_tests_name("daemon", tests, setup, teardown);
}
