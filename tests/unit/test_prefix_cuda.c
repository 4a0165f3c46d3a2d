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
#include "prefix_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One prefill step with in-step snapshots on a CUDA device, where BF16 activations and per-M
 * backend plans make any change of a step's size move the logits by roundings that the random
 * synth models amplify (S9-R2: a cut prefill vs one step, 0.2 of the largest logit on
 * synth:demo), so every comparison here keeps the steps' sizes equal:
 *  - the step (sequence A: 20 tokens, snapshots after 8 and 13; sequence B: 5 tokens, none)
 *    against the same step without snapshots: only the gdn op's pieces differ (5e-2 of the
 *    largest logit; the CPU gives equal bits, test_prefix.c);
 *  - A continued from each snapshot (a 12- or 7-token step over the same KV pages) against the
 *    same continuation from the state a prefill cut there leaves (the pre-S9 snapshot): within
 *    5e-2, or within 0.3 x what a zeroed state is off by (the scale of a wrong state).
 * Covers the 35B's GDN shapes (dk = dv = 128, 32 value heads: cuda_chunked's column split) at
 * 4 layers, synth:demo and the qwen3_next fixture. */
static void test_in_step_snapshot_on_cuda_equals_the_cut_steps(void **st) {
    (void)st;
    static const char *names[] = {"synth:demo", "synth:qwen3.5-35b-a3b,layers=4", "qwen3_next"};
    const double TOL = 5e-2;
    int ran = 0;
    for (size_t mi = 0; mi < sizeof names / sizeof names[0]; mi++) {
        model *m = pfx_test_open(names[mi], "cuda");
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        ls_err e = {0};
        model_cache_opts co = {.page_size = 16, .n_pages = 8, .n_slots = 8};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        for (int sl = 0; sl < 8; sl++) model_slot_reset(m, sl);
        const int32_t pcut[2] = {0, 1}, pstep[2] = {2, 3}, pb[1] = {4};
        float *lg = malloc(sizeof(float) * (N_IDS + 5) * V), *l0 = malloc(sizeof(float) * (N_IDS + 5) * V);
        float *ref = malloc(sizeof(float) * N_IDS * V), *zero = malloc(sizeof(float) * N_IDS * V);
        /* the cut: slot 0, steps [0, 8), [8, 13), [13, 20); its state at 8 and 13 kept in slots 6, 7 */
        const int at[3] = {0, 8, 13};
        for (int k = 0; k < 3; k++) {
            int n = (k < 2 ? at[k + 1] : N_IDS) - at[k];
            fwd_seq q = {.slot = 0, .n_past = at[k], .n_new = n, .pages = pcut, .logits_all = 1};
            fwd_batch b = {.n_seq = 1, .seqs = &q, .ids = k_ids + at[k], .logits = lg};
            if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
            if (k < 2) assert_int_equal(model_slot_copy(m, 6 + k, 0, &e), 0);
        }
        /* the step without, then with snapshots (A in slot 1, B in slot 4; snapshots into 2 and 3) */
        int32_t ids[N_IDS + 5];
        memcpy(ids, k_ids, sizeof k_ids);
        memcpy(ids + N_IDS, k_ids, 5 * sizeof *ids);
        fwd_seq q[2] = {{.slot = 1, .n_past = 0, .n_new = N_IDS, .pages = pstep, .logits_all = 1},
                        {.slot = 4, .n_past = 0, .n_new = 5, .pages = pb, .logits_all = 1}};
        fwd_batch b = {.n_seq = 2, .seqs = q, .ids = ids, .logits = l0};
        if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
        model_slot_reset(m, 1);
        model_slot_reset(m, 4);
        q[0].n_snap = 2;
        q[0].snap_off[0] = 8;
        q[0].snap_off[1] = 13;
        q[0].snap_slot[0] = 2;
        q[0].snap_slot[1] = 3;
        b.logits = lg;
        if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
        double r = rows_err(lg, l0, N_IDS + 5, V);
        printf("%s: one step with in-step snapshots vs without: %.3g\n", names[mi], r);
        if (r > TOL) fail_msg("%s: the snapshots moved the step's logits by %g", names[mi], r);
        /* continuations over the cut's pages (13 first: the one from 8 rewrites tokens 8..12) */
        for (int k = 2; k >= 1; k--) {
            const int n = N_IDS - at[k];
            float *outs[3] = {zero, ref, lg};
            for (int v = 0; v < 3; v++) { /* a zeroed state, the cut's state, the in-step snapshot */
                if (v == 0) model_slot_reset(m, 5);
                else assert_int_equal(model_slot_copy(m, 5, v == 1 ? 5 + k : 1 + k, &e), 0);
                fwd_seq c = {.slot = 5, .n_past = at[k], .n_new = n, .pages = pcut, .logits_all = 1};
                fwd_batch cb = {.n_seq = 1, .seqs = &c, .ids = k_ids + at[k], .logits = outs[v]};
                if (model_forward(m, &cb, &e)) fail_msg("%s: %s", names[mi], e.msg);
            }
            double rs = rows_err(lg, ref, n, V), rz = rows_err(zero, ref, n, V);
            printf("%s: continued from the in-step snapshot at token %d vs from the cut's state: %.3g "
                   "(a zeroed state: %.3g)\n", names[mi], at[k], rs, rz);
            if (rs > TOL && rs > 0.3 * rz)
                fail_msg("%s: continued from the snapshot at token %d: logits differ by %g (zeroed state: %g)",
                         names[mi], at[k], rs, rz);
        }
        free(lg);
        free(l0);
        free(ref);
        free(zero);
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
