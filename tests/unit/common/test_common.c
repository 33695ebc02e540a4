/* common/: error names and messages, errinfo formatting, allocation fault injection, CRC32C. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/file.h"

static uint32_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static void test_err_names(void **state)
{
    (void)state;
    assert_string_equal(ddp_err_name(DDP_EFORMAT), "DDP_EFORMAT");
    assert_string_equal(ddp_strerror(DDP_ETIMEDOUT), "deadline expired");
    assert_string_equal(ddp_err_name(-ENOENT), "ENOENT");
    assert_string_equal(ddp_strerror(-ENOENT), "No such file or directory");
    assert_string_equal(ddp_err_name(0), "OK");
    assert_string_equal(ddp_err_name(-999999), "EUNKNOWN");
}

static void test_errinfo_format(void **state)
{
    (void)state;
    ddp_errinfo_t ei;
    char buf[600];
    int rc = ddp_errinfo_set(&ei, DDP_ESPEC, "must be > 0, got %d", -3);
    assert_int_equal(rc, DDP_ESPEC);
    ddp_errinfo_path(&ei, "train.%s", "lr");
    ei.line = 4;
    ei.column = 7;
    assert_string_equal(ddp_errinfo_str(&ei, buf, sizeof buf), "train.lr:4:7: must be > 0, got -3");
    ddp_errinfo_clear(&ei);
    assert_string_equal(ddp_errinfo_str(&ei, buf, sizeof buf), "");
    assert_int_equal(ddp_errinfo_set(NULL, DDP_EIO, "x"), DDP_EIO);
}

static void test_alloc_fail_injection(void **state)
{
    (void)state;
    ddp_alloc_fail_at(2);
    void *a = ddp_malloc(8);
    void *b = ddp_malloc(8);
    void *c = ddp_malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    free(a);
    free(c);
    ddp_alloc_fail_at(0);
    char *s = ddp_strdup("abc");
    assert_string_equal(s, "abc");
    free(s);
}

/* ddp_file_read: a regular file whole, the size limit, a pipe read to its end (bigger than the
 * first buffer), a directory, a missing file, and every allocation failing in turn. */
static void test_file_read(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp-file-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("hello\nworld", f);
    fclose(f);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ddp_file_read(path, 100, &text, &len), 0);
    assert_int_equal(len, 11);
    assert_string_equal(text, "hello\nworld");
    free(text);
    assert_int_equal(ddp_file_read(path, 11, &text, NULL), 0); /* exactly max */
    free(text);
    assert_int_equal(ddp_file_read(path, 10, &text, &len), -EFBIG);
    assert_null(text);
    assert_int_equal(ddp_file_read(dir, 100, &text, NULL), -EISDIR);
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(ddp_file_read(path, 100, &text, NULL), -ENOENT);
    assert_null(text);
    /* a pipe: 200000 bytes, more than the first 64 KiB buffer */
    f = popen("head -c 200000 /dev/zero | tr '\\0' x", "r");
    assert_non_null(f);
    snprintf(path, sizeof path, "/dev/fd/%d", fileno(f));
    assert_int_equal(ddp_file_read(path, 1 << 20, &text, &len), 0);
    assert_int_equal(len, 200000);
    assert_int_equal(text[199999], 'x');
    assert_int_equal(text[200000], 0);
    free(text);
    pclose(f);
    snprintf(path, sizeof path, "%s/f", dir);
    for (int k = 1;; k++) { /* fault injection: the k-th allocation fails */
        ddp_alloc_fail_at(k);
        int rc = ddp_file_read(path, 100, &text, NULL);
        ddp_alloc_fail_at(0);
        if (rc == 0) break;
        assert_int_equal(rc, DDP_ENOMEM);
        assert_null(text);
    }
    free(text);
    unlink(path);
    rmdir(dir);
}

/* Whether the mapping that holds p is eligible for transparent huge pages (/proc/self/smaps's
 * THPeligible): 1 or 0, -1 when smaps does not say. */
static int thp_eligible(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, eligible = -1;
    uintptr_t a = (uintptr_t)p;
    while (eligible < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line */
            in = a >= lo && a < hi;
        else if (in && sscanf(line, "THPeligible: %d", &eligible) == 1)
            break;
    }
    fclose(f);
    return eligible;
}

/* ddp_mem_release gives whole pages of private memory back (they read as zero and are no
 * longer resident) and leaves the partial pages at either end alone; ddp_mem_resident counts
 * them with mincore. ZeRO-1's moment arenas between hosts are such memory. */
static void test_mem_release(void **state)
{
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 16 * page;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    assert_int_equal(ddp_mem_resident(p, n), 0); /* mapped, never touched */
    memset(p, 7, n);
    assert_int_equal(ddp_mem_resident(p, n), (long long)n);
    /* [page / 2, n - page / 2): the first and last pages are partial, so they stay */
    ddp_mem_release(p + page / 2, n - page);
    assert_int_equal(ddp_mem_resident(p, n), (long long)(2 * page));
    assert_int_equal(p[page / 2 - 1], 7);
    assert_int_equal(p[page / 2], 7); /* the rest of the first page */
    assert_int_equal(p[page], 0);     /* a released page reads as zero */
    assert_int_equal(p[n - page - 1], 0);
    assert_int_equal(p[n - page], 7);
    ddp_mem_release(NULL, n); /* no-ops */
    ddp_mem_release(p, page - 1);
    assert_int_equal(p[0], 7);
    munmap(p, n);
}

static void test_alloc_big(void **state)
{
    (void)state;
    char *small = ddp_alloc_big(100000);
    assert_non_null(small);
    assert_int_equal((uintptr_t)small % 4096, 0);
    memset(small, 1, 100000);
    free(small);

    size_t n = (5u << 20) + 3;
    char *big = ddp_alloc_big(n);
    assert_non_null(big);
    assert_int_equal((uintptr_t)big % (2u << 20), 0);
    memset(big, 1, n);
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        fclose(f);
    }
    if (mode[0] && !strstr(mode, "[never]"))
        assert_int_equal(thp_eligible(big), 1);
    else
        print_message("transparent huge pages are off here (%s): eligibility not checked\n",
                      mode[0] ? "never" : "no sysfs");
    free(big);
}

/* ---------------------------------------------------------------- CRC32C */

static void test_crc32c(void **state)
{
    (void)state;
    assert_int_equal(ddp_crc32c_update(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(ddp__crc32c_sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(ddp_crc32c_update(0, "", 0), 0u);
    size_t n = 100003;
    unsigned char *b = malloc(n + 8);
    uint64_t s = 5;
    for (size_t i = 0; i < n + 8; i++) b[i] = (unsigned char)rng(&s);
    for (size_t off = 0; off < 8; off++) {
        uint32_t hw = ddp_crc32c_update(0, b + off, n - off * 997);
        assert_int_equal(hw, ddp__crc32c_sw(0, b + off, n - off * 997));
        uint32_t a = ddp_crc32c_update(0, b + off, 12345 + off);
        a = ddp_crc32c_update(a, b + off + 12345 + off, n - off * 997 - 12345 - off);
        assert_int_equal(a, hw);
    }
    /* every implementation this CPU has, against the table: all lengths around the folding
     * path's 256-byte block and 16-byte lane boundaries, odd addresses, a non-zero start */
    for (int impl = DDP__CRC_SSE42; impl <= ddp_crc32c_hw(); impl++)
        for (size_t len = 0; len < 1100; len += len < 600 ? 1 : 7)
            for (size_t off = 0; off < 3; off++)
                assert_int_equal(ddp__crc32c_impl(impl, 0x1234567u, b + off, len),
                                 ddp__crc32c_sw(0x1234567u, b + off, len));
    for (int impl = DDP__CRC_SW; impl <= ddp_crc32c_hw(); impl++)
        assert_int_equal(ddp__crc32c_impl(impl, 0, b + 3, n - 3), ddp__crc32c_sw(0, b + 3, n - 3));
    /* three at once: each its own buffer's CRC, from three different starts, at every length
     * around the 8-byte word, odd addresses, and streamed in two calls */
    for (size_t len = 0; len < 300; len++) {
        const void *bufs[3] = {b + 1, b + 1000 + len % 3, b + 5003};
        uint32_t three[3] = {0, 0x9abcdefu, 0xffffffffu}, start[3];
        memcpy(start, three, sizeof start);
        ddp_crc32c_update3(three, bufs, len);
        for (int k = 0; k < 3; k++)
            assert_int_equal(three[k], ddp__crc32c_sw(start[k], bufs[k], len));
    }
    const void *halves[3] = {b, b + 30000, b + 60000}, *rest[3] = {b + 77, b + 30077, b + 60077};
    uint32_t three[3] = {0, 0, 0};
    ddp_crc32c_update3(three, halves, 77);
    ddp_crc32c_update3(three, rest, 9000);
    for (int k = 0; k < 3; k++)
        assert_int_equal(three[k], ddp__crc32c_sw(0, halves[k], 9077));
    free(b);
}

/* combine(crc(A), crc(B), |B|) == crc(A||B) for every split of a buffer, including empty A or B
 * and lengths past 2^32 bits of shift; and the chunked form the AdamW kernel and the checkpoint
 * writer use (pieces folded left to right). */
static void test_crc32c_combine(void **state)
{
    (void)state;
    size_t n = 70001;
    unsigned char *b = malloc(n);
    uint64_t s = 9;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)rng(&s);
    uint32_t whole = ddp__crc32c_sw(0, b, n);
    for (size_t cut = 0; cut <= n; cut += cut < 300 ? 1 : 997) {
        uint32_t a = ddp_crc32c_update(0, b, cut), c = ddp_crc32c_update(0, b + cut, n - cut);
        assert_int_equal(ddp_crc32c_combine(a, c, n - cut), whole);
    }
    uint32_t folded = 0;
    for (size_t lo = 0; lo < n; lo += 4096) {
        size_t len = n - lo < 4096 ? n - lo : 4096;
        folded = ddp_crc32c_combine(folded, ddp_crc32c_update(0, b + lo, len), len);
    }
    assert_int_equal(folded, whole);
    /* a long B: 5 GiB of zeros after A, built from 1 MiB pieces by combining */
    size_t mib = 1u << 20;
    unsigned char *z = calloc(mib, 1);
    uint32_t zc = ddp_crc32c_update(0, z, mib), zeros = 0;
    for (int i = 0; i < 5 * 1024; i++) zeros = ddp_crc32c_combine(zeros, zc, mib);
    uint32_t slow = ddp_crc32c_update(0, b, 100);
    for (int i = 0; i < 5 * 1024; i++) slow = ddp_crc32c_update(slow, z, mib);
    assert_int_equal(ddp_crc32c_combine(ddp_crc32c_update(0, b, 100), zeros, 5ull << 30), slow);
    free(z);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_names),
        cmocka_unit_test(test_errinfo_format),
        cmocka_unit_test(test_alloc_fail_injection),
        cmocka_unit_test(test_alloc_big),
        cmocka_unit_test(test_mem_release),
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_crc32c_combine),
        cmocka_unit_test(test_file_read),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
