/* ddp-prep: text files -> token shards (llm.c format) for training and validation.
 *
 *   ddp-prep [--tokenizer tokenizer.json [--bos T] [--eos T] [--threads N]]
 *            [--val-fraction F] [--shard-tokens N] [--out DIR] FILE...
 *
 * Without --tokenizer every byte is one token (vocab 256), so any text, in any encoding,
 * round-trips exactly; the files are concatenated in the order given and the last F of the
 * tokens (default 0.1) become the validation split. With --tokenizer each file is UTF-8 text
 * encoded on its own by a byte-level BPE (data/tokenizer.h) on all cores (prep_bpe.h), with
 * the tokens --bos and --eos name around it (the text "config": the bos_token / eos_token of
 * the tokenizer_config.json beside the tokenizer); the validation split begins at the first line
 * start at or after the last F of the input bytes. Shards hold 16-bit tokens for a vocabulary
 * of up to 65,536 and 32-bit tokens (llm.c's Llama 3 label) above. The rest is the training
 * split; each split is cut into shards of at most N tokens
 * (default 100M): DIR/train_000000.bin ..., DIR/val_000000.bin .... Files are streamed, so the
 * memory used is one shard, not the corpus. Shards from an earlier run with higher numbers are
 * removed, so a glob such as DIR/train_*.bin sees exactly this run's output.
 *
 * Exit status: 0 on success, 1 on an I/O or input error, 2 on a usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proto/shard.h"
#include "worker/prep/prep_bpe.h"
#include "worker/data/tokenizer.h"

#define DEFAULT_SHARD_TOKENS 100000000L
#define READ_CHUNK (1 << 20)

static const char USAGE[] =
    "usage: ddp-prep [--tokenizer FILE [--bos T] [--eos T] [--threads N]]\n"
    "                [--val-fraction F] [--shard-tokens N] [--out DIR] FILE...\n"
    "\n"
    "Turns text files into token shards (llm.c format): byte-level (vocab 256) by default,\n"
    "or a Hugging Face byte-level BPE tokenizer.json's ids.\n"
    "\n"
    "  --tokenizer FILE   encode with this tokenizer.json (GPT-2, Llama 3, Qwen2 BPE); the\n"
    "                     input must be UTF-8; shards are 32-bit past 65,536 ids\n"
    "  --bos T, --eos T   add token T (its text, e.g. '<|endoftext|>') before / after each file;\n"
    "                     'config': the one tokenizer_config.json beside FILE names\n"
    "  --threads N        encoding threads (default: every online core)\n"
    "  --val-fraction F   last fraction of the tokens kept for validation, 0 <= F < 1\n"
    "                     (default 0.1; 0 writes no validation shards)\n"
    "  --shard-tokens N   at most N tokens per shard (default 100000000)\n"
    "  --out DIR          output directory, created if missing (default .)\n"
    "  -h, --help         this text\n"
    "\n"
    "Writes DIR/train_000000.bin ... and DIR/val_000000.bin ...\n";

typedef struct split_writer {
    const char *dir, *prefix; /* "train" / "val" */
    void *buf;                /* uint16_t or uint32_t tokens, by width */
    int width;                /* 2 or 4 bytes a token */
    size_t len, cap;
    int index; /* shards written */
    size_t total;
} split_writer_t;

static int flush_shard(split_writer_t *w)
{
    if (!w->len) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", w->dir, w->prefix, w->index);
    int rc = w->width == 2 ? ddp_shard_write(path, w->buf, w->len)
                           : ddp_shard_write32(path, w->buf, w->len);
    if (rc) {
        fprintf(stderr, "ddp-prep: cannot write %s: %s\n", path, ddp_strerror(rc));
        return rc;
    }
    printf("wrote %s (%zu tokens)\n", path, w->len);
    w->index++;
    w->total += w->len;
    w->len = 0;
    return 0;
}

static int push_bytes(split_writer_t *w, const unsigned char *p, size_t n)
{
    while (n) {
        size_t take = w->cap - w->len < n ? w->cap - w->len : n;
        uint16_t *b = w->buf;
        for (size_t i = 0; i < take; i++) b[w->len + i] = p[i];
        w->len += take;
        p += take;
        n -= take;
        if (w->len == w->cap) DDP_CHECK(flush_shard(w));
    }
    return 0;
}

static int push_ids(split_writer_t *w, const uint32_t *p, size_t n)
{
    while (n) {
        size_t take = w->cap - w->len < n ? w->cap - w->len : n;
        if (w->width == 4)
            memcpy((uint32_t *)w->buf + w->len, p, take * sizeof *p);
        else
            for (size_t i = 0; i < take; i++) ((uint16_t *)w->buf)[w->len + i] = (uint16_t)p[i];
        w->len += take;
        p += take;
        n -= take;
        if (w->len == w->cap) DDP_CHECK(flush_shard(w));
    }
    return 0;
}

/* The BPE path's sink: training ids go to the first writer, validation ids to the second;
 * the training split is flushed when the validation split begins (they share one buffer). */
typedef struct bpe_sink {
    split_writer_t *train, *val;
    int in_val;
} bpe_sink_t;

static int sink_ids(void *ctx, int val, const uint32_t *ids, size_t n)
{
    bpe_sink_t *s = ctx;
    if (val && !s->in_val) {
        DDP_CHECK(flush_shard(s->train));
        s->in_val = 1;
    }
    return push_ids(s->in_val ? s->val : s->train, ids, n);
}

/* mkdir -p */
static int make_dirs(const char *dir)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(tmp, &st) < 0) return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* Removes DIR/<prefix>_NNNNNN.bin with NNNNNN >= keep (left over from a bigger earlier run). */
static void remove_stale(const char *dir, const char *prefix, int keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    size_t plen = strlen(prefix);
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        int idx;
        char tail[8];
        if (strncmp(n, prefix, plen) || n[plen] != '_' || strlen(n) != plen + 11) continue;
        if (sscanf(n + plen + 1, "%6d%4s", &idx, tail) != 2 || strcmp(tail, ".bin")) continue;
        if (idx < keep) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, n);
        if (unlink(path) == 0) printf("removed stale %s\n", path);
    }
    closedir(d);
}

/* Writes both splits' last shards, removes shards of an earlier run beyond them, and prints
 * the summary line ("train: N tokens in K shards; val: ... (what)"). Returns 0 or -1. */
static int finish_shards(split_writer_t *train, split_writer_t *val, const char *out,
                         const char *what)
{
    if (flush_shard(train) || flush_shard(val)) return -1;
    remove_stale(out, "train", train->index);
    remove_stale(out, "val", val->index);
    printf("train: %zu tokens in %d shard%s; val: %zu tokens in %d shard%s (%s)\n", train->total,
           train->index, train->index == 1 ? "" : "s", val->total, val->index,
           val->index == 1 ? "" : "s", what);
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* The text of `key` ("bos_token" / "eos_token") in the tokenizer_config.json beside the
 * tokenizer (a string, or an object with "content"), into buf. Returns 0 or -1 (printed). */
static int config_token(const char *tok_path, const char *key, char *buf, size_t len)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", tok_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    snprintf(path, sizeof path, "%s/tokenizer_config.json", slash ? dir : ".");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fprintf(stderr, "ddp-prep: %s: %s\n", path, jerr.text);
        return -1;
    }
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    int rc = 0;
    if (json_is_string(v) && json_string_length(v) < len) {
        snprintf(buf, len, "%s", json_string_value(v));
    } else {
        fprintf(stderr, "ddp-prep: %s: no %s (a string, or an object with \"content\")\n", path,
                key);
        rc = -1;
    }
    json_decref(root);
    return rc;
}

/* Resolves --bos/--eos to an id (UINT32_MAX when absent); the text "config" takes the token
 * that tokenizer_config.json beside the tokenizer names. Returns 0 or -1 (printed). */
static int token_id(const ddp_tok_t *t, const char *tok_path, const char *flag, const char *text,
                    uint32_t *id)
{
    *id = UINT32_MAX;
    if (!text) return 0;
    char from_config[1024];
    if (strcmp(text, "config") == 0) {
        if (config_token(tok_path, strcmp(flag, "--bos") ? "eos_token" : "bos_token", from_config,
                         sizeof from_config))
            return -1;
        text = from_config;
    }
    if (ddp_tok_find(t, text, id) == 0) return 0;
    fprintf(stderr,
            "ddp-prep: %s '%s' is neither an added token nor a vocabulary entry of the "
            "tokenizer\n",
            flag, text);
    return -1;
}

/* ddp-prep --tokenizer: every file through the BPE pipeline into the two splits. The
 * validation split begins at the first line start at or after input byte n_train. Returns the
 * exit status. */
static int run_bpe(const char *tok_path, const char *bos, const char *eos, int threads,
                   const char *out, size_t shard_tokens, size_t n_train, size_t total, char **files,
                   int n_files)
{
    /* a token covers at least one byte, but for --bos and --eos */
    if (shard_tokens > total + 2 * (size_t)n_files) shard_tokens = total + 2 * (size_t)n_files;
    ddp_tok_t *t = NULL;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_tok_load(tok_path, &t, &ei);
    if (rc) {
        char buf[1024];
        fprintf(stderr, "ddp-prep: cannot use the tokenizer: %s\n",
                ddp_errinfo_str(&ei, buf, sizeof buf));
        return 1;
    }
    uint32_t bos_id, eos_id;
    int status = 1;
    ddp__prep_bpe_t *p = NULL;
    split_writer_t train = {.dir = out, .prefix = "train", .cap = shard_tokens};
    split_writer_t val = {.dir = out, .prefix = "val", .cap = shard_tokens};
    if (token_id(t, tok_path, "--bos", bos, &bos_id) ||
        token_id(t, tok_path, "--eos", eos, &eos_id))
        goto out;
    if (ddp_tok_added_has_newline(t)) {
        fprintf(stderr,
                "ddp-prep: %s: an added token holds a line break, which the input's "
                "cuts at line starts could split: not implemented\n",
                tok_path);
        goto out;
    }
    uint32_t vocab = ddp_tok_vocab_size(t);
    train.width = val.width = vocab <= 65536 ? 2 : 4;
    /* a shard's buffer grows to shard_tokens only when the input needs it */
    if (!(train.buf = ddp_malloc(shard_tokens * (size_t)train.width))) {
        fprintf(stderr, "ddp-prep: out of memory (shard of %zu tokens)\n", shard_tokens);
        goto out;
    }
    val.buf = train.buf; /* the train split is flushed before val starts */
    if (ddp__prep_bpe_new(t, threads, bos_id, eos_id, &p)) {
        fprintf(stderr, "ddp-prep: out of memory\n");
        goto out;
    }
    bpe_sink_t sink = {.train = &train, .val = &val};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t seen = 0;
    for (int i = 0; i < n_files; i++) {
        struct stat st;
        if (stat(files[i], &st) < 0) {
            fprintf(stderr, "ddp-prep: cannot open %s: %s\n", files[i], strerror(errno));
            goto out;
        }
        size_t size = (size_t)st.st_size, val_from = SIZE_MAX, bytes = 0;
        if (n_train <= seen)
            val_from = 0;
        else if (n_train < seen + size)
            val_from = n_train - seen;
        if (ddp__prep_bpe_file(p, files[i], val_from, sink_ids, &sink, &bytes)) goto out;
        seen += bytes;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!sink.in_val && n_train < seen) {
        fprintf(stderr,
                "ddp-prep: no line start after input byte %zu to begin the validation "
                "split at; use --val-fraction 0 or more lines\n",
                n_train);
        goto out;
    }
    char what[600];
    snprintf(what, sizeof what, "%s, vocab %u, %d-bit shards", tok_path, vocab, train.width * 8);
    if (finish_shards(&train, &val, out, what)) goto out;
    printf("tokenized %zu bytes in %.3f s: %.2f MB/s on %d thread%s\n", seen, secs,
           secs > 0 ? (double)seen / secs / 1e6 : 0.0, threads, threads == 1 ? "" : "s");
    status = 0;
out:
    ddp__prep_bpe_free(p);
    free(train.buf);
    ddp_tok_free(t);
    return status;
}

int main(int argc, char **argv)
{
    double val_fraction = 0.1;
    long shard_tokens = DEFAULT_SHARD_TOKENS;
    const char *out = ".", *tokenizer = NULL, *bos = NULL, *eos = NULL;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"bos", required_argument, NULL, 'b'},
        {"eos", required_argument, NULL, 'e'},
        {"threads", required_argument, NULL, 'j'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"shard-tokens", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        double d;
        switch (c) {
        case 'v':
            if (parse_double(optarg, &d) || d < 0 || d >= 1) {
                fprintf(stderr,
                        "ddp-prep: --val-fraction must be a number >= 0 and < 1, got "
                        "'%s'\n",
                        optarg);
                return 2;
            }
            val_fraction = d;
            break;
        case 's':
            if (parse_double(optarg, &d) || d < 1 || d > INT32_MAX || d != floor(d)) {
                fprintf(stderr,
                        "ddp-prep: --shard-tokens must be an integer in 1..%d, got "
                        "'%s'\n",
                        INT32_MAX, optarg);
                return 2;
            }
            shard_tokens = (long)d;
            break;
        case 'o': out = optarg; break;
        case 't': tokenizer = optarg; break;
        case 'b': bos = optarg; break;
        case 'e': eos = optarg; break;
        case 'j':
            if (parse_double(optarg, &d) || d < 1 || d > 256 || d != floor(d)) {
                fprintf(stderr, "ddp-prep: --threads must be an integer in 1..256, got '%s'\n",
                        optarg);
                return 2;
            }
            threads = (long)d;
            break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: fputs(USAGE, stderr); return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "ddp-prep: no input files\n\n%s", USAGE);
        return 2;
    }
    if ((bos || eos) && !tokenizer) {
        fprintf(stderr, "ddp-prep: --bos and --eos need --tokenizer\n");
        return 2;
    }
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;

    /* Sizes first: the split point is a fraction of the whole corpus. */
    size_t total = 0;
    for (int i = optind; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "ddp-prep: cannot open %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISREG(st.st_mode)) {
            fprintf(stderr, "ddp-prep: %s is not a regular file\n", argv[i]);
            return 1;
        }
        total += (size_t)st.st_size;
    }
    if (total == 0) {
        fprintf(stderr, "ddp-prep: empty input: the files hold no bytes\n");
        return 1;
    }
    size_t n_val = (size_t)llround((double)total * val_fraction);
    if (val_fraction > 0 && n_val == 0) n_val = 1;
    if (n_val >= total) {
        fprintf(stderr,
                "ddp-prep: input too small (%zu bytes) to split off a validation "
                "set; use --val-fraction 0\n",
                total);
        return 1;
    }
    size_t n_train = total - n_val;

    int rc = make_dirs(out);
    if (rc) {
        fprintf(stderr, "ddp-prep: cannot create %s: %s\n", out, strerror(-rc));
        return 1;
    }
    if (tokenizer)
        return run_bpe(tokenizer, bos, eos, (int)threads, out, (size_t)shard_tokens, n_train, total,
                       argv + optind, argc - optind);
    size_t cap = (size_t)shard_tokens;
    if (cap > total) cap = total;
    split_writer_t train = {.dir = out, .prefix = "train", .cap = cap, .width = 2};
    split_writer_t val = {.dir = out, .prefix = "val", .cap = cap, .width = 2};
    train.buf = ddp_malloc(cap * sizeof(uint16_t));
    unsigned char *chunk = ddp_malloc(READ_CHUNK);
    int status = 1;
    if (!train.buf || !chunk) {
        fprintf(stderr, "ddp-prep: out of memory (shard of %zu tokens)\n", cap);
        goto out;
    }
    val.buf = train.buf; /* the train split is flushed before val starts */

    size_t seen = 0;
    for (int i = optind; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "ddp-prep: cannot open %s: %s\n", argv[i], strerror(errno));
            goto out;
        }
        for (;;) {
            ssize_t r = read(fd, chunk, READ_CHUNK);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                fprintf(stderr, "ddp-prep: cannot read %s: %s\n", argv[i], strerror(errno));
                close(fd);
                goto out;
            }
            if (r == 0) break;
            size_t n = (size_t)r, off = 0;
            if (seen + n > total) {
                fprintf(stderr, "ddp-prep: %s grew while being read\n", argv[i]);
                close(fd);
                goto out;
            }
            if (seen < n_train) {
                size_t t = n_train - seen < n ? n_train - seen : n;
                if (push_bytes(&train, chunk, t)) {
                    close(fd);
                    goto out;
                }
                off = t;
                if (seen + t == n_train && flush_shard(&train)) {
                    close(fd);
                    goto out;
                }
            }
            if (off < n && push_bytes(&val, chunk + off, n - off)) {
                close(fd);
                goto out;
            }
            seen += n;
        }
        close(fd);
    }
    if (seen != total) {
        fprintf(stderr, "ddp-prep: the input shrank while being read (%zu of %zu bytes)\n", seen,
                total);
        goto out;
    }
    if (finish_shards(&train, &val, out, "byte-level, vocab 256")) goto out;
    status = 0;
out:
    free(train.buf);
    free(chunk);
    return status;
}
