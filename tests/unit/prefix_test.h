/* prefix_test.h: the model side that test_prefix.c (CPU) and test_prefix_cuda.c (CUDA) share
 * for the prefix cache's in-step snapshots: the 20 prompt ids, opening a synth preset or a
 * fixture of ../shared (LS_SHARED overrides) on a device, and the logits rows' relative error.
 * Header-only: include it after <cmocka.h> (fail_msg) and model/model.h. */
#ifndef LS_TESTS_PREFIX_TEST_H
#define LS_TESTS_PREFIX_TEST_H

#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef cmocka_unit_test
#error "prefix_test.h: include <cmocka.h> first (fail_msg)"
#endif

#define N_IDS 20
static const int32_t k_ids[N_IDS] = {5, 900, 17, 256, 3, 77, 1000, 512, 42, 8,
                                     600, 13, 99, 731, 2, 64, 333, 870, 21, 400};

/* name: a synth preset or a fixture folder, opened on device ("cpu", "cuda"); NULL when the
 * folder is absent or (cuda) there is no CUDA device; any other failure fails the test */
static model *pfx_test_open(const char *name, const char *device) {
    char path[512];
    model *m = NULL;
    ls_err e = {0};
    model_opts o = {.device = device};
    if (strncmp(name, "synth:", 6)) {
        const char *root = getenv("LS_SHARED") ? getenv("LS_SHARED") : "../shared";
        snprintf(path, sizeof path, "%s/fixtures/models/%s", root, name);
        if (access(path, R_OK)) return NULL;
        name = path;
    }
    int rc = model_open(name, &o, &m, &e);
    if (rc && !strcmp(device, "cuda") && strstr(e.msg, "no CUDA device")) return NULL;
    if (rc) fail_msg("open %s on %s: %s", name, device, e.msg);
    return m;
}

/* max |a - b| / max |b| over n rows of V */
static double rows_err(const float *a, const float *b, int n, int V) {
    double d = 0, mx = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / mx;
}

#endif
