/* Tests of the ddp-prep tool: runs the built binary (its path is argv[1]) on small texts and
 * checks the shards it writes (split point, shard sizes, byte-for-byte tokens), stale-shard
 * removal, its errors and exit codes, and --tokenizer's 32-bit shards. */
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
    assert_int_equal(s.token_bytes, 2);
    uint32_t *tok = malloc((n ? n : 1) * sizeof *tok);
    assert_non_null(tok);
    assert_int_equal(ddp_shard_read(&s, 0, n, tok, &ei), 0);
    for (size_t i = 0; i < n; i++)
        if (tok[i] != bytes[i]) fail_msg("%s: token %zu is %u, want %u", name, i, tok[i], bytes[i]);
    free(tok);
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

/* A tokenizer.json without merges whose ids reach 70,000: the 256 bytes (GPT-2's alphabet) as
 * ids 0..255 and two added tokens, "<big>" = 69999 and "<|eot|>" = 256. */
static void write_wide_tokenizer(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/wide.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"added_tokens\": [{\"id\": 69999, \"content\": \"<big>\", \"normalized\": false},"
          " {\"id\": 256, \"content\": \"<|eot|>\", \"normalized\": false}],"
          " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
          "\"add_prefix_space\": false, \"use_regex\": true}, \"model\": {\"type\": \"BPE\", "
          "\"vocab\": {",
          f);
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : next++;
        const char *sep = b ? ", " : "";
        if (cp == '"' || cp == '\\') fprintf(f, "%s\"\\%c\": %d", sep, cp, b);
        else if (cp < 0x80) fprintf(f, "%s\"%c\": %d", sep, cp, b);
        else fprintf(f, "%s\"%c%c\": %d", sep, 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f), b);
    }
    fputs("}, \"merges\": []}}", f);
    assert_int_equal(fclose(f), 0);
}

/* --tokenizer with a vocabulary past 65,536: 32-bit shards (llm.c's Llama 3 label) holding the
 * ids, --bos/--eos around each file, and input that is not UTF-8 named by file and offset.
 * (tests/unit/proto/test_tokenizer_hf.py compares the ids with Hugging Face's tokenizers.) */
static void test_tokenizer_32bit(void **state)
{
    write_wide_tokenizer();
    const char *text = "ab<big>\nc";
    write_file("w.txt", (const unsigned char *)text, strlen(text));
    assert_int_equal(run("--tokenizer wide.json --eos '<|eot|>' --val-fraction 0 --out w w.txt"),
                     0);
    assert_non_null(strstr(out, "vocab 70000, 32-bit shards"));
    char path[512];
    snprintf(path, sizeof path, "%s/w/train_000000.bin", dir);
    ddp_shard_t s;
    ddp_errinfo_t ei;
    if (ddp_shard_open(&s, path, &ei)) fail_msg("%s: %s", path, ei.msg);
    assert_int_equal(s.token_bytes, 4);
    const uint32_t want[] = {'a', 'b', 69999, '\n', 'c', 256};
    assert_int_equal(s.n_tokens, 6);
    uint32_t got[6];
    assert_int_equal(ddp_shard_read(&s, 0, 6, got, &ei), 0);
    for (size_t i = 0; i < 6; i++) assert_int_equal(got[i], want[i]);
    ddp_shard_close(&s);

    write_file("bad.txt", (const unsigned char *)"fine\nline \xc3(", 13);
    assert_int_equal(run("--tokenizer wide.json --val-fraction 0 --out w bad.txt"), 1);
    if (!strstr(out, "bad.txt: byte offset 10: invalid UTF-8 (byte 0xc3)"))
        fail_msg("output lacks the file and offset: %s", out);
    assert_int_equal(run("--tokenizer wide.json --bos '<nope>' --out w w.txt"), 1);
    assert_non_null(strstr(out, "--bos '<nope>' is neither an added token"));
    assert_int_equal(run("--eos x w.txt"), 2);
    assert_non_null(strstr(out, "--bos and --eos need --tokenizer"));
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
        cmocka_unit_test(test_tokenizer_32bit),
    };
    return cmocka_run_group_tests_name("prep", tests, setup, teardown);
}
