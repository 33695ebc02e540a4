/* Shared helpers of the trainer-checkpoint tests: a temporary directory with a token shard, and
 * a trainer spec over it. Header-only (static functions). */
#ifndef DDP_TESTS_UNIT_WORKER_CKPT_TESTUTIL_H
#define DDP_TESTS_UNIT_WORKER_CKPT_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/shard.h"
#include "proto/spec.h"

/* Makes a temporary directory holding train_000000.bin (n deterministic byte tokens). */
static int wc_make_data(char *dir, size_t dirlen, size_t n)
{
    snprintf(dir, dirlen, "%s/ddp-wckpt-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return -1;
    uint16_t *tok = malloc(n * sizeof *tok);
    if (!tok) return -1;
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (uint16_t)((s >> 33) % 64 + 32);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    int rc = ddp_shard_write(path, tok, n);
    free(tok);
    return rc;
}

/* A spec for `preset` over dir's data, checkpointing into dir/ck (ckpt != 0). */
static int wc_spec(ddp_spec_t *spec, const char *dir, const char *preset, int B, int T,
                   long steps, int ckpt)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"name\":\"t\",\"model\":{\"preset\":\"%s\"},"
             "\"data\":{\"train\":\"%s/train_*.bin\"},"
             "\"train\":{\"steps\":%ld,\"micro_batch\":%d,\"seq_len\":%d,\"lr\":0.001,"
             "\"warmup\":1,\"seed\":9,\"threads\":1,\"sample_tokens\":0},"
             "\"checkpoint\":{\"dir\":\"%s%s\",\"keep_last\":0}}",
             preset, dir, steps, B, T, ckpt ? dir : "", ckpt ? "/ck" : "");
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_spec_parse(spec, text, strlen(text), "<test>", &ei);
    if (rc) fprintf(stderr, "# spec: %s\n", ei.msg);
    return rc;
}

static void wc_rmrf(const char *dir)
{
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "# cannot remove %s\n", dir);
}

/* The group fixture of both test binaries: a world of one and a small dataset in `dir`. */
static char dir[900];

static int wc_setup(void **state)
{
    (void)state;
    unsetenv("DDP_WORLD_SIZE");
    return wc_make_data(dir, sizeof dir, 20000);
}

static int wc_teardown(void **state)
{
    (void)state;
    wc_rmrf(dir);
    return 0;
}

#endif
