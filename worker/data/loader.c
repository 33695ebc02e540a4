/* Dataset windows, the seeded permutation, and the prefetching loader (see loader.h). */
#include "worker/data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/trace.h"

int ddp_dataset_open(ddp_dataset_t *d, const char *glob, int T, int vocab_size, uint64_t seed,
                     ddp_errinfo_t *ei)
{
    memset(d, 0, sizeof *d);
    d->T = T;
    d->vocab_size = vocab_size;
    d->seed = seed;
    char **paths = NULL;
    size_t count = 0;
    DDP_CHECK(ddp_shard_glob(glob, &paths, &count, ei));
    int rc = 0;
    d->shards = ddp_calloc(count, sizeof *d->shards);
    d->first_window = ddp_calloc(count + 1, sizeof *d->first_window);
    if (!d->shards || !d->first_window) {
        rc = DDP_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        DDP_CHECK_GOTO(ddp_shard_open(&d->shards[i], paths[i], ei), rc, out);
        d->n_shards++;
        size_t n = d->shards[i].n_tokens;
        size_t windows = n > (size_t)T ? (n - 1) / (size_t)T : 0;
        d->first_window[i + 1] = d->first_window[i] + windows;
    }
    d->n_windows = d->first_window[count];
    if (d->n_windows == 0)
        rc = ddp_errinfo_set(ei, DDP_EINVAL,
                             "%s: the shards hold no complete sequence of %d tokens", glob, T + 1);
out:
    ddp_shard_glob_free(paths, count);
    if (rc) ddp_dataset_close(d);
    return rc;
}

void ddp_dataset_close(ddp_dataset_t *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_shards; i++) ddp_shard_close(&d->shards[i]);
    free(d->shards);
    free(d->first_window);
    memset(d, 0, sizeof *d);
}

/* A keyed pseudo-random permutation of [0, n): a 4-round Feistel network over the smallest
 * even number of bits covering n, with cycle walking for values >= n. Pure function of
 * (key, x); no memory proportional to n. */
static uint64_t round_fn(uint64_t key, int round, uint64_t half)
{
    uint64_t x = key ^ ((uint64_t)round * 0x9e3779b97f4a7c15ull) ^ (half * 0xd6e8feb86659fd93ull);
    return ddp_splitmix64(&x);
}

static uint64_t permute(uint64_t key, uint64_t n, uint64_t x)
{
    if (n <= 1) return 0;
    int bits = 2;
    while ((1ull << bits) < n) bits += 2;
    int hb = bits / 2;
    uint64_t mask = (1ull << hb) - 1;
    do {
        uint64_t left = x >> hb, right = x & mask;
        for (int r = 0; r < 4; r++) {
            uint64_t next = left ^ (round_fn(key, r, right) & mask);
            left = right;
            right = next;
        }
        x = (left << hb) | right;
    } while (x >= n);
    return x;
}

size_t ddp_dataset_sample(const ddp_dataset_t *d, uint64_t j)
{
    uint64_t epoch = j / d->n_windows;
    uint64_t key = d->seed * 0x2545f4914f6cdd1dull + epoch;
    return (size_t)permute(ddp_splitmix64(&key), d->n_windows, j % d->n_windows);
}

/* The token shard holding window w, by binary search over the prefix sums. */
static size_t shard_of(const ddp_dataset_t *d, size_t w)
{
    size_t lo = 0, hi = d->n_shards;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (d->first_window[mid] <= w)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int ddp_dataset_fill(const ddp_dataset_t *d, uint64_t j, int count, int shuffle, int32_t *inputs,
                     int32_t *targets, ddp_errinfo_t *ei)
{
    for (int i = 0; i < count; i++) {
        uint64_t g = j + (uint64_t)i;
        size_t w = shuffle ? ddp_dataset_sample(d, g) : (size_t)(g % d->n_windows);
        DDP_CHECK(ddp_dataset_fill_window(d, w, inputs + (size_t)i * d->T,
                                          targets + (size_t)i * d->T, ei));
    }
    return 0;
}

int ddp_dataset_fill_window(const ddp_dataset_t *d, size_t w, int32_t *in, int32_t *tg,
                            ddp_errinfo_t *ei)
{
    int T = d->T;
    size_t s = shard_of(d, w);
    size_t start = (w - d->first_window[s]) * (size_t)T;
    const ddp_shard_t *sh = &d->shards[s];
    /* the window's T + 1 tokens: the inputs are the first T, the targets the last T */
    DDP_CHECK(ddp_shard_read(sh, start, (size_t)T, (uint32_t *)in, ei));
    memcpy(tg, in + 1, (size_t)(T - 1) * sizeof *tg);
    DDP_CHECK(ddp_shard_read(sh, start + (size_t)T, 1, (uint32_t *)&tg[T - 1], ei));
    for (int t = 0; t <= T; t++) {
        uint32_t tok = (uint32_t)(t < T ? in[t] : tg[T - 1]);
        if (tok >= (uint32_t)d->vocab_size) {
            ddp_errinfo_set(ei, DDP_EFORMAT, "token %u at index %zu is >= vocab_size %d", tok,
                            start + t, d->vocab_size);
            ddp_errinfo_path(ei, "%s", sh->path);
            if (ei)
                ei->offset =
                    (long long)(DDP_SHARD_HEADER_BYTES + (size_t)sh->token_bytes * (start + t));
            return DDP_EFORMAT;
        }
    }
    return 0;
}

void ddp_loader_mix_step(const ddp_loader_mix_t *mix, ddp_mixture_state_t *s, int64_t G,
                         int64_t *drawn, const ddp_data_source_t *sources, long step, int log)
{
    int64_t before[DDP_MIXTURE_MAX];
    ddp_mixture_seek(&mix->m, s, (int64_t)(step - 1) * G); /* (a no-op: s is at the step) */
    memcpy(before, s->count, sizeof before);
    if (drawn) memset(drawn, 0, sizeof *drawn * (size_t)mix->m.n);
    ddp_mixture_draw(&mix->m, s, G, NULL, NULL, drawn);
    for (int d = 0; log && d < mix->m.n; d++) {
        /* sequence k is in epoch k / S: did this step draw a k > 0 that is a multiple of S? */
        int64_t S = (int64_t)mix->sets[d].n_windows, lo = before[d] > 0 ? before[d] : 1;
        int64_t last = s->count[d] - 1;
        if (last < lo || last / S == (lo - 1) / S) continue;
        DDP_INFO("data: source %s wraps into its epoch %lld (of %lld sequences) in step %ld; its "
                 "sequences now come in a new order",
                 sources[d].name, (long long)(last / S) + 1, (long long)S, step);
    }
}

/* ---- the prefetching loader ---- */

static uint64_t first_sample(const ddp_loader_t *l, int64_t key)
{
    int64_t step = key / l->accum, micro = key % l->accum;
    uint64_t G = (uint64_t)l->n_micro * l->B;
    return (uint64_t)step * G + ((uint64_t)micro * l->world + l->rank) * l->B;
}

static int slot_of(const ddp_loader_t *l, int64_t key)
{
    for (int s = 0; s < 2; s++)
        if (l->slot_key[s] == key) return s;
    return -1;
}

/* A slot the thread may fill next and the key for it, or -1. Caller holds mu. */
static int pick_work(const ddp_loader_t *l, int64_t *key)
{
    for (int64_t k = l->want; k <= l->want + 1; k++) {
        if (k < 0 || slot_of(l, k) >= 0) continue;
        for (int s = 0; s < 2; s++) {
            /* free, or holding a key the consumer has moved past (not the one it holds now) */
            if (l->slot_key[s] == -1 || (l->slot_key[s] >= 0 && l->slot_key[s] < l->want)) {
                *key = k;
                return s;
            }
        }
    }
    return -1;
}

/* A sample's id for the debug log's hash: its global index, source and window, mixed. */
static uint64_t sample_id(uint64_t j, int src, size_t w)
{
    uint64_t x = j * 0x9e3779b97f4a7c15ull ^ ((uint64_t)src << 56) ^ (uint64_t)w;
    return ddp_splitmix64(&x);
}

/* The mixture's assignment of step `step`'s G samples into mix_src/mix_k (loader thread). */
static void assign_step(ddp_loader_t *l, int64_t step)
{
    if (l->mix_step == step) return;
    int64_t G = (int64_t)l->n_micro * l->B;
    ddp_mixture_seek(&l->mix.m, &l->mix.at, step * G); /* back only when a step is redone */
    ddp_mixture_state_t s = l->mix.at;
    ddp_mixture_draw(&l->mix.m, &s, G, l->mix_src, l->mix_k, NULL);
    l->mix_step = step;
}

/* Micro-batch `key` into inputs/targets (loader thread). */
static int fill_micro(ddp_loader_t *l, int64_t key, int32_t *inputs, int32_t *targets, char *note,
                      size_t note_len, ddp_errinfo_t *ei)
{
    uint64_t j = first_sample(l, key), ids = 0;
    int64_t step = key / l->accum;
    int rc = 0;
    char drawn[1024] = ""; /* a mixture's " d:k" per sample, for the debug line */
    size_t at = 0;
    if (!l->has_mix) {
        rc = ddp_dataset_fill(l->d, j, l->B, 1, inputs, targets, ei);
        for (int i = 0; i < l->B; i++) ids += sample_id(j + i, 0, ddp_dataset_sample(l->d, j + i));
    } else {
        assign_step(l, step);
        uint64_t step0 = (uint64_t)step * l->n_micro * l->B;
        int T = l->mix.sets[0].T;
        for (int i = 0; rc == 0 && i < l->B; i++) {
            int d = l->mix_src[j + i - step0];
            size_t w = ddp_dataset_sample(&l->mix.sets[d], l->mix_k[j + i - step0]);
            ids += sample_id(j + i, d, w);
            if (at < sizeof drawn - 40)
                at += (size_t)snprintf(drawn + at, sizeof drawn - at, " %d:%llu", d,
                                       (unsigned long long)l->mix_k[j + i - step0]);
            rc = ddp_dataset_fill_window(&l->mix.sets[d], w, inputs + (size_t)i * T,
                                         targets + (size_t)i * T, ei);
        }
    }
    snprintf(note, note_len, "loader: step %lld samples [%llu, %llu) ids %016llx%s%s",
             (long long)step + 1, (unsigned long long)j, (unsigned long long)(j + l->B),
             (unsigned long long)ids, drawn[0] ? " source:sequence" : "", drawn);
    return rc;
}

static void *loader_main(void *arg)
{
    ddp_loader_t *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int64_t key = 0;
        int s;
        while (!l->stop && (s = pick_work(l, &key)) < 0) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        l->slot_key[s] = -2; /* being filled */
        pthread_mutex_unlock(&l->mu);
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        int64_t tr = ddp_trace_begin();
        int rc = fill_micro(l, key, l->buf[s][0], l->buf[s][1], l->slot_note[s],
                            sizeof l->slot_note[s], &ei);
        ddp_trace_end(DDP_TRACE_DATA, tr, "load step %lld micro-batch %lld",
                      (long long)(key / l->accum + 1), (long long)(key % l->accum));
        pthread_mutex_lock(&l->mu);
        l->slot_key[s] = key;
        l->slot_rc[s] = rc;
        l->slot_ei[s] = ei;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int start(ddp_loader_t *l, const ddp_dataset_t *d, const ddp_loader_mix_t *mix, int B,
                 int rank, int world, int n_micro);

int ddp_loader_start(ddp_loader_t *l, const ddp_dataset_t *d, int B, int rank, int world,
                     int n_micro)
{
    return start(l, d, NULL, B, rank, world, n_micro);
}

int ddp_loader_start_mix(ddp_loader_t *l, const ddp_loader_mix_t *mix, int B, int rank, int world,
                         int n_micro)
{
    return start(l, &mix->sets[0], mix, B, rank, world, n_micro);
}

static void free_buffers(ddp_loader_t *l)
{
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 2; b++) free(l->buf[s][b]);
    free(l->mix_src);
    free(l->mix_k);
    l->mix_src = NULL;
    l->mix_k = NULL;
}

static int start(ddp_loader_t *l, const ddp_dataset_t *d, const ddp_loader_mix_t *mix, int B,
                 int rank, int world, int n_micro)
{
    memset(l, 0, sizeof *l);
    l->d = d;
    l->B = B;
    l->rank = rank;
    l->world = world;
    l->n_micro = n_micro;
    l->accum = ddp_loader_accum(n_micro, rank, world);
    if (l->accum < 1) return DDP_EINVAL;
    l->want = -1;
    l->slot_key[0] = l->slot_key[1] = -1;
    size_t n = (size_t)B * d->T;
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 2; b++)
            if (!(l->buf[s][b] = ddp_malloc(n * sizeof(int32_t)))) goto nomem;
    l->mix_step = -1;
    if (mix) {
        size_t G = (size_t)n_micro * B;
        l->has_mix = 1;
        l->mix = *mix;
        l->mix_src = ddp_malloc(G * sizeof *l->mix_src);
        l->mix_k = ddp_malloc(G * sizeof *l->mix_k);
        if (!l->mix_src || !l->mix_k) goto nomem;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int rc = pthread_create(&l->thread, NULL, loader_main, l);
    if (rc) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free_buffers(l);
        return -rc;
    }
    l->started = 1;
    return 0;
nomem:
    free_buffers(l);
    return DDP_ENOMEM;
}

int ddp_loader_next(ddp_loader_t *l, long step, int micro, const int32_t **inputs,
                    const int32_t **targets, ddp_errinfo_t *ei)
{
    int64_t key = (int64_t)step * l->accum + micro;
    int64_t tr = ddp_trace_begin();
    pthread_mutex_lock(&l->mu);
    l->want = key;
    pthread_cond_broadcast(&l->cv);
    int s;
    while ((s = slot_of(l, key)) < 0) pthread_cond_wait(&l->cv, &l->mu);
    int rc = l->slot_rc[s];
    if (rc && ei) *ei = l->slot_ei[s];
    DDP_DEBUG("%s", l->slot_note[s]); /* what this micro-step trains on */
    *inputs = l->buf[s][0];
    *targets = l->buf[s][1];
    pthread_mutex_unlock(&l->mu);
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "data wait (micro-batch %d)", micro);
    return rc;
}

void ddp_loader_stop(ddp_loader_t *l)
{
    if (!l || !l->started) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free_buffers(l);
    l->started = 0;
}
