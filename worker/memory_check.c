/* The trainer's side of the memory budget (budget/memory_budget.h): each rank plans its own memory
 * before it allocates the model, prints the plan, and refuses a job that cannot fit before
 * step 1; at the end it prints the peak it reached, beside its plan's total.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/alloc.h"
#include "common/log.h"
#include "worker/budget/memory_budget.h"
#include "worker/trainer.h"

/* Device memory of this rank's GPU, asked of the CUDA runtime the kernel module loaded
 * (cudaMemGetInfo through the module's handle, so nothing here links CUDA); 0 when unknown. */
static int64_t gpu_bytes(const ddp_trainer_t *t)
{
    if (!t->k.module) return 0;
    typedef int (*meminfo_fn)(size_t *free_b, size_t *total_b);
    meminfo_fn fn = (meminfo_fn)dlsym(t->k.module, "cudaMemGetInfo");
    size_t free_b = 0, total_b = 0;
    if (!fn || fn(&free_b, &total_b) != 0) return 0;
    return (int64_t)total_b;
}

/* Ranks on this host, as the launcher said (main.c read it with the spec). */
static int local_ranks(const ddp_trainer_t *t, int world)
{
    int n = t->opts.env.local_world;
    return n >= 1 && n <= world ? n : 1;
}

int ddp_trainer_check_memory(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    ddp_mem_budget_t b;
    int world = t->world.size, on_gpu = ddp_k_gpu_memory(&t->k);
    const char *why;
    /* native bf16 matters only to a run that may use it; probing loads oneDNN, which an fp32
     * run would then carry */
    int bf16 = t->spec.precision == DDP_PREC_BF16 || t->spec.precision == DDP_PREC_AUTO;
    int where = on_gpu                                                     ? DDP_MEM_GPU
                : bf16 && ddp_k_prec_native(&t->k, DDP_KPREC_BF16, &why) ? DDP_MEM_CPU_BF16
                                                                           : DDP_MEM_CPU;
    /* model/export.c copies the parameters to the host for --dump-weights (rank 0, at the end) */
    int64_t extra = t->opts.dump_weights && t->world.rank == 0
                        ? (int64_t)ddp_model_count_params(&t->spec.model) * 4
                        : 0;
    /* evaluation's host rows, losses and token lists (evaluate/score.h) and its tasks' text */
    if (t->spec.n_eval > 0)
        extra += (int64_t)ddp_mc_scorer_bytes(t->spec.micro_batch, t->spec.seq_len);
    for (int i = 0; i < t->spec.n_eval; i++) extra += ddp_mc_task_bytes(t->spec.eval[i].path);
    if (ddp_mem_budget_plan(&t->spec, world, local_ranks(t, world), t->world.rank, where,
                            gpu_bytes(t), extra, &b))
        return 0; /* nothing to plan without a model (init_from resolves it first) */
    t->memory.budget = b.total;
    char text[2048], advice[1024];
    if (!t->opts.quiet || b.total > b.limit) {
        ddp_mem_budget_format(&b, text, sizeof text);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
            DDP_INFO("%s", line);
    }
    if (ddp_mem_budget_fits(&b, &t->spec, advice, sizeof advice)) return 0;
    return ddp_errinfo_set(ei, DDP_ESPEC, "memory budget: %s", advice);
}

/* This process's peak resident set in KiB: VmHWM of /proc/self/status, the high-water mark of
 * its own memory since exec, else ru_maxrss, which Linux carries across exec (under torchrun
 * it starts at the Python launcher's few hundred MiB); -1 when neither can be read. *what
 * names the one used. */
static long peak_rss_kib(const char **what)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    *what = "VmHWM";
    if (kib >= 0) return kib;
    struct rusage ru;
    *what = "ru_maxrss";
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

void ddp_trainer_log_peak_memory(const ddp_trainer_t *t)
{
    const char *what;
    long kib = peak_rss_kib(&what);
    if (kib < 0 || t->opts.quiet) return;
    char peak[32], plan[32];
    DDP_INFO("peak RSS %s (%s %ld KiB); the memory budget said %s (%lld KiB)",
             ddp_mem_fmt((int64_t)kib * 1024, peak, sizeof peak), what, kib,
             ddp_mem_fmt(t->memory.budget, plan, sizeof plan),
             (long long)(t->memory.budget / 1024));
}

void ddp_trainer_log_moments(const ddp_trainer_t *t)
{
    if (ddp_k_gpu_memory(&t->k) || t->opts.quiet) return; /* mincore() cannot see a GPU's */
    size_t bytes = t->opt.n * sizeof(float);
    long long m = ddp_mem_resident(t->opt.m, bytes), v = ddp_mem_resident(t->opt.v, bytes);
    char res[32], all[32];
    if (m >= 0 && v >= 0)
        DDP_INFO("optimizer moments resident after step %ld: %s of %s (%lld KiB)%s", t->pos.step,
                 ddp_mem_fmt(m + v, res, sizeof res),
                 ddp_mem_fmt(2 * (int64_t)bytes, all, sizeof all), (m + v) / 1024,
                 t->zero1.on ? ", sharded: this rank's slices" : "");
}
