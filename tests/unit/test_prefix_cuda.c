/* test_prefix_cuda.c: the prefix cache's in-step GDN snapshots (fwd_seq.n_snap,
 * model_qwen3_next.c) on a CUDA device: the model side of what test_prefix.c pins exactly on
 * the CPU, here against the prefill cut into steps (the way snapshots were taken before S9),
 * within BF16 roundings. Uses synth presets and the qwen3_next fixture of ../shared (LS_SHARED
 * overrides; skipped when absent). Every test is skipped without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_IDS 20
static const int32_t k_ids[N_IDS] = {5, 900, 17, 256, 3, 77, 1000, 512, 42, 8,
                                     600, 13, 99, 731, 2, 64, 333, 870, 21, 400};

/* name: a synth preset or a fixture folder; NULL when the folder is absent or there is no CUDA
 * device */
static model *open_cuda(const char *name) {
    char path[512];
    model *m = NULL;
    ls_err e = {0};
    model_opts o = {.device = "cuda"};
    if (strncmp(name, "synth:", 6)) {
        const char *root = getenv("LS_SHARED") ? getenv("LS_SHARED") : "../shared";
        snprintf(path, sizeof path, "%s/fixtures/models/%s", root, name);
        if (access(path, R_OK)) return NULL;
        name = path;
    }
    int rc = model_open(name, &o, &m, &e);
    if (rc && strstr(e.msg, "no CUDA device")) return NULL;
    if (rc) fail_msg("open %s on cuda: %s", name, e.msg);
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

/* One prefill step with in-step snapshots on a CUDA device, where BF16 activations and per-M backend
 * plans make chunkings differ in their roundings: against the prefill cut into steps of 8, 5
 * and 7 tokens (the pre-S9 way to snapshot at tokens 8 and 13), the one-step prefill with
 * in-step snapshots there gives the same logits, and each snapshot continued in another slot
 * gives the cut run's logits from its token on (within 3e-2 of the largest logit; a zeroed
 * state is off by O(1) on synth:demo); so does a second sequence in the step. Covers the 35B's
 * GDN shapes (dk = dv = 128, 32 value heads: cuda_chunked's column split) at 4 layers. */
static void test_in_step_snapshot_on_cuda_equals_the_cut_steps(void **st) {
    (void)st;
    static const char *names[] = {"synth:demo", "synth:qwen3.5-35b-a3b,layers=4", "qwen3_next"};
    int ran = 0;
    for (size_t mi = 0; mi < sizeof names / sizeof names[0]; mi++) {
        model *m = open_cuda(names[mi]);
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        ls_err e = {0};
        model_cache_opts co = {.page_size = 16, .n_pages = 8, .n_slots = 6};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        for (int sl = 0; sl < 6; sl++) model_slot_reset(m, sl);
        const int32_t pcut[2] = {0, 1}, pstep[2] = {2, 3};
        float *cut = malloc(sizeof(float) * N_IDS * V), *lg = malloc(sizeof(float) * N_IDS * V);
        /* the cut: slot 0, steps [0, 8), [8, 13), [13, 20) */
        const int at[3] = {0, 8, 13};
        for (int k = 0; k < 3; k++) {
            int n = (k < 2 ? at[k + 1] : N_IDS) - at[k];
            fwd_seq q = {.slot = 0, .n_past = at[k], .n_new = n, .pages = pcut, .logits_all = 1};
            fwd_batch b = {.n_seq = 1, .seqs = &q, .ids = k_ids + at[k], .logits = cut + (size_t)at[k] * V};
            if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
        }
        /* one step in slot 1, snapshots into slots 2 and 3, beside a sequence without any (slot 4,
         * the first 5 tokens: only in the first gdn piece, which then spans both) */
        const int32_t pb[1] = {4};
        int32_t ids[N_IDS + 5];
        memcpy(ids, k_ids, sizeof k_ids);
        memcpy(ids + N_IDS, k_ids, 5 * sizeof *ids);
        fwd_seq q[2] = {{.slot = 1, .n_past = 0, .n_new = N_IDS, .pages = pstep, .logits_all = 1,
                         .n_snap = 2, .snap_off = {8, 13}, .snap_slot = {2, 3}},
                        {.slot = 4, .n_past = 0, .n_new = 5, .pages = pb, .logits_all = 1}};
        float *lg2 = malloc(sizeof(float) * (N_IDS + 5) * V);
        fwd_batch b = {.n_seq = 2, .seqs = q, .ids = ids, .logits = lg2};
        if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
        double r = rows_err(lg2, cut, N_IDS, V), rb = rows_err(lg2 + (size_t)N_IDS * V, cut, 5, V);
        free(lg2);
        printf("%s: one step with in-step snapshots vs the cut steps: %.3g (the other sequence: %.3g)\n",
               names[mi], r, rb);
        if (r > 3e-2 || rb > 3e-2)
            fail_msg("%s: the snapshotting step's logits differ from the cut's by %g (other sequence %g)",
                     names[mi], r, rb);
        for (int k = 1; k < 3; k++) {
            assert_int_equal(model_slot_copy(m, 5, 1 + k, &e), 0);
            fwd_seq c = {.slot = 5, .n_past = at[k], .n_new = N_IDS - at[k], .pages = pstep, .logits_all = 1};
            fwd_batch cb = {.n_seq = 1, .seqs = &c, .ids = k_ids + at[k], .logits = lg};
            if (model_forward(m, &cb, &e)) fail_msg("%s: %s", names[mi], e.msg);
            r = rows_err(lg, cut + (size_t)at[k] * V, N_IDS - at[k], V);
            printf("%s: continued from the snapshot at token %d vs the cut: %.3g\n", names[mi], at[k], r);
            if (r > 3e-2) fail_msg("%s: continued from the snapshot at token %d: logits differ by %g", names[mi],
                                   at[k], r);
        }
        free(lg);
        free(cut);
        model_close(m);
    }
    if (!ran) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_step_snapshot_on_cuda_equals_the_cut_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
