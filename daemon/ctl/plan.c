/* `ddpctl plan` (see ctl.h): the worker's own budget code (worker/memory_budget.c), run
 * here on the spec file, so the two always print the same figures. */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/ctl/ctl.h"
#include "kernels/kernels.h"
#include "proto/hf_config.h"
#include "proto/spec.h"
#include "worker/budget/memory_budget.h"

int ddpctl_plan(int argc, char **argv)
{
    static const struct option o[] = {{"workers", required_argument, 0, 'w'},
                                      {"local", required_argument, 0, 'l'},
                                      {"gpu", required_argument, 0, 'g'},
                                      {0, 0, 0, 0}};
    int c, workers = 0, local = 0;
    int64_t gpu = 0; /* bytes of each rank's GPU; 0 = the ranks run on the CPU */
    optind = 0;
    while ((c = getopt_long(argc, argv, "w:l:g:", o, NULL)) != -1) {
        if (c == 'w') workers = atoi(optarg);
        else if (c == 'l') local = atoi(optarg);
        else if (c == 'g' && ddp_spec_parse_bytes(optarg, &gpu) == 0 && gpu > 0) continue;
        else return CTL_USAGE;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "ddpctl: plan needs exactly one spec file\n");
        return CTL_USAGE;
    }
    const char *path = argv[optind];
    ddp_spec_t spec;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    char msg[1024];
    int rc = ddp_spec_load(&spec, path, &ei);
    if (rc == 0) rc = ddp_spec_resolve_model(&spec, &ei); /* model.init_from's config.json */
    if (rc) {
        fprintf(stderr, "ddpctl: %s\n", ei.msg[0] ? ddp_spec_errstr(&ei, path, msg, sizeof msg)
                                                  : ddp_strerror(rc));
        return CTL_USAGE;
    }
    if (workers < 1) workers = spec.workers;
    if (local < 1 || local > workers) local = workers;
    ddp_mem_budget_t b, rest;
    const char *why;
    /* the CPU backend as it would run on this machine (auto: bf16 where it is native) */
    int where = gpu > 0                      ? DDP_MEM_GPU
                : ddp_kernels_cpu_bf16(&why) ? DDP_MEM_CPU_BF16
                                             : DDP_MEM_CPU;
    if (ddp_mem_budget_plan(&spec, workers, local, 0, where, gpu, 0, &b)) {
        fprintf(stderr, "ddpctl: %s: no model to plan for\n", path);
        return CTL_USAGE;
    }
    char text[2048], advice[1024], tot[32];
    printf("%s\n", ddp_mem_budget_format(&b, text, sizeof text));
    /* the first rank after the writers stands for all of them (the budget differs by role) */
    int writers = spec.writers < workers ? spec.writers : workers;
    if (b.writer && writers < workers &&
        ddp_mem_budget_plan(&spec, workers, local, writers, where, gpu, 0, &rest) == 0 &&
        rest.total != b.total) {
        char who[64];
        if (workers - writers > 1)
            snprintf(who, sizeof who, "ranks %d-%d write", writers, workers - 1);
        else
            snprintf(who, sizeof who, "rank %d writes", writers);
        printf("%s no checkpoint shard: total %s%s\n", who,
               ddp_mem_fmt(rest.total, tot, sizeof tot), workers - writers > 1 ? " each" : "");
    }
    if (ddp_mem_budget_fits(&b, &spec, advice, sizeof advice)) return CTL_OK;
    printf("does not fit: %s\n", advice);
    return CTL_JOB_FAILED;
}
