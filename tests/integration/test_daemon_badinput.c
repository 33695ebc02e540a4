/* Bad input against a real ddpd: each kind of malformed request gets its stable error code and
 * the daemon keeps answering, on the same connection where the protocol allows it and on new
 * ones after a connection is closed (2 MiB line). TAP output.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/client.h"
#include "tests/integration/harness.h"

static ddpd_test_daemon_t D;

/* Sends one raw line and returns the response object (new ref) or NULL. */
static json_t *raw(ddpd_client_t *c, const char *line)
{
    if (ddpd_client_send_raw(c, line, strlen(line)) || ddpd_client_send_raw(c, "\n", 1))
        return NULL;
    json_t *m = NULL;
    if (ddpd_client_recv(c, &m, 10000)) return NULL;
    return m;
}

static long long code_of(json_t *m)
{
    return json_integer_value(json_object_get(json_object_get(m, "error"), "code"));
}

static const char *data_str(json_t *m, const char *key)
{
    const char *s = json_string_value(
        json_object_get(json_object_get(json_object_get(m, "error"), "data"), key));
    return s ? s : "";
}

static int alive(ddpd_client_t *c)
{
    json_t *r = NULL, *e = NULL;
    int rc = ddpd_client_call(c, "daemon.status", NULL, &r, &e, 10000);
    int ok = rc == 0 && json_is_string(json_object_get(r, "version"));
    json_decref(r);
    json_decref(e);
    return ok;
}

static void expect(ddpd_client_t *c, const char *what, const char *line, long long code)
{
    json_t *m = raw(c, line);
    long long got = code_of(m);
    tap_ok(m && got == code, "%s -> %lld (got %lld)", what, code, got);
    json_decref(m);
}

int main(void)
{
    const char *extra[] = {"--worker-bin", "/bin/true", "--slots", "2", NULL};
    if (ddpd_test_start(&D, extra) != 0) {
        printf("1..0 # SKIP ddpd did not start\n");
        return 1;
    }
    ddpd_client_t c;
    tap_ok(ddpd_client_connect(&c, D.socket) == 0, "connect to %s", D.socket);

    expect(&c, "invalid JSON", "{\"jsonrpc\":\"2.0\",\"id\":1,", -32700);
    expect(&c, "truncated string", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"job.li", -32700);
    tap_ok(alive(&c), "same connection still answers after parse errors");
    expect(&c, "array instead of object", "[1,2,3]", -32600);
    expect(&c, "missing jsonrpc", "{\"id\":2,\"method\":\"job.list\"}", -32600);
    expect(&c, "jsonrpc 1.0", "{\"jsonrpc\":\"1.0\",\"id\":2,\"method\":\"job.list\"}", -32600);
    expect(&c, "method not a string", "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":7}", -32600);
    expect(&c, "id is an object", "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"job.list\"}",
           -32600);
    expect(&c, "unknown method", "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"job.explode\"}",
           -32601);
    expect(&c, "params is an array",
           "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"job.list\",\"params\":[1]}", -32602);
    json_t *m = raw(&c, "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"job.get\",\"params\":{\"id\":"
                        "\"seven\"}}");
    tap_ok(code_of(m) == -32602 && !strcmp(data_str(m, "path"), "id"),
           "job.get id as string -> -32602 with data.path id (%s)", data_str(m, "path"));
    json_decref(m);
    expect(&c, "job.logs follow not a bool",
           "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"job.logs\",\"params\":{\"id\":1,"
           "\"follow\":\"yes\"}}",
           -32602);
    expect(&c, "job.list limit negative",
           "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"job.list\",\"params\":{\"limit\":-1}}",
           -32602);
    expect(&c, "job.list unknown state",
           "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"job.list\",\"params\":{\"state\":\"zz\"}}",
           -32602);
    expect(&c, "job.submit with spec and path",
           "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"job.submit\",\"params\":{\"spec\":\"a\","
           "\"path\":\"b\"}}",
           -32602);
    expect(&c, "job.submit with neither",
           "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"job.submit\",\"params\":{}}", -32602);
    expect(&c, "job.get of a job that does not exist",
           "{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"job.get\",\"params\":{\"id\":999}}", 1002);
    expect(&c, "spec path unreadable",
           "{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"job.submit\",\"params\":{\"path\":"
           "\"/nonexistent/job.yaml\"}}",
           1006);

    /* a bad spec: field path, line and column */
    m = raw(&c, "{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"job.submit\",\"params\":{\"spec\":"
                "\"name: x\\ndata: {train: t}\\ntrain:\\n  lr: banana\\n\"}}");
    json_t *data = json_object_get(json_object_get(m, "error"), "data");
    tap_ok(code_of(m) == 1001, "bad spec -> 1001 (got %lld)", code_of(m));
    tap_ok(strstr(data_str(m, "path"), "train.lr") != NULL, "bad spec names train.lr (%s)",
           data_str(m, "path"));
    tap_ok(json_integer_value(json_object_get(data, "line")) == 4,
           "bad spec line 4 (got %lld)", (long long)json_integer_value(json_object_get(data, "line")));
    tap_ok(json_integer_value(json_object_get(data, "column")) > 0, "bad spec has a column");
    json_decref(m);
    m = raw(&c, "{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"job.submit\",\"params\":{\"spec\":"
                "\"name: x\\ndata: {train: t}\\nddp: {workers: 64}\\n\"}}");
    tap_ok(code_of(m) == 1005, "more ranks than slots -> 1005 (got %lld)", code_of(m));
    json_decref(m);

    /* a notification gets no response: the next response is for the next id */
    const char *note = "{\"jsonrpc\":\"2.0\",\"method\":\"job.list\"}\n";
    ddpd_client_send_raw(&c, note, strlen(note));
    m = raw(&c, "{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"daemon.status\"}");
    tap_ok(json_integer_value(json_object_get(m, "id")) == 16,
           "a notification gets no response");
    json_decref(m);

    /* a 2 MiB line: error, the connection is closed, others are untouched */
    ddpd_client_t other;
    tap_ok(ddpd_client_connect(&other, D.socket) == 0, "second client connects");
    size_t big = 2u << 20;
    char *line = malloc(big + 1);
    memset(line, 'x', big);
    memcpy(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"", 35);
    line[big] = '\n';
    ddpd_client_send_raw(&c, line, big + 1); /* may fail midway once the daemon closes */
    free(line);
    m = NULL;
    int rc = ddpd_client_recv(&c, &m, 10000);
    tap_ok(rc == 0 && code_of(m) == -32600, "2 MiB line -> -32600 (rc %d, code %lld)", rc,
           code_of(m));
    tap_ok(json_integer_value(json_object_get(
               json_object_get(json_object_get(m, "error"), "data"), "limit")) == 1048576,
           "error data says the 1 MiB limit");
    json_decref(m);
    m = NULL;
    rc = ddpd_client_recv(&c, &m, 10000);
    tap_ok(rc == -ECONNRESET, "then the connection is closed (rc %d)", rc);
    json_decref(m);
    ddpd_client_close(&c);
    tap_ok(alive(&other), "the other client still gets answers");
    ddpd_client_t third;
    tap_ok(ddpd_client_connect(&third, D.socket) == 0 && alive(&third),
           "a new client connects and gets answers");
    ddpd_client_close(&third);
    ddpd_client_close(&other);

    int st = ddpd_test_stop(&D);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ddpd exits 0 on SIGTERM (status %d)", st);
    return tap_done();
}
