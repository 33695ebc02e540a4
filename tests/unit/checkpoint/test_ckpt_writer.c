/* The checkpoint writer's I/O path: CRC32Cs handed over by the update (known CRCs), a live save
 * frozen mid-write, O_DIRECT against buffered writes (identical files), and dio's appends and
 * overwrites keeping a file's bytes exactly (sizes off every block, a bounce buffer for unaligned
 * sources). The rest of the checkpoint tests: test_checkpoint.c. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_testutil.h"
#include "common/clock.h"
#include "worker/checkpoint/checkpoint.h"
#include "common/crc32c.h"
#include "worker/checkpoint/dio.h"
#include "worker/checkpoint/uring.h"

static const char *TRAINER = "{\"step\": 7, \"tokens\": 1234, \"rng\": [1, 2, 3], "
                             "\"cursor\": {\"epoch\": 0, \"index\": 99}, \"world_size\": 2}";

/* Changes every value of every tensor (what an optimizer update does). */
static void tu_update(tstate_t *ts)
{
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++) {
        ddp_ckpt_tensor_t *t = i < ts->n_model ? &ts->model[i] : &ts->optim[i - ts->n_model];
        float *f = t->data;
        for (uint64_t k = 0; k < t->nbytes / 4; k++) f[k] = f[k] * 0.5f + 1.0f;
    }
}

static int host_copy(void *dst, const void *src, size_t n, void *ctx)
{
    memcpy(dst, src, n);
    return 0;
}

/* Tensors that come with their CRC32C (as the CPU trainer's update computes them) are not read
 * for it: the writer checksums only the others (crc_bytes), the manifest still verifies, across
 * several shards and with arenas whose writes span tensors; and the given CRC is what goes into
 * the manifest: a wrong one makes verification fail on that tensor's shard. */
static void test_known_crcs(void **state)
{
    char *dir = tu_tmpdir();
    tstate_t ts;
    void *arenas[3];
    tu_make(&ts, 1000, 64, 96, 2, 1, 6);
    assert_int_equal(tu_arenas(&ts, arenas), 0);
    uint64_t unknown = 0;
    for (size_t i = 0; i < ts.n_model + ts.n_optim; i++) {
        ddp_ckpt_tensor_t *t = i < ts.n_model ? &ts.model[i] : &ts.optim[i - ts.n_model];
        t->crc_known = i % 3 != 0;
        t->crc32c = t->crc_known ? ddp__crc32c_sw(0, t->data, t->nbytes) : 0xdeadbeef;
        if (!t->crc_known) unknown += t->nbytes;
    }
    ddp_errinfo_t ei;
    for (int wrong = 0; wrong < 2; wrong++) {
        if (wrong) ts.optim[1].crc32c ^= 1; /* exp_avg.wpe.weight: known, shard 2 (wte fills 1) */
        ddp_ckpt_saver_t *s = tu_slow_saver(dir, 0.3, "0");
        ddp_ckpt_state_t st = tu_state(&ts, 50 + wrong, TRAINER);
        assert_int_equal(ddp_ckpt_save_live(s, &st, &ei), 0);
        assert_int_equal(ddp_ckpt_wait(s, &ei), 0);
        ddp_ckpt_stats_t stats;
        ddp_ckpt_saver_stats(s, &stats);
        assert_int_equal(stats.crc_bytes, unknown);
        tu_slow_saver_free(s);
        char path[4096];
        snprintf(path, sizeof path, "%s/step-%08d", dir, 50 + wrong);
        if (!wrong) {
            assert_int_equal(ddp_ckpt_verify(path, &ei), 0);
            continue;
        }
        assert_int_equal(ddp_ckpt_verify(path, &ei), DDP_ECHECKSUM);
        if (!strstr(ei.msg, "optim-00002-of-")) fail_msg("not named: %s", ei.msg);
    }
    tu_arenas_free(&ts, arenas);
    tu_free(&ts);
    tu_rmrf(dir);
    free(dir);
}

/* A live save: the writer reads the tensors themselves; after ddp_ckpt_freeze the caller
 * changes them (an update) while the writer is still busy, and the checkpoint must hold the
 * values from before the update, bitwise; likewise when the freeze comes after the writer is
 * past the shards (nothing to copy). */
static void test_live_save_freeze(void **state)
{
    char *dir = tu_tmpdir();
    tstate_t ts, ref, out;
    void *arenas[3];
    tu_make(&ts, 1000, 64, 96, 2, 1, 5);
    assert_int_equal(tu_arenas(&ts, arenas), 0);
    for (int late = 0; late < 2; late++) {
        /* several shards, and a pause after each, so the freeze finds shards not yet read */
        ddp_ckpt_saver_t *s = tu_slow_saver(dir, 0.3, "100");
        ddp_errinfo_t ei;
        tu_copy(&ref, &ts);
        ddp_ckpt_state_t st = tu_state(&ts, 30 + late, TRAINER);
        assert_int_equal(ddp_ckpt_save_live(s, &st, &ei), 0);
        if (late) {
            while (ddp_ckpt_busy(s)) usleep(10000);
        } else {
            /* the writer has read its first shard once the second one's file exists (it
             * pauses 100 ms before each next shard): the freeze then finds some shards read
             * and some not. Waited for with a deadline, never a fixed sleep. */
            char pat[4200];
            snprintf(pat, sizeof pat, "%s/.step-%08d.tmp/*.safetensors", dir, 30 + late);
            size_t files = 0;
            int64_t end = ddp_now_ns() + 60000000000LL;
            while (files < 2 && ddp_now_ns() < end) {
                glob_t g;
                files = glob(pat, 0, NULL, &g) == 0 ? g.gl_pathc : 0;
                globfree(&g);
                if (files < 2) nanosleep(&(struct timespec){0, 2000000}, NULL);
            }
            assert_true(files >= 2);
            assert_true(ddp_ckpt_busy(s));
        }
        uint64_t copied = 1;
        assert_int_equal(ddp_ckpt_freeze(s, &copied, &ei), 0);
        if (late) assert_int_equal(copied, 0);
        else assert_true(copied > 0 && copied < ts.bytes);
        tu_update(&ts); /* the update, while the writer goes on from the snapshot */
        assert_int_equal(ddp_ckpt_wait(s, &ei), 0);
        tu_slow_saver_free(s);
        char path[4096];
        snprintf(path, sizeof path, "%s/step-%08d", dir, 30 + late);
        assert_int_equal(ddp_ckpt_verify(path, &ei), 0);
        tu_like(&out, &ts);
        ddp_ckpt_load_t req = {.model = out.model, .n_model = out.n_model, .optim = out.optim,
                               .n_optim = out.n_optim};
        assert_int_equal(ddp_ckpt_load(path, &req, &ei), 0);
        tu_assert_same_state(&ref, &out);
        free(req.config_json);
        free(req.trainer_json);
        tu_free(&out);
        tu_free(&ref);
    }
    /* a live save needs host tensors */
    ddp_ckpt_opts_t o = {.dir = dir, .copy = host_copy};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
    ddp_ckpt_state_t st = tu_state(&ts, 40, TRAINER);
    assert_int_equal(ddp_ckpt_save_live(s, &st, &ei), DDP_EINVAL);
    ddp_ckpt_saver_free(s);
    tu_arenas_free(&ts, arenas);
    tu_free(&ts);
    tu_rmrf(dir);
    free(dir);
}

/* Whether `dir` takes a 4096-byte O_DIRECT write reporting its alignment through statx (ext4,
 * xfs; not tmpfs). */
static int fs_has_direct(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/.probe", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, 0644), ok = 0;
    void *buf = NULL;
    struct statx sx;
    if (fd >= 0 && posix_memalign(&buf, 4096, 4096) == 0) {
        memset(buf, 0, 4096);
        ok = write(fd, buf, 4096) == 4096 &&
             statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
             (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align;
    }
    free(buf);
    if (fd >= 0) close(fd);
    unlink(path);
    return ok;
}

/* The same state saved with O_DIRECT (arenas, and separately allocated tensors whose addresses
 * do not match their file offsets: the bounce buffer) and buffered: identical files, data
 * starting 4096-aligned, no trailing bytes. */
static void test_direct_matches_buffered(void **state)
{
    char *dir = tu_tmpdir();
    int direct_fs = fs_has_direct(dir);
    for (int arena = 0; arena < 2; arena++) {
        tstate_t ts;
        void *arenas[3];
        tu_make(&ts, 1001, 33, 96, 2, 1, 6); /* odd sizes: shards end off any block */
        if (arena) assert_int_equal(tu_arenas(&ts, arenas), 0);
        for (int direct = 0; direct < 2; direct++) {
            if (!direct) setenv("DDP_CKPT_DIRECT", "0", 1);
            ddp_ckpt_opts_t o = {.dir = dir, .shard_mb = 0.5, .keep_last = 0};
            ddp_ckpt_saver_t *s;
            ddp_errinfo_t ei;
            assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
            unsetenv("DDP_CKPT_DIRECT");
            ddp_ckpt_state_t st = tu_state(&ts, 100 * arena + direct, TRAINER);
            assert_int_equal(direct ? ddp_ckpt_save_live(s, &st, &ei) : ddp_ckpt_save(s, &st, &ei),
                             0);
            assert_int_equal(ddp_ckpt_wait(s, &ei), 0);
            ddp_ckpt_stats_t stats;
            ddp_ckpt_saver_stats(s, &stats);
            if (!direct) assert_int_equal(stats.direct_bytes, 0);
            else if (direct_fs && arena) assert_true(stats.direct_bytes > ts.bytes / 2);
            ddp_ckpt_saver_free(s);
        }
        char pat[4096];
        snprintf(pat, sizeof pat, "%s/step-%08d/*.safetensors", dir, 100 * arena);
        glob_t g;
        assert_int_equal(glob(pat, 0, NULL, &g), 0);
        assert_true(g.gl_pathc >= 3);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            char other[4096];
            snprintf(other, sizeof other, "%s/step-%08d/%s", dir, 100 * arena + 1,
                     strrchr(g.gl_pathv[i], '/') + 1);
            unsigned char *a, *b;
            size_t la, lb;
            assert_int_equal(tu_read_file(g.gl_pathv[i], &a, &la), 0);
            assert_int_equal(tu_read_file(other, &b, &lb), 0);
            assert_int_equal(la, lb);
            if (memcmp(a, b, la)) fail_msg("%s differs between buffered and O_DIRECT", other);
            /* data at a 4096 boundary, and the file ends where the last tensor ends */
            ddp_st_file_t *f;
            ddp_errinfo_t ei;
            assert_int_equal(ddp_st_open(other, &f, &ei), 0);
            assert_int_equal(ddp_st_data_start(f) % 4096, 0);
            const ddp_st_tensor_t *last = ddp_st_get(f, ddp_st_count(f) - 1);
            const unsigned char *first = ddp_st_get(f, 0)->data;
            assert_int_equal(ddp_st_data_start(f) +
                                 (uint64_t)((const unsigned char *)last->data - first) +
                                 last->nbytes,
                             lb);
            ddp_st_close(f);
            free(a);
            free(b);
        }
        globfree(&g);
        char path[4096];
        snprintf(path, sizeof path, "%s/step-%08d", dir, 100 * arena + 1);
        ddp_errinfo_t ei;
        assert_int_equal(ddp_ckpt_verify(path, &ei), 0);
        if (arena) tu_arenas_free(&ts, arenas);
        tu_free(&ts);
    }
    tu_rmrf(dir);
    free(dir);
}

/* ddp__dio_*: appends of odd sizes from addresses of every phase produce exactly those bytes. */
static void test_dio_appends(void **state)
{
    char *dir = tu_tmpdir();
    size_t total = 3 * DDP__DIO_BOUNCE + 12345;
    unsigned char *src = NULL;
    assert_int_equal(posix_memalign((void **)&src, 4096, total + 8192), 0);
    uint64_t seed = 9;
    for (size_t i = 0; i < total + 8192; i++) src[i] = (unsigned char)tu_rng(&seed);
    const size_t sizes[] = {100, 4096 - 100, 8192, 1, DDP__DIO_BOUNCE + 7, 511, 65536 * 3,
                            DDP__DIO_BOUNCE, 3};
    /* mode 2: direct, with the first half of the source registered with io_uring (where this
     * kernel allows it), so direct writes go through the ring or through pwrite */
    ddp__uring_t *ring = NULL;
    if (ddp__uring_new(&ring) == 0) {
        struct iovec half = {src, total / 2};
        if (ddp__uring_register(ring, &half, 1) < 0) {
            ddp__uring_free(ring);
            ring = NULL;
        }
    }
    for (int mode = 0; mode < 3; mode++) {
        int direct = mode > 0;
        char path[4096];
        snprintf(path, sizeof path, "%s/f%d", dir, mode);
        ddp__dio_t d;
        ddp_errinfo_t ei;
        assert_int_equal(ddp__dio_open(&d, path, direct, false, mode == 2 ? ring : NULL, &ei), 0);
        unsigned char *expect = malloc(total);
        size_t len = 0, phase = 0;
        for (size_t k = 0; len < total; k++) {
            size_t n = sizes[k % (sizeof sizes / sizeof sizes[0])];
            if (n > total - len) n = total - len;
            /* the source: page-aligned when its file offset is, else some other phase */
            const unsigned char *p = src + (k % 3 == 0 ? len % 4096 : (len + ++phase) % 4096);
            memcpy(expect + len, p, n);
            assert_int_equal(ddp__dio_write(&d, p, n, &ei), 0);
            len += n;
        }
        assert_int_equal(ddp__dio_close(&d, 0, &ei), 0);
        unsigned char *got;
        size_t glen;
        assert_int_equal(tu_read_file(path, &got, &glen), 0);
        assert_int_equal(glen, total);
        if (memcmp(got, expect, total)) fail_msg("mode %d: file content differs", mode);
        if (mode == 2 && ring) {
            fprintf(stderr, "io_uring: %llu of %llu direct bytes\n",
                    (unsigned long long)d.fixed_bytes, (unsigned long long)d.direct_bytes);
            assert_true(d.fixed_bytes > 0 && d.fixed_bytes <= d.direct_bytes);
        } else {
            assert_int_equal(d.fixed_bytes, 0);
        }
        free(got);
        free(expect);
    }
    if (ring) {
        /* a write is cut where the registered memory ends; other memory is not the ring's */
        char path[4096];
        snprintf(path, sizeof path, "%s/cut", dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        size_t end = (total / 2 + 4095) / 4096 * 4096; /* registered up to this page end */
        assert_int_equal(ddp__uring_pwrite(ring, fd, src + end - 8192, 3 * 4096, 0), 8192);
        assert_int_equal(ddp__uring_pwrite(ring, fd, src + end, 4096, 8192), -ENOENT);
        close(fd);
    }
    ddp__uring_free(ring);
    free(src);
    tu_rmrf(dir);
    free(dir);
}

/* Overwrite mode writes over an existing file's blocks (the same inode) and leaves exactly the
 * new bytes, whether the old file was longer or shorter, direct or buffered. */
static void test_dio_overwrites(void **state)
{
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/f", dir);
    const size_t sizes[] = {3 * 4096 * 256 + 100, 4096 * 100 + 77, 1000, 2 * 4096 * 256};
    uint64_t seed = 5;
    for (int direct = 0; direct < 2; direct++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            unsigned char *src = NULL, *got;
            size_t glen;
            assert_int_equal(posix_memalign((void **)&src, 4096, n), 0);
            for (size_t i = 0; i < n; i++) src[i] = (unsigned char)tu_rng(&seed);
            struct stat before, after;
            int existed = stat(path, &before) == 0;
            ddp__dio_t d;
            ddp_errinfo_t ei;
            assert_int_equal(ddp__dio_open(&d, path, direct, true, NULL, &ei), 0);
            assert_int_equal(d.old_size, existed ? (uint64_t)before.st_size : 0);
            assert_int_equal(ddp__dio_write(&d, src, 100, &ei), 0); /* then unaligned */
            assert_int_equal(ddp__dio_write(&d, src + 100, n - 100, &ei), 0);
            assert_int_equal(ddp__dio_close(&d, 0, &ei), 0);
            assert_int_equal(stat(path, &after), 0);
            if (existed) assert_true(after.st_ino == before.st_ino);
            assert_int_equal(tu_read_file(path, &got, &glen), 0);
            assert_int_equal(glen, n);
            if (memcmp(got, src, n)) fail_msg("direct %d, size %zu: content differs", direct, n);
            free(got);
            free(src);
        }
    }
    tu_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_crcs),
        cmocka_unit_test(test_live_save_freeze),
        cmocka_unit_test(test_direct_matches_buffered),
        cmocka_unit_test(test_dio_appends),
        cmocka_unit_test(test_dio_overwrites),
    };
    return cmocka_run_group_tests_name("checkpoint_writer", tests, NULL, NULL);
}
