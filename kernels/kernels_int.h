/* Internals of the kernels module shared by its files (never included outside kernels/): the
 * per-op profiler's window, kept by kprof.c and used by the front door (wrappers.c) and
 * ddp_kernels_close (open.c). The public side is kernels.h's ddp_k_profile_*.
 *
 * Invariants
 * - k->prof is allocated by the first ddp_k_profile_start and freed by ddp_kernels_close, never
 *   earlier: a wrapper on another thread (the checkpoint helper's copies) that loaded it still
 *   finds it. It is read and set atomically.
 * - A window belongs to the thread that opened it: ddp__kprof_mine (thread-local) points at its
 *   profiler from start to stop, and only that thread's calls are recorded. Every other field
 *   is touched by the owner only, so nothing else needs a lock.
 * - Records hold the two marks of each call until the window is read (stop, or a drain at
 *   DDP__KPROF_DRAIN records); marks belong to the backend's context (kernels.h, timer_*).
 */
#ifndef DDP_KERNELS_KERNELS_INT_H
#define DDP_KERNELS_KERNELS_INT_H

#include <stdint.h>

#include "kernels/kernels.h"

/* Records (calls) after which the marks are read in the middle of a window. */
#define DDP__KPROF_DRAIN 65536

typedef struct ddp__kprof_rec {
    void *a, *b; /* the call's start and end marks */
    int op;      /* ddp_kop_t */
} ddp__kprof_rec_t;

struct ddp__kprof {
    int open;               /* a window is open */
    int on;                 /* it records (open and not paused) */
    int marks;              /* the backend has timer_* members; else ms is the host clock */
    ddp__kprof_rec_t *recs; /* [cap]: the calls whose marks are not read yet */
    size_t n, cap;
    ddp_kprof_stat_t op[DDP_KOP_COUNT];
    int64_t t0;     /* monotonic ns when recording last (re)started */
    double wall_ms; /* recorded time before the last pause */
    int err;        /* first error of a mark, a drain or an allocation in this window */
};

/* The profiler whose window the calling thread owns, or NULL. */
extern __thread struct ddp__kprof *ddp__kprof_mine;

/* A call in progress: its profiler, start mark and host clock. */
typedef struct ddp__kspan {
    struct ddp__kprof *p;
    void *a;
    int64_t h0;
} ddp__kspan_t;

/* The slow half of ddp__kprof_begin: records the start mark when p records. */
int ddp__kprof_begin_slow(ddp_kernels_t *k, struct ddp__kprof *p, ddp__kspan_t *s);

/* 1 when the calling thread records k's calls now: the start mark and clock are then in *s and
 * the caller runs the call and ddp__kprof_end. Outside a window: one load and one branch (a
 * thread-local compare as well once k has been profiled). */
static inline int ddp__kprof_begin(ddp_kernels_t *k, ddp__kspan_t *s)
{
    struct ddp__kprof *p = __atomic_load_n(&k->prof, __ATOMIC_ACQUIRE);
    if (__builtin_expect(p == NULL, 1) || p != ddp__kprof_mine) return 0;
    return ddp__kprof_begin_slow(k, p, s);
}

/* Ends the call begun with s: the end mark, and op charged with one call, its host time, flops
 * and bytes. Owner thread. */
void ddp__kprof_end(ddp_kernels_t *k, ddp_kop_t op, const ddp__kspan_t *s, double flops,
                    double bytes);

/* Frees k's profiler (ddp_kernels_close, after the backend's context). NULL-safe. */
void ddp__kprof_free(struct ddp__kprof *p);

/* Causal attention's work in terms of B, T, C, NH, NKV only (kernels.h): FLOPs 2 B NH T^2 hs
 * forward and 2.5 times that backward, the same whatever NKV (every query head still meets T
 * keys); bytes of qkv [B,T,C + 2 NKV hs] and out forward, and of dout, qkv, out and dqkv
 * backward, `act` bytes per element (the log-sum-exps, B NH T, are left out). */
static inline double ddp__attn_flops(int B, int T, int C, int NH, int bwd)
{
    double f = 2.0 * B * NH * (double)T * T * (C / NH);
    return bwd ? 2.5 * f : f;
}

static inline double ddp__attn_bytes(int B, int T, int C, int NH, int NKV, int bwd, double act)
{
    double btc = (double)B * T * C, qkv = (double)B * T * (C + 2.0 * NKV * (C / NH));
    return act * (bwd ? btc + qkv + btc + qkv : qkv + btc);
}

#endif
