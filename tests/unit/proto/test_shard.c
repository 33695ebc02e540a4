/* Unit tests of token shards: write/open round trip, every rejected file (truncated, wrong
 * magic, wrong version, header-only with a nonzero count, oversized), 32-bit shards (round
 * trip, truncated, mislabelled), atomic write leaving no temporary, window reads (no resident
 * pages left behind, a file cut short after opening), and globbing (sorted, empty). Files live in a fresh temporary directory. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/shard.h"
#include "tests/unit/proc_status.h"

static char dir[256];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/ddp-test-shard-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *p(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* Writes a raw file: header ints (magic, version, count) then `body` bytes of pattern. */
static void write_raw(const char *path, size_t header_bytes, int32_t magic, int32_t version,
                      int32_t count, size_t body)
{
    int32_t h[DDP_SHARD_HEADER_INTS] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, 1, header_bytes, f), header_bytes);
    for (size_t i = 0; i < body; i++) fputc((int)(i & 0xff), f);
    assert_int_equal(fclose(f), 0);
}

static void expect_format_error(const char *path, const char *msg, long long offset)
{
    ddp_shard_t s;
    ddp_errinfo_t ei;
    int rc = ddp_shard_open(&s, path, &ei);
    assert_int_equal(rc, DDP_EFORMAT);
    assert_string_equal(ei.path, path);
    if (!strstr(ei.msg, msg)) fail_msg("message '%s' lacks '%s'", ei.msg, msg);
    assert_int_equal(ei.offset, offset);
    assert_int_equal(s.path[0], 0); /* nothing held */
    ddp_shard_close(&s); /* safe after a failed open */
}

static void test_round_trip(void **state)
{
    enum { N = 100003 };
    uint16_t *tok = malloc(N * sizeof *tok);
    assert_non_null(tok);
    for (size_t i = 0; i < N; i++) tok[i] = (uint16_t)(i * 2654435761u >> 7);
    tok[0] = 0;
    tok[1] = 65535;
    assert_int_equal(ddp_shard_write(p("a.bin"), tok, N), 0);
    assert_int_equal(access(p("a.bin.tmp"), F_OK), -1); /* renamed away */

    ddp_shard_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_shard_open(&s, p("a.bin"), &ei), 0);
    assert_int_equal(s.n_tokens, N);
    assert_int_equal(s.token_bytes, 2);
    uint32_t *back = malloc(N * sizeof *back);
    assert_non_null(back);
    assert_int_equal(ddp_shard_read(&s, 0, N, back, &ei), 0);
    for (size_t i = 0; i < N; i++)
        if (back[i] != tok[i]) fail_msg("token %zu is %u, want %u", i, back[i], tok[i]);
    assert_int_equal(ddp_shard_read(&s, N - 1, 1, back, &ei), 0);
    assert_int_equal(back[0], tok[N - 1]);
    free(back);
    assert_string_equal(s.path, p("a.bin"));
    int32_t h[DDP_SHARD_HEADER_INTS];
    FILE *f = fopen(p("a.bin"), "rb");
    assert_non_null(f);
    assert_int_equal(fread(h, 4, DDP_SHARD_HEADER_INTS, f), DDP_SHARD_HEADER_INTS);
    fclose(f);
    assert_int_equal(h[0], DDP_SHARD_MAGIC);
    assert_int_equal(h[1], DDP_SHARD_VERSION);
    assert_int_equal(h[2], N);
    for (int i = 3; i < DDP_SHARD_HEADER_INTS; i++) assert_int_equal(h[i], 0);
    ddp_shard_close(&s);
    assert_int_equal(s.path[0], 0);
    ddp_shard_close(&s); /* twice is fine */
    ddp_shard_close(NULL);

    /* an empty shard is valid; overwriting replaces */
    assert_int_equal(ddp_shard_write(p("a.bin"), tok, 0), 0);
    assert_int_equal(ddp_shard_open(&s, p("a.bin"), &ei), 0);
    assert_int_equal(s.n_tokens, 0);
    ddp_shard_close(&s);
    free(tok);

    /* a directory that does not exist */
    uint16_t t = 1;
    assert_int_equal(ddp_shard_write(p("nodir/x.bin"), &t, 1), -ENOENT);
}

static void test_bad_files(void **state)
{
    ddp_shard_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_shard_open(&s, p("missing.bin"), &ei), -ENOENT);
    assert_string_equal(ei.path, p("missing.bin"));

    write_raw(p("short.bin"), 100, DDP_SHARD_MAGIC, 1, 0, 0);
    expect_format_error(p("short.bin"), "shorter than the 1024-byte header", 100);

    write_raw(p("empty.bin"), 0, 0, 0, 0, 0);
    expect_format_error(p("empty.bin"), "0 bytes", 0);

    write_raw(p("magic.bin"), DDP_SHARD_HEADER_BYTES, 20240802, 1, 4, 8);
    expect_format_error(p("magic.bin"), "magic is 20240802", 0);

    write_raw(p("version.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 7, 4, 8);
    expect_format_error(p("version.bin"), "unsupported token shard version 7 for magic 20240520",
                        4);

    write_raw(p("headeronly.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 1, 1000, 0);
    expect_format_error(p("headeronly.bin"),
                        "header says 1000 2-byte tokens, so 3024 bytes expected, "
                        "but the file has 1024 bytes",
                        1024);

    write_raw(p("trunc.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 1, 10, 15);
    expect_format_error(p("trunc.bin"), "truncated token shard", 1039);

    write_raw(p("long.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 1, 2, 6);
    expect_format_error(p("long.bin"), "oversized token shard", 1028);

    write_raw(p("neg.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 1, -5, 0);
    expect_format_error(p("neg.bin"), "negative token count -5", 8);

    expect_format_error(dir, "not a regular file", -1);
}

/* 32-bit shards (llm.c's Llama 3 label): round trip with ids past 65,535, and the errors of a
 * truncated or mislabelled file, each naming the file and the offset. */
static void test_32bit(void **state)
{
    enum { N = 70001 };
    uint32_t *tok = malloc(N * sizeof *tok);
    assert_non_null(tok);
    for (size_t i = 0; i < N; i++) tok[i] = (uint32_t)(i * 2654435761u) % 200000u;
    tok[0] = 65536;
    tok[1] = UINT32_MAX;
    assert_int_equal(ddp_shard_write32(p("w.bin"), tok, N), 0);
    ddp_shard_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_shard_open(&s, p("w.bin"), &ei), 0);
    assert_int_equal(s.token_bytes, 4);
    assert_int_equal(s.n_tokens, N);
    int32_t h[3];
    FILE *f = fopen(p("w.bin"), "rb");
    assert_non_null(f);
    assert_int_equal(fread(h, 4, 3, f), 3);
    fclose(f);
    assert_int_equal(h[0], 20240801);
    assert_int_equal(h[1], 7);
    assert_int_equal(h[2], N);
    uint32_t *back = malloc(N * sizeof *back);
    assert_non_null(back);
    assert_int_equal(ddp_shard_read(&s, 0, N, back, &ei), 0);
    assert_memory_equal(back, tok, N * sizeof *tok);
    assert_int_equal(ddp_shard_read(&s, N - 2, 1, back, &ei), 0);
    assert_int_equal(back[0], tok[N - 2]);
    ddp_shard_close(&s);
    free(back);

    /* a 16-bit shard reads through the same call, widened */
    uint16_t t16[3] = {7, 65535, 0};
    assert_int_equal(ddp_shard_write(p("n.bin"), t16, 3), 0);
    assert_int_equal(ddp_shard_open(&s, p("n.bin"), &ei), 0);
    assert_int_equal(s.token_bytes, 2);
    uint32_t w[2];
    assert_int_equal(ddp_shard_read(&s, 1, 2, w, &ei), 0);
    assert_int_equal(w[0], 65535);
    assert_int_equal(w[1], 0);
    ddp_shard_close(&s);
    free(tok);

    write_raw(p("t32.bin"), DDP_SHARD_HEADER_BYTES, 20240801, 7, 10, 38);
    expect_format_error(p("t32.bin"), "truncated token shard: header says 10 4-byte tokens, "
                                      "so 1064 bytes expected, but the file has 1062 bytes",
                        1062);
    /* 16-bit tokens under the 32-bit label, and the reverse: the size gives it away */
    write_raw(p("m32.bin"), DDP_SHARD_HEADER_BYTES, 20240801, 7, 10, 20);
    expect_format_error(p("m32.bin"), "(16-bit tokens labelled 32-bit?)", 1044);
    write_raw(p("m16.bin"), DDP_SHARD_HEADER_BYTES, DDP_SHARD_MAGIC, 1, 10, 40);
    expect_format_error(p("m16.bin"), "(32-bit tokens labelled 16-bit?)", 1044);
    /* the Llama 3 magic with GPT-2's version */
    write_raw(p("v32.bin"), DDP_SHARD_HEADER_BYTES, 20240801, 1, 1, 4);
    expect_format_error(p("v32.bin"), "unsupported token shard version 1 for magic 20240801 "
                                      "(supported: 7)", 4);
}

/* Reading a whole 32 MiB shard window by window, as a trainer samples it, leaves the resident
 * set where it was (a mapping would keep every page it read resident); and a shard cut short
 * after it was opened gives an error naming the file and the offset, not a crash. */
static void test_read_window_by_window(void **state)
{
    enum { N = 16 << 20, WINDOW = 1025 };
    uint16_t *tok = malloc((size_t)N * sizeof *tok);
    assert_non_null(tok);
    for (size_t i = 0; i < N; i++) tok[i] = (uint16_t)(i * 40503u);
    assert_int_equal(ddp_shard_write(p("big.bin"), tok, N), 0);
    free(tok);
    ddp_shard_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_shard_open(&s, p("big.bin"), &ei), 0);
    long before = proc_status_kib("RssFile");
    uint32_t win[WINDOW];
    for (size_t first = 0; first + WINDOW <= N; first += WINDOW - 1) {
        assert_int_equal(ddp_shard_read(&s, first, WINDOW, win, &ei), 0);
        if (win[7] != (uint16_t)((first + 7) * 40503u)) fail_msg("token %zu wrong", first + 7);
    }
    long after = proc_status_kib("RssFile");
    assert_true(before >= 0 && after >= 0);
    if (after - before > 256)
        fail_msg("reading 32 MiB of tokens left %ld KiB more of the file resident", after - before);

    assert_int_equal(truncate(p("big.bin"), DDP_SHARD_HEADER_BYTES + 2 * 1000), 0);
    assert_int_equal(ddp_shard_read(&s, 990, 20, win, &ei), DDP_EFORMAT);
    assert_string_equal(ei.path, p("big.bin"));
    assert_int_equal(ei.offset, DDP_SHARD_HEADER_BYTES + 2 * 1000);
    assert_non_null(strstr(ei.msg, "shorter than when opened"));
    ddp_shard_close(&s);
}

static void test_glob(void **state)
{
    uint16_t t[3] = {1, 2, 3};
    /* written out of order; glob must sort */
    assert_int_equal(ddp_shard_write(p("g_000002.bin"), t, 3), 0);
    assert_int_equal(ddp_shard_write(p("g_000000.bin"), t, 1), 0);
    assert_int_equal(ddp_shard_write(p("g_000010.bin"), t, 2), 0);
    assert_int_equal(ddp_shard_write(p("g_000001.bin"), t, 2), 0);
    char **paths = NULL;
    size_t n = 0;
    ddp_errinfo_t ei;
    char pat[512];
    snprintf(pat, sizeof pat, "%s/g_*.bin", dir);
    assert_int_equal(ddp_shard_glob(pat, &paths, &n, &ei), 0);
    assert_int_equal(n, 4);
    assert_string_equal(paths[0], p("g_000000.bin"));
    assert_string_equal(paths[1], p("g_000001.bin"));
    assert_string_equal(paths[2], p("g_000002.bin"));
    assert_string_equal(paths[3], p("g_000010.bin"));
    ddp_shard_glob_free(paths, n);
    ddp_shard_glob_free(NULL, 0);

    snprintf(pat, sizeof pat, "%s/none_*.bin", dir);
    paths = (char **)1;
    assert_int_equal(ddp_shard_glob(pat, &paths, &n, &ei), DDP_ENOTFOUND);
    assert_null(paths);
    assert_int_equal(n, 0);
    assert_string_equal(ei.path, pat);
    assert_non_null(strstr(ei.msg, "no token shards match"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_32bit),
        cmocka_unit_test(test_read_window_by_window),
        cmocka_unit_test(test_glob),
    };
    return cmocka_run_group_tests_name("shard", tests, setup, teardown);
}
