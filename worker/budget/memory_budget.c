/* One rank's memory budget (see memory_budget.h).
 *
 * Invariant: every figure here names the allocation it stands for, so that a change there is a
 * change here; tests/unit/worker/test_oom.sh holds the prediction to within 10% of the peak
 * RSS measured for three 1-rank shapes and for each rank of 2-rank runs with validation and
 * with checkpoints, and test_gpt2.c holds the activation count to the model's.
 */
#include "worker/budget/memory_budget.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "worker/model/model.h"

/* The process without its arenas, measured (peak RSS less the other lines, on x86-64 with
 * OpenBLAS 0.3: code and libraries, the kernels' and loader's threads, OpenBLAS's packing
 * buffers, the heap's slack): 8.2-9.1 MiB for gpt2-tiny at 1 and 2 ranks, 12 MiB for gpt2-mini,
 * whose larger products touch more of the packing buffers. Without MALLOC_PERTURB_, which
 * touches every page malloc hands out (meson test sets it: 2 MiB more for gpt2-tiny). */
#define RUNTIME_CPU ((int64_t)9 << 20)
/* kernels/cpu/bf16_gemm.c: oneDNN loaded for native bf16 products (its relocated library and
 * OpenMP runtime, the JIT kernels of a few dozen tile shapes, a scratchpad per thread):
 * measured beside fp32's runtime for gpt2-tiny at 1 and 2 ranks, 10-11 MiB on one machine and
 * 8-8.5 MiB on a 2-vCPU Xeon with AMX (2026-11-27, where 10 put a rank of test_oom.sh's
 * validation run 9.7-10.3% above its peak): the middle of the two. */
#define RUNTIME_DNNL ((int64_t)9 << 20)
/* A CUDA context and cuBLAS's workspace on the device (typical of CUDA 12-13 on an H100; on an
 * H200, fp32 runs of GPT-2 124M at 8 x 1024 and 2 x 256 peaked within 0.1% of the budget). */
#define RUNTIME_GPU ((int64_t)600 << 20)
/* kernels/cpu/matmul.c: the LM head's split-K partials (MM_KSPLIT_MIN, MM_KCHUNK,
 * MM_KSPLIT_BYTES) */
#define KSPLIT_MIN 8192
#define KCHUNK 4096
#define KSPLIT_BYTES ((int64_t)32 << 20)
/* kernels/cpu/attention.c: a row block of scores (ATT_ROWS rows) per thread, two in backward
 * and one more in a 16-bit run (P or dS rounded), with the heads' widened slices (8 T hs) */
#define ATT_ROWS 128
/* kernels/cuda/kcuda.cuh: cuBLASLt's workspace (DDP_CUDA_LT_WS) */
#define LT_WORKSPACE ((int64_t)32 << 20)
/* collectives/ring_setup.c: the ring's slots on a link (DDP__RING_NSLOTS x the default 512 KiB
 * chunk). On one host they are the shared-memory transport's segments, and what passes through
 * them is the initial weights' broadcast and small votes: at most the parameters touch them
 * (measured: 1.7 MiB for gpt2-tiny, 4 MiB for gpt2-mini); between hosts the TCP transport's
 * send and receive slots, both filled by the gradients. */
#define RING_SLOTS ((int64_t)8 * (512 << 10))
/* checkpoint/dio.c and checkpoint/checkpoint.c: the writer thread's own, beside the snapshot
 * (the O_DIRECT bounce buffer's touched part, its stack, io_uring's rings; measured 1.1-2.3 MiB) */
#define WRITER_IO ((int64_t)2 << 20)

const char *ddp_mem_fmt(int64_t bytes, char *buf, size_t len)
{
    double b = (double)bytes;
    if (bytes >= ((int64_t)1 << 30))
        snprintf(buf, len, "%.2f GiB", b / (1 << 30));
    else if (bytes >= ((int64_t)1 << 20))
        snprintf(buf, len, "%.1f MiB", b / (1 << 20));
    else if (bytes >= 1024)
        snprintf(buf, len, "%.1f KiB", b / 1024);
    else
        snprintf(buf, len, "%" PRId64 " B", bytes);
    return buf;
}

/* memory.max of this process's cgroup (v2), or -1 when none is set or readable. */
static int64_t cgroup_limit(void)
{
    char line[512], path[700];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    path[0] = '\0';
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
        }
    fclose(f);
    if (!path[0] || !(f = fopen(path, "r"))) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1; /* "max" */
    fclose(f);
    return v;
}

int64_t ddp_mem_host_limit(const char **from)
{
    int64_t ram = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE);
    int64_t cg = cgroup_limit();
    if (cg > 0 && cg < ram) {
        if (from) *from = "the cgroup's memory.max";
        return cg;
    }
    if (from) *from = "RAM";
    return ram;
}

int ddp_mem_threads(int local)
{
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (local < 1) local = 1;
    return cores / local > 0 ? cores / local : 1;
}

/* The activations' precision as far as their size goes (2 or 4 bytes an element). */
static ddp_kprec_t act_prec(const ddp_mem_budget_t *b)
{
    return b->act_bytes == 2 ? DDP_KPREC_BF16 : DDP_KPREC_FP32;
}

/* Bytes of the things that grow with the micro-batch, at B x T under recompute r. */
static int64_t batch_bytes(const ddp_mem_budget_t *b, const ddp_model_cfg_t *cfg, int B,
                           ddp_recompute_t r, int64_t *acts, int64_t *emb, int64_t *work)
{
    int64_t BT = (int64_t)B * b->T, C = cfg->n_embd, V = cfg->vocab_size;
    ddp_model_dims_t d = ddp_model_dims(cfg); /* QKV, FH (the MLP's first product), H */
    int64_t QKV = d.QKV, FH = d.FH, H = d.H;
    /* the global batch in tokens stays: B changes the micro-batches per step */
    int64_t tokens = (int64_t)b->n_micro * b->B * b->T;
    int64_t n_micro = tokens / BT > 0 ? tokens / BT : 1;
    *acts = (int64_t)ddp_model_acts_bytes(cfg, B, b->T, r, act_prec(b), b->on_gpu);
    /* sync/emb_slots.c: n_micro slots of B*T tokens and B*T*C gradient values, on every rank */
    *emb = n_micro * (BT + BT * C) * 4;
    int64_t w = 0, lm_rows = ddp_model_lm_rows(cfg, B, b->T, act_prec(b), b->on_gpu);
    if (!b->on_gpu) {
        /* the CPU kernels' one scratch buffer (grown, never shrunk): the larger of the split-K
         * partials and attention's score blocks */
        int64_t lowp = b->act_bytes == 2, hs = C / cfg->n_head;
        int64_t att =
            b->threads * 4 *
            ((2 + lowp) * (b->T < ATT_ROWS ? b->T : ATT_ROWS) * b->T + lowp * 8 * hs * b->T);
        int64_t part = 0;
        if (V >= KSPLIT_MIN) part = (V + KCHUNK - 1) / KCHUNK * lm_rows * C * 4;
        if (part > KSPLIT_BYTES) part = 0;
        /* 16-bit: each thread's fp32 tile of a product's output before its rounding, the
         * largest of the model's products' (forward, and backward's dinp) */
        int64_t tile = 0;
        if (b->act_bytes == 2) {
            const int64_t outs[][2] = {{BT, QKV},    {BT, FH},     {BT, H}, {BT, C},
                                       {lm_rows, V}, {lm_rows, C}, {B, V}};
            for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
                int64_t f = (int64_t)ddp_kernels_cpu_tile_floats((int)outs[i][0], (int)outs[i][1]);
                if (f * 4 * b->threads > tile) tile = f * 4 * b->threads;
            }
        }
        w += part > att ? part : att;
        if (tile > w) w = tile;
        w += 4 * BT * 4; /* data/loader.c: the loader's 2 x 2 token buffers */
    } else {
        /* the CUDA kernels' one scratch buffer (grown, never shrunk): the larger of the
         * attention general path's (fp32, or a head size the flash kernels do not take) scores
         * and their gradient, [B,NH,T,T] each, and the embedding backward's sorted tokens and
         * piece sums [BT, C] (kernels/cuda/attention.cu, encoder.cu) */
        int64_t att = b->flash ? 0 : 2 * (int64_t)B * cfg->n_head * b->T * b->T * 4;
        int64_t enc = BT * C * 4 + 3 * BT * 4;
        /* 16-bit: a biased product's fp32 result [BT, FH] at most (GPT-2's MLP; a Llama's
         * only biases are Qwen2's q/k/v), where cuBLASLt refuses the bias or GELU epilogue,
         * and GPT-2's fc proj input gradient [BT, FH] where it refuses DGELU
         * (kernels/cuda/matmul.cu's fallbacks); and cuBLASLt's workspace */
        int64_t biased = cfg->arch == DDP_ARCH_LLAMA ? (cfg->attention_bias ? QKV : 0) : FH;
        int64_t bias = b->act_bytes == 2 ? BT * biased * 4 : 0;
        int64_t most = att > enc ? att : enc;
        w += most > bias ? most : bias;
        /* a 16-bit run's general attention path: fp32 copies of qkv, out, dout and dqkv */
        if (!b->flash && b->act_bytes == 2) w += (2 * BT * QKV + 2 * BT * C) * 4;
        /* ... and, where K/V heads are shared, each query head's dK and dV before the group's
         * sum: 2 B NH T hs floats */
        if (!b->flash && d.NKV < d.NH) w += 2 * BT * C * 4;
        if (b->act_bytes == 2) w += LT_WORKSPACE;
    }
    /* kernels/cpu/lowp.c where the CPU emulates bf16/fp16: a product's two activation inputs
     * widened to fp32, the largest being the LM head's dout [lm_rows, V] (rows padded to
     * ddp_logits_ld(V)) or the MLP's [BT, FH] (a GPU, and native bf16, read the 16-bit ones in
     * place) */
    int64_t lm = lm_rows * ddp_logits_ld((int)V);
    int64_t widest = lm > BT * FH ? lm : BT * FH;
    if (b->lowp_bytes == 4) w += (widest + BT * FH) * 4;
    w += 3 * BT * 4; /* sync/emb_slots.c, model/model.c: token and loss staging on the host */
    *work = w;
    return *acts + *emb + w;
}

/* The ring's slots on the CPU (RING_SLOTS); none for one rank, nor on a GPU (NCCL's are in
 * its runtime share). */
static int64_t ring_bytes(const ddp_mem_budget_t *b)
{
    if (b->world < 2 || b->on_gpu) return 0;
    if (!b->shared) return 2 * RING_SLOTS;
    return b->params < RING_SLOTS ? b->params : RING_SLOTS;
}

/* Everything but the batch's share, at accumulation `accum`. */
static int64_t fixed_bytes(const ddp_mem_budget_t *b, int accum)
{
    return b->params + b->grads + b->moments + (accum > 1 ? b->params : 0) + b->runtime +
           ring_bytes(b) + b->extra + b->peers + b->checkpoint;
}

/* Total at micro-batch B (the same global batch: more accumulation as B shrinks). */
static int64_t total_at(const ddp_mem_budget_t *b, const ddp_model_cfg_t *cfg, int B,
                        ddp_recompute_t r)
{
    int64_t acts, emb, work;
    int64_t tokens = (int64_t)b->n_micro * b->B * b->T, per = (int64_t)B * b->T;
    int n_micro = (int)(tokens / per > 0 ? tokens / per : 1);
    int accum = (n_micro + b->world - 1) / b->world;
    return fixed_bytes(b, accum) + batch_bytes(b, cfg, B, r, &acts, &emb, &work);
}

/* The largest micro-batch that divides the global batch (over the ranks) and fits. Every
 * divisor is tried: the total is not monotonic in B (the accumulation buffer goes away where
 * one micro-step per rank remains). */
static int largest_fit(const ddp_mem_budget_t *b, const ddp_model_cfg_t *cfg, ddp_recompute_t r)
{
    int64_t seqs = (int64_t)b->n_micro * b->B; /* sequences per step, all ranks */
    int best = 0;
    for (int64_t B = 1; B <= seqs && B <= (1 << 20); B++)
        if (seqs % (B * b->world) == 0 && total_at(b, cfg, (int)B, r) <= b->limit) best = (int)B;
    return best;
}

/* A save's share of one rank (saving/saving.c): the moments gathered whole, and on a writing
 * rank of the CPU its snapshot and what its live save reads (a GPU's snapshot is host memory,
 * outside a device budget). */
static int64_t checkpoint_bytes(const ddp_mem_budget_t *b)
{
    /* the gather (optim/zero1.c, before each save) brings the other ranks' slices of both
     * moments (2P - 2P/W; a GPU commits them from the start when there are checkpoints): into
     * this rank's own arenas between hosts; on one host the all-gather copies
     * this rank's slices into every other rank's arenas, whose pages it maps as it writes them,
     * the same amount. Either way they stay resident: shared arenas give no pages back, and a
     * rank's own are given back only after the next update. */
    int64_t gathered = b->zero1 ? 2 * b->params - b->moments : 0;
    if (!b->writer || b->on_gpu) return gathered;
    /* ddp_ckpt_saver_reserve (open_saver) touches a snapshot of the whole stream, parameters and
     * both moments, on every writing rank, however few of the checkpoint shards it writes; then the
     * live save reads (and io_uring registers) this rank's arenas whole: on one host the slices
     * that the others' all-gather wrote into its moments join its resident set only then */
    int64_t snapshot = 3 * b->params + WRITER_IO;
    return gathered + snapshot + (b->shared ? gathered : 0);
}

int ddp_mem_budget_plan(const ddp_spec_t *s, int world, int local, int rank, int where,
                        int64_t device_bytes, int64_t extra, ddp_mem_budget_t *b)
{
    int on_gpu = where == DDP_MEM_GPU, native = where != DDP_MEM_CPU;
    memset(b, 0, sizeof *b);
    const ddp_model_cfg_t *cfg = &s->model;
    if (cfg->n_layer < 1 || cfg->n_embd < 1 || s->seq_len < 1 || s->micro_batch < 1)
        return DDP_EINVAL;
    if (world < 1) world = 1;
    if (local < 1) local = 1;
    if (rank < 0 || rank >= world) rank = 0;
    b->world = world;
    b->rank = rank;
    b->B = s->micro_batch;
    b->T = s->seq_len;
    b->on_gpu = on_gpu;
    b->recompute = s->recompute;
    long per = (long)b->B * b->T;
    long gbt = s->global_batch_tokens ? s->global_batch_tokens : per * world;
    b->n_micro = gbt / per > 0 ? (int)(gbt / per) : 1;
    b->accum = (b->n_micro + world - 1) / world;
    /* worker/setup.c alloc_arenas: the optimizer step is split over the ring (any transport)
     * on the CPU and over NCCL on a GPU (optim/zero1.c); not over MPI, nor in an elastic job
     * (restart: on-failure) */
    b->zero1 = s->shard_optimizer && world > 1 && strcmp(s->backend, "mpi") != 0 &&
               strcmp(s->restart, "on-failure") != 0;
    /* collectives/shm_direct.c: a ring whose ranks are all on this host shares its collective
     * memory (the gradient and embedding arenas; under ZeRO-1, the parameters' and moments' too) */
    b->shared = world > 1 && local >= world && !on_gpu && strcmp(s->backend, "mpi") != 0;
    int writers = s->writers < world ? s->writers : world;
    b->writer = s->ckpt_dir[0] && rank < (writers > 0 ? writers : 1);

    b->n_params = (int64_t)ddp_model_count_params(cfg);
    /* ddp.grad_dtype bf16 needs no staging: each bucket is narrowed in place, in its own
     * memory (sync/grad_dtype.h); on a GPU through a host scratch of the largest bucket, host
     * memory, not the device's */
    b->params = b->grads = b->n_params * 4;
    b->moments = 2 * b->params / (b->zero1 ? world : 1);
    b->accum_buf = b->accum > 1 ? b->params : 0;
    b->runtime = on_gpu ? RUNTIME_GPU : RUNTIME_CPU;
    b->extra = extra > 0 ? extra : 0;
    /* bf16/fp16 (kernels' set_precision): 16-bit activations, and the matrix weights' converted
     * copies, kept per step: 16-bit on a GPU and for native bf16 on a CPU, rounded fp32 where
     * the CPU emulates (fp16 on every CPU); auto is bf16 where it is native */
    int bf16 = s->precision == DDP_PREC_BF16 || (s->precision == DDP_PREC_AUTO && native);
    int lowp = bf16 || s->precision == DDP_PREC_FP16;
    b->lowp_bytes = !lowp ? 0 : on_gpu || (native && bf16) ? 2 : 4;
    b->act_bytes = lowp ? 2 : 4;
    /* kernels/cuda/flash_attention.cu: 16-bit runs at head sizes 32, 64, 128 */
    int hs = cfg->n_head > 0 ? cfg->n_embd / cfg->n_head : 0;
    b->flash = on_gpu && lowp && (hs == 32 || hs == 64 || hs == 128);
    b->threads = s->threads > 0 ? s->threads : ddp_mem_threads(local);
    b->extra += b->params / 4 * b->lowp_bytes;
    if (where == DDP_MEM_CPU_BF16 && bf16) b->runtime += RUNTIME_DNNL;
    b->checkpoint = s->ckpt_dir[0] ? checkpoint_bytes(b) : 0;
    int64_t work;
    batch_bytes(b, cfg, b->B, s->recompute, &b->acts, &b->emb, &work);
    /* shared: rank r reduces slice r of every rank's gradients and embedding slots and writes
     * the sum back into each, and (ZeRO-1) copies its slice of the updated parameters into
     * each: (W - 1) / W of every such arena of the others is mapped here */
    if (b->shared)
        b->peers = (b->grads + b->emb + (b->zero1 ? b->params : 0)) * (world - 1) / world;
    b->acts_none =
        (int64_t)ddp_model_acts_bytes(cfg, b->B, b->T, DDP_RECOMPUTE_NONE, act_prec(b), b->on_gpu);
    b->acts_block =
        (int64_t)ddp_model_acts_bytes(cfg, b->B, b->T, DDP_RECOMPUTE_BLOCK, act_prec(b), b->on_gpu);
    b->workspace = work + ring_bytes(b) + b->extra;
    b->total = total_at(b, cfg, b->B, s->recompute);

    const char *from = "train.memory_limit";
    if (s->memory_limit > 0) {
        b->limit = s->memory_limit;
    } else if (on_gpu && device_bytes > 0) {
        b->limit = device_bytes;
        from = "the GPU's memory";
    } else {
        b->limit = ddp_mem_host_limit(&from) / local;
    }
    snprintf(b->limit_from, sizeof b->limit_from, "%s%s", from,
             s->memory_limit <= 0 && !on_gpu && local > 1 ? " / local ranks" : "");
    b->max_B = largest_fit(b, cfg, s->recompute);
    b->max_B_block = largest_fit(b, cfg, DDP_RECOMPUTE_BLOCK);
    return 0;
}

const char *ddp_mem_budget_format(const ddp_mem_budget_t *b, char *buf, size_t len)
{
    char p[32], g[32], mo[32], ac[32], em[32], an[32], ab[32], ws[32], rt[32], tot[32], lim[32];
    char ck[32], pe[32];
    ddp_mem_fmt(b->checkpoint, ck, sizeof ck);
    ddp_mem_fmt(b->peers, pe, sizeof pe);
    ddp_mem_fmt(b->params, p, sizeof p);
    ddp_mem_fmt(b->grads, g, sizeof g);
    ddp_mem_fmt(b->moments, mo, sizeof mo);
    ddp_mem_fmt(b->accum_buf, ac, sizeof ac);
    ddp_mem_fmt(b->emb, em, sizeof em);
    ddp_mem_fmt(b->acts_none, an, sizeof an);
    ddp_mem_fmt(b->acts_block, ab, sizeof ab);
    ddp_mem_fmt(b->workspace, ws, sizeof ws);
    ddp_mem_fmt(b->runtime, rt, sizeof rt);
    ddp_mem_fmt(b->total, tot, sizeof tot);
    ddp_mem_fmt(b->limit, lim, sizeof lim);
    snprintf(buf, len,
             "memory budget of rank %d (%s, %d rank(s), micro-batch %d x %d, %d micro-step(s)):\n"
             "  parameters        %12s  (%.2fM fp32)\n"
             "  gradients         %12s\n"
             "  moments           %12s  (AdamW m and v%s)\n"
             "  accumulation      %12s\n"
             "  embedding grads   %12s\n"
             "  activations       %12s  recompute none%s; block: %s%s\n"
             "  workspaces        %12s%s\n"
             "  peer arenas       %12s%s\n"
             "  checkpoint        %12s%s\n"
             "  runtime           %12s\n"
             "  total             %12s  of %s (%s): %s; largest micro_batch that fits this "
             "global batch: %d (recompute block: %d)",
             b->rank, b->on_gpu ? "GPU" : "CPU", b->world, b->B, b->T, b->accum, p,
             (double)b->n_params / 1e6, g, mo, b->zero1 ? ", / world: sharded" : "", ac, em, an,
             b->recompute == DDP_RECOMPUTE_NONE ? " (in use)" : "", ab,
             b->recompute == DDP_RECOMPUTE_BLOCK ? " (in use)" : "", ws,
             b->lowp_bytes == 2   ? "  (with 16-bit copies of the weights)"
             : b->lowp_bytes == 4 ? "  (with rounded fp32 copies of the weights and widened "
                                    "products' inputs: emulated)"
                                  : "",
             pe,
             b->shared ? "  (slices of the other ranks' shared arenas that this rank reduces)" : "",
             ck,
             !b->checkpoint ? ""
             : b->writer && !b->on_gpu
                 ? "  (this rank writes shards: a snapshot of the state)"
                 : "  (the moments gathered for a save; this rank writes no shard)",
             rt, tot, lim, b->limit_from, b->total <= b->limit ? "fits" : "DOES NOT FIT", b->max_B,
             b->max_B_block);
    return buf;
}

int ddp_mem_budget_fits(const ddp_mem_budget_t *b, const ddp_spec_t *s, char *buf, size_t len)
{
    if (b->total <= b->limit) {
        if (len) buf[0] = '\0';
        return 1;
    }
    char t[32], l[32], o[32], x[32];
    size_t n = (size_t)snprintf(
        buf, len, "needs %s on rank %d but the limit is %s (%s), %s over; what helps:",
        ddp_mem_fmt(b->total, t, sizeof t), b->rank, ddp_mem_fmt(b->limit, l, sizeof l),
        b->limit_from, ddp_mem_fmt(b->total - b->limit, o, sizeof o));
#define ADD(...) (n += n < len ? (size_t)snprintf(buf + n, len - n, __VA_ARGS__) : 0)
    int cur = b->max_B;
    if (cur >= 1 && cur < b->B)
        ADD(" train.micro_batch %d (the same global batch in %d micro-steps per rank) saves %s;",
            cur, (b->n_micro * b->B / cur + b->world - 1) / b->world,
            ddp_mem_fmt(b->total - total_at(b, &s->model, cur, b->recompute), x, sizeof x));
    else if (cur < 1 && b->B > 1)
        ADD(" no micro_batch fits at seq_len %d (micro_batch 1 saves %s);", b->T,
            ddp_mem_fmt(b->total - total_at(b, &s->model, 1, b->recompute), x, sizeof x));
    else if (cur < 1)
        ADD(" not even micro_batch 1 fits at seq_len %d;", b->T);
    if (b->recompute == DDP_RECOMPUTE_NONE)
        ADD(" train.recompute: block saves %s%s;",
            ddp_mem_fmt(b->acts_none - b->acts_block, x, sizeof x),
            b->max_B_block >= b->B ? " (enough alone)" : "");
    /* bf16/fp16 round the products' inputs; activations stay fp32 (and the CPU keeps rounded
     * copies of the weights), so precision is no memory saver here yet */
    ADD(" train.precision does not lower memory (activations stay fp32);");
    if (b->zero1)
        ADD(" ddp.shard_optimizer is on already;");
    else if (b->world > 1 && s->shard_optimizer)
        ADD(" ddp.shard_optimizer works over the ring and nccl, not over mpi nor in an elastic "
            "job;");
    else
        ADD(" ddp.shard_optimizer over %d ranks would save %s;", b->world > 1 ? b->world : 2,
            ddp_mem_fmt(b->moments - b->moments / (b->world > 1 ? b->world : 2), x, sizeof x));
    ADD(" or raise train.memory_limit");
#undef ADD
    return 0;
}
