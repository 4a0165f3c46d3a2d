/* cuda_test.h: how the CUDA cmocka tests (tests/unit/test_*_cuda.c) find their GPU.
 *
 * cuda_test_gpu(name, min_cc_major, &mem, &dev, &stream) opens device 0 through the
 * registered CUDA dev_mem once per test binary and says whether it is there and of compute
 * capability >= min_cc_major (0: any); when not, it prints "NAME: no CUDA device ...:
 * skipping" once and the caller skips (cmocka's skip()), so the binary passes on a machine
 * without a GPU (CI) and tests for real on one. Header-only: each test binary has its own
 * state. */
#ifndef LS_TESTS_CUDA_TEST_H
#define LS_TESTS_CUDA_TEST_H

#include "ops/ops.h"

#include <stdio.h>

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
    return state = 1;
}

#endif
