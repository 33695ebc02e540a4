/* Unit tests of the byte-level BPE (worker/data/tokenizer.h) on small hand-written tokenizer.json
 * files: merges applied by rank and leftmost first, long words, ignore_merges, added tokens
 * (leftmost-longest, before the regex), bytes missing from the vocabulary dropped, decode
 * round trip and a bad id, the NFC normalizer, the UTF-8 check's offsets, and every refused
 * shape naming its field.
 * (tests/unit/proto/test_tokenizer_hf.py compares with Hugging Face's `tokenizers` itself.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/byte_symbol.h"
#include "worker/data/tokenizer.h"

static char dir[64];
static char path[128];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/ddp-test-tok-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return 0;
}

static int teardown(void **state)
{
    unlink(path);
    return rmdir(dir);
}

/* Writes a tokenizer.json: ids 0..255 the bytes (but `skip_byte`, if >= 0), then `extra_vocab`
 * ("\"ab\": 256, ..."), merges, added tokens, and the pre_tokenizer / normalizer / model
 * extras as JSON fragments. */
static void write_tok(int skip_byte, const char *extra_vocab, const char *merges, const char *added,
                      const char *pre, const char *normalizer, const char *model_extra)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"version\": \"1.0\", \"added_tokens\": [%s], \"normalizer\": %s,\n"
            " \"pre_tokenizer\": %s,\n \"model\": {\"type\": \"BPE\", %s \"vocab\": {",
            added, normalizer, pre, model_extra);
    const char *sep = "";
    for (int b = 0; b < 256; b++) {
        if (b == skip_byte) continue;
        char s[8];
        byte_symbol(b, s);
        fprintf(f, "%s\"%s\": %d", sep, s, b);
        sep = ", ";
    }
    fprintf(f, "%s%s}, \"merges\": [%s]}}\n", *extra_vocab ? ", " : "", extra_vocab, merges);
    assert_int_equal(fclose(f), 0);
}

#define GPT2_PRE "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"

static ddp_tok_t *load_ok(void)
{
    ddp_tok_t *t = NULL;
    ddp_errinfo_t ei;
    int rc = ddp_tok_load(path, &t, &ei);
    if (rc) fail_msg("load: %s", ei.msg);
    return t;
}

/* Encodes text and compares with want[n]. */
static void expect_ids(const ddp_tok_t *t, const char *text, size_t len, const uint32_t *want,
                       size_t n)
{
    ddp_tok_enc_t *e;
    assert_int_equal(ddp_tok_enc_new(t, &e), 0);
    for (int pass = 0; pass < 2; pass++) { /* the second pass reads the word cache */
        ddp_tok_ids_t ids = {0};
        assert_int_equal(ddp_tok_encode(e, text, len, &ids), 0);
        if (ids.len != n) fail_msg("'%s': %zu ids, want %zu", text, ids.len, n);
        for (size_t i = 0; i < n; i++)
            if (ids.ids[i] != want[i])
                fail_msg("'%s' pass %d: id %zu is %u, want %u", text, pass, i, ids.ids[i], want[i]);
        free(ids.ids);
    }
    ddp_tok_enc_free(e);
}

static void test_merges_by_rank(void **state)
{
    /* ranks: (b c) before (a b): "abc" -> a, bc; (a a) then (aa aa) */
    write_tok(-1, "\"bc\": 256, \"ab\": 257, \"aa\": 258, \"aaaa\": 259, \"abc\": 260",
              "\"b c\", \"a b\", [\"a\", \"a\"], \"aa aa\"", "", GPT2_PRE, "null", "");
    ddp_tok_t *t = load_ok();
    assert_int_equal(ddp_tok_vocab_size(t), 261);
    expect_ids(t, "abc", 3, (uint32_t[]){'a', 256}, 2);
    expect_ids(t, "ab", 2, (uint32_t[]){257}, 1);
    /* leftmost first: "aaa" -> aa, a; "aaaaa" -> aaaa, a */
    expect_ids(t, "aaa", 3, (uint32_t[]){258, 'a'}, 2);
    expect_ids(t, "aaaaa", 5, (uint32_t[]){259, 'a'}, 2);
    /* the regex splits first: " ab" is one piece (" ", "ab"), "ab!" two */
    expect_ids(t, " ab!?", 5, (uint32_t[]){' ', 257, '!', '?'}, 4);
    /* a long word: 100001 a's -> 25000 aaaa and one a */
    size_t n = 100001;
    char *w = malloc(n);
    uint32_t *want = malloc((n / 4 + 1) * sizeof *want);
    memset(w, 'a', n);
    for (size_t i = 0; i < n / 4; i++) want[i] = 259;
    want[n / 4] = 'a';
    expect_ids(t, w, n, want, n / 4 + 1);
    free(w);
    free(want);

    /* one encoder, words growing from 1 to 300 bytes (its scratch and heap grow between) */
    ddp_tok_enc_t *e;
    assert_int_equal(ddp_tok_enc_new(t, &e), 0);
    char a300[300];
    memset(a300, 'a', sizeof a300);
    for (size_t k = 1; k <= sizeof a300; k++) {
        ddp_tok_ids_t ids = {0};
        assert_int_equal(ddp_tok_encode(e, a300, k, &ids), 0);
        size_t m = k / 4 + (k % 4 >= 2) + (k % 2);
        if (ids.len != m) fail_msg("a x %zu: %zu ids, want %zu", k, ids.len, m);
        for (size_t i = 0; i < k / 4; i++) assert_int_equal(ids.ids[i], 259);
        if (k % 2) assert_int_equal(ids.ids[m - 1], 'a');
        free(ids.ids);
    }
    ddp_tok_enc_free(e);

    uint32_t id;
    assert_int_equal(ddp_tok_find(t, "bc", &id), 0);
    assert_int_equal(id, 256);
    assert_int_equal(ddp_tok_find(t, "zzz", &id), DDP_ENOTFOUND);
    ddp_tok_free(t);

    /* ignore_merges: a word in the vocabulary is taken whole */
    write_tok(-1, "\"bc\": 256, \"ab\": 257, \"abc\": 258", "\"b c\", \"a b\"", "", GPT2_PRE,
              "null", "\"ignore_merges\": true,");
    t = load_ok();
    expect_ids(t, "abc", 3, (uint32_t[]){258}, 1);
    expect_ids(t, "abcc", 4, (uint32_t[]){'a', 256, 'c'}, 3);
    ddp_tok_free(t);
}

static void test_added_tokens(void **state)
{
    write_tok(-1, "\"ab\": 256", "\"a b\"",
              "{\"id\": 300, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
              "{\"id\": 301, \"content\": \"<s>x\", \"special\": true, \"normalized\": false},"
              "{\"id\": 302, \"content\": \"b<\", \"special\": false, \"normalized\": true}",
              GPT2_PRE, "null", "");
    ddp_tok_t *t = load_ok();
    assert_int_equal(ddp_tok_vocab_size(t), 303);
    /* leftmost-longest; the un-normalized ones first, so "b<" never sees the '<' of "<s>" */
    expect_ids(t, "ab<s>xab<s>ab", 13, (uint32_t[]){256, 301, 256, 300, 256}, 5);
    expect_ids(t, "ab<q", 4, (uint32_t[]){'a', 302, 'q'}, 3);
    uint32_t id;
    assert_int_equal(ddp_tok_find(t, "<s>x", &id), 0);
    assert_int_equal(id, 301);
    assert_int_equal(ddp_tok_added_has_newline(t), 0);

    /* decode: the bytes back, added tokens as their text; an unknown id named by index */
    uint32_t ids[] = {256, 301, 0, 255, 302};
    char *out;
    size_t len;
    assert_int_equal(ddp_tok_decode(t, ids, 5, &out, &len), 0);
    assert_int_equal(len, 10);
    assert_memory_equal(out,
                        "ab<s>x\0\xff"
                        "b<",
                        10);
    free(out);
    uint32_t bad[] = {1, 2, 299};
    assert_int_equal(ddp_tok_decode(t, bad, 3, &out, &len), DDP_EINVAL);
    assert_int_equal(len, 2);
    assert_null(out);
    ddp_tok_free(t);
}

static void test_missing_byte_dropped(void **state)
{
    /* as `tokenizers` does without an unk_token: a byte missing from the vocabulary vanishes */
    write_tok('z', "", "", "", GPT2_PRE, "null", "");
    ddp_tok_t *t = load_ok();
    expect_ids(t, "aza", 3, (uint32_t[]){'a', 'a'}, 2);
    ddp_tok_free(t);
}

static void test_nfc(void **state)
{
    /* NFC composes e + U+0301 into U+00E9, and the Angstrom sign into U+00C5; the added token
     * with "normalized": true is matched on the composed text */
    write_tok(-1, "", "",
              "{\"id\": 300, \"content\": \"\u00e9!\", \"special\": false, \"normalized\": true}",
              GPT2_PRE, "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}", "");
    ddp_tok_t *t = load_ok();
    expect_ids(t, "e\xcc\x81 \xe2\x84\xab", 7, (uint32_t[]){0xc3, 0xa9, ' ', 0xc3, 0x85}, 5);
    expect_ids(t, "xe\xcc\x81!", 5, (uint32_t[]){'x', 300}, 2);
    ddp_tok_free(t);
}

static void test_utf8_check(void **state)
{
    static const struct {
        const char *s;
        size_t len, bad;
    } cases[] = {
        {"plain ascii", 11, 11},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, 14},
        {"ab\xff", 3, 2},
        {"\xc0\xaf", 2, 0},         /* overlong '/' */
        {"x\xe0\x80\xaf", 4, 1},    /* overlong, 3 bytes */
        {"xy\xed\xa0\x80", 5, 2},   /* a surrogate */
        {"\xf4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
        {"abc\xe2\x82", 5, 3},      /* cut by the end */
        {"a\x80", 2, 1},            /* a stray continuation byte */
        {"\xe2\x82\x41", 3, 0},     /* a bad continuation */
        {"nul\0ok", 6, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t got = ddp_tok_utf8_check((const unsigned char *)cases[i].s, cases[i].len);
        if (got != cases[i].bad)
            fail_msg("case %zu: first invalid byte at %zu, want %zu", i, got, cases[i].bad);
    }
}

/* Loading fails with DDP_EFORMAT and a message holding `needle`, the path in ei. */
static void expect_refused(const char *needle)
{
    ddp_tok_t *t = (ddp_tok_t *)1;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_tok_load(path, &t, &ei);
    if (rc != DDP_EFORMAT) fail_msg("rc %d (%s), want DDP_EFORMAT for '%s'", rc, ei.msg, needle);
    assert_null(t);
    assert_string_equal(ei.path, path);
    if (!strstr(ei.msg, needle)) fail_msg("message '%s' lacks '%s'", ei.msg, needle);
}

static void test_refused_shapes(void **state)
{
    write_tok(-1, "", "", "", GPT2_PRE, "{\"type\": \"NFKC\"}", "");
    expect_refused("normalizer.type: NFKC is not implemented");
    write_tok(-1, "", "", "", GPT2_PRE, "null", "\"byte_fallback\": true,");
    expect_refused("model.byte_fallback: true is not implemented");
    write_tok(-1, "", "", "", GPT2_PRE, "null", "\"continuing_subword_prefix\": \"##\",");
    expect_refused("model.continuing_subword_prefix");
    write_tok(-1, "", "", "", GPT2_PRE, "null", "\"dropout\": 0.1,");
    expect_refused("model.dropout: 0.1 is not implemented");
    write_tok(-1, "", "", "", "{\"type\": \"Metaspace\"}", "null", "");
    expect_refused("pre_tokenizer.type: Metaspace is not implemented");
    write_tok(-1, "", "", "", "null", "null", "");
    expect_refused("pre_tokenizer: null is not implemented");
    write_tok(-1, "", "", "",
              "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}", "null",
              "");
    expect_refused("pre_tokenizer.add_prefix_space: true is not implemented");
    write_tok(-1, "", "", "",
              "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
              "{\"Regex\": \"a\"}, \"behavior\": \"Removed\", \"invert\": false}, {\"type\": "
              "\"ByteLevel\", \"use_regex\": false}]}",
              "null", "");
    expect_refused("pre_tokenizer.pretokenizers[0].behavior: Removed is not implemented");
    write_tok(-1, "", "", "",
              "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
              "{\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
              "\"ByteLevel\", \"use_regex\": false}]}",
              "null", "");
    expect_refused("pre_tokenizer: pattern /(a/");
    write_tok(-1, "", "\"a q\"", "", GPT2_PRE, "null", "");
    expect_refused("model.merges[0]: the merged symbol is not in model.vocab");
    write_tok(-1, "", "\"a b c\"", "", GPT2_PRE, "null", "");
    expect_refused("model.merges[0]: \"a b c\" is not two symbols");
    write_tok(-1, "", "",
              "{\"id\": 300, \"content\": \"<s>\", \"lstrip\": true, \"normalized\": false}",
              GPT2_PRE, "null", "");
    expect_refused("added_tokens[0].lstrip: true is not implemented");

    /* a Unigram model */
    FILE *f = fopen(path, "w");
    fputs("{\"normalizer\": null, \"pre_tokenizer\": " GPT2_PRE ", \"model\": {\"type\": "
          "\"Unigram\", \"vocab\": [[\"a\", -1.0]]}}",
          f);
    fclose(f);
    expect_refused("model.type: Unigram: only BPE is implemented");

    /* not JSON: the parser's line */
    f = fopen(path, "w");
    fputs("{\n  \"model\": [1, 2,\n", f);
    fclose(f);
    ddp_tok_t *t;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_tok_load(path, &t, &ei), DDP_EFORMAT);
    assert_string_equal(ei.path, path);
    assert_true(ei.line >= 2);

    unlink(path);
    assert_true(ddp_tok_load(path, &t, &ei) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_missing_byte_dropped),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_utf8_check),
        cmocka_unit_test(test_refused_shapes),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, setup, teardown);
}
