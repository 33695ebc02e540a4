/* ddp-worker: the trainer process. Reads a job spec, trains, reports, checkpoints.
 *
 *   ddp-worker [options] JOB.yaml
 *   ddp-worker --selftest
 *   ddp-worker --spec-reference
 *
 * Exit codes: 0 done, 1 training error, 2 bad usage or spec, 143 stopped by SIGTERM/SIGINT
 * after finishing the current step (and saving a checkpoint when checkpoint.dir is set).
 * With checkpoint.dir, a run resumes from the newest verified checkpoint there.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "collectives/flight.h"
#include "common/alloc.h"
#include "common/file.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "kernels/kernels.h"
#include "proto/spec.h"
#include "worker/model/export.h"
#include "worker/trainer.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* OpenBLAS's runtime CPU detection falls back to its generic SSE3 ("Prescott") kernels on
 * processors it does not know, such as virtual Xeons that do have AVX2 or AVX-512; its sgemm is
 * then 2-4x slower. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so when the user has
 * not chosen, this process re-executes itself once with the widest kernels the CPU runs:
 * AVX-512's (SkylakeX; Cooperlake with AVX512_BF16) or AVX2's (Haswell). Measured on a 2-vCPU
 * Sapphire Rapids Xeon that OpenBLAS 0.3.21 calls Prescott, sgemm 1024 x 768 x 2304 on one
 * thread: Prescott 29, Haswell 62, SkylakeX 108, Cooperlake 110 GFLOP/s. */
char *openblas_get_corename(void);

static const char *widest_blas_core(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

static void prefer_fast_blas(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename(), *widest = widest_blas_core();
    if (!core || strcmp(core, "Prescott") != 0 || !widest) return;
    setenv("OPENBLAS_CORETYPE", widest, 1);
    execv("/proc/self/exe", argv);
    DDP_DEBUG("re-executing with OPENBLAS_CORETYPE=%s failed; keeping OpenBLAS's choice", widest);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ddp-worker [options] JOB.yaml\n"
            "       ddp-worker --selftest\n"
            "       ddp-worker --spec-reference\n"
            "       ddp-worker --eval TASK.jsonl --init-from DIR [--eval-limit N]\n"
            "                  [--eval-delimiter STR] [--eval-details FILE]\n"
            "\n"
            "Trains the GPT-2 described by JOB.yaml (YAML or JSON).\n"
            "\n"
            "options:\n"
            "  --set KEY=VALUE     override a spec field, e.g. --set train.steps=20 or --set\n"
            "                      'eval=[{\"name\":\"hs\",\"path\":\"hs.jsonl\"}]' (repeatable;\n"
            "                      VALUE is read as JSON when it parses, else as a string)\n"
            "  --run-dir DIR       write metrics.jsonl there (default: $DDP_RUN_DIR)\n"
            "  --backend NAME      kernel backend: auto (default), cpu, cuda, sim (tests)\n"
            "  --dump-weights FILE write the final parameters as a safetensors file (HF names)\n"
            "  --resume-step N     resume from checkpoint step N of checkpoint.dir (default: the\n"
            "                      newest one that verifies, when there is one)\n"
            "  --no-resume         start at step 0 even when checkpoint.dir holds checkpoints\n"
            "  --stop-at-step N    stop after step N (saving a checkpoint), as if interrupted\n"
            "  --quiet             no per-step lines\n"
            "  --print-spec        print the validated spec (defaults filled in) as JSON, exit\n"
            "  --selftest          compare every kernel backend present with the CPU one\n"
            "  --eval TASK.jsonl   score a multiple-choice task (HellaSwag rows or {context,\n"
            "                      choices, label}) with the model in --init-from DIR (a checkpoint\n"
            "                      or a Hugging Face directory; its tokenizer.json), print the\n"
            "                      scores as a JSON line and a line of text, exit (CPU)\n"
            "  --eval-limit N      score only the first N rows\n"
            "  --eval-delimiter STR  put STR between the context and each choice (default \" \",\n"
            "                      the harness's target_delimiter; at most 15 bytes)\n"
            "  --eval-details FILE each example's log-likelihoods there, a JSON line each\n"
            "  --spec-reference    print the reference of every spec field (docs/spec.md) as\n"
            "                      Markdown, exit\n"
            "  --help, --version\n");
}

/* The first of the variables `names` that is set, or NULL. */
static const char *first_env(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v) return v;
    }
    return NULL;
}

/* An integer variable in [lo, hi]: 0 and *out set (unset: dflt), or -1 with a message. */
static int env_long(const char *name, long lo, long hi, long dflt, long *out)
{
    const char *s = getenv(name);
    *out = dflt;
    if (!s || !*s) return 0;
    char *end;
    long x = strtol(s, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "ddp-worker: %s='%s' is not an integer in [%ld, %ld]\n", name, s, lo,
                hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* The world from the launcher's variables. ddpd's own (deploy/launch-local.sh, ddpd, Slurm):
 * DDP_WORLD_SIZE, DDP_RANK, DDP_RDZV, DDP_JOB_TOKEN, DDP_GENERATION. Without DDP_WORLD_SIZE,
 * the PyTorch convention that `torchrun --no-python`, Kubeflow's PyTorchJob and similar set:
 * WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Rank 0 listens on
 * MASTER_PORT, or on MASTER_PORT + 1 when torchrun's agent already serves its own store there
 * (TORCHELASTIC_USE_AGENT_STORE=True). The job token, which every rank's hello must carry, is
 * DDP_JOB_TOKEN, else torchrun's TORCHELASTIC_RUN_ID, else "torch:MASTER_ADDR:MASTER_PORT":
 * without DDP_JOB_TOKEN, a process that can reach the port and knows the launch's run id (or
 * address) can join as a rank, as it can join torch.distributed's own store. Returns 0 or -1
 * (a message printed). */
static int read_world(ddp_train_env_t *env)
{
    long size = 0, rank = 0, gen = 0, port = 0, lw = 0, lr = 0;
    if (getenv("DDP_WORLD_SIZE")) {
        if (env_long("DDP_WORLD_SIZE", 1, 1 << 20, 1, &size) ||
            env_long("DDP_RANK", 0, size - 1, 0, &rank) ||
            env_long("DDP_GENERATION", 0, 1L << 62, 0, &gen))
            return -1;
        env->launcher = "ddpd";
        env->rdzv = getenv("DDP_RDZV");
        env->job_token = getenv("DDP_JOB_TOKEN");
        if (size > 1 && !getenv("DDP_RANK")) {
            fprintf(stderr, "ddp-worker: DDP_WORLD_SIZE=%ld but DDP_RANK is not set\n", size);
            return -1;
        }
    } else if (getenv("WORLD_SIZE") && getenv("RANK")) {
        const char *addr = getenv("MASTER_ADDR"), *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        if (env_long("WORLD_SIZE", 1, 1 << 20, 1, &size) ||
            env_long("RANK", 0, size - 1, 0, &rank) ||
            env_long("MASTER_PORT", 1, 65534, 0, &port) ||
            env_long("LOCAL_RANK", 0, 1 << 20, -1, &lr) ||
            env_long("LOCAL_WORLD_SIZE", 1, 1 << 20, 0, &lw))
            return -1;
        env->launcher = "torchrun";
        if (size > 1 && (!addr || !*addr || port == 0)) {
            fprintf(stderr, "ddp-worker: WORLD_SIZE=%ld (the torchrun convention) needs "
                            "MASTER_ADDR and MASTER_PORT\n", size);
            return -1;
        }
        if (agent && !strcasecmp(agent, "true")) port++;
        snprintf(env->rdzv_buf, sizeof env->rdzv_buf, "%s:%ld", addr ? addr : "", port);
        env->rdzv = env->rdzv_buf;
        const char *run_id = getenv("TORCHELASTIC_RUN_ID");
        if ((env->job_token = getenv("DDP_JOB_TOKEN")) == NULL) {
            if (run_id && *run_id)
                snprintf(env->token_buf, sizeof env->token_buf, "torchrun:%.200s", run_id);
            else
                snprintf(env->token_buf, sizeof env->token_buf, "torch:%s", env->rdzv_buf);
            env->job_token = env->token_buf;
        }
        if (lr >= 0) env->local_rank = (int)lr;
        if (lw > 0) env->local_world = (int)lw;
    }
    env->world_size = (int)size;
    env->rank = (int)rank;
    env->generation = gen;
    return 0;
}

/* The test hooks' variables (common/test_hook.h), read once here for every module of this
 * process that has a hook: the trainer, the checkpoint writer, the ring. */
static void read_test_hooks(ddp_test_hooks_t *h)
{
    const char *v;
    memset(h, 0, sizeof *h);
    if ((v = getenv("DDP_TEST_NAN_STEP"))) h->nan_step = atol(v);
    if ((v = getenv("DDP_TEST_SLOW_RANK")) && strchr(v, ':')) { /* "R:US" */
        h->slow_rank = atoi(v);
        h->slow_us = atol(strchr(v, ':') + 1);
    }
    if ((v = getenv("DDP_TEST_OVERFLOW")) && strchr(v, ':')) { /* "S:R" */
        h->overflow_step = atol(v);
        h->overflow_rank = atoi(strchr(v, ':') + 1);
    }
    if ((v = getenv("DDP_TEST_LOSS_SPIKE")) && strchr(v, ':')) { /* "S:R" */
        h->loss_spike_step = atol(v);
        h->loss_spike_rank = atoi(strchr(v, ':') + 1);
    }
    if ((v = getenv("DDP_TEST_NORM_SPIKE"))) h->norm_spike_step = atol(v);
    if ((v = getenv("DDP_TEST_HANG")) && strchr(v, ':')) { /* "S:R" */
        h->hang_step = atol(v);
        h->hang_rank = atoi(strchr(v, ':') + 1);
    }
    if ((v = getenv("DDP_TEST_EVAL_HANG")) && strchr(v, ':')) { /* "S:R" */
        h->eval_hang_step = atol(v);
        h->eval_hang_rank = atoi(strchr(v, ':') + 1);
    }
    if ((v = getenv("DDP_TEST_REPLICA_FLIP_RANK"))) {
        h->flip = 1;
        h->flip_rank = atoi(v);
    }
    if ((v = getenv("DDP_TEST_CKPT_SHARD_DELAY_MS"))) h->ckpt_shard_delay_ms = atol(v);
    if ((v = getenv("DDP_COLL_DELAY_US")) && *v) h->ring_send_delay_us = atoi(v);
    if ((v = getenv("DDP_TEST_HOST_OF_RANK")))
        snprintf(h->host_of_rank, sizeof h->host_of_rank, "%s", v);
}

/* Everything the trainer takes from the environment, read once here beside the spec (the
 * trainer itself reads none), and the test hooks, installed for the whole process. Returns 0 or
 * -1 (a message printed). */
static int read_env(ddp_train_env_t *env)
{
    static const char *const local_rank[] = {"DDP_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "SLURM_LOCALID", NULL};
    static const char *const local_world[] = {"DDP_LOCAL_WORLD_SIZE",
                                              "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    const char *v;
    memset(env, 0, sizeof *env);
    if ((v = first_env(local_rank))) env->local_rank = atoi(v);
    if ((v = first_env(local_world))) env->local_world = atoi(v);
    env->elastic = (v = getenv("DDP_ELASTIC")) && strcmp(v, "1") == 0;
    if (!env->elastic && read_world(env)) return -1;
    if (env->elastic) {
        env->rdzv = getenv("DDP_RDZV");
        env->job_token = getenv("DDP_JOB_TOKEN");
    }
    if ((v = getenv("DDP_RANK"))) env->rank_hint = atoi(v);
    if ((v = getenv("DDP_RDZV_TIMEOUT_S"))) env->rdzv_timeout_s = atof(v);
    ddp_test_hooks_t hooks;
    read_test_hooks(&hooks);
    ddp_test_hooks_set(&hooks);
    return 0;
}

/* The flight recorder (collectives/flight.h): DDP_FLIGHT_RECORDER_SIZE records (default 64, 0
 * off), dumps to RUN_DIR/flight/rank-R.json on a collective timeout, on SIGUSR2 (ddpctl dump), on
 * a fatal signal, and when the elastic coordinator asks. Returns 0 or -1 (a message printed). */
static int start_flight_recorder(const ddp_train_opts_t *opts)
{
    const char *v = getenv("DDP_FLIGHT_RECORDER_SIZE");
    char *end = NULL;
    long n = v && *v ? strtol(v, &end, 10) : -1;
    if (v && *v && (*end || n < 0 || n > 1000000)) {
        fprintf(stderr, "ddp-worker: DDP_FLIGHT_RECORDER_SIZE: expected a count of records from 0 "
                "to 1000000, got '%s'\n", v);
        return -1;
    }
    ddp_flight_cfg_t cfg = {.records = (int)n, .run_dir = opts->run_dir,
                            .rank = opts->env.elastic ? opts->env.rank_hint : opts->env.rank};
    int rc = ddp_flight_setup(&cfg);
    if (rc) /* no file is no reason to stop training: the log says where it would have gone */
        DDP_WARN("flight recorder: cannot create %s/flight: %s", opts->run_dir, ddp_strerror(rc));
    if (n == 0) return 0;
    ddp_flight_catch_fatal();
    rc = ddp_flight_listen_sigusr2();
    if (rc) DDP_WARN("flight recorder: no SIGUSR2 dumps: %s", ddp_strerror(rc));
    return 0;
}

/* The caps on what this process writes (its log, metrics.jsonl, TensorBoard): per file the
 * smaller of the spec's limits.* and the daemon's per-user limit, which ddpd passes as
 * DDP_LIMIT_LOG_BYTES, DDP_LIMIT_METRICS_BYTES and DDP_LIMIT_TENSORBOARD_BYTES (decimal bytes);
 * 0 or unset on either side sets no cap. Under mpirun or Slurm there is no daemon and the spec
 * alone decides. Read here, once; the worker writes these files itself (the daemon does not
 * relay them, which lets it adopt running workers across its restarts), so it caps them. Installs
 * the caps (common/log.h, observe/metrics_sink.h) and returns 0, or -1 for a variable that is not
 * a decimal byte count (a message printed). */
static int apply_limits(const ddp_spec_t *spec)
{
    static const struct {
        const char *env, *field;
    } L[3] = {
        {"DDP_LIMIT_LOG_BYTES", "limits.log_bytes"},
        {"DDP_LIMIT_METRICS_BYTES", "limits.metrics_bytes"},
        {"DDP_LIMIT_TENSORBOARD_BYTES", "limits.tensorboard_bytes"},
    };
    uint64_t cap[3] = {(uint64_t)spec->log_bytes, (uint64_t)spec->metrics_bytes,
                       (uint64_t)spec->tensorboard_bytes}; /* each >= 0: the spec checked */
    char from[3][96];
    for (int i = 0; i < 3; i++) {
        snprintf(from[i], sizeof from[i], "%s", L[i].field);
        const char *v = getenv(L[i].env);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno || x > INT64_MAX) {
            fprintf(stderr, "ddp-worker: %s='%s' is not a byte count (decimal digits; 0 or unset "
                            "= no cap)\n", L[i].env, v);
            return -1;
        }
        if (x && (!cap[i] || x < cap[i])) {
            cap[i] = x;
            snprintf(from[i], sizeof from[i], "the daemon's per-user limit, %s", L[i].env);
        }
    }
    ddp_metrics_caps_t mc = {.metrics_bytes = cap[1], .tensorboard_bytes = cap[2]};
    snprintf(mc.metrics_from, sizeof mc.metrics_from, "%s", from[1]);
    snprintf(mc.tensorboard_from, sizeof mc.tensorboard_from, "%s", from[2]);
    ddp_metrics_sink_set_caps(&mc);
    if (cap[0]) ddp_log_set_limit(cap[0], from[0]); /* from here on, before other threads */
    return 0;
}

/* Applies "a.b=value" overrides to spec by a round trip through its JSON form, so an override
 * is validated exactly like the file it overrides. */
static int apply_overrides(ddp_spec_t *spec, char **sets, int n_sets, ddp_errinfo_t *ei)
{
    if (n_sets == 0) return 0;
    char *text = ddp_spec_to_json(spec);
    if (!text) return DDP_ENOMEM;
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    free(text);
    if (!root) return DDP_ENOMEM;
    int rc = 0;
    for (int i = 0; i < n_sets && rc == 0; i++) {
        char *eq = strchr(sets[i], '=');
        char *dot = strchr(sets[i], '.');
        if (dot && eq && dot > eq) dot = NULL;
        if (!eq || eq == sets[i]) {
            rc = ddp_errinfo_set(ei, DDP_ESPEC,
                                 "--set %s: expected SECTION.KEY=VALUE (or KEY=VALUE for a "
                                 "top-level field: name, eval)", sets[i]);
            break;
        }
        char section[64], key[64];
        snprintf(section, sizeof section, "%.*s", dot ? (int)(dot - sets[i]) : 0, sets[i]);
        snprintf(key, sizeof key, "%.*s", dot ? (int)(eq - dot - 1) : (int)(eq - sets[i]),
                 dot ? dot + 1 : sets[i]);
        json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, &jerr);
        if (!value) value = json_string(eq + 1);
        json_t *obj = dot ? json_object_get(root, section) : root;
        if (!obj) {
            obj = json_object();
            json_object_set_new(root, section, obj);
        }
        json_object_set_new(obj, key, value); /* the parse below refuses an unknown key */
    }
    if (rc == 0) {
        text = json_dumps(root, JSON_COMPACT);
        rc = text ? ddp_spec_parse(spec, text, strlen(text), "--set", ei) : DDP_ENOMEM;
        free(text);
    }
    json_decref(root);
    return rc;
}

static int worker_main(int argc, char **argv)
{
    enum { OPT_SET = 256, OPT_RUN_DIR, OPT_BACKEND, OPT_DUMP, OPT_QUIET, OPT_SELFTEST, OPT_VER,
           OPT_RESUME_STEP, OPT_NO_RESUME, OPT_STOP_AT, OPT_PRINT_SPEC, OPT_SPEC_REF, OPT_EVAL,
           OPT_INIT_FROM, OPT_EVAL_LIMIT, OPT_EVAL_DETAILS, OPT_EVAL_DELIM };
    static const struct option long_opts[] = {
        {"set", required_argument, NULL, OPT_SET},
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"dump-weights", required_argument, NULL, OPT_DUMP},
        {"quiet", no_argument, NULL, OPT_QUIET},
        {"resume-step", required_argument, NULL, OPT_RESUME_STEP},
        {"no-resume", no_argument, NULL, OPT_NO_RESUME},
        {"stop-at-step", required_argument, NULL, OPT_STOP_AT},
        {"selftest", no_argument, NULL, OPT_SELFTEST},
        {"print-spec", no_argument, NULL, OPT_PRINT_SPEC},
        {"spec-reference", no_argument, NULL, OPT_SPEC_REF},
        {"version", no_argument, NULL, OPT_VER},
        {"eval", required_argument, NULL, OPT_EVAL},
        {"init-from", required_argument, NULL, OPT_INIT_FROM},
        {"eval-limit", required_argument, NULL, OPT_EVAL_LIMIT},
        {"eval-details", required_argument, NULL, OPT_EVAL_DETAILS},
        {"eval-delimiter", required_argument, NULL, OPT_EVAL_DELIM},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    prefer_fast_blas(argv);
    ddp_file_raise_fd_limit(); /* a descriptor per token shard */
    ddp_train_opts_t opts = {.backend = "auto", .run_dir = getenv("DDP_RUN_DIR")};
    if (read_env(&opts.env)) return 2;
    char **sets = calloc((size_t)argc, sizeof *sets);
    int n_sets = 0, c, print_spec = 0;
    const char *eval_task = NULL, *init_from = NULL, *eval_details = NULL; /* --eval */
    const char *eval_delim = " ";
    long eval_limit = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_SET: sets[n_sets++] = optarg; break;
        case OPT_RUN_DIR: opts.run_dir = optarg; break;
        case OPT_BACKEND: opts.backend = optarg; break;
        case OPT_DUMP: opts.dump_weights = optarg; break;
        case OPT_QUIET: opts.quiet = 1; break;
        case OPT_RESUME_STEP: {
            char *end = NULL;
            opts.resume_step = strtol(optarg, &end, 10);
            if (!*optarg || *end || opts.resume_step <= 0) {
                fprintf(stderr, "ddp-worker: --resume-step: expected a step >= 1, got '%s'\n",
                        optarg);
                free(sets);
                return 2;
            }
            break;
        }
        case OPT_NO_RESUME: opts.no_resume = 1; break;
        case OPT_STOP_AT: opts.stop_at_step = atol(optarg); break;
        case OPT_PRINT_SPEC: print_spec = 1; break;
        case OPT_EVAL: eval_task = optarg; break;
        case OPT_INIT_FROM: init_from = optarg; break;
        case OPT_EVAL_LIMIT: eval_limit = atol(optarg); break;
        case OPT_EVAL_DETAILS: eval_details = optarg; break;
        case OPT_EVAL_DELIM: eval_delim = optarg; break;
        case OPT_SELFTEST: free(sets); return ddp_kernels_selftest();
        case OPT_SPEC_REF: {
            int rc = ddp_spec_reference(stdout);
            if (rc) fprintf(stderr, "ddp-worker: --spec-reference: %s\n", ddp_strerror(rc));
            free(sets);
            return rc ? 1 : 0;
        }
        case OPT_VER: printf("ddp-worker 0.1.0\n"); free(sets); return 0;
        case 'h': usage(stdout); free(sets); return 0;
        default: usage(stderr); free(sets); return 2;
        }
    }
    if (eval_task) { /* the scorer alone on a checkpoint (worker/evaluate.c) */
        free(sets);
        if (!init_from || optind != argc) {
            fprintf(stderr, "ddp-worker: --eval needs --init-from DIR and no job spec\n");
            return 2;
        }
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        char msg[1024];
        FILE *details = eval_details ? fopen(eval_details, "we") : NULL;
        if (eval_details && !details) {
            fprintf(stderr, "ddp-worker: --eval-details %s: %s\n", eval_details, strerror(errno));
            return 1;
        }
        int rc = ddp_trainer_eval_checkpoint(eval_task, init_from, eval_limit, eval_delim,
                                             strcmp(opts.backend, "auto") ? opts.backend : "cpu",
                                             stdout, details, &ei);
        if (details && fclose(details) != 0 && rc == 0) rc = -errno;
        if (rc) {
            if (!ei.msg[0]) ddp_errinfo_set(&ei, rc, "%s", ddp_strerror(rc));
            fprintf(stderr, "ddp-worker: --eval: %s\n", ddp_errinfo_str(&ei, msg, sizeof msg));
        }
        int bad = rc == DDP_EFORMAT || rc == DDP_ESPEC || rc == DDP_EINVAL || (rc < 0 && rc > -1000);
        return rc == 0 ? 0 : bad ? 2 : 1; /* 2: a task or model that cannot be read or used */
    }
    if (optind != argc - 1) {
        usage(stderr);
        free(sets);
        return 2;
    }

    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    char msg[1024];
    ddp_spec_t spec;
    int rc = ddp_spec_load(&spec, argv[optind], &ei);
    const char *origin = argv[optind];
    if (rc == 0) {
        rc = apply_overrides(&spec, sets, n_sets, &ei);
        origin = "--set";
        ei.line = ei.column = 0; /* a position in the re-serialised spec would mislead */
    }
    free(sets);
    if (rc) {
        fprintf(stderr, "ddp-worker: %s\n",
                ei.msg[0] ? ddp_spec_errstr(&ei, origin, msg, sizeof msg) : ddp_strerror(rc));
        return 2;
    }

    if (print_spec) {
        char *text = ddp_spec_to_json(&spec);
        if (!text) return 1;
        printf("%s\n", text);
        free(text);
        return 0;
    }

    if (apply_limits(&spec)) return 2;

    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (start_flight_recorder(&opts)) return 2;

    ddp_trainer_t t;
    rc = ddp_trainer_init(&t, &spec, &opts, &ei);
    if (rc == DDP_ECLOSED) { /* elastic: a restarted rank that came after the last step */
        fprintf(stderr, "ddp-worker: %s\n", ei.msg);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "ddp-worker: %s\n", ddp_errinfo_str(&ei, msg, sizeof msg));
        return rc == DDP_ESPEC ? 2 : 1;
    }
    rc = ddp_trainer_run(&t, &stop_requested, &ei);
    if (rc == 0 && opts.dump_weights && t.world.rank == 0)
        rc = ddp_model_export(&t.model, opts.dump_weights, &ei);
    if (rc == 0 && !t.stop.any && t.world.rank == 0 && spec.sample_tokens > 0) {
        printf("--- sample (%d tokens) ---\n", spec.sample_tokens);
        rc = ddp_trainer_sample(&t, spec.sample_tokens, stdout);
        fflush(stdout);
        ddp_log_check_limit(); /* the sample went to fd 1, past ddp_log's count */
    }
    if (rc == 0) ddp_trainer_log_done(&t);
    if (rc) {
        if (!ei.msg[0]) ddp_errinfo_set(&ei, rc, "%s", ddp_strerror(rc));
        fprintf(stderr, "ddp-worker: %s\n", ddp_errinfo_str(&ei, msg, sizeof msg));
    }
    int stopped = t.stop.any;
    ddp_trainer_log_peak_memory(&t);
    ddp_trainer_close(&t);
    if (rc) return 1;
    return stopped ? 143 : 0;
}

/* A rank a daemon started records how it ended in <DDP_RUN_DIR>/rank-<DDP_RANK>.exit, "<pid>
 * <code>": a daemon that restarted meanwhile is not this process's parent and learns the exit
 * status only from there (daemon/spawn.h, ddpd_adopt_rank). */
static void record_exit(int code)
{
    const char *dir = getenv("DDP_RUN_DIR"), *rank = getenv("DDP_RANK");
    if (!dir || !rank || !getenv("DDP_JOB_TOKEN")) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%s.exit", dir, rank);
    FILE *f = fopen(path, "we");
    if (!f) return;
    fprintf(f, "%ld %d\n", (long)getpid(), code);
    fclose(f);
}

int main(int argc, char **argv)
{
    int code = worker_main(argc, argv);
    record_exit(code);
    return code;
}
