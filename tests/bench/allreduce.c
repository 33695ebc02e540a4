/* All-reduce bus bandwidth, 2 ranks on this machine, in one invocation: the ring backend over
 * shared memory (on a buffer from ddp_coll_mem_alloc, its single-pass path, and on a malloc()ed
 * buffer, the ring through slots), the ring over TCP loopback, Open MPI's MPI_Allreduce with the vader and tcp BTLs
 * (this program re-runs itself under mpirun), and memcpy of the same bytes; prints a markdown
 * table with ratios. Sizes 1, 4, 25, 100, 500 MiB of fp32.
 *
 * This machine's speed drifts (2x within a minute has been seen), so the contenders are measured
 * in ROUNDS interleaved rounds (each round runs every one of them once, in turn); a round's
 * figure is the median over its repetitions. The table gives, per size, the median over rounds
 * of each contender's GB/s and the median over rounds of the per-round ratios, and below it the
 * lowest and highest per-round ratio, so a ratio is always taken between runs minutes apart at
 * most, never between one contender's good minute and another's bad one.
 *
 *   tests/bench/allreduce.sh [build-dir]      (builds this file with mpicc, then runs it)
 *
 * Bus bandwidth = 2 (n-1)/n * bytes / time, which for n = 2 is bytes / time.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "common/clock.h"

static const int sizes_mib[] = {1, 4, 25, 100, 500};
#define NSIZES 5

#define ROUNDS 5

static int reps_for(int mib) { return mib <= 4 ? 60 : mib <= 25 ? 12 : mib <= 100 ? 5 : 3; }

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

/* One rank of the ring benchmark; rank 0 writes GB/s per size to `out`. */
static int ring_rank(int rank, int port, const char *transport, int coll_mem, FILE *out)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ddp_coll_rdzv_cfg_t cfg = {.rank = rank, .size = 2, .addr = addr, .token = "bench"};
    ddp_coll_bootstrap_t *bs;
    ddp_coll_t *c;
    ddp_errinfo_t ei;
    if (ddp_coll_bootstrap_tcp(&cfg, &bs, &ei) < 0) {
        fprintf(stderr, "bootstrap: %s\n", ei.msg);
        return 1;
    }
    ddp_coll_opts_t o = {.transport = transport};
    if (ddp_coll_new(bs, &o, &c, &ei) < 0) {
        fprintf(stderr, "coll: %s\n", ei.msg);
        return 1;
    }
    ddp_coll_bootstrap_free(bs);
    size_t maxn = (size_t)sizes_mib[NSIZES - 1] << 18;
    float *buf = NULL;
    if (coll_mem && ddp_coll_mem_alloc(c, maxn * sizeof(float), (void **)&buf, &ei) < 0) {
        fprintf(stderr, "coll mem: %s\n", ei.msg);
        return 1;
    }
    if (coll_mem && !ddp_coll_mem_shared(c, buf)) fprintf(stderr, "coll mem: not shared\n");
    if (!coll_mem) buf = malloc(maxn * sizeof(float));
    for (size_t i = 0; i < maxn; i++) buf[i] = 1.0f;
    for (int s = 0; s < NSIZES; s++) {
        size_t n = (size_t)sizes_mib[s] << 18;
        int reps = reps_for(sizes_mib[s]);
        double t[128];
        for (int k = -1; k < reps; k++) {
            ddp_coll_barrier(c, 0, NULL);
            int64_t t0 = ddp_now_ns();
            ddp_coll_req_t *r;
            ddp_coll_allreduce(c, buf, n, DDP_DT_F32, DDP_OP_AVG, &r);
            if (ddp_coll_wait(r, 0, &ei) < 0) {
                fprintf(stderr, "allreduce: %s\n", ei.msg);
                return 1;
            }
            if (k >= 0) t[k] = (double)(ddp_now_ns() - t0) * 1e-9;
        }
        if (rank == 0) fprintf(out, "%.3f\n", (double)(n * 4) / median(t, reps) / 1e9);
    }
    if (coll_mem)
        ddp_coll_mem_free(c, buf);
    else
        free(buf);
    ddp_coll_free(c);
    return 0;
}

static int run_ring(const char *transport, int coll_mem, double *gbs)
{
    int port = 30000 + (int)(getpid() % 20000);
    char tmp[] = "/tmp/ddp-bench-XXXXXX";
    int fd = mkstemp(tmp);
    FILE *out = fdopen(fd, "w+");
    pid_t p[2];
    for (int r = 0; r < 2; r++) {
        p[r] = fork();
        if (p[r] == 0) {
            int rc = ring_rank(r, port, transport, coll_mem, out);
            fflush(out);
            _exit(rc);
        }
    }
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(p[r], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    rewind(out);
    for (int s = 0; s < NSIZES; s++)
        if (fscanf(out, "%lf", &gbs[s]) != 1) gbs[s] = 0;
    fclose(out);
    unlink(tmp);
    return ok ? 0 : -1;
}

/* Under mpirun: MPI_Allreduce in place, rank 0 prints GB/s per size. */
static int mpi_main(void)
{
    MPI_Init(NULL, NULL);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t maxn = (size_t)sizes_mib[NSIZES - 1] << 18;
    float *buf = malloc(maxn * sizeof(float));
    for (size_t i = 0; i < maxn; i++) buf[i] = 1.0f;
    for (int s = 0; s < NSIZES; s++) {
        size_t n = (size_t)sizes_mib[s] << 18;
        int reps = reps_for(sizes_mib[s]);
        double t[128];
        for (int k = -1; k < reps; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (k >= 0) t[k] = MPI_Wtime() - t0;
        }
        if (rank == 0) printf("%.3f\n", (double)(n * 4) / median(t, reps) / 1e9);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}

static int run_mpi(const char *self, const char *btl, double *gbs)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe --mca plm isolated -np 2 "
             "--mca btl %s %s --mpi-child 2>/dev/null", btl, self);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    for (int s = 0; s < NSIZES; s++)
        if (fscanf(p, "%lf", &gbs[s]) != 1) gbs[s] = 0;
    return pclose(p) == 0 ? 0 : -1;
}

static void run_memcpy(double *gbs)
{
    size_t maxb = (size_t)sizes_mib[NSIZES - 1] << 20;
    char *a = malloc(maxb), *b = malloc(maxb);
    memset(a, 1, maxb);
    memset(b, 2, maxb);
    for (int s = 0; s < NSIZES; s++) {
        size_t n = (size_t)sizes_mib[s] << 20;
        int reps = reps_for(sizes_mib[s]);
        double t[128];
        for (int k = -1; k < reps; k++) {
            int64_t t0 = ddp_now_ns();
            memcpy(k & 1 ? a : b, k & 1 ? b : a, n);
            if (k >= 0) t[k] = (double)(ddp_now_ns() - t0) * 1e-9;
        }
        gbs[s] = (double)n / median(t, reps) / 1e9;
    }
    free(a);
    free(b);
}

enum { SHM, SLOTS, TCP, VADER, MTCP, MEM, NCONT };

/* Median over rounds of v[r][s] (or of a[r][s] / b[r][s] when b) for size s; lo/hi the range. */
static double over_rounds(double v[ROUNDS][NCONT][NSIZES], int a, int b, int s, double *lo,
                          double *hi)
{
    double x[ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        x[r] = b < 0 ? v[r][a][s] : v[r][b][s] > 0 ? v[r][a][s] / v[r][b][s] : 0;
    double m = median(x, ROUNDS); /* sorts x */
    if (lo) *lo = x[0];
    if (hi) *hi = x[ROUNDS - 1];
    return m;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--mpi-child")) return mpi_main();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    static double v[ROUNDS][NCONT][NSIZES];
    for (int r = 0; r < ROUNDS; r++) {
        if (run_ring("auto", 1, v[r][SHM]) < 0) fprintf(stderr, "ring/shm (coll. memory) failed\n");
        if (run_ring("auto", 0, v[r][SLOTS]) < 0) fprintf(stderr, "ring/shm (malloc) failed\n");
        if (run_ring("tcp", 0, v[r][TCP]) < 0) fprintf(stderr, "ring/tcp failed\n");
        if (run_mpi(self, "self,vader", v[r][VADER]) < 0) fprintf(stderr, "mpi vader failed\n");
        if (run_mpi(self, "self,tcp", v[r][MTCP]) < 0) fprintf(stderr, "mpi tcp failed\n");
        run_memcpy(v[r][MEM]);
        fprintf(stderr, "round %d of %d done\n", r + 1, ROUNDS);
    }
    printf("| size | ring/shm, coll. memory GB/s | ring/shm, malloc GB/s | ring/TCP GB/s | "
           "Open MPI vader GB/s | Open MPI tcp GB/s | memcpy GB/s | shm / vader | "
           "TCP / MPI tcp | shm / memcpy |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < NSIZES; s++)
        printf("| %d MiB | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
               sizes_mib[s], over_rounds(v, SHM, -1, s, NULL, NULL),
               over_rounds(v, SLOTS, -1, s, NULL, NULL), over_rounds(v, TCP, -1, s, NULL, NULL),
               over_rounds(v, VADER, -1, s, NULL, NULL), over_rounds(v, MTCP, -1, s, NULL, NULL),
               over_rounds(v, MEM, -1, s, NULL, NULL), over_rounds(v, SHM, VADER, s, NULL, NULL),
               over_rounds(v, TCP, MTCP, s, NULL, NULL), over_rounds(v, SHM, MEM, s, NULL, NULL));
    printf("\nMedians over %d interleaved rounds. Per-round ratios, lowest-highest:\n", ROUNDS);
    for (int s = 0; s < NSIZES; s++) {
        double a, b, c, d, e, f;
        over_rounds(v, SHM, VADER, s, &a, &b);
        over_rounds(v, TCP, MTCP, s, &c, &d);
        over_rounds(v, SHM, MEM, s, &e, &f);
        printf("  %3d MiB: shm/vader %.2f-%.2f, TCP/MPI tcp %.2f-%.2f, shm/memcpy %.2f-%.2f\n",
               sizes_mib[s], a, b, c, d, e, f);
    }
    return 0;
}
