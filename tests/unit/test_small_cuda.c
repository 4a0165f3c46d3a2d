/* test_small_cuda.c: the CUDA small op qk_norm_rope_kv (src/ops/cuda/small.cu), an
 * attention layer's q/k head norm + RoPE and KV write in one launch, against the three
 * ops it replaces (qk_norm_rope on q, on k, kv_write) run on copies of the same inputs:
 * q, k and both KV pools must come out bitwise identical, for a BF16 and an fp32 pool,
 * two sequences (a decode row and a 5-token chunk that crosses a page), zero-centred and
 * plain norm weights, partial rotary; a token whose page is out of the pool is not
 * stored (its slot keeps the poison). The fused kernel is forced on
 * (LASTSTAND_SMALL_QKV=1, set before the first call unless the caller set it).
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) {
    static int state = -1;
    if (state >= 0) return state;
    state = 0;
    g_mem = ops_dev_mem(DEV_CUDA);
    ls_err e = {0};
    if (g_mem && g_mem->open(0, &g_dev, &g_st, &e) == 0) state = 1;
    else fprintf(stderr, "test_small_cuda: no CUDA device (%s): skipping\n", e.msg);
    return state;
}

static uint32_t g_rng = 777;
static float urand(void) { /* [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)(g_rng >> 8) / 8388608.f - 1.f;
}

static void *dev_copy(const void *h, size_t n) {
    ls_err e = {0};
    void *d = g_mem->alloc(n, &e);
    assert_non_null(d);
    assert_int_equal(g_mem->h2d(d, h, n, g_st, &e), 0);
    return d;
}

/* One case: kv dtype kvdt, norm kind. Runs the three ops on set A, the fused op on set B. */
static void one_case(act_dtype kvdt, rms_kind kind) {
    const small_ops *so = ops_small_find("cuda");
    assert_non_null(so);
    assert_non_null(so->qk_norm_rope_kv);
    enum { NH = 4, NKV = 2, HD = 64, ROT = 16, PS = 4, NP = 8, NT = 7 };
    const double theta = 1e6;
    const float eps = 1e-6f;
    ls_err e = {0};
    /* rows: sequence 0 = 1 decode row at position 9 (page 2 of its table), sequence 1 = rows
     * 1..5 at positions 2..6 (pages 0 and 1 of its table: crosses a page), row 6 = a token at
     * position 3 of sequence 2 whose page is out of the pool */
    uint16_t q[NT * NH * HD], k[NT * NKV * HD], v[NT * NKV * HD];
    for (int i = 0; i < NT * NH * HD; i++) q[i] = f32_to_bf16(urand() * 3.f);
    for (int i = 0; i < NT * NKV * HD; i++) k[i] = f32_to_bf16(urand() * 3.f), v[i] = f32_to_bf16(urand());
    float qw[HD], kw[HD];
    for (int i = 0; i < HD; i++) qw[i] = 1.f + 0.3f * urand(), kw[i] = 0.2f * urand();
    int32_t pos[NT] = {9, 2, 3, 4, 5, 6, 3};
    int32_t pg0[3] = {5, 6, 1}, pg1[2] = {3, 7}, pg2[1] = {NP + 3};
    int32_t *dpg0 = dev_copy(pg0, sizeof pg0), *dpg1 = dev_copy(pg1, sizeof pg1), *dpg2 = dev_copy(pg2, sizeof pg2);
    attn_seq seqs[3] = {{.n_past = 9, .n_new = 1, .row0 = 0, .pages = dpg0},
                        {.n_past = 2, .n_new = 5, .row0 = 1, .pages = dpg1},
                        {.n_past = 3, .n_new = 1, .row0 = 6, .pages = dpg2}};
    attn_seq *dseqs = dev_copy(seqs, sizeof seqs);
    const size_t es = kvdt == ACT_BF16 ? 2 : 4, pool = (size_t)NP * PS * NKV * HD * es;
    unsigned char *poison = malloc(pool);
    memset(poison, 0x7f, pool);
    void *dq[2], *dk[2], *dv = dev_copy(v, sizeof v), *kp[2], *vp[2];
    float *dqw = dev_copy(qw, sizeof qw), *dkw = dev_copy(kw, sizeof kw);
    int32_t *dpos = dev_copy(pos, sizeof pos);
    for (int s = 0; s < 2; s++) {
        dq[s] = dev_copy(q, sizeof q);
        dk[s] = dev_copy(k, sizeof k);
        kp[s] = dev_copy(poison, pool);
        vp[s] = dev_copy(poison, pool);
    }
    kv_layer kv[2];
    for (int s = 0; s < 2; s++) kv[s] = (kv_layer){.k = kp[s], .v = vp[s], .n_pages = NP, .page_size = PS, .dt = kvdt};
    assert_int_equal(so->qk_norm_rope(NT, NH, HD, dq[0], dqw, kind, eps, ROT, dpos, theta, ACT_BF16, g_st), 0);
    assert_int_equal(so->qk_norm_rope(NT, NKV, HD, dk[0], dkw, kind, eps, ROT, dpos, theta, ACT_BF16, g_st), 0);
    assert_int_equal(so->kv_write(&kv[0], 3, dseqs, NKV, HD, dk[0], dv, ACT_BF16, g_st), 0);
    assert_int_equal(so->qk_norm_rope_kv(NT, NH, NKV, HD, dq[1], dk[1], dv, dqw, dkw, kind, eps, ROT, dpos, theta,
                                         &kv[1], 3, dseqs, ACT_BF16, g_st), 0);
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    unsigned char *a = malloc(pool), *b = malloc(pool);
    const size_t sizes[4] = {sizeof q, sizeof k, pool, pool};
    void *const *bufs[4] = {dq, dk, kp, vp};
    const char *what[4] = {"q", "k", "K pool", "V pool"};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(g_mem->d2h(a, bufs[j][0], sizes[j], g_st, &e), 0);
        assert_int_equal(g_mem->d2h(b, bufs[j][1], sizes[j], g_st, &e), 0);
        if (memcmp(a, b, sizes[j])) fprintf(stderr, "qk_norm_rope_kv: %s differs from the three ops\n", what[j]);
        assert_memory_equal(a, b, sizes[j]);
        if (j == 2) { /* the pool was written where it should be, and not for row 6 */
            size_t written = 0;
            for (size_t i = 0; i < pool; i++) written += a[i] != 0x7f;
            assert_true(written > 0);
            assert_true(written <= (size_t)6 * NKV * HD * es);
        }
    }
    free(a);
    free(b);
    free(poison);
    for (int s = 0; s < 2; s++) {
        g_mem->free(dq[s]); g_mem->free(dk[s]); g_mem->free(kp[s]); g_mem->free(vp[s]);
    }
    g_mem->free(dv); g_mem->free(dqw); g_mem->free(dkw); g_mem->free(dpos); g_mem->free(dseqs);
    g_mem->free(dpg0); g_mem->free(dpg1); g_mem->free(dpg2);
}
#endif

static void test_qk_norm_rope_kv_equals_the_three_ops(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    one_case(ACT_BF16, RMS_ZC);
    one_case(ACT_BF16, RMS_PLAIN);
    one_case(ACT_F32, RMS_ZC);
#else
    skip();
#endif
}

int main(void) {
    setenv("LASTSTAND_SMALL_QKV", "1", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qk_norm_rope_kv_equals_the_three_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
