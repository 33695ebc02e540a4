/* A small seeded random number generator: xoshiro256** seeded through splitmix64.
 *
 * Every random choice of a run (initial weights, sampling) comes from one of these, so a run is a
 * pure function of its seed. The state is four words and is saved in checkpoints as is.
 * Written here rather than taken from a library: it is twelve lines, and its exact output
 * sequence is part of the checkpoint format, which a library could change under us.
 */
#ifndef DDP_COMMON_RNG_H
#define DDP_COMMON_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct ddp_rng {
    uint64_t s[4];
} ddp_rng_t;

static inline uint64_t ddp_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void ddp_rng_seed(ddp_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = ddp_splitmix64(&seed);
}

static inline uint64_t ddp_rng_next(ddp_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1) with 53 bits. */
static inline double ddp_rng_uniform(ddp_rng_t *r)
{
    return (double)(ddp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller; one value per call, the pair's second value discarded so the
 * state depends only on the number of calls). */
static inline double ddp_rng_normal(ddp_rng_t *r)
{
    double u1 = ddp_rng_uniform(r), u2 = ddp_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
