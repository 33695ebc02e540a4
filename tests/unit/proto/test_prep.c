/* Tests of the ddp-prep tool: runs the built binary (its path is argv[1]) on small texts and
 * checks the shards it writes (split point, shard sizes, byte-for-byte tokens), stale-shard
 * removal, and its errors and exit codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/shard.h"

static const char *prep;
static char dir[256];
static char out[8192]; /* stdout + stderr of the last run */

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/ddp-test-prep-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs ddp-prep with args (a shell fragment); returns its exit status, output in `out`. */
static int run(const char *args)
{
    char cmd[2048], log[512];
    snprintf(log, sizeof log, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s > '%s' 2>&1", dir, prep, args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f) fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *name, const unsigned char *data, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Checks that shard `name` holds exactly bytes[0..n) as tokens. */
static void expect_shard(const char *name, const unsigned char *bytes, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ddp_shard_t s;
    ddp_errinfo_t ei;
    if (ddp_shard_open(&s, path, &ei)) fail_msg("%s: %s", path, ei.msg);
    assert_int_equal(s.n_tokens, n);
    for (size_t i = 0; i < n; i++)
        if (s.tokens[i] != bytes[i]) fail_msg("%s: token %zu is %u, want %u", name, i,
                                              s.tokens[i], bytes[i]);
    ddp_shard_close(&s);
}

static int exists(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void test_split_and_shards(void **state)
{
    /* 600 + 400 bytes covering every byte value, in two files */
    unsigned char text[1000];
    for (int i = 0; i < 1000; i++) text[i] = (unsigned char)(i * 7 + 3);
    write_file("a.txt", text, 600);
    write_file("b.txt", text + 600, 400);

    assert_int_equal(run("--val-fraction 0.1 --shard-tokens 300 --out sh a.txt b.txt"), 0);
    expect_shard("sh/train_000000.bin", text, 300);
    expect_shard("sh/train_000001.bin", text + 300, 300);
    expect_shard("sh/train_000002.bin", text + 600, 300);
    expect_shard("sh/val_000000.bin", text + 900, 100);
    assert_false(exists("sh/train_000003.bin"));
    assert_false(exists("sh/val_000001.bin"));
    assert_non_null(strstr(out, "train: 900 tokens in 3 shards; val: 100 tokens in 1 shard"));
    assert_non_null(strstr(out, "wrote sh/train_000000.bin (300 tokens)"));

    /* a second run with bigger shards removes the stale higher-numbered ones */
    assert_int_equal(run("--val-fraction 0.25 --shard-tokens 1000 --out sh a.txt b.txt"), 0);
    expect_shard("sh/train_000000.bin", text, 750);
    expect_shard("sh/val_000000.bin", text + 750, 250);
    assert_false(exists("sh/train_000001.bin"));
    assert_false(exists("sh/train_000002.bin"));
    assert_non_null(strstr(out, "removed stale"));

    /* no validation split; nested output directory created; default shard size */
    assert_int_equal(run("--val-fraction 0 --out deep/er/dir a.txt"), 0);
    expect_shard("deep/er/dir/train_000000.bin", text, 600);
    assert_false(exists("deep/er/dir/val_000000.bin"));

    /* default fraction 0.1, output in the working directory */
    assert_int_equal(run("b.txt"), 0);
    expect_shard("train_000000.bin", text + 600, 360);
    expect_shard("val_000000.bin", text + 960, 40);
}

static void test_errors(void **state)
{
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(out, "usage: ddp-prep"));

    assert_int_equal(run(""), 2);
    assert_non_null(strstr(out, "no input files"));
    assert_int_equal(run("--bogus a.txt"), 2);
    assert_non_null(strstr(out, "usage"));
    assert_int_equal(run("--val-fraction 1 a.txt"), 2);
    assert_non_null(strstr(out, "--val-fraction must be a number >= 0 and < 1, got '1'"));
    assert_int_equal(run("--val-fraction x a.txt"), 2);
    assert_int_equal(run("--shard-tokens 0 a.txt"), 2);
    assert_non_null(strstr(out, "--shard-tokens must be an integer"));
    assert_int_equal(run("--shard-tokens 2.5 a.txt"), 2);

    assert_int_equal(run("missing.txt"), 1);
    assert_non_null(strstr(out, "cannot open missing.txt: No such file or directory"));

    write_file("empty.txt", (const unsigned char *)"", 0);
    assert_int_equal(run("empty.txt"), 1);
    assert_non_null(strstr(out, "empty input"));

    write_file("one.txt", (const unsigned char *)"x", 1);
    assert_int_equal(run("--val-fraction 0.5 one.txt"), 1);
    assert_non_null(strstr(out, "too small"));

    write_file("file", (const unsigned char *)"x", 1);
    assert_int_equal(run("--val-fraction 0 --out file/sub one.txt"), 1);
    assert_non_null(strstr(out, "cannot create file/sub"));
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_prep PATH-OF-ddp-prep\n");
        return 2;
    }
    prep = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_and_shards),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("prep", tests, setup, teardown);
}
