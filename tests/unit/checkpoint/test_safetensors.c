/* worker/checkpoint's safetensors codec: a round trip of every dtype and shape, and every
 * malformed header and length refused with a clear error, never read past the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <malloc.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_testutil.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/checkpoint/checkpoint.h"
#include "common/crc32c.h"
#include "worker/checkpoint/dio.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/safetensors.h"

/* ---------------------------------------------------------------- safetensors */

static void test_st_round_trip(void **state)
{
    char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3f80, 0x4000, 0xbf80};
    ddp_st_tensor_t t[3] = {
        {.name = "w", .dtype = DDP_ST_F32, .ndim = 2, .shape = {2, 3}, .data = w, .nbytes = 24},
        {.name = "empty", .dtype = DDP_ST_F32, .ndim = 1, .shape = {0}, .data = NULL, .nbytes = 0},
        {.name = "h", .dtype = DDP_ST_BF16, .ndim = 1, .shape = {3}, .data = h, .nbytes = 6},
    };
    const char *meta[] = {"format", "pt", "note", "ünïcode \"quoted\""};
    ddp_errinfo_t ei;
    assert_int_equal(ddp_st_write_file(path, t, 3, meta, 2, &ei), 0);
    long long sz = tu_file_size(path);
    FILE *f = fopen(path, "rb");
    unsigned char hdr[8];
    assert_int_equal(fread(hdr, 1, 8, f), 8);
    fclose(f);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | hdr[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal((long long)(8 + n + 30), sz); /* no trailing bytes */
    ddp_st_file_t *r;
    assert_int_equal(ddp_st_open(path, &r, &ei), 0);
    assert_int_equal(ddp_st_count(r), 3);
    assert_string_equal(ddp_st_metadata(r, "format"), "pt");
    assert_string_equal(ddp_st_metadata(r, "note"), "ünïcode \"quoted\"");
    assert_null(ddp_st_metadata(r, "nope"));
    assert_string_equal(ddp_st_get(r, 0)->name, "w"); /* data order */
    const ddp_st_tensor_t *x = ddp_st_find(r, "h");
    assert_non_null(x);
    assert_int_equal(x->dtype, DDP_ST_BF16);
    assert_int_equal(x->shape[0], 3);
    assert_memory_equal(x->data, h, 6);
    x = ddp_st_find(r, "w");
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[1], 3);
    assert_memory_equal(x->data, w, 24);
    assert_int_equal(ddp_st_find(r, "empty")->nbytes, 0);
    assert_null(ddp_st_find(r, "zzz"));
    ddp_st_release(r, x->data, x->nbytes);
    assert_memory_equal(x->data, w, 24); /* released pages come back from the file */
    ddp_st_close(r);
    /* writer rejects inconsistent descriptions */
    ddp_st_tensor_t bad = t[0];
    bad.nbytes = 20;
    assert_int_equal(ddp_st_write_file(path, &bad, 1, NULL, 0, &ei), DDP_EINVAL);
    ddp_st_tensor_t dup[2] = {t[0], t[0]};
    assert_int_equal(ddp_st_write_file(path, dup, 2, NULL, 0, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "duplicate"));
    tu_rmrf(dir);
    free(dir);
}

/* Builds a file image: 8-byte length, header text (unpadded), then `data_len` bytes. */
static size_t image(unsigned char *buf, const char *header, size_t data_len, uint64_t len_override)
{
    size_t hn = strlen(header);
    uint64_t v = len_override ? len_override : hn;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(v >> (8 * i));
    memcpy(buf + 8, header, hn);
    memset(buf + 8 + hn, 0x11, data_len);
    return 8 + hn + data_len;
}

static void test_st_malformed(void **state)
{
    static const struct {
        const char *header;
        size_t data;
        uint64_t len_override;
        const char *expect; /* substring of the message */
    } cases[] = {
        {"{}", 0, 0, NULL}, /* valid: no tensors */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 1000,
         "exceeds the file"},
        {"{}", 0, 200000000, "exceeds the limit"},
        {"[1,2]", 0, 0, "does not start with '{'"},
        {"{\"a\":", 0, 0, "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, 0, "not valid JSON"}, /* duplicate key */
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0,
         "unknown dtype 'F33'"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "missing dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, 0, "missing shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0,
         "shape[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, 0,
         "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0,
         "data_offsets is not [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0, "begin > end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, 0,
         "past the end of the data"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0,
         "give 12 bytes but data_offsets [0, 8] hold 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, 0, "gap before it"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, 0, "overlaps the previous tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, 0,
         "4 bytes after the last tensor"},
        {"{\"__metadata__\":{\"k\":1}}", 0, 0, "value of 'k' is not a string"},
        {"{\"__metadata__\":[1]}", 0, 0, "__metadata__ is not an object"},
        {"{\"a\":[1]}", 0, 0, "tensor 'a': entry is not an object"},
        {"{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0,
         "not valid JSON"}, /* invalid UTF-8 */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}",
         8, 0, "give"}, /* shape product overflows */
    };
    unsigned char *buf = malloc(4096);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = image(buf, cases[i].header, cases[i].data, cases[i].len_override);
        ddp_st_file_t *f = NULL;
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        int rc = ddp_st_parse(buf, n, "case.safetensors", &f, &ei);
        if (!cases[i].expect) {
            if (rc != 0) fail_msg("case %zu: unexpected error: %s", i, ei.msg);
            ddp_st_close(f);
            continue;
        }
        if (rc != DDP_EFORMAT) fail_msg("case %zu: rc %d, expected DDP_EFORMAT", i, rc);
        assert_null(f);
        if (!strstr(ei.msg, cases[i].expect))
            fail_msg("case %zu: message '%s' lacks '%s'", i, ei.msg, cases[i].expect);
        if (!strstr(ei.msg, "case.safetensors")) fail_msg("case %zu: file not named", i);
        assert_string_equal(ei.path, "case.safetensors");
    }
    /* shorter than 8 bytes; errors from a real file name it and the offset */
    ddp_st_file_t *f = NULL;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_st_parse(buf, 5, "short", &f, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.msg, "shorter than"));
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    size_t n = image(buf, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0);
    tu_write_bytes(path, buf, n);
    assert_int_equal(ddp_st_open(path, &f, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.msg, path));
    assert_non_null(strstr(ei.msg, "tensor 'x'"));
    assert_non_null(strstr(ei.msg, "file offset"));
    assert_true(ei.offset > 8);
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    assert_int_equal(ddp_st_open(path, &f, &ei), -ENOENT);
    tu_rmrf(dir);
    free(dir);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_st_round_trip),
        cmocka_unit_test(test_st_malformed),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
