/* cuda_test.h: how the CUDA cmocka tests (tests/unit/test_*_cuda.c) find their GPU.
 *
 * cuda_test_gpu(name, min_cc_major, &mem, &dev, &stream) opens device 0 through the
 * registered CUDA dev_mem once per test binary and says whether it is there and of compute
 * capability >= min_cc_major (0: any); when not, it prints "NAME: no CUDA device ...:
 * skipping" once and the caller skips (cmocka's skip()), so the binary passes on a machine
 * without a GPU (CI) and tests for real on one. Header-only: each test binary has its own
 * state.
 *
 * Helpers every CUDA test shares (include this header after <cmocka.h>):
 *   rnd() / urand(): the inputs' LCG (x = 1664525·x + 1013904223 mod 2^32), rnd() its top 24
 *     bits, urand() those as a float in [-1, 1); the binary picks its seed by defining
 *     CUDA_TEST_SEED before the include (each test keeps the inputs it was written with);
 *   dev_copy(h, n): n bytes of host memory h in a new buffer of the device that cuda_test_gpu
 *     opened (asserts on failure; the test frees it through its dev_mem or leaks it at exit);
 *   dev_fetch(h, d, n): n bytes of device buffer d into host memory h (asserts on failure);
 *   diff_count(x, y, n, es, &first): how many of the n / es elements of es bytes differ between
 *     host buffers x and y, bit for bit (*first: the index of the first; untouched when none);
 *     dev_diff_count: the same for two device buffers. */
#ifndef LS_TESTS_CUDA_TEST_H
#define LS_TESTS_CUDA_TEST_H

#include "ops/ops.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef cmocka_unit_test
#error "cuda_test.h: include <cmocka.h> first (dev_copy asserts)"
#endif
#ifndef CUDA_TEST_SEED
#define CUDA_TEST_SEED 2024u
#endif

static const dev_mem *cuda_test_mem; /* what cuda_test_gpu opened, for dev_copy */
static ls_stream cuda_test_stream;
static uint32_t cuda_test_rng = CUDA_TEST_SEED;

static inline int cuda_test_gpu(const char *name, int min_cc_major, const dev_mem **mem, dev_info *dev,
                                ls_stream *st) {
    static int state = -1;
    if (state >= 0) return state;
    state = 0;
    *mem = ops_dev_mem(DEV_CUDA);
    ls_err e = {0};
    if (!*mem || (*mem)->open(0, dev, st, &e) != 0) {
        fprintf(stderr, "%s: no CUDA device (%s): skipping\n", name, e.msg[0] ? e.msg : "no CUDA dev_mem registered");
        return state;
    }
    if (dev->cc_major < min_cc_major) {
        fprintf(stderr, "%s: the CUDA device is cc %d.%d, needs >= %d.0: skipping\n", name, dev->cc_major,
                dev->cc_minor, min_cc_major);
        return state;
    }
    cuda_test_mem = *mem;
    cuda_test_stream = *st;
    return state = 1;
}

static inline uint32_t rnd(void) {
    cuda_test_rng = cuda_test_rng * 1664525u + 1013904223u;
    return cuda_test_rng >> 8;
}

static inline float urand(void) { return (float)rnd() / 8388608.f - 1.f; } /* [-1, 1) */

static inline void *dev_copy(const void *h, size_t n) {
    ls_err e = {0};
    assert_non_null(cuda_test_mem);
    void *d = cuda_test_mem->alloc(n, &e);
    assert_non_null(d);
    assert_int_equal(cuda_test_mem->h2d(d, h, n, cuda_test_stream, &e), 0);
    return d;
}

static inline void dev_fetch(void *h, const void *d, size_t n) {
    ls_err e = {0};
    assert_non_null(cuda_test_mem);
    assert_int_equal(cuda_test_mem->d2h(h, d, n, cuda_test_stream, &e), 0);
}

static inline size_t diff_count(const void *x, const void *y, size_t n, size_t es, size_t *first) {
    const unsigned char *a = x, *b = y;
    size_t bad = 0;
    for (size_t i = 0; i < n / es; i++)
        if (memcmp(a + i * es, b + i * es, es) && !bad++) *first = i;
    return bad;
}

static inline size_t dev_diff_count(const void *da, const void *db, size_t n, size_t es, size_t *first) {
    unsigned char *x = malloc(n), *y = malloc(n);
    assert_non_null(x);
    assert_non_null(y);
    dev_fetch(x, da, n);
    dev_fetch(y, db, n);
    const size_t bad = diff_count(x, y, n, es, first);
    free(x);
    free(y);
    return bad;
}

#endif
