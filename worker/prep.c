/* ddp-prep: text files -> byte-level token shards (llm.c format) for training and validation.
 *
 *   ddp-prep [--val-fraction F] [--shard-tokens N] [--out DIR] FILE...
 *
 * Every byte is one token (vocab 256), so any text, in any encoding, round-trips exactly. The
 * files are concatenated in the order given; the last F of the tokens (default 0.1) become the
 * validation split, the rest the training split, each cut into shards of at most N tokens
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proto/shard.h"

#define DEFAULT_SHARD_TOKENS 100000000L
#define READ_CHUNK (1 << 20)

static const char USAGE[] =
    "usage: ddp-prep [--val-fraction F] [--shard-tokens N] [--out DIR] FILE...\n"
    "\n"
    "Turns text files into byte-level token shards (vocab 256, llm.c format).\n"
    "\n"
    "  --val-fraction F   last fraction of the tokens kept for validation, 0 <= F < 1\n"
    "                     (default 0.1; 0 writes no validation shards)\n"
    "  --shard-tokens N   at most N tokens per shard (default 100000000)\n"
    "  --out DIR          output directory, created if missing (default .)\n"
    "  -h, --help         this text\n"
    "\n"
    "Writes DIR/train_000000.bin ... and DIR/val_000000.bin ...\n";

typedef struct split_writer {
    const char *dir, *prefix; /* "train" / "val" */
    uint16_t *buf;
    size_t len, cap;
    int index; /* shards written */
    size_t total;
} split_writer_t;

static int flush_shard(split_writer_t *w)
{
    if (!w->len) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", w->dir, w->prefix, w->index);
    int rc = ddp_shard_write(path, w->buf, w->len);
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
        for (size_t i = 0; i < take; i++) w->buf[w->len + i] = p[i];
        w->len += take;
        p += take;
        n -= take;
        if (w->len == w->cap) DDP_CHECK(flush_shard(w));
    }
    return 0;
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

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    double val_fraction = 0.1;
    long shard_tokens = DEFAULT_SHARD_TOKENS;
    const char *out = ".";
    static const struct option opts[] = {
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
                fprintf(stderr, "ddp-prep: --val-fraction must be a number >= 0 and < 1, got "
                                "'%s'\n", optarg);
                return 2;
            }
            val_fraction = d;
            break;
        case 's':
            if (parse_double(optarg, &d) || d < 1 || d > INT32_MAX || d != floor(d)) {
                fprintf(stderr, "ddp-prep: --shard-tokens must be an integer in 1..%d, got "
                                "'%s'\n", INT32_MAX, optarg);
                return 2;
            }
            shard_tokens = (long)d;
            break;
        case 'o': out = optarg; break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: fputs(USAGE, stderr); return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "ddp-prep: no input files\n\n%s", USAGE);
        return 2;
    }

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
        fprintf(stderr, "ddp-prep: input too small (%zu bytes) to split off a validation "
                        "set; use --val-fraction 0\n", total);
        return 1;
    }
    size_t n_train = total - n_val;

    int rc = make_dirs(out);
    if (rc) {
        fprintf(stderr, "ddp-prep: cannot create %s: %s\n", out, strerror(-rc));
        return 1;
    }
    size_t cap = (size_t)shard_tokens;
    if (cap > total) cap = total;
    split_writer_t train = {.dir = out, .prefix = "train", .cap = cap};
    split_writer_t val = {.dir = out, .prefix = "val", .cap = cap};
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
        fprintf(stderr, "ddp-prep: the input shrank while being read (%zu of %zu bytes)\n",
                seen, total);
        goto out;
    }
    if (flush_shard(&train) || flush_shard(&val)) goto out;
    remove_stale(out, "train", train.index);
    remove_stale(out, "val", val.index);
    printf("train: %zu tokens in %d shard%s; val: %zu tokens in %d shard%s "
           "(byte-level, vocab 256)\n",
           train.total, train.index, train.index == 1 ? "" : "s", val.total, val.index,
           val.index == 1 ? "" : "s");
    status = 0;
out:
    free(train.buf);
    free(chunk);
    return status;
}
