/* test_small_cuda.c: the CUDA small op qk_norm_rope_kv (src/ops/cuda/small.cu), an
 * attention layer's q/k head norm + RoPE and KV write in one launch, against the three
 * ops it replaces (qk_norm_rope on q, on k, kv_write) run on copies of the same inputs:
 * q, k and both KV pools must come out bitwise identical, for a BF16 and an fp32 pool,
 * two sequences (a decode row and a 5-token chunk that crosses a page), zero-centred and
 * plain norm weights, partial rotary; a token whose page is out of the pool is not
 * stored (its slot keeps the poison). The fused kernel is forced on
 * (LASTSTAND_SMALL_QKV=1, set before the first call unless the caller set it).
 * add_rmsnorm (LASTSTAND_SMALL_ADDNORM=1 likewise: its one-round-trip kernel) against
 * the host: the residual sum exactly, the normed row within one BF16 rounding.
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 777u
#include "cuda_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) { return cuda_test_gpu("test_small_cuda", 0, &g_mem, &g_dev, &g_st); }

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

#ifdef LS_HAVE_CUDA
/* add_rmsnorm on rows x cols against the host: h' = h + x (init: x) in fp32, exactly; y =
 * norm(h') in BF16 within one BF16 rounding of the fp64 value (the sum of squares' order
 * differs from the host's). */
static void addnorm_case(int rows, int cols, int init, rms_kind kind) {
    const small_ops *so = ops_small_find("cuda");
    ls_err e = {0};
    const size_t n = (size_t)rows * cols;
    float *h = malloc(n * 4), *w = malloc(cols * 4), *h2 = malloc(n * 4);
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = 4.f * urand(), x[i] = f32_to_bf16(2.f * urand());
    for (int i = 0; i < cols; i++) w[i] = kind == RMS_ZC ? 0.3f * urand() : 1.f + 0.3f * urand();
    float *dh = dev_copy(h, n * 4), *dw = dev_copy(w, cols * 4);
    void *dx = dev_copy(x, n * 2), *dy = dev_copy(x, n * 2);
    assert_int_equal(so->add_rmsnorm(rows, cols, dh, dx, init, dw, kind, 1e-6f, dy, ACT_BF16, g_st), 0);
    assert_int_equal(g_mem->d2h(h2, dh, n * 4, g_st, &e), 0);
    assert_int_equal(g_mem->d2h(y, dy, n * 2, g_st, &e), 0);
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * cols + c;
            const float v = init ? bf16_to_f32(x[i]) : h[i] + bf16_to_f32(x[i]);
            if (h2[i] != v && bad++ < 3) fprintf(stderr, "add_rmsnorm [%d x %d]: h[%d,%d] %g, want %g\n", rows, cols, r, c, h2[i], v);
            ss += (double)v * v;
        }
        const double sc = 1.0 / sqrt(ss / cols + 1e-6);
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * cols + c;
            const double xh = (double)h2[i] * sc, ref = kind == RMS_ZC ? xh * (1.0 + w[c]) : w[c] * xh;
            const double got = bf16_to_f32(y[i]);
            if (!(fabs(got - ref) <= fabs(ref) / 128 + 1e-6) && bad++ < 3)
                fprintf(stderr, "add_rmsnorm [%d x %d]: y[%d,%d] %g, fp64 %g\n", rows, cols, r, c, got, ref);
        }
    }
    assert_int_equal(bad, 0);
    g_mem->free(dh); g_mem->free(dw); g_mem->free(dx); g_mem->free(dy);
    free(h); free(w); free(h2); free(x); free(y);
}
#endif

/* add_rmsnorm (LASTSTAND_SMALL_ADDNORM=1: the one-round-trip kernel where cols % 8 == 0,
 * else the loop) against the host, H = 2048 and 4096 (the 35B and 397B models), a short
 * odd row, init and not, both norm kinds. */
static void test_add_rmsnorm_matches_the_host(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int shapes[][2] = {{1, 2048}, {5, 2048}, {1, 4096}, {3, 4096}, {2, 200}, {2, 36}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int init = 0; init < 2; init++) {
            addnorm_case(shapes[i][0], shapes[i][1], init, RMS_ZC);
            addnorm_case(shapes[i][0], shapes[i][1], init, RMS_PLAIN);
        }
#else
    skip();
#endif
}

int main(void) {
    setenv("LASTSTAND_SMALL_QKV", "1", 0);
    setenv("LASTSTAND_SMALL_ADDNORM", "1", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qk_norm_rope_kv_equals_the_three_ops),
        cmocka_unit_test(test_add_rmsnorm_matches_the_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
