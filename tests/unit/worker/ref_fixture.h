/* Reference fixtures of the model tests (test_gpt2.c, test_llama.c): a .bin of little-endian
 * tensors and a .json index {"config": {...}, "tensors": {name: {"offset", "shape", "dtype"}}},
 * as tests/fixtures/make_gpt2_fixtures.py and make_llama_fixtures.py write them. A missing
 * tensor or key fails the running cmocka test. */
#ifndef DDP_TESTS_REF_FIXTURE_H
#define DDP_TESTS_REF_FIXTURE_H

#include <jansson.h>
#include <stddef.h>

typedef struct {
    json_t *meta;
    char *blob;
} ref_fixture_t;

/* Loads $DDP_SOURCE_ROOT/<json> and <bin>. Returns 0 or -1. */
int ref_open(ref_fixture_t *r, const char *json, const char *bin);
void ref_close(ref_fixture_t *r);
/* The tensor `name` and its element count (numel may be NULL). */
const void *ref_tensor(const ref_fixture_t *r, const char *name, size_t *numel);
/* config.<key> as a number. */
double ref_num(const ref_fixture_t *r, const char *key);
/* |a - ref| / |ref| over n elements, in double. */
double ref_rel_norm_err(const float *a, const float *ref, size_t n);

#endif
