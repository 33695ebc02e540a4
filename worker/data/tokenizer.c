/* Byte-level BPE from a tokenizer.json (see tokenizer.h for the accepted shapes).
 *
 * Invariants: every vocabulary entry is stored as the raw bytes it stands for (the byte-level
 * alphabet undone), so pieces are merged as bytes and decoding is a concatenation. A merge is a
 * pair of ids -> (rank, merged id). The loaded tokenizer is immutable; the encoder's word cache
 * is per thread. Words are merged with a binary heap of candidate pairs keyed by (rank,
 * position), stale entries skipped on pop, so a long word costs O(n log n), not O(n^2).
 */
#include "worker/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <utf8proc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "worker/data/bytemap.h"

/* GPT-2's pre-tokenizer pattern (ByteLevel with use_regex true). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define NONE DDP__BYTEMAP_NONE

/* ---- the tokenizer ---- */

typedef struct added {
    char *content;
    size_t len;
    uint32_t id;
    int normalized;
} added_t;

typedef struct merge_slot {
    uint64_t pair; /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank, merged;
} merge_slot_t;

struct ddp_tok {
    ddp__bytemap_t vocab; /* raw bytes -> id */
    char **id_bytes;      /* [vocab_size]: an id's bytes (NULL: unused id) */
    uint32_t *id_len;     /* [vocab_size] */
    uint32_t vocab_size;
    uint32_t byte_id[256]; /* the id of each single byte, NONE when missing */
    merge_slot_t *merges;  /* open addressing */
    size_t merge_slots;
    added_t *added;
    size_t n_added;
    int ignore_merges;
    int nfc;                     /* normalizer NFC */
    size_t n_raw, n_normalized;  /* added tokens matched before / after normalizing */
    uint8_t added_first[2][256]; /* [normalized][byte]: some added token starts with it */
    uint32_t unk; /* NONE: bytes missing from the vocabulary are dropped, as tokenizers does */
    pcre2_code *re;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. Fills cp_of[256]. */
static void byte_alphabet(uint32_t cp_of[256])
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        cp_of[b] = printable ? (uint32_t)b : next++;
    }
}

/* Decodes one UTF-8 code point at p (valid input assumed: it came from jansson). */
static uint32_t utf8_next(const unsigned char **p, const unsigned char *end)
{
    const unsigned char *s = *p;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (s + n > end) n = (int)(end - s);
    if (n == 2)
        c &= 0x1f;
    else if (n == 3)
        c &= 0x0f;
    else if (n == 4)
        c &= 0x07;
    for (int i = 1; i < n; i++) c = (c << 6) | (s[i] & 0x3f);
    *p = s + n;
    return c;
}

/* A byte-level string -> raw bytes in out (at most len bytes). Returns the length, or -1 when
 * some character is outside the alphabet. */
static long from_byte_level(const uint32_t byte_of_cp[324], const char *s, size_t len, char *out)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    long n = 0;
    while (p < end) {
        uint32_t c = utf8_next(&p, end);
        if (c >= 324 || byte_of_cp[c] == NONE) return -1;
        out[n++] = (char)byte_of_cp[c];
    }
    return n;
}

uint32_t ddp_tok_vocab_size(const ddp_tok_t *t) { return t->vocab_size; }

int ddp_tok_added_has_newline(const ddp_tok_t *t)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (memchr(t->added[i].content, '\n', t->added[i].len) ||
            memchr(t->added[i].content, '\r', t->added[i].len))
            return 1;
    return 0;
}

static merge_slot_t *merge_find(const ddp_tok_t *t, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = t->merge_slots - 1, i = (size_t)ddp__hash_bytes(&key, sizeof key) & mask;
    for (;; i = (i + 1) & mask) {
        if (t->merges[i].pair == key) return &t->merges[i];
        if (t->merges[i].pair == UINT64_MAX) return NULL;
    }
}

void ddp_tok_free(ddp_tok_t *t)
{
    if (!t) return;
    ddp__bytemap_free(&t->vocab);
    if (t->id_bytes)
        for (uint32_t i = 0; i < t->vocab_size; i++) free(t->id_bytes[i]);
    free(t->id_bytes);
    free(t->id_len);
    free(t->merges);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    pcre2_code_free(t->re);
    free(t);
}

int ddp_tok_find(const ddp_tok_t *t, const char *content, uint32_t *id)
{
    size_t len = strlen(content);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].content, content, len) == 0) {
            *id = t->added[i].id;
            return 0;
        }
    for (uint32_t i = 0; i < t->vocab_size; i++)
        if (t->id_bytes[i] && t->id_len[i] == len && memcmp(t->id_bytes[i], content, len) == 0) {
            *id = i;
            return 0;
        }
    return DDP_ENOTFOUND;
}

/* Loading: each helper refuses with ei naming the field. */
#define REFUSE(ei, ...) ddp_errinfo_set((ei), DDP_EFORMAT, __VA_ARGS__)

static int is_false(json_t *v) { return !v || json_is_null(v) || json_is_false(v); }
static int is_empty_str(json_t *v)
{
    return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

static int check_byte_level(json_t *bl, const char *where, int want_regex, ddp_errinfo_t *ei)
{
    if (!is_false(json_object_get(bl, "add_prefix_space")))
        return REFUSE(ei, "%s.add_prefix_space: true is not implemented", where);
    json_t *ur = json_object_get(bl, "use_regex");
    int use_regex = !ur || json_is_true(ur);
    if (use_regex != want_regex)
        return REFUSE(ei, "%s.use_regex: %s is not implemented in this position", where,
                      use_regex ? "true" : "false");
    return 0;
}

/* The pre-tokenizer's pattern into *pattern (borrowed from the JSON or static); *literal when
 * it is a plain string. */
static int read_pre_tokenizer(json_t *pt, const char **pattern, int *literal, ddp_errinfo_t *ei)
{
    *literal = 0;
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!pt || json_is_null(pt))
        return REFUSE(ei, "pre_tokenizer: null is not implemented (byte-level BPE needs "
                          "ByteLevel)");
    if (!type) return REFUSE(ei, "pre_tokenizer.type: missing");
    if (strcmp(type, "ByteLevel") == 0) {
        DDP_CHECK(check_byte_level(pt, "pre_tokenizer", 1, ei));
        *pattern = GPT2_PATTERN;
        return 0;
    }
    if (strcmp(type, "Sequence") != 0)
        return REFUSE(ei,
                      "pre_tokenizer.type: %s is not implemented (ByteLevel, or Sequence of "
                      "Split and ByteLevel)",
                      type);
    json_t *list = json_object_get(pt, "pretokenizers");
    if (!json_is_array(list) || json_array_size(list) != 2)
        return REFUSE(ei, "pre_tokenizer.pretokenizers: only [Split, ByteLevel] is implemented");
    json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    const char *t0 = json_string_value(json_object_get(split, "type"));
    const char *t1 = json_string_value(json_object_get(bl, "type"));
    if (!t0 || strcmp(t0, "Split") != 0)
        return REFUSE(ei, "pre_tokenizer.pretokenizers[0].type: %s is not implemented (Split)",
                      t0 ? t0 : "missing");
    if (!t1 || strcmp(t1, "ByteLevel") != 0)
        return REFUSE(ei,
                      "pre_tokenizer.pretokenizers[1].type: %s is not implemented "
                      "(ByteLevel)",
                      t1 ? t1 : "missing");
    DDP_CHECK(check_byte_level(bl, "pre_tokenizer.pretokenizers[1]", 0, ei));
    const char *beh = json_string_value(json_object_get(split, "behavior"));
    if (!beh || strcmp(beh, "Isolated") != 0)
        return REFUSE(ei,
                      "pre_tokenizer.pretokenizers[0].behavior: %s is not implemented "
                      "(Isolated)",
                      beh ? beh : "missing");
    if (!is_false(json_object_get(split, "invert")))
        return REFUSE(ei, "pre_tokenizer.pretokenizers[0].invert: true is not implemented");
    json_t *pat = json_object_get(split, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *str = json_string_value(json_object_get(pat, "String"));
    if (re)
        *pattern = re;
    else if (str) {
        *pattern = str;
        *literal = 1;
    } else
        return REFUSE(ei, "pre_tokenizer.pretokenizers[0].pattern: neither Regex nor String");
    return 0;
}

static int read_model(ddp_tok_t *t, json_t *model, ddp_errinfo_t *ei)
{
    if (!json_is_object(model)) return REFUSE(ei, "model: missing");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return REFUSE(ei, "model.type: %s: only BPE is implemented", type);
    if (!type && !json_object_get(model, "merges"))
        return REFUSE(ei, "model.type: missing and no merges: only BPE is implemented");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return REFUSE(ei, "model.dropout: %g is not implemented", json_number_value(dropout));
    if (!is_empty_str(json_object_get(model, "continuing_subword_prefix")))
        return REFUSE(ei, "model.continuing_subword_prefix: not implemented");
    if (!is_empty_str(json_object_get(model, "end_of_word_suffix")))
        return REFUSE(ei, "model.end_of_word_suffix: not implemented");
    if (!is_false(json_object_get(model, "byte_fallback")))
        return REFUSE(ei, "model.byte_fallback: true is not implemented (SentencePiece-style "
                          "BPE)");
    if (!is_false(json_object_get(model, "fuse_unk")))
        return REFUSE(ei, "model.fuse_unk: true is not implemented");
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return REFUSE(ei, "model.vocab: not an object");
    uint32_t cp_of[256], byte_of_cp[324];
    byte_alphabet(cp_of);
    for (int i = 0; i < 324; i++) byte_of_cp[i] = NONE;
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of[b]] = (uint32_t)b;

    DDP_CHECK(ddp__bytemap_init(&t->vocab, json_object_size(vocab)));
    const char *key;
    json_t *val;
    char *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    json_object_foreach(vocab, key, val)
    {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= INT32_MAX) {
            rc = REFUSE(ei, "model.vocab[\"%s\"]: not an id in 0..2^31-2", key);
            break;
        }
        size_t len = strlen(key);
        if (len + 1 > buf_cap) {
            buf_cap = 2 * len + 64;
            free(buf);
            if (!(buf = ddp_malloc(buf_cap))) {
                rc = DDP_ENOMEM;
                break;
            }
        }
        long n = from_byte_level(byte_of_cp, key, len, buf);
        /* an entry outside the alphabet (a special token) can only come from added_tokens:
         * keep its text as it is */
        if (n < 0) {
            memcpy(buf, key, len);
            n = (long)len;
        }
        if ((rc = ddp__bytemap_put(&t->vocab, buf, (size_t)n, (uint32_t)id))) break;
        if ((uint32_t)id + 1 > t->vocab_size) t->vocab_size = (uint32_t)id + 1;
    }
    free(buf);
    DDP_CHECK(rc);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = ddp__bytemap_get(&t->vocab, &c, 1);
    }
    json_t *unk = json_object_get(model, "unk_token");
    t->unk = NONE;
    if (json_is_string(unk)) {
        const char *u = json_string_value(unk);
        char tmp[512];
        long n = strlen(u) < sizeof tmp ? from_byte_level(byte_of_cp, u, strlen(u), tmp) : -1;
        uint32_t id = n >= 0 ? ddp__bytemap_get(&t->vocab, tmp, (size_t)n) : NONE;
        if (id == NONE) id = ddp__bytemap_get(&t->vocab, u, strlen(u));
        if (id == NONE) return REFUSE(ei, "model.unk_token: \"%s\" is not in model.vocab", u);
        t->unk = id;
    }

    json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return REFUSE(ei, "model.merges: not an array");
    size_t nm = json_array_size(merges);
    t->merge_slots = 64;
    while (t->merge_slots < nm * 2) t->merge_slots *= 2;
    t->merges = ddp_malloc(t->merge_slots * sizeof *t->merges);
    if (!t->merges) return DDP_ENOMEM;
    for (size_t i = 0; i < t->merge_slots; i++) t->merges[i].pair = UINT64_MAX;
    char a[1024], b[1024], ab[2048];
    for (size_t r = 0; r < nm; r++) {
        json_t *m = json_array_get(merges, r);
        const char *sa, *sb;
        size_t la, lb;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return REFUSE(ei, "model.merges[%zu]: \"%s\" is not two symbols", r, s);
            sa = s;
            la = (size_t)(sp - s);
            sb = sp + 1;
            lb = strlen(sb);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            sa = json_string_value(json_array_get(m, 0));
            sb = json_string_value(json_array_get(m, 1));
            la = strlen(sa);
            lb = strlen(sb);
        } else
            return REFUSE(ei, "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", r);
        if (la >= sizeof a || lb >= sizeof b)
            return REFUSE(ei, "model.merges[%zu]: a symbol longer than %zu bytes", r, sizeof a);
        long na = from_byte_level(byte_of_cp, sa, la, a);
        long nb = from_byte_level(byte_of_cp, sb, lb, b);
        if (na < 0 || nb < 0)
            return REFUSE(ei, "model.merges[%zu]: a symbol outside the byte-level alphabet", r);
        uint32_t ia = ddp__bytemap_get(&t->vocab, a, (size_t)na);
        uint32_t ib = ddp__bytemap_get(&t->vocab, b, (size_t)nb);
        memcpy(ab, a, (size_t)na);
        memcpy(ab + na, b, (size_t)nb);
        uint32_t iab = ddp__bytemap_get(&t->vocab, ab, (size_t)(na + nb));
        if (ia == NONE || ib == NONE || iab == NONE)
            return REFUSE(ei, "model.merges[%zu]: %s is not in model.vocab", r,
                          ia == NONE   ? "the first symbol"
                          : ib == NONE ? "the second symbol"
                                       : "the merged symbol");
        uint64_t key64 = (uint64_t)ia << 32 | ib;
        size_t mask = t->merge_slots - 1, i = (size_t)ddp__hash_bytes(&key64, 8) & mask;
        while (t->merges[i].pair != UINT64_MAX && t->merges[i].pair != key64) i = (i + 1) & mask;
        if (t->merges[i].pair == key64) continue; /* a duplicate keeps its first rank */
        t->merges[i] = (merge_slot_t){.pair = key64, .rank = (uint32_t)r, .merged = iab};
    }
    return 0;
}

static int read_added(ddp_tok_t *t, json_t *list, ddp_errinfo_t *ei)
{
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return REFUSE(ei, "added_tokens: not an array");
    size_t n = json_array_size(list);
    t->added = ddp_calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return DDP_ENOMEM;
    static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(list, i);
        const char *content = json_string_value(json_object_get(a, "content"));
        json_t *id = json_object_get(a, "id");
        if (!content || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX)
            return REFUSE(ei, "added_tokens[%zu]: needs a string content and an id", i);
        for (size_t f = 0; f < 3; f++)
            if (!is_false(json_object_get(a, flags[f])))
                return REFUSE(ei, "added_tokens[%zu].%s: true is not implemented", i, flags[f]);
        size_t len = strlen(content);
        if (!len) return REFUSE(ei, "added_tokens[%zu].content: empty", i);
        added_t *d = &t->added[t->n_added++];
        if (!(d->content = ddp_strdup(content))) return DDP_ENOMEM;
        d->len = len;
        d->id = (uint32_t)json_integer_value(id);
        json_t *norm = json_object_get(a, "normalized");
        d->normalized = norm ? json_is_true(norm) : 1;
        if (d->normalized)
            t->n_normalized++;
        else
            t->n_raw++;
        t->added_first[d->normalized][(unsigned char)content[0]] = 1;
        if (d->id + 1 > t->vocab_size) t->vocab_size = d->id + 1;
    }
    return 0;
}

/* id -> bytes, for decoding: the vocabulary's entries, then the added tokens' contents. */
static int build_id_table(ddp_tok_t *t)
{
    t->id_bytes = ddp_calloc(t->vocab_size, sizeof *t->id_bytes);
    t->id_len = ddp_calloc(t->vocab_size, sizeof *t->id_len);
    if (!t->id_bytes || !t->id_len) return DDP_ENOMEM;
    const ddp__bytemap_t *m = &t->vocab;
    for (size_t i = 0; i < m->n_slots; i++) {
        if (!m->slot_key[i]) continue;
        size_t kl;
        const char *kp = ddp__bytemap_key(m, m->slot_key[i], &kl);
        uint32_t id = m->slot_val[i];
        free(t->id_bytes[id]);
        if (!(t->id_bytes[id] = ddp_malloc(kl + 1))) return DDP_ENOMEM;
        memcpy(t->id_bytes[id], kp, kl);
        t->id_len[id] = (uint32_t)kl;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        uint32_t id = t->added[i].id;
        free(t->id_bytes[id]);
        if (!(t->id_bytes[id] = ddp_strdup(t->added[i].content))) return DDP_ENOMEM;
        t->id_len[id] = (uint32_t)t->added[i].len;
    }
    return 0;
}

static int compile_pattern(ddp_tok_t *t, const char *pattern, int literal, ddp_errinfo_t *ei)
{
    int err;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return REFUSE(ei, "pre_tokenizer: pattern /%s/ at offset %zu: %s", pattern, (size_t)at,
                      (const char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* an interpreter fallback when JIT fails */
    return 0;
}

/* null, {"type": "NFC"}, or a Sequence of at most one NFC (Qwen2's is NFC). */
static int read_normalizer(ddp_tok_t *t, json_t *norm, ddp_errinfo_t *ei)
{
    if (!norm || json_is_null(norm)) return 0;
    const char *type = json_string_value(json_object_get(norm, "type"));
    json_t *list = json_object_get(norm, "normalizers");
    if (type && strcmp(type, "Sequence") == 0 && json_is_array(list) &&
        json_array_size(list) <= 1) {
        if (json_array_size(list) == 0) return 0;
        norm = json_array_get(list, 0);
        type = json_string_value(json_object_get(norm, "type"));
    }
    if (type && strcmp(type, "NFC") == 0) {
        t->nfc = 1;
        return 0;
    }
    return REFUSE(ei, "normalizer.type: %s is not implemented (null or NFC)",
                  type ? type : "(missing)");
}

int ddp_tok_load(const char *path, ddp_tok_t **out, ddp_errinfo_t *ei)
{
    *out = NULL;
    if (access(path, R_OK) < 0) {
        int rc = ddp_errinfo_set(ei, -errno, "cannot read the tokenizer: %s", strerror(errno));
        ddp_errinfo_path(ei, "%s", path);
        return rc;
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        int rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s", jerr.text);
        ddp_errinfo_path(ei, "%s", path);
        if (ei) {
            ei->line = jerr.line;
            ei->column = jerr.column;
        }
        return rc;
    }
    ddp_tok_t *t = ddp_calloc(1, sizeof *t);
    int rc = t ? 0 : DDP_ENOMEM;
    if (!rc) rc = read_normalizer(t, json_object_get(root, "normalizer"), ei);
    const char *pattern = NULL;
    int literal = 0;
    if (!rc)
        rc = read_pre_tokenizer(json_object_get(root, "pre_tokenizer"), &pattern, &literal, ei);
    if (!rc) rc = read_model(t, json_object_get(root, "model"), ei);
    if (!rc) rc = read_added(t, json_object_get(root, "added_tokens"), ei);
    if (!rc) rc = build_id_table(t);
    if (!rc) rc = compile_pattern(t, pattern, literal, ei);
    json_decref(root);
    if (rc) {
        if (rc == DDP_ENOMEM) ddp_errinfo_set(ei, rc, "out of memory");
        ddp_errinfo_path(ei, "%s", path);
        ddp_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---- encoding ---- */

#define CACHE_MAX_WORDS (1u << 16) /* the cache is emptied when it holds this many */
#define CACHE_MAX_WORD 256         /* longer words are not cached */

typedef struct heap_ent {
    uint32_t rank, pos, left, right; /* left/right: the ids when pushed */
} heap_ent_t;

struct ddp_tok_enc {
    const ddp_tok_t *t;
    pcre2_match_data *md;
    ddp__bytemap_t cache; /* word -> offset into cache_ids; the ids run until a NONE */
    uint32_t *cache_ids;
    size_t cache_len, cache_cap;
    /* scratch for one word */
    uint32_t *id, *prev, *next;
    heap_ent_t *heap;
    size_t scratch_cap, heap_cap;
};

int ddp_tok_enc_new(const ddp_tok_t *t, ddp_tok_enc_t **out)
{
    ddp_tok_enc_t *e = ddp_calloc(1, sizeof *e);
    *out = NULL;
    if (!e) return DDP_ENOMEM;
    e->t = t;
    e->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!e->md || ddp__bytemap_init(&e->cache, CACHE_MAX_WORDS)) {
        ddp_tok_enc_free(e);
        return DDP_ENOMEM;
    }
    *out = e;
    return 0;
}

void ddp_tok_enc_free(ddp_tok_enc_t *e)
{
    if (!e) return;
    pcre2_match_data_free(e->md);
    ddp__bytemap_free(&e->cache);
    free(e->cache_ids);
    free(e->id);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e);
}

static int ids_push(ddp_tok_ids_t *o, uint32_t id)
{
    if (o->len == o->cap) {
        size_t c = o->cap ? o->cap * 2 : 1024;
        uint32_t *p = ddp_realloc(o->ids, c * sizeof *p);
        if (!p) return DDP_ENOMEM;
        o->ids = p;
        o->cap = c;
    }
    o->ids[o->len++] = id;
    return 0;
}

static int heap_less(const heap_ent_t *a, const heap_ent_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_ent_t *h, size_t *n, heap_ent_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static heap_ent_t heap_pop(heap_ent_t *h, size_t *n)
{
    heap_ent_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(ddp_tok_enc_t *e, size_t *hn, uint32_t pos)
{
    uint32_t nx = e->next[pos];
    if (nx == NONE) return;
    const merge_slot_t *m = merge_find(e->t, e->id[pos], e->id[nx]);
    if (m) heap_push(e->heap, hn, (heap_ent_t){m->rank, pos, e->id[pos], e->id[nx]});
}

/* Merges one piece's bytes by rank and appends its ids. */
static int bpe_word(ddp_tok_enc_t *e, const unsigned char *w, size_t n, ddp_tok_ids_t *out)
{
    const ddp_tok_t *t = e->t;
    if (t->ignore_merges) {
        uint32_t whole = ddp__bytemap_get(&t->vocab, w, n);
        if (whole != NONE) return ids_push(out, whole);
    }
    int cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        uint32_t at = ddp__bytemap_get(&e->cache, w, n);
        if (at != NONE) {
            for (const uint32_t *p = e->cache_ids + at; *p != NONE; p++)
                DDP_CHECK(ids_push(out, *p));
            return 0;
        }
    }
    if (n >= UINT32_MAX / 2) return DDP_EINVAL; /* positions are uint32 */
    /* The heap holds at most 2n - 2 entries: n - 1 pairs at first, and each merge pops one
     * and pushes at most two. */
    if (n > e->scratch_cap) {
        size_t c = n * 2;
        uint32_t *a = ddp_realloc(e->id, c * sizeof *a);
        if (a) e->id = a;
        uint32_t *b = ddp_realloc(e->prev, c * sizeof *b);
        if (b) e->prev = b;
        uint32_t *d = ddp_realloc(e->next, c * sizeof *d);
        if (d) e->next = d;
        if (!a || !b || !d) return DDP_ENOMEM;
        e->scratch_cap = c;
    }
    if (2 * n > e->heap_cap) {
        size_t c = n * 4;
        heap_ent_t *h = ddp_realloc(e->heap, c * sizeof *h);
        if (!h) return DDP_ENOMEM;
        e->heap = h;
        e->heap_cap = c;
    }
    /* one symbol per byte; a byte missing from the vocabulary becomes unk or is dropped */
    uint32_t count = 0, last = NONE;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = t->byte_id[w[i]];
        if (id == NONE) id = t->unk;
        if (id == NONE) continue;
        e->id[count] = id;
        e->prev[count] = last;
        e->next[count] = NONE;
        if (last != NONE) e->next[last] = count;
        last = count++;
    }
    size_t hn = 0;
    for (uint32_t i = 0; i < count; i++) push_pair(e, &hn, i);
    while (hn) {
        heap_ent_t top = heap_pop(e->heap, &hn);
        uint32_t p = top.pos, r = e->next[p];
        /* stale: either side merged away or changed since the pair was pushed */
        if (e->id[p] == NONE || r == NONE || e->id[p] != top.left || e->id[r] != top.right)
            continue;
        e->id[p] = merge_find(t, top.left, top.right)->merged;
        e->id[r] = NONE;
        e->next[p] = e->next[r];
        if (e->next[r] != NONE) e->prev[e->next[r]] = p;
        if (e->prev[p] != NONE) push_pair(e, &hn, e->prev[p]);
        push_pair(e, &hn, p);
    }
    size_t first = out->len;
    for (uint32_t i = 0; i < count; i = e->next[i]) {
        DDP_CHECK(ids_push(out, e->id[i]));
        if (e->next[i] == NONE) break;
    }
    if (!cacheable) return 0;
    size_t k = out->len - first;
    if (e->cache.count >= CACHE_MAX_WORDS) {
        ddp__bytemap_free(&e->cache);
        e->cache_len = 0;
        DDP_CHECK(ddp__bytemap_init(&e->cache, CACHE_MAX_WORDS));
    }
    if (e->cache_len + k + 1 > e->cache_cap) {
        size_t c = e->cache_cap ? e->cache_cap * 2 : 1 << 16;
        while (c < e->cache_len + k + 1) c *= 2;
        uint32_t *p = ddp_realloc(e->cache_ids, c * sizeof *p);
        if (!p) return DDP_ENOMEM;
        e->cache_ids = p;
        e->cache_cap = c;
    }
    DDP_CHECK(ddp__bytemap_put(&e->cache, w, n, (uint32_t)e->cache_len));
    memcpy(e->cache_ids + e->cache_len, out->ids + first, k * sizeof *out->ids);
    e->cache_len += k;
    e->cache_ids[e->cache_len++] = NONE;
    return 0;
}

/* Splits text by the pre-tokenizer's pattern (matches and the stretches between them are
 * pieces, as the Isolated behaviour has it) and merges each piece. */
static int encode_pieces(ddp_tok_enc_t *e, const char *text, size_t len, ddp_tok_ids_t *out)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t pos = 0, gap = 0; /* gap: the start of text not yet emitted */
    while (pos < len) {
        int rc = pcre2_match(e->t->re, s, len, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return DDP_EIO;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match: step over one character */
            pos = ms + 1;
            while (pos < len && (s[pos] & 0xc0) == 0x80) pos++;
            continue;
        }
        if (ms > gap) DDP_CHECK(bpe_word(e, s + gap, ms - gap, out));
        DDP_CHECK(bpe_word(e, s + ms, me - ms, out));
        pos = gap = me;
    }
    if (gap < len) DDP_CHECK(bpe_word(e, s + gap, len - gap, out));
    return 0;
}

static int encode_added(ddp_tok_enc_t *e, const char *text, size_t len, int cls,
                        ddp_tok_ids_t *out);

/* Normalizes text (NFC, when the tokenizer has it), then cuts out the added tokens matched
 * after normalizing, then the pieces. */
static int encode_normalized(ddp_tok_enc_t *e, const char *text, size_t len, ddp_tok_ids_t *out)
{
    const ddp_tok_t *t = e->t;
    if (!t->nfc)
        return t->n_normalized ? encode_added(e, text, len, 1, out)
                               : encode_pieces(e, text, len, out);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return n == UTF8PROC_ERROR_NOMEM ? DDP_ENOMEM : DDP_EINVAL;
    const char *s = (const char *)dst;
    int rc = t->n_normalized ? encode_added(e, s, (size_t)n, 1, out)
                             : encode_pieces(e, s, (size_t)n, out);
    free(dst);
    return rc;
}

/* Cuts out the added tokens of one class (normalized == cls) leftmost-longest: class 0 on the
 * text as it is, its stretches between normalized and then cut by class 1, whose stretches go
 * to the pieces (the order `tokenizers` follows). */
static int encode_added(ddp_tok_enc_t *e, const char *text, size_t len, int cls, ddp_tok_ids_t *out)
{
    const ddp_tok_t *t = e->t;
    size_t gap = 0;
    const uint8_t *first = t->added_first[cls];
    for (size_t i = 0; i < len;) {
        if (!first[(unsigned char)text[i]]) {
            i++;
            continue;
        }
        const added_t *best = NULL;
        for (size_t k = 0; k < t->n_added; k++) {
            const added_t *a = &t->added[k];
            if (a->normalized != cls || a->len > len - i || (best && a->len <= best->len)) continue;
            if (a->content[0] == text[i] && memcmp(a->content, text + i, a->len) == 0) best = a;
        }
        if (!best) {
            i++;
            continue;
        }
        if (i > gap)
            DDP_CHECK(cls ? encode_pieces(e, text + gap, i - gap, out)
                          : encode_normalized(e, text + gap, i - gap, out));
        DDP_CHECK(ids_push(out, best->id));
        i += best->len;
        gap = i;
    }
    if (gap < len)
        DDP_CHECK(cls ? encode_pieces(e, text + gap, len - gap, out)
                      : encode_normalized(e, text + gap, len - gap, out));
    return 0;
}

int ddp_tok_encode(ddp_tok_enc_t *e, const char *text, size_t len, ddp_tok_ids_t *out)
{
    if (e->t->n_raw) return encode_added(e, text, len, 0, out);
    return encode_normalized(e, text, len, out);
}

size_t ddp_tok_utf8_check(const unsigned char *p, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            n = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            n = 3;
            if (c == 0xe0)
                lo = 0xa0; /* no overlongs */
            else if (c == 0xed)
                hi = 0x9f; /* no surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 4;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f; /* <= U+10FFFF */
        } else
            return i;
        if (i + n > len) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < n; k++)
            if ((p[i + k] & 0xc0) != 0x80) return i;
        i += n;
    }
    return len;
}

int ddp_tok_decode(const ddp_tok_t *t, const uint32_t *ids, size_t n, char **out, size_t *out_len)
{
    *out = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->vocab_size || !t->id_bytes[ids[i]]) {
            *out_len = i;
            return DDP_EINVAL;
        }
        total += t->id_len[ids[i]];
    }
    char *buf = ddp_malloc(total + 1);
    if (!buf) return DDP_ENOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + at, t->id_bytes[ids[i]], t->id_len[ids[i]]);
        at += t->id_len[ids[i]];
    }
    buf[at] = '\0';
    *out = buf;
    *out_len = at;
    return 0;
}
