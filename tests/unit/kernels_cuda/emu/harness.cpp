/* kernels/cuda/flash_attention.cu on the CPU emulator (shim.h) against a double-precision
 * reference (TAP). Built from the kernel file in the tree by transform.py at build time.
 *
 * Every case runs forward (out, lse) and backward (dqkv overwritten: it starts as NaN, so an
 * element not written fails the case) on 16-bit tensors for bf16 and fp16, head sizes 32, 64,
 * 128, T = 1 (one row), 63 (a partial tile), 64 (a full one), 65 (one row into a second
 * tile), 130 (three tiles, the last ragged; hs = 128's dK/dV kernel walks
 * 32-row Q tiles, so its edges fall elsewhere), B*NH = 2 (two heads of a sequence or two
 * sequences, alternately), plus cases with large scores, where the running max moves between
 * tiles and the partial sums are rescaled, and grouped-query cases (NH/NKV = 2, 3, 4 query heads
 * a K/V head, at each head size), whose reference repeats the K/V heads and sums their
 * gradients over each group. Each case runs twice: threads scheduled in opposite orders,
 * cp.async copies landing at their wait or when issued (SCHEDULES): the results must be
 * bitwise equal (the backward's fixed-order sums; a race on shared memory, a prefetch into a
 * buffer still read or a read before the wait would make them differ), the logged errors none,
 * the guard words around every buffer intact (ASan builds rely on exact allocations instead).
 * At hs <= 64 a third run takes the forward kernel with one m-tile a warp
 * (DDP_FA_FWD_ROWS=16) instead of two: the same bits again.
 *
 *   test_flash_emu            all cases
 *   test_flash_emu PREC HS T B NH [AMP [NKV]]   one case (PREC bf16 or fp16), for debugging
 */
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <random>
#include <vector>

#include "shim.h"

namespace {

/* Tolerances. An error is max|got - ref| over a tensor divided by the largest magnitude its
 * rounding errors scale with (attention_ref: the same sums over absolute values).
 *
 * The reference is the exact attention, in double, of the 16-bit inputs (q, k, v, dout are
 * tensors of the kernel's 16-bit type: their rounding is the contract, not an error). What
 * remains is the kernel's own rounding, unit roundoff u = 2^-8 = 3.9e-3 (bf16) or 2^-11 =
 * 4.9e-4 (fp16):
 *   out, dv   P is rounded to 16 bits as the A operand of P V (P^T dO): each term of the sum
 *             gets a relative error <= u, so the error is <= u sum P |v|; the roundings being
 *             independent, about u/3 is seen. The result is rounded to 16 bits on store: u/2
 *             of |out| <= sum P |v| more, so <= 1.5u in all.
 *   dq, dk    dS = P (dP - D) is rounded to 16 bits (relative u), and D = rowsum(dout * out)
 *             uses the 16-bit out (relative u/2 of each term, an error of order u |D| that does
 *             not cancel where dP - D does), and the store rounds once more: <= about 2.5u of
 *             sum P (|dP| + |D|) |k|; up to about u/2 is seen.
 *   lse       fp32 only (scores, max, sum, exp2, log), relative to 1 + |lse|: a few fp32 ulps.
 * Worst observed over all cases below (grouped-query ones included), both schedules (the
 * # worst lines print them per head size):
 *   bf16  out 3.5e-3, lse 8.8e-8, dq 1.7e-3, dk 1.5e-3, dv 2.5e-3
 *   fp16  out 4.2e-4, lse 9.7e-8, dq 2.6e-4, dk 1.4e-4, dv 2.4e-4
 * The limits are the bounds above for out and dv (1.5u), and keep about 3x over the observed
 * errors for dq and dk. The emulator's mma.sync sums exact products in double; a
 * GPU's tensor cores add their own fp32 accumulation error, well below these limits (the GPU
 * itself is held to kernels/selftest.c's tolerances). */
struct tolerance {
    double out, lse, dq, dk, dv;
};
constexpr tolerance TOL_BF16 = {6e-3, 3e-7, 8e-3, 1.2e-2, 6e-3};
constexpr tolerance TOL_FP16 = {7.5e-4, 3e-7, 7.5e-4, 4.5e-4, 7.5e-4};

/* 64 bytes of NaN words before and after each buffer (keeps the 16-byte alignment); none under
 * ASan, whose exact allocations catch reads as well as writes. */
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t GUARD = 0;
#else
constexpr size_t GUARD = 16;
#endif
constexpr uint32_t GUARD_WORD = 0x7fc0dea1u;

/* A buffer of n elements of E (float, or uint16_t for the 16-bit tensors), 16-byte aligned,
 * with GUARD words around it. */
template <typename E> struct buffer {
    unsigned char *base = nullptr;
    size_t n = 0;
    explicit buffer(size_t count) : n(count)
    {
        void *p = nullptr;
        if (posix_memalign(&p, 64, n * sizeof(E) + 8 * GUARD)) abort();
        base = static_cast<unsigned char *>(p);
        for (size_t i = 0; i < GUARD; i++) {
            memcpy(base + 4 * i, &GUARD_WORD, 4);
            memcpy(base + 4 * GUARD + n * sizeof(E) + 4 * i, &GUARD_WORD, 4);
        }
    }
    buffer(const buffer &) = delete;
    buffer &operator=(const buffer &) = delete;
    ~buffer() { free(base); }
    E *data() { return reinterpret_cast<E *>(base + 4 * GUARD); }
    bool guards_intact() const
    {
        for (size_t i = 0; i < GUARD; i++)
            if (memcmp(base + 4 * i, &GUARD_WORD, 4) ||
                memcmp(base + 4 * GUARD + n * sizeof(E) + 4 * i, &GUARD_WORD, 4))
                return false;
        return true;
    }
};

int n_tests, n_failed;

/* One TAP result; the detail lines become TAP comments. */
__attribute__((format(printf, 2, 3))) void tap(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++n_tests);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    n_failed += !ok;
}

const char *prec_name(ddp_kprec_t p) { return p == DDP_KPREC_BF16 ? "bf16" : "fp16"; }

uint16_t to16(float x, ddp_kprec_t prec)
{
    return prec == DDP_KPREC_BF16 ? emu_f32_to_bf16(x) : emu_f32_to_f16(x);
}

float from16(uint16_t h, ddp_kprec_t prec)
{
    return prec == DDP_KPREC_BF16 ? emu_bf16_to_f32(h) : emu_f16_to_f32(h);
}

float round16(float x, ddp_kprec_t prec) { return from16(to16(x, prec), prec); }

/* A 16-bit buffer holding v rounded to prec. */
void fill16(buffer<uint16_t> &b, const std::vector<float> &v, ddp_kprec_t prec)
{
    for (size_t i = 0; i < b.n; i++) b.data()[i] = to16(v[i], prec);
}

std::vector<float> widen16(buffer<uint16_t> &b, ddp_kprec_t prec)
{
    std::vector<float> v(b.n);
    for (size_t i = 0; i < b.n; i++) v[i] = from16(b.data()[i], prec);
    return v;
}

struct shape {
    ddp_kprec_t prec;
    int hs, T, B, NH;
    float amp; /* standard deviation of q, k, v */
    int NKV;   /* K/V heads: NH/NKV query heads share one */
};

/* Elements of a position's qkv row: NH query heads, NKV key and NKV value heads. */
size_t qkv_width(const shape &s) { return (size_t)(s.NH + 2 * s.NKV) * s.hs; }

/* Inputs of a case, from a seed that depends only on the shape, rounded to the case's 16-bit
 * type (the kernels' tensors are of that type). */
struct inputs {
    std::vector<float> qkv, dout;
    explicit inputs(const shape &s)
    {
        size_t C = (size_t)s.NH * s.hs, n = (size_t)s.B * s.T;
        std::mt19937 rng(1000u * s.hs + 10u * s.T + s.B + (s.prec == DDP_KPREC_FP16 ? 7u : 0u) +
                         100000u * (s.NH / s.NKV - 1));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        qkv.resize(n * qkv_width(s));
        dout.resize(n * C);
        for (float &x : qkv) x = round16(s.amp * nd(rng), s.prec);
        for (float &x : dout) x = round16(nd(rng), s.prec);
    }
};

/* What the kernels produced. */
struct outputs {
    std::vector<float> out, lse, dqkv;
    int err = 0;
    long logged = 0;
    bool guards = true;
};

/* How the emulator runs a case: which thread goes first after a barrier, and when a cp.async
 * copy lands (shim.h). Each hazard shows under either order, so two runs cover both landings:
 * at the wait (a read before it sees the buffer's old contents) and at issue (a prefetch before
 * the barrier overwrites what a warp still reads). The results must be bitwise equal. */
struct schedule {
    emu_order order;
    emu_landing landing;
};
constexpr schedule SCHEDULES[] = {{EMU_ORDER_FORWARD, EMU_LAND_AT_WAIT},
                                  {EMU_ORDER_REVERSE, EMU_LAND_AT_ISSUE}};

outputs run_kernels(const shape &s, const inputs &in, schedule sched)
{
    size_t C = (size_t)s.NH * s.hs, n = (size_t)s.B * s.T;
    buffer<uint16_t> qkv(n * qkv_width(s)), dout(n * C), out(n * C), dqkv(n * qkv_width(s));
    buffer<float> lse((size_t)s.B * s.NH * s.T);
    fill16(qkv, in.qkv, s.prec);
    fill16(dout, in.dout, s.prec);
    /* an element never written stays NaN (0xffff is a NaN in bf16 and fp16): the backward must
     * overwrite every element of dqkv */
    std::fill(out.data(), out.data() + out.n, (uint16_t)0xffffu);
    std::fill(dqkv.data(), dqkv.data() + dqkv.n, (uint16_t)0xffffu);
    std::fill(lse.data(), lse.data() + lse.n, NAN);
    ddp_kctx_t ctx = {};
    ctx.prec = s.prec;
    emu_set_order(sched.order);
    emu_set_landing(sched.landing);
    long logged = emu_errors_logged();
    ddp__cuda_flash_fwd(&ctx, out.data(), lse.data(), qkv.data(), s.B, s.T, (int)C, s.NH,
                        s.NKV);
    ddp__cuda_flash_bwd(&ctx, dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B,
                        s.T, (int)C, s.NH, s.NKV);
    free(ctx.scratch);
    outputs r;
    r.out = widen16(out, s.prec);
    r.lse = std::vector<float>(lse.data(), lse.data() + lse.n);
    r.dqkv = widen16(dqkv, s.prec);
    r.err = ctx.err;
    r.logged = emu_errors_logged() - logged;
    r.guards = qkv.guards_intact() && dout.guards_intact() && out.guards_intact() &&
               lse.guards_intact() && dqkv.guards_intact();
    return r;
}

/* The exact attention of the rounded inputs: out, lse and the gradient (dq, dk, dv in qkv's
 * layout; query head h reads K/V head h / (NH/NKV), whose gradient sums the group's); and for
 * each the magnitude its rounding errors scale with: the
 * same sums over absolute values (out: sum P |v|; dv: sum P |dout|; dq, dk: sums of
 * P (|dP| + |D|) times |k|, |q|; lse: 1 + |lse|). A gradient that cancels to about zero (dq and
 * dk at T = 1, where softmax is constant) still has errors of the size of its terms. */
struct reference {
    std::vector<double> out, lse, grad, out_mag, grad_mag;
};

reference attention_ref(const shape &s, const inputs &in)
{
    const int T = s.T, hs = s.hs, NH = s.NH, G = s.NH / s.NKV;
    const size_t C = (size_t)NH * hs, W = qkv_width(s), KVW = (size_t)s.NKV * hs;
    const double scale = 1.0 / std::sqrt((double)hs);
    reference r;
    r.out.assign((size_t)s.B * T * C, 0.0);
    r.out_mag = r.out;
    r.lse.assign((size_t)s.B * NH * T, 0.0);
    r.grad.assign((size_t)s.B * T * W, 0.0);
    r.grad_mag = r.grad;
    std::vector<double> q(T * hs), k(T * hs), v(T * hs), dout(T * hs), P((size_t)T * T),
        dS((size_t)T * T), dS_mag((size_t)T * T);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < NH; h++) {
            /* head h's q, and its K/V head's k and v, at these offsets of a position's row */
            const size_t part_off[3] = {(size_t)h * hs, C + (size_t)(h / G) * hs,
                                        C + KVW + (size_t)(h / G) * hs};
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    size_t row = ((size_t)b * T + t) * W + d;
                    q[t * hs + d] = round16(in.qkv[row + part_off[0]], s.prec);
                    k[t * hs + d] = round16(in.qkv[row + part_off[1]], s.prec);
                    v[t * hs + d] = round16(in.qkv[row + part_off[2]], s.prec);
                    size_t orow = ((size_t)b * T + t) * C + (size_t)h * hs + d;
                    dout[t * hs + d] = round16(in.dout[orow], s.prec);
                }
            for (int t = 0; t < T; t++) {
                double *p = &P[(size_t)t * T];
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int u = 0; u <= t; u++) {
                    double x = 0.0;
                    for (int d = 0; d < hs; d++) x += q[t * hs + d] * k[u * hs + d];
                    p[u] = x * scale;
                    mx = std::max(mx, p[u]);
                }
                for (int u = 0; u <= t; u++) sum += std::exp(p[u] - mx);
                for (int u = 0; u <= t; u++) p[u] = std::exp(p[u] - mx) / sum;
                r.lse[((size_t)b * NH + h) * T + t] = mx + std::log(sum);
                for (int d = 0; d < hs; d++) {
                    double o = 0.0, mag = 0.0;
                    for (int u = 0; u <= t; u++) {
                        o += p[u] * v[u * hs + d];
                        mag += p[u] * std::fabs(v[u * hs + d]);
                    }
                    r.out[((size_t)b * T + t) * C + h * hs + d] = o;
                    r.out_mag[((size_t)b * T + t) * C + h * hs + d] = mag;
                    D += o * dout[t * hs + d];
                }
                for (int u = 0; u <= t; u++) {
                    double dp = 0.0;
                    for (int d = 0; d < hs; d++) dp += dout[t * hs + d] * v[u * hs + d];
                    dS[(size_t)t * T + u] = p[u] * (dp - D);
                    dS_mag[(size_t)t * T + u] = p[u] * (std::fabs(dp) + std::fabs(D));
                }
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    double g[3] = {0, 0, 0}, mag[3] = {0, 0, 0};
                    for (int u = 0; u <= t; u++) {
                        g[0] += dS[(size_t)t * T + u] * k[u * hs + d];
                        mag[0] += dS_mag[(size_t)t * T + u] * std::fabs(k[u * hs + d]);
                    }
                    for (int u = t; u < T; u++) {
                        g[1] += dS[(size_t)u * T + t] * q[u * hs + d];
                        mag[1] += dS_mag[(size_t)u * T + t] * std::fabs(q[u * hs + d]);
                        g[2] += P[(size_t)u * T + t] * dout[u * hs + d];
                        mag[2] += P[(size_t)u * T + t] * std::fabs(dout[u * hs + d]);
                    }
                    size_t row = ((size_t)b * T + t) * W + d;
                    for (int part = 0; part < 3; part++) { /* k, v: summed over the group */
                        double f = part < 2 ? scale : 1.0;
                        r.grad[row + part_off[part]] += f * g[part];
                        r.grad_mag[row + part_off[part]] += f * mag[part];
                    }
                }
        }
    return r;
}

/* Errors of a case, each max|got - ref| / max(magnitude) over a tensor; NaN or Inf anywhere
 * (an unwritten or poisoned element) gives Inf. */
struct errors {
    double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

/* Over the elements of part `part` (0 q, 1 k, 2 v) of every row of a [rows, C + 2 KVW] tensor
 * (parts = 3; the q heads are C wide, the k and v heads KVW each), or over all elements
 * (parts = 1). */
double rel_err(const std::vector<double> &ref, const std::vector<double> &mag,
               const std::vector<double> &got, size_t C, size_t KVW, int parts, int part)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        size_t j = i % (C + 2 * KVW);
        if (parts == 3 && (j < C ? 0 : j < C + KVW ? 1 : 2) != part) continue;
        if (!std::isfinite(got[i])) return INFINITY;
        num = std::max(num, std::fabs(got[i] - ref[i]));
        den = std::max(den, mag[i]);
    }
    return den > 0.0 ? num / den : num;
}

errors compare(const shape &s, const reference &ref, const outputs &got)
{
    size_t C = (size_t)s.NH * s.hs, KVW = (size_t)s.NKV * s.hs;
    std::vector<double> out(got.out.begin(), got.out.end()), grad(got.dqkv.size()),
        lse(got.lse.begin(), got.lse.end()), lse_mag(ref.lse.size());
    for (size_t i = 0; i < grad.size(); i++) grad[i] = (double)got.dqkv[i];
    for (size_t i = 0; i < lse_mag.size(); i++) lse_mag[i] = 1.0 + std::fabs(ref.lse[i]);
    errors e;
    e.out = rel_err(ref.out, ref.out_mag, out, C, 0, 1, 0);
    e.lse = rel_err(ref.lse, lse_mag, lse, C, 0, 1, 0);
    e.dq = rel_err(ref.grad, ref.grad_mag, grad, C, KVW, 3, 0);
    e.dk = rel_err(ref.grad, ref.grad_mag, grad, C, KVW, 3, 1);
    e.dv = rel_err(ref.grad, ref.grad_mag, grad, C, KVW, 3, 2);
    return e;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float));
}

/* Worst errors per precision and head size, reported at the end. */
errors worst[2][3];

void run_case(const shape &s)
{
    inputs in(s);
    reference ref = attention_ref(s, in);
    errors e = {};
    bool det = true, clean = true, guards = true;
    int err = 0;
    outputs first;
    for (const schedule &sched : SCHEDULES) {
        outputs r = run_kernels(s, in, sched);
        errors er = compare(s, ref, r);
        e.out = std::max(e.out, er.out); /* the worst of the schedules */
        e.lse = std::max(e.lse, er.lse);
        e.dq = std::max(e.dq, er.dq);
        e.dk = std::max(e.dk, er.dk);
        e.dv = std::max(e.dv, er.dv);
        if (&sched == SCHEDULES)
            first = r;
        else
            det = det && same_bits(first.out, r.out) && same_bits(first.lse, r.lse) &&
                  same_bits(first.dqkv, r.dqkv);
        clean = clean && r.err == 0 && r.logged == 0;
        guards = guards && r.guards;
        err = err ? err : r.err;
    }
    if (s.hs <= 64) { /* the forward with one m-tile a warp (4 warps) gives the same bits */
        setenv("DDP_FA_FWD_ROWS", "16", 1);
        outputs r = run_kernels(s, in, SCHEDULES[0]);
        unsetenv("DDP_FA_FWD_ROWS");
        det = det && same_bits(first.out, r.out) && same_bits(first.lse, r.lse) &&
              same_bits(first.dqkv, r.dqkv);
        clean = clean && r.err == 0 && r.logged == 0;
        guards = guards && r.guards;
    }
    const tolerance &tol = s.prec == DDP_KPREC_BF16 ? TOL_BF16 : TOL_FP16;
    bool ok = e.out <= tol.out && e.lse <= tol.lse && e.dq <= tol.dq && e.dk <= tol.dk &&
              e.dv <= tol.dv && det && clean && guards;
    tap(ok,
        "%s hs=%d T=%d B=%d NH=%d NKV=%d amp=%g: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e%s%s%s",
        prec_name(s.prec), s.hs, s.T, s.B, s.NH, s.NKV, (double)s.amp, e.out, e.lse, e.dq, e.dk,
        e.dv,
        det ? "" : ", NOT bitwise equal across schedules and forward kernels",
        clean ? "" : ", an error was reported",
        guards ? "" : ", a write outside a buffer");
    if (!ok)
        printf("# limits: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e; ctx->err %d\n", tol.out,
               tol.lse, tol.dq, tol.dk, tol.dv, err);
    errors &w = worst[s.prec == DDP_KPREC_BF16 ? 0 : 1][s.hs == 32 ? 0 : s.hs == 64 ? 1 : 2];
    w.out = std::max(w.out, e.out);
    w.lse = std::max(w.lse, e.lse);
    w.dq = std::max(w.dq, e.dq);
    w.dk = std::max(w.dk, e.dk);
    w.dv = std::max(w.dv, e.dv);
}

/* ddp__cuda_flash_supported takes bf16/fp16 at hs 32/64/128 on compute capability >= 8 only. */
void test_supported()
{
    ddp_kctx_t ctx = {};
    bool ok = true;
    for (ddp_kprec_t p : {DDP_KPREC_BF16, DDP_KPREC_FP16}) {
        ctx.prec = p;
        ok &= ddp__cuda_flash_supported(&ctx, 64, 2) && ddp__cuda_flash_supported(&ctx, 256, 4) &&
              ddp__cuda_flash_supported(&ctx, 768, 6) && !ddp__cuda_flash_supported(&ctx, 96, 2) &&
              !ddp__cuda_flash_supported(&ctx, 64, 3);
        emu_set_cc_major(7);
        ok &= !ddp__cuda_flash_supported(&ctx, 128, 2);
        emu_set_cc_major(8);
    }
    ctx.prec = DDP_KPREC_FP32;
    ok &= !ddp__cuda_flash_supported(&ctx, 128, 2);
    tap(ok, "flash_supported: bf16/fp16, hs 32/64/128, compute capability >= 8");
}

/* A misaligned tensor is refused (DDP_EINVAL recorded, nothing launched or written). */
void test_misaligned()
{
    const int B = 1, T = 4, NH = 1, C = 32;
    buffer<uint16_t> qkv(B * T * 3 * C + 8), out(B * T * C);
    std::vector<float> lse(B * NH * T, NAN);
    std::fill(qkv.data(), qkv.data() + qkv.n, (uint16_t)0x3f00u); /* 0.5 in bf16 */
    std::fill(out.data(), out.data() + out.n, (uint16_t)0xffffu);
    ddp_kctx_t ctx = {};
    ctx.prec = DDP_KPREC_BF16;
    long before = emu_collectives(), logged = emu_errors_logged();
    uint16_t *q = qkv.data() + 1; /* 2 bytes off 16 */
    ddp__cuda_flash_fwd(&ctx, out.data(), lse.data(), q, B, T, C, NH, NH);
    bool ok = ctx.err == DDP_EINVAL && emu_collectives() == before &&
              emu_errors_logged() == logged + 1 && out.data()[0] == 0xffffu && std::isnan(lse[0]);
    tap(ok, "a misaligned qkv: DDP_EINVAL recorded, nothing launched (ctx->err %d)", ctx.err);
}

/* NH not a multiple of NKV is refused (DDP_EINVAL recorded, nothing launched or written). */
void test_bad_group()
{
    const int B = 1, T = 4, NH = 3, NKV = 2, C = 3 * 32;
    buffer<uint16_t> qkv(B * T * (NH + 2 * NKV) * 32), out(B * T * C);
    std::vector<float> lse(B * NH * T, NAN);
    std::fill(qkv.data(), qkv.data() + qkv.n, (uint16_t)0x3f00u);
    std::fill(out.data(), out.data() + out.n, (uint16_t)0xffffu);
    ddp_kctx_t ctx = {};
    ctx.prec = DDP_KPREC_BF16;
    long before = emu_collectives();
    ddp__cuda_flash_fwd(&ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
    bool ok = ctx.err == DDP_EINVAL && emu_collectives() == before && out.data()[0] == 0xffffu &&
              std::isnan(lse[0]);
    tap(ok, "NH = 3 on NKV = 2: DDP_EINVAL recorded, nothing launched (ctx->err %d)", ctx.err);
}

std::vector<shape> all_cases()
{
    std::vector<shape> cases;
    for (ddp_kprec_t p : {DDP_KPREC_BF16, DDP_KPREC_FP16})
        for (int hs : {32, 64, 128}) {
            int n = 0;
            for (int T : {1, 63, 64, 65, 130}) {
                bool heads = n++ % 2 == 0; /* two heads of one sequence, or two sequences */
                cases.push_back({p, hs, T, heads ? 1 : 2, heads ? 2 : 1, 1.0f, heads ? 2 : 1});
            }
            /* grouped-query: 2, 3 and 4 query heads a K/V head, odd T */
            cases.push_back({p, hs, 65, 1, 4, 1.0f, 2});
            cases.push_back({p, hs, 130, 1, 6, 1.0f, 2});
            cases.push_back({p, hs, 63, 2, 4, 1.0f, 1});
        }
    /* scores of standard deviation 9: the row max moves between tiles, exp2 rescales */
    for (ddp_kprec_t p : {DDP_KPREC_BF16, DDP_KPREC_FP16})
        cases.push_back({p, 64, 130, 1, 2, 3.0f, 2});
    return cases;
}

} // namespace

int main(int argc, char **argv)
{
    std::vector<shape> cases;
    if (argc >= 6 && argc <= 8) {
        shape s = {strcmp(argv[1], "fp16") ? DDP_KPREC_BF16 : DDP_KPREC_FP16, atoi(argv[2]),
                   atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                   argc >= 7 ? (float)atof(argv[6]) : 1.0f, argc == 8 ? atoi(argv[7]) : 0};
        if (s.NKV <= 0) s.NKV = s.NH;
        if (s.NH % s.NKV) {
            fprintf(stderr, "NH must be a multiple of NKV\n");
            return 2;
        }
        cases.push_back(s);
        printf("1..%zu\n", cases.size());
    } else if (argc == 1) {
        cases = all_cases();
        printf("1..%zu\n", cases.size() + 3);
        test_supported();
        test_misaligned();
        test_bad_group();
    } else {
        fprintf(stderr, "usage: %s [bf16|fp16 HS T B NH [AMP [NKV]]]\n", argv[0]);
        return 2;
    }
    for (const shape &s : cases) run_case(s);
    for (int p = 0; p < 2; p++)
        for (int h = 0; h < 3; h++) {
            const errors &w = worst[p][h];
            printf("# worst %s hs=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                   p ? "fp16" : "bf16", 32 << h, w.out, w.lse, w.dq, w.dk, w.dv);
        }
    printf("# %ld warp collectives and block barriers emulated\n", emu_collectives());
    emu_shutdown();
    return n_failed ? 1 : 0;
}
