/* The emulator's runtime (shim.h): fibers for CUDA threads, barriers, warp collectives with the
 * PTX ISA's fragment layouts, launches and the host API stubs.
 *
 * Invariants: one host thread runs everything; `cur` is the running emulated thread (nullptr
 * outside a launch); a thread waiting at a barrier is resumed only after that barrier's
 * generation moved on, and the last thread to arrive runs the barrier's completion (for a warp
 * collective: every lane's result) before anyone leaves, so results are read before the next
 * collective of that warp can overwrite them.
 */
#include "shim.h"

#include <cerrno>
#include <cstdarg>
#include <deque>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emulator: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stdout);
    abort();
}

/* ---- fibers ---- */

constexpr size_t STACK_BYTES = 64 * 1024; /* a kernel thread needs a few KB, ASan frames more */
constexpr unsigned MAX_THREADS = 1024;

struct barrier;

/* A cp.async copy in flight: cp_size bytes to shared offset dst, the first src_bytes from src,
 * zeros after. */
struct cp_copy {
    uint32_t dst;
    const void *src;
    int cp_size, src_bytes;
};

struct fiber {
    ucontext_t uc;
    void *stack = nullptr; /* STACK_BYTES, a guard page below */
    dim3 idx;
    bool done = false;
    const barrier *waiting = nullptr; /* at this barrier, until its generation differs */
    unsigned waiting_gen = 0;
    void *fake_stack = nullptr; /* ASan's fake stack of this fiber while it is switched out */
    std::vector<cp_copy> open;             /* cp.async copies not yet committed */
    std::deque<std::vector<cp_copy>> groups; /* committed groups in flight, oldest first */
};

struct barrier {
    unsigned expected = 0, arrived = 0, gen = 0;
    const char *what = "";
};

ucontext_t sched_uc;
fiber *cur;
long n_releases; /* barriers completed so far */
std::vector<fiber> fibers;
const std::function<void()> *body;
#ifdef EMU_ASAN
const void *sched_stack_bottom; /* the scheduler's stack, for ASan's fiber switches */
size_t sched_stack_size;
#endif

void to_scheduler()
{
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&cur->fake_stack, sched_stack_bottom, sched_stack_size);
#endif
    fiber *self = cur;
    if (swapcontext(&self->uc, &sched_uc)) die("swapcontext: %s", strerror(errno));
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(self->fake_stack, &sched_stack_bottom, &sched_stack_size);
#endif
}

void fiber_main()
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &sched_stack_bottom, &sched_stack_size);
#endif
    (*body)();
    if (!cur->open.empty() || !cur->groups.empty())
        die("thread %u of block (%u, %u) returned with cp.async copies in flight", cur->idx.x,
            blockIdx.x, blockIdx.y);
    cur->done = true;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, sched_stack_bottom, sched_stack_size);
#endif
    /* returning resumes uc_link, the scheduler */
}

void resume(fiber &f)
{
    cur = &f;
    threadIdx = f.idx;
#ifdef EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, (char *)f.stack, STACK_BYTES);
#endif
    if (swapcontext(&sched_uc, &f.uc)) die("swapcontext: %s", strerror(errno));
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    cur = nullptr;
}

void *new_stack()
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die("mmap of a fiber stack: %s", strerror(errno));
    if (mprotect(p, page, PROT_NONE)) die("mprotect: %s", strerror(errno)); /* overflow: SEGV */
    return (char *)p + page;
}

/* Where the threads of the block stand, for a deadlock report. */
[[noreturn]] void deadlock(unsigned nthreads)
{
    fprintf(stderr, "emulator: deadlock in block (%u, %u, %u):", blockIdx.x, blockIdx.y,
            blockIdx.z);
    for (unsigned i = 0; i < nthreads; i++) {
        const fiber &f = fibers[i];
        const char *at = f.done ? "exited" : f.waiting ? f.waiting->what : "running";
        unsigned j = i;
        while (j + 1 < nthreads && fibers[j + 1].done == f.done &&
               fibers[j + 1].waiting == f.waiting)
            j++;
        fprintf(stderr, "\n  threads %u..%u: %s", i, j, at);
        i = j;
    }
    fputc('\n', stderr);
    die("a barrier that some thread of the block never reaches");
}

bool runnable(const fiber &f) { return !f.done && (!f.waiting || f.waiting->gen != f.waiting_gen); }

/* Runs the threads of one block until all have returned, always resuming the first runnable
 * thread in `order`: the first warp runs ahead as far as the barriers let it (through the
 * tile loops, into the next tile's staging) before the next warp moves, which is what makes a
 * missing __syncthreads visible. */
void run_block(unsigned nthreads, emu_order order)
{
    fibers.reserve(MAX_THREADS); /* never moved: a ucontext_t points into itself */
    while (fibers.size() < nthreads) {
        fibers.emplace_back();
        fibers.back().stack = new_stack();
    }
    for (unsigned t = 0; t < nthreads; t++) {
        fiber &f = fibers[t];
        f.idx = dim3(t, 0, 0);
        f.done = false;
        f.waiting = nullptr;
        f.open.clear();
        f.groups.clear();
        if (getcontext(&f.uc)) die("getcontext: %s", strerror(errno));
        f.uc.uc_stack.ss_sp = f.stack;
        f.uc.uc_stack.ss_size = STACK_BYTES;
        f.uc.uc_link = &sched_uc;
        makecontext(&f.uc, fiber_main, 0);
    }
    unsigned n = 0;
    for (;;) {
        if (n == nthreads) { /* nothing runnable after the last release */
            bool all_done = true;
            for (unsigned t = 0; t < nthreads; t++) all_done = all_done && fibers[t].done;
            if (all_done) return;
            deadlock(nthreads);
        }
        fiber &f = fibers[order == EMU_ORDER_FORWARD ? n : nthreads - 1 - n];
        if (!runnable(f)) {
            n++;
            continue;
        }
        long before = n_releases;
        f.waiting = nullptr;
        resume(f);
        if (n_releases != before) n = 0; /* it released others: the first of them goes next */
    }
}

/* The calling thread arrives at b; the last to arrive runs complete() and goes on, the others
 * wait until then. */
template <typename F> void arrive(barrier &b, F complete)
{
    if (!cur) die("%s called outside a kernel", b.what);
    if (++b.arrived < b.expected) {
        cur->waiting = &b;
        cur->waiting_gen = b.gen;
        to_scheduler();
        return;
    }
    complete();
    b.arrived = 0;
    b.gen++;
    n_releases++;
}

/* ---- the running launch ---- */

enum op { OP_NONE, OP_SHFL, OP_LDSM, OP_LDSM_T, OP_MMA_BF16, OP_MMA_F16 };
const char *const op_names[] = {"", "__shfl_sync", "ldmatrix.x4", "ldmatrix.x4.trans",
                                "mma.sync bf16", "mma.sync f16"};

/* A warp's collective in progress: each lane's inputs, then every lane's results. */
struct warp {
    barrier bar;
    op kind = OP_NONE;      /* of the lanes arrived so far */
    float f_in[32];         /* shuffle value */
    int src[32];            /* shuffle source lane */
    uint32_t u_in[32][6];   /* ldmatrix address; mma a[0..3], b[0..1] */
    float c_in[32][4];      /* mma c */
    float f_out[32][4];     /* shuffle result (f_out[l][0]), mma d */
    uint32_t u_out[32][4];  /* ldmatrix d */
};

std::vector<warp> warps;
barrier block_bar;
unsigned char *smem;
size_t smem_bytes;
emu_order sched_order = EMU_ORDER_FORWARD;
emu_landing cp_landing = EMU_LAND_AT_WAIT;
int cc_major = 8;
long n_errors, n_collectives;
cudaError_t last_error = cudaSuccess;
struct func_attr {
    const void *kernel;
    int max_dynamic_smem;
};
std::vector<func_attr> attrs;

constexpr size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 99 * 1024;

/* The calling lane's warp after checking that the warp's lanes agree on the operation. */
warp &warp_enter(op kind, unsigned mask)
{
    if (mask != 0xffffffffu)
        die("%s with mask %#x: only full warps are emulated", op_names[kind], mask);
    warp &w = warps[threadIdx.x / 32];
    if (w.bar.arrived == 0) w.kind = kind;
    if (w.kind != kind)
        die("warp %u: lane %u is at %s while other lanes are at %s", threadIdx.x / 32,
            threadIdx.x % 32, op_names[kind], op_names[w.kind]);
    w.bar.what = op_names[kind];
    return w;
}

float shuffle(unsigned mask, float v, int src, int width)
{
    if (width != 32) die("shuffle of width %d: only 32 is emulated", width);
    warp &w = warp_enter(OP_SHFL, mask);
    unsigned lane = threadIdx.x % 32;
    w.f_in[lane] = v;
    w.src[lane] = src;
    arrive(w.bar, [&] {
        for (int l = 0; l < 32; l++) w.f_out[l][0] = w.f_in[w.src[l]];
        n_collectives++;
    });
    return w.f_out[lane][0];
}

uint16_t half_of(uint32_t reg, int hi) { return (uint16_t)(hi ? reg >> 16 : reg & 0xffffu); }

/* ldmatrix .x4: lanes 8m..8m+7 give the row addresses of matrix m (16 bytes each). Lane l,
 * with g = l / 4 and t = l % 4, receives in d[m] (PTX ISA, "Matrix fragments for ldmatrix"):
 *   plain:  M_m[g][2t], M_m[g][2t+1]               (low half first)
 *   .trans: M_m[2t][g], M_m[2t+1][g] */
void ldmatrix_complete(warp &w, bool trans)
{
    const uint16_t *rows[32];
    for (int l = 0; l < 32; l++) {
        uint32_t a = w.u_in[l][0];
        if (a % 16 || a + 16 > smem_bytes)
            die("ldmatrix: lane %d's row address %u is misaligned or beyond the %zu bytes of "
                "shared memory", l, a, smem_bytes);
        rows[l] = reinterpret_cast<const uint16_t *>(smem + a);
    }
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int m = 0; m < 4; m++) {
            const uint16_t *const *mrow = rows + 8 * m;
            uint16_t lo = trans ? mrow[2 * t][g] : mrow[g][2 * t];
            uint16_t hi = trans ? mrow[2 * t + 1][g] : mrow[g][2 * t + 1];
            w.u_out[l][m] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

/* mma.m16n8k16 with .row.col and f32 accumulators (PTX ISA, "Matrix fragments for mma.m16n8k16
 * with floating point type"); lane l, g = l / 4, t = l % 4; element i of a register list counts
 * 16-bit halves, low half first:
 *   A (16x16): a_i, i = 0..7: row g for i in {0,1,4,5}, else g+8; col 2t + (i & 1), +8 for i >= 4
 *   B (16x8):  b_i, i = 0..3: row 2t + (i & 1), +8 for i >= 2; col g
 *   C, D (16x8 f32): c_i, i = 0..3: row g for i < 2, else g+8; col 2t + (i & 1) */
void mma_complete(warp &w, bool bf16)
{
    double A[16][16], B[16][8], C[16][8];
    auto value = [&](uint32_t reg, int hi) {
        uint16_t h = half_of(reg, hi);
        return (double)(bf16 ? emu_bf16_to_f32(h) : emu_f16_to_f32(h));
    };
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 8; i++) {
            int row = (i % 4 < 2) ? g : g + 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = value(w.u_in[l][i / 2], i & 1);
        }
        for (int i = 0; i < 4; i++)
            B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = value(w.u_in[l][4 + i / 2], i & 1);
        for (int i = 0; i < 4; i++) C[i < 2 ? g : g + 8][2 * t + (i & 1)] = w.c_in[l][i];
    }
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
            double s = C[row][col];
            for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
            w.f_out[l][i] = (float)s;
        }
    }
}

} // namespace

/* ---- device functions ---- */

void __syncthreads()
{
    block_bar.what = "__syncthreads";
    arrive(block_bar, [] { n_collectives++; });
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width)
{
    int lane = (int)(threadIdx.x % 32), src = lane ^ lane_mask;
    return shuffle(mask, v, src >= 0 && src < 32 ? src : lane, width); /* beyond: its own */
}

float __shfl_sync(unsigned mask, float v, int src, int width)
{
    return shuffle(mask, v, src & 31, width); /* srcLane % width */
}

uint4 __ldg(const uint4 *p)
{
    if ((uintptr_t)p % 16) die("__ldg of a uint4 at %p: not 16-byte aligned", (const void *)p);
    return *p;
}

size_t __cvta_generic_to_shared(const void *p)
{
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (!smem || c < smem || c >= smem + smem_bytes)
        die("__cvta_generic_to_shared(%p): not in the block's %zu bytes of shared memory", p,
            smem_bytes);
    return (size_t)(c - smem);
}

unsigned char *emu_dynamic_smem() { return smem; }

namespace {
void land(const cp_copy &c)
{
    memcpy(smem + c.dst, c.src, (size_t)c.src_bytes);
    memset(smem + c.dst + c.src_bytes, 0, (size_t)(c.cp_size - c.src_bytes));
}
} // namespace

void emu_cp_async(uint32_t dst, const void *src, int cp_size, int src_bytes)
{
    if (!cur) die("cp.async outside a kernel");
    if (dst % (uint32_t)cp_size || dst + (size_t)cp_size > smem_bytes)
        die("cp.async of %d bytes to shared offset %u: misaligned, or beyond the block's %zu "
            "bytes", cp_size, dst, smem_bytes);
    if ((uintptr_t)src % (uintptr_t)cp_size)
        die("cp.async of %d bytes from %p: not %d-byte aligned", cp_size, src, cp_size);
    if (src_bytes < 0 || src_bytes > cp_size)
        die("cp.async of %d bytes with src-size %d", cp_size, src_bytes);
    cp_copy c = {dst, src, cp_size, src_bytes};
    if (cp_landing == EMU_LAND_AT_ISSUE)
        land(c);
    else
        cur->open.push_back(c);
}

void emu_cp_async_commit()
{
    if (!cur) die("cp.async.commit_group outside a kernel");
    cur->groups.push_back(std::move(cur->open));
    cur->open.clear();
}

void emu_cp_async_wait(int n)
{
    if (!cur) die("cp.async.wait_group outside a kernel");
    while (cur->groups.size() > (size_t)n) {
        for (const cp_copy &c : cur->groups.front()) land(c);
        cur->groups.pop_front();
    }
}

void emu_ldmatrix_x4(uint32_t d[4], uint32_t addr, bool trans)
{
    warp &w = warp_enter(trans ? OP_LDSM_T : OP_LDSM, 0xffffffffu);
    unsigned lane = threadIdx.x % 32;
    w.u_in[lane][0] = addr;
    arrive(w.bar, [&] {
        ldmatrix_complete(w, trans);
        n_collectives++;
    });
    memcpy(d, w.u_out[lane], sizeof w.u_out[lane]);
}

void emu_mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                      emu_elem type)
{
    warp &w = warp_enter(type == EMU_BF16 ? OP_MMA_BF16 : OP_MMA_F16, 0xffffffffu);
    unsigned lane = threadIdx.x % 32;
    memcpy(w.u_in[lane], a, 4 * sizeof *a);
    memcpy(w.u_in[lane] + 4, b, 2 * sizeof *b);
    memcpy(w.c_in[lane], c, sizeof w.c_in[lane]);
    arrive(w.bar, [&] {
        mma_complete(w, type == EMU_BF16);
        n_collectives++;
    });
    memcpy(d, w.f_out[lane], sizeof w.f_out[lane]);
}

/* ---- host side ---- */

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (attr != cudaDevAttrComputeCapabilityMajor || device != 0) return cudaErrorInvalidValue;
    *value = cc_major;
    return cudaSuccess;
}

cudaError_t cudaGetLastError()
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > SMEM_OPTIN)
        return cudaErrorInvalidValue;
    for (func_attr &a : attrs)
        if (a.kernel == kernel) {
            a.max_dynamic_smem = value;
            return cudaSuccess;
        }
    attrs.push_back({kernel, value});
    return cudaSuccess;
}

void emu_log_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "DDP_ERROR: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    n_errors++;
}

int ddp__cuda_check(ddp_kctx_t *ctx, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    emu_log_error("cuda: %s: error %d", what, (int)e);
    if (!ctx->err) ctx->err = DDP_ECUDA;
    return DDP_ECUDA;
}

int ddp__cuda_launched(ddp_kctx_t *ctx, const char *what)
{
    return ddp__cuda_check(ctx, cudaGetLastError(), what);
}

int ddp__cuda_enter(ddp_kctx_t *ctx) { return ctx->err ? ctx->err : 0; }

int ddp__cuda_scratch(ddp_kctx_t *ctx, size_t bytes, void **out)
{
    if (bytes > ctx->scratch_bytes) {
        free(ctx->scratch);
        ctx->scratch = malloc(bytes);
        if (!ctx->scratch) return DDP_ENOMEM;
        memset(ctx->scratch, 0xff, bytes);
        ctx->scratch_bytes = bytes;
    }
    *out = ctx->scratch;
    return 0;
}

void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem_size,
                  const std::function<void()> &kernel_body)
{
    size_t allowed = SMEM_DEFAULT;
    for (const func_attr &a : attrs)
        if (a.kernel == kernel && (size_t)a.max_dynamic_smem > allowed)
            allowed = (size_t)a.max_dynamic_smem;
    unsigned nthreads = block.x * block.y * block.z;
    if (smem_size > allowed || block.y != 1 || block.z != 1 || nthreads == 0 || nthreads % 32 ||
        nthreads > MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z != 1 || grid.y > 65535) {
        /* the GPU refuses the launch; the emulator also refuses what it does not model (2-D
         * blocks, partial warps) */
        fprintf(stderr, "emulator: launch refused: grid (%u, %u, %u), block (%u, %u, %u), %zu "
                "bytes of shared memory (%zu allowed)\n", grid.x, grid.y, grid.z, block.x,
                block.y, block.z, smem_size, allowed);
        last_error = cudaErrorInvalidValue;
        return;
    }
    if (cur) die("a launch from inside a kernel");
    gridDim = grid;
    blockDim = block;
    body = &kernel_body;
    warps.assign(nthreads / 32, warp());
    for (warp &w : warps) w.bar.expected = 32;
    block_bar = barrier();
    block_bar.expected = nthreads;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = dim3(bx, by, 0);
            smem_bytes = smem_size;
            smem = static_cast<unsigned char *>(malloc(smem_size ? smem_size : 1));
            if (!smem) die("out of memory for %zu bytes of shared memory", smem_size);
            memset(smem, 0xff, smem_size);
            run_block(nthreads, sched_order);
            free(smem);
            smem = nullptr;
        }
    body = nullptr;
}

void emu_set_order(emu_order order) { sched_order = order; }
void emu_set_landing(emu_landing when) { cp_landing = when; }
void emu_set_cc_major(int major) { cc_major = major; }
long emu_errors_logged() { return n_errors; }
long emu_collectives() { return n_collectives; }

void emu_shutdown()
{
    long page = sysconf(_SC_PAGESIZE);
    for (fiber &f : fibers) munmap((char *)f.stack - page, STACK_BYTES + page);
    fibers.clear();
    attrs.clear();
}
