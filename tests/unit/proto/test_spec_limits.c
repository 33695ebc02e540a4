/* Unit tests of the spec's `limits` section and of ddp_spec_name_ok (proto/spec.h): the three
 * byte caps parse as integers or sizes with units, default to 0 (no cap), survive the JSON round
 * trip, and a negative value, text that is no size, an unknown unit or a wrong type is refused
 * with the field's path, line and column; an unknown key under `limits` names the allowed ones.
 * Job names: the characters allowed, the first character, and the length bound of ddp_spec_t's
 * name. (Kept apart from test_spec.c, the spec's main tests.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/spec.h"

#define D "data: {train: x}\n"

static int parse(ddp_spec_t *s, const char *text, ddp_errinfo_t *ei)
{
    ddp_errinfo_clear(ei);
    return ddp_spec_parse(s, text, strlen(text), "<test>", ei);
}

static void test_limits_default_and_units(void **state)
{
    (void)state;
    ddp_spec_t s;
    ddp_errinfo_t ei;
    assert_int_equal(parse(&s, D, &ei), 0);
    assert_int_equal(s.log_bytes, 0);
    assert_int_equal(s.metrics_bytes, 0);
    assert_int_equal(s.tensorboard_bytes, 0);
    static const struct {
        const char *text;
        int64_t log, metrics, tb;
    } ok[] = {
        {D "limits: {log_bytes: 2000, metrics_bytes: \"64MiB\", tensorboard_bytes: \"1.5 GB\"}",
         2000, 64 << 20, 1500000000},
        {D "limits:\n  log_bytes: 1e6\n  tensorboard_bytes: 2K\n", 1000000, 0, 2048},
        {D "limits: {metrics_bytes: \"512kB\"}", 0, 512000, 0},
        {D "limits:", 0, 0, 0}, /* an empty section */
        {"{\"data\": {\"train\": \"x\"}, \"limits\": {\"log_bytes\": 4096, "
         "\"metrics_bytes\": \"1G\", \"tensorboard_bytes\": 0}}", 4096, 1 << 30, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int rc = parse(&s, ok[i].text, &ei);
        if (rc) fail_msg("%s: rc %d: %s: %s", ok[i].text, rc, ei.path, ei.msg);
        if (s.log_bytes != ok[i].log || s.metrics_bytes != ok[i].metrics ||
            s.tensorboard_bytes != ok[i].tb)
            fail_msg("%s: got %lld %lld %lld, want %lld %lld %lld", ok[i].text,
                     (long long)s.log_bytes, (long long)s.metrics_bytes,
                     (long long)s.tensorboard_bytes, (long long)ok[i].log,
                     (long long)ok[i].metrics, (long long)ok[i].tb);
    }
}

static void test_limits_json_round_trip(void **state)
{
    (void)state;
    ddp_spec_t a, b;
    ddp_errinfo_t ei;
    assert_int_equal(parse(&a, D "limits: {log_bytes: 123, metrics_bytes: \"2MiB\", "
                                 "tensorboard_bytes: 77}", &ei), 0);
    char *json = ddp_spec_to_json(&a);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"limits\""));
    assert_int_equal(parse(&b, json, &ei), 0);
    free(json);
    assert_int_equal(b.log_bytes, 123);
    assert_int_equal(b.metrics_bytes, 2 << 20);
    assert_int_equal(b.tensorboard_bytes, 77);
    assert_memory_equal(&a, &b, sizeof a);
}

static void test_limits_refused(void **state)
{
    (void)state;
    static const struct {
        const char *text, *path;
        int line, column;
        const char *msg;
    } bad[] = {
        {D "limits: {log_bytes: -1}", "limits.log_bytes", 2, 21, "must be a size in bytes >= 0"},
        {D "limits: {metrics_bytes: \"-5MiB\"}", "limits.metrics_bytes", 2, 25, "got \"-5MiB\""},
        {D "limits: {tensorboard_bytes: lots}", "limits.tensorboard_bytes", 2, 29, "got lots"},
        {D "limits: {tensorboard_bytes: \"12 parsecs\"}", "limits.tensorboard_bytes", 2, 29,
         "must be a size in bytes"},
        {D "limits: {log_bytes: [1]}", "limits.log_bytes", 2, 21, "got a sequence"},
        {D "limits: {log_bytes: 1e30}", "limits.log_bytes", 2, 21, "must be a size"},
        {D "limits: {log_byte: 1}", "limits.log_byte", 2, 10,
         "allowed here: log_bytes, metrics_bytes, tensorboard_bytes"},
        {D "limits: 5", "limits", 2, 9, "must be a mapping"},
        {"{\"data\": {\"train\": \"x\"},\n \"limits\": {\"metrics_bytes\": -3}}",
         "limits.metrics_bytes", 2, 30, "must be a size in bytes >= 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ddp_spec_t s;
        ddp_errinfo_t ei;
        int rc = parse(&s, bad[i].text, &ei);
        if (rc != DDP_ESPEC || strcmp(ei.path, bad[i].path) || !strstr(ei.msg, bad[i].msg) ||
            ei.line != bad[i].line || ei.column != bad[i].column)
            fail_msg("%s\n  got  rc %d %s:%d:%d: %s\n  want %s:%d:%d: ...%s...", bad[i].text, rc,
                     ei.path, ei.line, ei.column, ei.msg, bad[i].path, bad[i].line,
                     bad[i].column, bad[i].msg);
    }
}

static void test_name_ok(void **state)
{
    (void)state;
    char n127[128], n128[129];
    memset(n127, 'a', 127);
    n127[127] = '\0';
    memset(n128, 'b', 128);
    n128[128] = '\0';
    const char *good[] = {"job", "it-tiny", "shakespeare-mini", "gpt2-124M", "a", "A.b_c-9",
                          "x..", "9lives", n127};
    const char *bad[] = {"", ".", "..", ".x", "-x", "--help", "a/b", "a\nb", "a b", "a\\b",
                         "caf\xc3\xa9", "a:b", "a*", n128};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!ddp_spec_name_ok(good[i])) fail_msg("refused \"%s\"", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (ddp_spec_name_ok(bad[i])) fail_msg("accepted \"%s\"", bad[i]);
    assert_int_equal(ddp_spec_name_ok(NULL), 0);

    /* the spec's own check is the same rule, with the path and the rule in the message */
    ddp_spec_t s;
    ddp_errinfo_t ei;
    assert_int_equal(parse(&s, D "name: it-tiny\n", &ei), 0);
    assert_string_equal(s.name, "it-tiny");
    assert_int_equal(parse(&s, D "name: .hidden\n", &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "name");
    if (!strstr(ei.msg, "not start with '-' or '.'")) fail_msg("message: %s", ei.msg);
    assert_int_equal(parse(&s, D "name: \"-rf\"\n", &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "name");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_default_and_units),
        cmocka_unit_test(test_limits_json_round_trip),
        cmocka_unit_test(test_limits_refused),
        cmocka_unit_test(test_name_ok),
    };
    return cmocka_run_group_tests_name("spec_limits", tests, NULL, NULL);
}
