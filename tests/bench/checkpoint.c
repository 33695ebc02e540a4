/* Checkpoint benchmark (not a test): GPT-2 124M weights + AdamW moments (~1.5 GB), laid out as
 * the CPU trainer has them (three page-aligned arenas: parameters, exp_avg, exp_avg_sq).
 *
 * In one invocation, on the same disk: the write throughput of a live save (ddp_ckpt_save_live,
 * what the CPU trainer does: the writer reads the arenas; shards + CRC32C + fsyncs + manifest +
 * rename), the same for a save from the host snapshot (ddp_ckpt_save: the GPU path) with the
 * copy into the snapshot timed separately, and a plain sequential write of the same bytes
 * (8 MiB buffered writes, then fsync) as the reference. Medians of --runs runs; prints a
 * markdown table. The savers keep the last checkpoint (keep_last 1), as a training run does: each
 * save after the first two writes over the files of the one its predecessor retired
 * (DDP_CKPT_RECYCLE=0: new files, the retired one deleted at the commit, in the timed save).
 * DDP_CKPT_DIRECT=0 turns the savers' O_DIRECT off. Live saves are timed twice:
 * reading every tensor for its CRC32C, and with the CRCs given (crc_known, what the CPU trainer's
 * update computes for a planned save; computed here once, untimed).
 *
 * Usage: bench_checkpoint [--dir DIR] [--runs N] [--no-optim] [--layers L] [--live-only]
 *                         [--known-crcs]
 * DIR (default .) is where it makes its own directory, bench-ckpt.XXXXXX, and removes it after:
 * nothing else in DIR is touched.
 * --live-only: only the live saves (for profiling the writer: perf record, CPU time);
 * --known-crcs: those with the CRCs given.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "tests/unit/checkpoint/ckpt_testutil.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Plain sequential write of every tensor's bytes into one file, then fsync. Seconds. */
static double plain_write(const char *dir, const tstate_t *ts)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/plain.bin", dir);
    int64_t t0 = ddp_now_ns();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++) {
        const ddp_ckpt_tensor_t *t = i < ts->n_model ? &ts->model[i] : &ts->optim[i - ts->n_model];
        const char *p = t->data;
        uint64_t left = t->nbytes;
        while (left) {
            size_t c = left < (8u << 20) ? (size_t)left : (8u << 20);
            ssize_t w = write(fd, p, c);
            if (w < 0) {
                perror("write");
                exit(1);
            }
            p += w;
            left -= (uint64_t)w;
        }
    }
    if (fsync(fd) < 0) perror("fsync");
    close(fd);
    double dt = (double)(ddp_now_ns() - t0) * 1e-9;
    unlink(path);
    return dt;
}

static void *arenas[3];

/* Gives every tensor its CRC32C (known = 1) or takes it away. */
static void set_known_crcs(tstate_t *ts, int known)
{
    for (size_t i = 0; i < ts->n_model + ts->n_optim; i++) {
        ddp_ckpt_tensor_t *t = i < ts->n_model ? &ts->model[i] : &ts->optim[i - ts->n_model];
        if (known && !t->crc32c) t->crc32c = ddp_crc32c_update(0, t->data, t->nbytes);
        t->crc_known = known;
    }
}

/* CPU time of this process so far, seconds: user + system, and system alone in *sys. */
static double cpu_s(double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + *sys;
}

/* The machine's CPU time so far from /proc/stat, seconds: busy (user, nice, system, irq and
 * softirq of every CPU: kernel threads and interrupts too, which getrusage does not see) and, in
 * *steal, time the hypervisor ran something else on our vCPUs. */
static double machine_busy_s(double *steal)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                     &v[4], &v[5], &v[6], &v[7]) != 8)
        v[0] = 0;
    if (f) fclose(f);
    double tick = 1.0 / (double)sysconf(_SC_CLK_TCK);
    *steal = (double)v[7] * tick;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) * tick;
}

static double last_cpu, last_sys; /* CPU seconds of the last save_once, copy included */
static double last_busy, last_steal; /* the machine's, over the last save_once */

static uint64_t last_fixed; /* bytes of the last save written from io_uring-registered memory */

static double save_once(ddp_ckpt_saver_t *s, tstate_t *ts, int step, int live, double *stall,
                        uint64_t *bytes, uint64_t *direct)
{
    set_known_crcs(ts, live == 2);
    double s0, c0 = cpu_s(&s0), st0, b0 = machine_busy_s(&st0);
    ddp_errinfo_t ei;
    ddp_ckpt_state_t st = tu_state(ts, step, "{\"step\": 0}");
    int64_t t0 = ddp_now_ns();
    int rc = live ? ddp_ckpt_save_live(s, &st, &ei) : ddp_ckpt_save(s, &st, &ei);
    *stall = (double)(ddp_now_ns() - t0) * 1e-9;
    if (rc == 0) rc = ddp_ckpt_wait(s, &ei);
    if (rc < 0) {
        fprintf(stderr, "save: %s\n", ei.msg);
        exit(1);
    }
    ddp_ckpt_stats_t stats;
    ddp_ckpt_saver_stats(s, &stats);
    *bytes = stats.bytes;
    *direct = stats.direct_bytes;
    last_fixed = stats.fixed_bytes;
    double s1;
    last_cpu = cpu_s(&s1) - c0;
    last_sys = s1 - s0;
    double st1;
    last_busy = machine_busy_s(&st1) - b0;
    last_steal = st1 - st0;
    return stats.write_s;
}

/* --live-only: two warm-up live saves (the second retires the first: from the third on a save
 * writes over retired files), then `runs` timed ones; prints wall and CPU time of each.
 * live: 1, or 2 with the CRCs given. */
static void live_only_main(ddp_ckpt_saver_t *s, tstate_t *ts, int runs, int live)
{
    double dummy;
    uint64_t bytes = 0, direct = 0;
    for (int r = -1; r <= runs; r++) {
        double w = save_once(s, ts, 3001 + r, live, &dummy, &bytes, &direct);
        printf("live save %d%s: %.0f MB in %.0f ms (%.0f MB/s), CPU %.0f ms (system %.0f ms); "
               "machine: busy %.0f ms, steal %.0f ms; %.0f%% O_DIRECT from the arenas (%.0f%% "
               "through io_uring)\n",
               r, r > 0 ? "" : " (warm-up)", (double)bytes / 1e6, w * 1e3, (double)bytes / w / 1e6,
               last_cpu * 1e3, last_sys * 1e3, last_busy * 1e3, last_steal * 1e3,
               100.0 * (double)direct / (double)ts->bytes,
               100.0 * (double)last_fixed / (double)ts->bytes);
    }
    ddp_ckpt_saver_free(s);
}

int main(int argc, char **argv)
{
    const char *parent = ".";
    int runs = 3, optim = 1, layers = 12, live_only = 0, known = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            parent = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-optim"))
            optim = 0;
        else if (!strcmp(argv[i], "--live-only"))
            live_only = 1;
        else if (!strcmp(argv[i], "--known-crcs"))
            known = 1;
        else {
            fprintf(stderr, "usage: %s [--dir DIR] [--runs N] [--no-optim] [--layers L] "
                            "[--live-only] [--known-crcs]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1 || runs > 50) runs = 3;
    ddp_log_set_level(DDP_LOG_WARN);
    tstate_t ts;
    tu_make(&ts, 50257, 1024, 768, layers, optim, 1);
    if (tu_arenas(&ts, arenas)) exit(1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/bench-ckpt.XXXXXX", parent);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return 1;
    }
    ddp_ckpt_opts_t o = {.dir = dir, .keep_last = 1};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    if (ddp_ckpt_saver_new(&o, &s, &ei) < 0) {
        fprintf(stderr, "%s\n", ei.msg);
        return 1;
    }
    if (live_only) {
        live_only_main(s, &ts, runs, 1 + known);
        tu_rmrf(dir);
        return 0;
    }
    int64_t tr = ddp_now_ns();
    if (ddp_ckpt_saver_reserve(s, ts.bytes, &ei) < 0) {
        fprintf(stderr, "%s\n", ei.msg);
        return 1;
    }
    double reserve_s = (double)(ddp_now_ns() - tr) * 1e-9;
    /* live saves on a saver of their own, as the CPU trainer has: their sources stay registered
     * with io_uring from one save to the next (the snapshot saves register the snapshot) */
    ddp_ckpt_saver_t *live_s;
    if (ddp_ckpt_saver_new(&o, &live_s, &ei) < 0) {
        fprintf(stderr, "%s\n", ei.msg);
        return 1;
    }
    double *stall = calloc((size_t)runs, sizeof *stall), *wr = calloc((size_t)runs, sizeof *wr);
    double *wl = calloc((size_t)runs, sizeof *wl), *cl = calloc((size_t)runs, sizeof *cl);
    double *cs = calloc((size_t)runs, sizeof *cs);
    double *pl = calloc((size_t)runs, sizeof *pl), first_stall = 0, dummy;
    double *wk = calloc((size_t)runs, sizeof *wk), *ck = calloc((size_t)runs, sizeof *ck);
    double *bk = calloc((size_t)runs, sizeof *bk), *sk = calloc((size_t)runs, sizeof *sk);
    uint64_t bytes = 0, direct = 0, direct_live = 0;
    for (int r = 0; r < runs + 1; r++) {
        double dt;
        double w = save_once(s, &ts, 2000 + 3 * r, 0, &dt, &bytes, &direct);
        if (r == 0) { /* first saves: snapshot allocation, page faults, io_uring registration */
            first_stall = dt;
            save_once(live_s, &ts, 2000 + 1, 1, &dummy, &bytes, &direct_live);
            continue;
        }
        stall[r - 1] = dt;
        wr[r - 1] = w;
        cs[r - 1] = last_cpu;
        wl[r - 1] = save_once(live_s, &ts, 2000 + 3 * r + 1, 1, &dummy, &bytes, &direct_live);
        cl[r - 1] = last_cpu;
        wk[r - 1] = save_once(live_s, &ts, 2000 + 3 * r + 2, 2, &dummy, &bytes, &direct);
        ck[r - 1] = last_cpu;
        bk[r - 1] = last_busy;
        sk[r - 1] = last_steal;
        pl[r - 1] = plain_write(dir, &ts);
    }
    ddp_ckpt_saver_free(s);
    ddp_ckpt_saver_free(live_s);
    double st_med = median(stall, runs), wr_med = median(wr, runs), pl_med = median(pl, runs);
    double wl_med = median(wl, runs);
    const char *dio = getenv("DDP_CKPT_DIRECT"), *rec = getenv("DDP_CKPT_RECYCLE");
    printf("\nCheckpoint of GPT-2 124M (%d layers)%s: %.1f MB of tensors, %.1f MB written per "
           "save, medians of %d runs, dir %s, O_DIRECT %s, keep_last 1: %s\n\n",
           layers, optim ? " + AdamW moments" : "", (double)ts.bytes / 1e6, (double)bytes / 1e6,
           runs, dir, dio && !strcmp(dio, "0") ? "off (DDP_CKPT_DIRECT=0)" : "where the fs allows",
           rec && !strcmp(rec, "0") ? "new files, the retired checkpoint deleted "
                                      "(DDP_CKPT_RECYCLE=0)"
                                    : "written over the retired checkpoint's files");
    printf("| measure | value |\n|---|---|\n");
    printf("| live save (CPU trainer): write throughput, shards + CRC32C + fsync + manifest + "
           "rename | **%.0f MB/s** (%.0f%% of the bytes written with O_DIRECT from the arenas) |\n",
           (double)bytes / wl_med / 1e6, 100.0 * (double)direct_live / (double)ts.bytes);
    printf("| live save: CPU time it costs (user + system, all threads) | %.0f ms |\n",
           median(cl, runs) * 1e3);
    printf("| live save with the update's CRC32C (a planned save of the CPU trainer): throughput, "
           "CPU time | %.0f MB/s, **%.0f ms** |\n", (double)bytes / median(wk, runs) / 1e6,
           median(ck, runs) * 1e3);
    printf("| the same, the machine's CPU (every CPU: kernel threads and interrupts too) / "
           "time the hypervisor took from it (steal) | %.0f ms / %.0f ms |\n", median(bk, runs) * 1e3,
           median(sk, runs) * 1e3);
    printf("| plain sequential write + fsync, same bytes, same disk | %.0f MB/s |\n",
           (double)ts.bytes / pl_med / 1e6);
    printf("| **live save / plain** | **%.2f** |\n",
           ((double)bytes / wl_med) / ((double)ts.bytes / pl_med));
    printf("| save from the host snapshot (GPU path): write throughput | %.0f MB/s (save / plain: "
           "%.2f) |\n", (double)bytes / wr_med / 1e6,
           ((double)bytes / wr_med) / ((double)ts.bytes / pl_med));
    printf("| save from the host snapshot: CPU time, copy included | %.0f ms |\n",
           median(cs, runs) * 1e3);
    printf("| its copy into the snapshot, first save / later saves | %.0f ms / %.0f ms "
           "(%.1f GB/s) |\n", first_stall * 1e3, st_med * 1e3, (double)ts.bytes / st_med / 1e9);
    printf("| ddp_ckpt_saver_reserve at start-up (allocate + fault in, once) | %.0f ms |\n",
           reserve_s * 1e3);
    tu_arenas_free(&ts, arenas);
    tu_free(&ts);
    tu_rmrf(dir);
    free(stall);
    free(wr);
    free(wl);
    free(cl);
    free(cs);
    free(pl);
    free(wk);
    free(ck);
    free(bk);
    free(sk);
    return 0;
}
