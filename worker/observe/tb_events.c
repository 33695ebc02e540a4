/* TensorBoard event files (see tb_events.h).
 *
 * Why by hand: no Debian package offers a C writer of TensorFlow event files (TensorFlow's own
 * C++ EventsWriter comes only with TensorFlow; tensorboardX and TensorBoard are Python), and
 * what a scalar needs is small and frozen since 2016: the TFRecord framing
 *     u64 length (LE) | u32 masked CRC32C(length bytes) | payload | u32 masked CRC32C(payload)
 * and, for the payload, five fields of two protobuf messages (event.proto, summary.proto):
 *     Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *               Summary summary = 5; }
 *     Summary { repeated Value value = 1; }    Value { string tag = 1; float simple_value = 2; }
 * protobuf-c (Debian's libprotobuf-c-dev) would need the two .proto files vendored, protoc-c at
 * build time and generated code larger than this file, for three wire types we encode here in
 * a dozen lines (varint, fixed64, fixed32, length-delimited). The CRC32C is the project's
 * (common/crc32c.c). tests/unit/worker/test_tb_events.py reads every scalar back with
 * TensorBoard's own EventAccumulator, which checks both CRCs of every record.
 */
#include "worker/observe/tb_events.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/err.h"

struct ddp_tb {
    int fd;
    uint64_t cap;   /* 0: none */
    uint64_t bytes; /* the directory's event files at open + what this writer wrote */
    char path[4200];
};

uint32_t ddp__tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf wire format: a cursor that only writes forward ---- */

typedef struct {
    uint8_t *p;
} wbuf_t;

static void put_varint(wbuf_t *b, uint64_t v)
{
    while (v >= 0x80) {
        *b->p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *b->p++ = (uint8_t)v;
}

static void put_le(wbuf_t *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) *b->p++ = (uint8_t)(v >> (8 * i));
}

/* key = field number << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
static void put_key(wbuf_t *b, int field, int wire)
{
    put_varint(b, (uint64_t)(field << 3 | wire));
}

static void put_bytes(wbuf_t *b, int field, const void *s, size_t n)
{
    put_key(b, field, 2);
    put_varint(b, n);
    memcpy(b->p, s, n);
    b->p += n;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

/* Summary.Value{tag, simple_value}: its encoded length */
static size_t value_len(const ddp_tb_scalar_t *v)
{
    size_t t = strlen(v->tag);
    return 1 + varint_len(t) + t + 1 + 4;
}

static void put_double(wbuf_t *b, int field, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put_key(b, field, 1);
    put_le(b, u, 8);
}

/* Frames payload[0..n) as one TFRecord in rec (n + 16 bytes). */
static size_t frame(uint8_t *rec, const uint8_t *payload, size_t n)
{
    wbuf_t b = {rec};
    put_le(&b, n, 8);
    put_le(&b, ddp__tb_mask_crc(ddp_crc32c_update(0, rec, 8)), 4);
    memmove(b.p, payload, n);
    b.p += n;
    put_le(&b, ddp__tb_mask_crc(ddp_crc32c_update(0, payload, n)), 4);
    return (size_t)(b.p - rec);
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Encodes an Event (summary values optional) as one framed record: *out (caller frees), *len. */
static int encode_event(double wall_time, int64_t step, const char *file_version,
                        const ddp_tb_scalar_t *v, int n, uint8_t **out, size_t *len)
{
    size_t summary = 0;
    for (int i = 0; i < n; i++) summary += 1 + varint_len(value_len(&v[i])) + value_len(&v[i]);
    size_t cap = 9 + 11 + (file_version ? 2 + strlen(file_version) : 0) + 1 + 10 + summary;
    /* the payload is encoded at offset 12 of the record buffer, then framed in place */
    uint8_t *rec = ddp_malloc(cap + 16);
    if (!rec) return DDP_ENOMEM;
    wbuf_t b = {rec + 12};
    put_double(&b, 1, wall_time);
    if (step) {
        put_key(&b, 2, 0);
        put_varint(&b, (uint64_t)step);
    }
    if (file_version) put_bytes(&b, 3, file_version, strlen(file_version));
    if (n > 0) {
        put_key(&b, 5, 2);
        put_varint(&b, summary);
        for (int i = 0; i < n; i++) {
            size_t t = strlen(v[i].tag);
            uint32_t f;
            memcpy(&f, &v[i].value, sizeof f);
            put_key(&b, 1, 2);
            put_varint(&b, value_len(&v[i]));
            put_bytes(&b, 1, v[i].tag, t);
            put_key(&b, 2, 5);
            put_le(&b, f, 4);
        }
    }
    *len = frame(rec, rec + 12, (size_t)(b.p - (rec + 12)));
    *out = rec;
    return 0;
}

/* Whether a record of len bytes fits under the cap. */
static int fits(const ddp_tb_t *tb, size_t len) { return !tb->cap || tb->bytes + len <= tb->cap; }

/* Encodes an Event and appends it as one record, unless it would cross the cap (-EFBIG). */
static int write_event(ddp_tb_t *tb, double wall_time, int64_t step, const char *file_version,
                       const ddp_tb_scalar_t *v, int n)
{
    uint8_t *rec;
    size_t len;
    DDP_CHECK(encode_event(wall_time, step, file_version, v, n, &rec, &len));
    int rc = fits(tb, len) ? write_all(tb->fd, rec, len) : -EFBIG;
    if (rc == 0) tb->bytes += len;
    free(rec);
    return rc;
}

/* The bytes of the event files already in dir (earlier runs, a respawned rank 0). */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t sum = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    struct stat st;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20) &&
            fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    closedir(d);
    return sum;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int ddp_tb_open(const char *run_dir, uint64_t cap, ddp_tb_t **out)
{
    *out = NULL;
    ddp_tb_t *tb = ddp_calloc(1, sizeof *tb);
    if (!tb) return DDP_ENOMEM;
    tb->fd = -1;
    tb->cap = cap;
    char dir[4096], host[256] = "localhost";
    if ((size_t)snprintf(dir, sizeof dir, "%s/tb", run_dir) >= sizeof dir) {
        free(tb);
        return -ENAMETOOLONG;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int rc = -errno;
        free(tb);
        return rc;
    }
    tb->bytes = dir_bytes(dir);
    if (cap) {
        /* a full directory gets no new (empty) file: the first record must fit too */
        uint8_t *rec = NULL;
        size_t len = 0;
        int rc = encode_event(now_s(), 0, "brain.Event:2", NULL, 0, &rec, &len);
        free(rec);
        if (rc == 0 && !fits(tb, len)) rc = -EFBIG;
        if (rc) {
            free(tb);
            return rc;
        }
    }
    gethostname(host, sizeof host - 1);
    /* TensorBoard sorts a directory's files by name; a resumed run in the same second gets a
     * distinct name through O_EXCL and a suffix */
    time_t sec = time(NULL);
    for (int i = 0; i < 100; i++) {
        char suffix[16] = "";
        if (i) snprintf(suffix, sizeof suffix, ".%d", i);
        if ((size_t)snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s%s", dir,
                             (long long)sec, host, suffix) >= sizeof tb->path) {
            errno = ENAMETOOLONG;
            break;
        }
        tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (tb->fd >= 0 || errno != EEXIST) break;
    }
    if (tb->fd < 0) {
        int rc = -errno;
        free(tb);
        return rc;
    }
    int rc = write_event(tb, now_s(), 0, "brain.Event:2", NULL, 0);
    if (rc) {
        ddp_tb_close(tb);
        return rc;
    }
    *out = tb;
    return 0;
}

int ddp_tb_scalars(ddp_tb_t *tb, int64_t step, double wall_time, const ddp_tb_scalar_t *v, int n)
{
    if (!tb || n < 1) return DDP_EINVAL;
    for (int i = 0; i < n; i++)
        if (!v[i].tag || strlen(v[i].tag) > 255) return DDP_EINVAL;
    return write_event(tb, wall_time, step, NULL, v, n);
}

const char *ddp_tb_path(const ddp_tb_t *tb) { return tb ? tb->path : ""; }

void ddp_tb_close(ddp_tb_t *tb)
{
    if (!tb) return;
    if (tb->fd >= 0) close(tb->fd);
    free(tb);
}
