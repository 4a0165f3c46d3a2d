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
 * The row-wise norms' two forms (small_cuda_block: one block a row; small_cuda_rows: one warp
 * a row, persistent, LASTSTAND_SMALL_ROWS's default from 2048 rows) on the same inputs:
 * rmsnorm, rmsnorm_gated, qk_norm_rope and qk_norm_rope_kv must give the same bytes (outputs, both KV pools) on the
 * 35B's prefill shapes (8192 tokens x 32 v heads x 128 gated, 2048 tokens x 16 q / 2 kv heads
 * x 256, rot 64, a paged pool with pages missing and tokens outside every sequence) and odd
 * ones (cols not a multiple of 32, head_dim 64 / 96 / 128, rot_dim = head_dim, rot 16 and
 * 0, both norm kinds, an fp32 pool, in place); the warp form against the host (fp64 norm,
 * the same fp32 inverse frequencies) within one BF16 rounding, its KV pools against the
 * host's slot map exactly (every slot no token owns keeps the poison).
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#include "ops/cuda/fwd_cuda.h"
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
        dev_fetch(a, bufs[j][0], sizes[j]);
        dev_fetch(b, bufs[j][1], sizes[j]);
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
    const size_t n = (size_t)rows * cols;
    float *h = malloc(n * 4), *w = malloc(cols * 4), *h2 = malloc(n * 4);
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = 4.f * urand(), x[i] = f32_to_bf16(2.f * urand());
    for (int i = 0; i < cols; i++) w[i] = kind == RMS_ZC ? 0.3f * urand() : 1.f + 0.3f * urand();
    float *dh = dev_copy(h, n * 4), *dw = dev_copy(w, cols * 4);
    void *dx = dev_copy(x, n * 2), *dy = dev_copy(x, n * 2);
    assert_int_equal(so->add_rmsnorm(rows, cols, dh, dx, init, dw, kind, 1e-6f, dy, ACT_BF16, g_st), 0);
    dev_fetch(h2, dh, n * 4);
    dev_fetch(y, dy, n * 2);
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

#ifdef LS_HAVE_CUDA
enum { NF = 2 }; /* the forms: small_cuda_block (the oracle), small_cuda_rows */

static int first_diff(const void *a, const void *b, size_t n, size_t es) {
    size_t first = 0;
    return diff_count(a, b, n, es, &first) ? (int)first : -1;
}

static double silu_d(double z) { return z / (1.0 + exp(-z)); }

/* rmsnorm (gated: rmsnorm_gated) on rows x cols by both forms: the same bytes; the warp form
 * against the host in fp64 on every 61st row and the last, within one BF16 rounding. Row 1 is
 * all zeros (y = 0). inplace: y aliases x. */
static void rows_norm_case(int rows, int cols, int gated, rms_kind kind, int inplace) {
    const small_ops *fm[NF] = {&small_cuda_block, &small_cuda_rows};
    const size_t n = (size_t)rows * cols;
    const float eps = 1e-6f;
    uint16_t *x = malloc(n * 2), *z = malloc(n * 2), *y[NF] = {malloc(n * 2), malloc(n * 2)};
    float *w = malloc(cols * 4);
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(3.f * urand()), z[i] = f32_to_bf16(4.f * urand());
    if (rows > 1) memset(x + cols, 0, (size_t)cols * 2);
    for (int i = 0; i < cols; i++) w[i] = kind == RMS_ZC ? 0.3f * urand() : 1.f + 0.3f * urand();
    void *dx = dev_copy(x, n * 2), *dz = dev_copy(z, n * 2), *dy[NF];
    float *dw = dev_copy(w, cols * 4);
    for (int f = 0; f < NF; f++) {
        void *in = inplace ? dev_copy(x, n * 2) : dx;
        dy[f] = inplace ? in : dev_copy(z, n * 2);
        const int rc = gated ? fm[f]->rmsnorm_gated(rows, cols, in, dz, dw, eps, dy[f], ACT_BF16, g_st)
                             : fm[f]->rmsnorm(rows, cols, in, dw, kind, eps, dy[f], ACT_BF16, g_st);
        assert_int_equal(rc, 0);
        dev_fetch(y[f], dy[f], n * 2);
    }
    for (int f = 1; f < NF; f++) {
        const int d = first_diff(y[0], y[f], n * 2, 2);
        if (d >= 0)
            fprintf(stderr, "rmsnorm%s [%d x %d]: %s differs from the block form at [%d, %d]: %#x vs %#x\n",
                    gated ? "_gated" : "", rows, cols, fm[f]->name, d / cols, d % cols, y[f][d], y[0][d]);
        assert_int_equal(d, -1);
    }
    int bad = 0;
    for (int r = 0; r < rows; r = r + 61 < rows || r == rows - 1 ? r + 61 : rows - 1) {
        double ss = 0;
        for (int c = 0; c < cols; c++) ss += (double)bf16_to_f32(x[(size_t)r * cols + c]) * bf16_to_f32(x[(size_t)r * cols + c]);
        const double sc = 1.0 / sqrt(ss / cols + eps);
        for (int c = 0; c < cols; c++) {
            const size_t i = (size_t)r * cols + c;
            const double xh = bf16_to_f32(x[i]) * sc;
            const double ref = gated ? w[c] * xh * silu_d(bf16_to_f32(z[i])) : kind == RMS_ZC ? xh * (1.0 + w[c]) : w[c] * xh;
            const double got = bf16_to_f32(y[1][i]);
            if (!(fabs(got - ref) <= fabs(ref) / 128 + 1e-6) && bad++ < 3)
                fprintf(stderr, "rmsnorm%s [%d x %d]: y[%d,%d] %g, fp64 %g\n", gated ? "_gated" : "", rows, cols, r, c,
                        got, ref);
        }
    }
    assert_int_equal(bad, 0);
    for (int f = 0; f < NF; f++) g_mem->free(dy[f]), free(y[f]);
    g_mem->free(dx); g_mem->free(dz); g_mem->free(dw);
    free(x); free(z); free(w);
}
#endif

/* rmsnorm_gated / rmsnorm: one warp a row = one block a row, bit for bit, and the host. */
static void test_rows_norms_equal_the_block_form(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    rows_norm_case(8192 * 32, 128, 1, RMS_PLAIN, 0); /* the 35B's GDN output norm, 8192 tokens */
    rows_norm_case(8192 * 32, 128, 1, RMS_PLAIN, 1);
    rows_norm_case(37, 128, 1, RMS_PLAIN, 0);         /* decode-sized */
    rows_norm_case(20000, 100, 1, RMS_PLAIN, 0);      /* cols not a multiple of 32 */
    rows_norm_case(5, 200, 1, RMS_PLAIN, 1);
    rows_norm_case(3, 17, 1, RMS_PLAIN, 0);
    rows_norm_case(17000, 256, 0, RMS_ZC, 0);
    rows_norm_case(9, 256, 0, RMS_PLAIN, 1);
    rows_norm_case(40000, 64, 0, RMS_ZC, 1);
    rows_norm_case(7, 40, 0, RMS_PLAIN, 0);
    rows_norm_case(4, 2048, 0, RMS_ZC, 0);            /* cols > 256: both the block kernel */
#else
    skip();
#endif
}

#ifdef LS_HAVE_CUDA
/* qk_norm_rope_kv (fused) on nt tokens x (nh q + nkv kv heads) x hd by both forms, a paged pool
 * (page size 16) of dtype kvdt: sequence 0 = tokens [0, nt/2) at positions 37.., its pages 2
 * (missing: -1) and 3 (outside the pool) unwritable; sequence 1 = tokens [nt/2, nt - 3) from
 * position 0; the last 3 tokens in no sequence. q, k and both pools: the same bytes; the warp
 * form's q and k rows against the host (fp64 norm and rotation of the fp32 angle) on every
 * 53rd token; its pools against the host's slot map. */
static void rows_qk_case(int nt, int nh, int nkv, int hd, int rot, rms_kind kind, act_dtype kvdt) {
    const small_ops *fm[NF] = {&small_cuda_block, &small_cuda_rows};
    enum { PS = 16 };
    const double theta = 1e7;
    const float eps = 1e-6f;
    const int n0 = nt / 2, n1 = nt - 3 - n0, past0 = 37;
    const int p0 = (past0 + n0 + PS - 1) / PS, p1 = (n1 + PS - 1) / PS, np = p0 + p1;
    int32_t *pg0 = malloc(p0 * 4), *pg1 = malloc(p1 * 4);
    for (int i = 0; i < p0; i++) pg0[i] = np - 1 - i; /* reversed: page order is not token order */
    if (p0 > 3) pg0[2] = -1, pg0[3] = np + 5;
    for (int i = 0; i < p1; i++) pg1[i] = i;
    int32_t *dpg0 = dev_copy(pg0, p0 * 4), *dpg1 = dev_copy(pg1, p1 * 4);
    attn_seq seqs[2] = {{.n_past = past0, .n_new = n0, .row0 = 0, .pages = dpg0},
                        {.n_past = 0, .n_new = n1, .row0 = n0, .pages = dpg1}};
    attn_seq *dseqs = dev_copy(seqs, sizeof seqs);
    int32_t *pos = malloc(nt * 4);
    long long *slot = malloc(nt * sizeof *slot); /* the host's slot map */
    for (int t = 0; t < nt; t++) {
        const int sq = t < n0 ? 0 : t < n0 + n1 ? 1 : -1;
        pos[t] = sq == 0 ? past0 + t : sq == 1 ? t - n0 : 5;
        slot[t] = -1;
        if (sq >= 0) {
            const int32_t page = (sq ? pg1 : pg0)[pos[t] / PS];
            if (page >= 0 && page < np) slot[t] = (long long)page * PS + pos[t] % PS;
        }
    }
    const size_t nq = (size_t)nt * nh * hd, nk = (size_t)nt * nkv * hd, es = kvdt == ACT_BF16 ? 2 : 4;
    const size_t pool = (size_t)np * PS * nkv * hd * es;
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2);
    for (size_t i = 0; i < nq; i++) q[i] = f32_to_bf16(urand() * 3.f);
    for (size_t i = 0; i < nk; i++) k[i] = f32_to_bf16(urand() * 3.f), v[i] = f32_to_bf16(urand());
    float *qw = malloc(hd * 4), *kw = malloc(hd * 4);
    for (int i = 0; i < hd; i++)
        qw[i] = kind == RMS_ZC ? 0.3f * urand() : 1.f + 0.3f * urand(), kw[i] = kind == RMS_ZC ? 0.2f * urand() : 1.f + 0.2f * urand();
    unsigned char *poison = malloc(pool);
    memset(poison, 0x7f, pool);
    float *dqw = dev_copy(qw, hd * 4), *dkw = dev_copy(kw, hd * 4);
    int32_t *dpos = dev_copy(pos, nt * 4);
    void *dv = dev_copy(v, nk * 2), *dq[NF], *dk[NF], *kp[NF], *vp[NF];
    for (int f = 0; f < NF; f++) {
        dq[f] = dev_copy(q, nq * 2);
        dk[f] = dev_copy(k, nk * 2);
        kp[f] = dev_copy(poison, pool);
        vp[f] = dev_copy(poison, pool);
        kv_layer kv = {.k = kp[f], .v = vp[f], .n_pages = np, .page_size = PS, .dt = kvdt};
        assert_int_equal(fm[f]->qk_norm_rope_kv(nt, nh, nkv, hd, dq[f], dk[f], dv, dqw, dkw, kind, eps, rot, dpos,
                                                theta, &kv, 2, dseqs, ACT_BF16, g_st), 0);
    }
    uint16_t *oq[NF], *ok[NF];
    unsigned char *ko[NF], *vo[NF];
    for (int f = 0; f < NF; f++) {
        oq[f] = malloc(nq * 2), ok[f] = malloc(nk * 2), ko[f] = malloc(pool), vo[f] = malloc(pool);
        dev_fetch(oq[f], dq[f], nq * 2);
        dev_fetch(ok[f], dk[f], nk * 2);
        dev_fetch(ko[f], kp[f], pool);
        dev_fetch(vo[f], vp[f], pool);
    }
    for (int f = 1; f < NF; f++) {
        const void *pa[4] = {oq[0], ok[0], ko[0], vo[0]}, *pb[4] = {oq[f], ok[f], ko[f], vo[f]};
        const size_t sz[4] = {nq * 2, nk * 2, pool, pool}, esz[4] = {2, 2, es, es};
        const char *what[4] = {"q", "k", "K pool", "V pool"};
        for (int j = 0; j < 4; j++) {
            const int d = first_diff(pa[j], pb[j], sz[j], esz[j]);
            if (d >= 0)
                fprintf(stderr, "qk_norm_rope_kv [%d tok, %d+%d x %d, rot %d]: %s's %s differs at element %d\n", nt,
                        nh, nkv, hd, rot, fm[f]->name, what[j], d);
            assert_int_equal(d, -1);
        }
    }
    /* the pools against the slot map: owned slots hold the token's k (as written to k) and v,
     * the others the poison */
    const size_t prow = (size_t)nkv * hd;
    unsigned char *owned = calloc((size_t)np * PS, 1);
    int bad = 0;
    for (int t = 0; t < nt; t++) {
        if (slot[t] < 0) continue;
        owned[slot[t]] = 1;
        for (size_t c = 0; c < prow; c++) {
            const size_t pi = (size_t)slot[t] * prow + c, ti = (size_t)t * prow + c;
            float kg, vg;
            if (es == 2) {
                kg = bf16_to_f32(((uint16_t *)ko[1])[pi]), vg = bf16_to_f32(((uint16_t *)vo[1])[pi]);
            } else {
                kg = ((float *)ko[1])[pi], vg = ((float *)vo[1])[pi];
            }
            if ((kg != bf16_to_f32(ok[1][ti]) || vg != bf16_to_f32(v[ti])) && bad++ < 3)
                fprintf(stderr, "qk_norm_rope_kv: token %d's pool slot %lld col %zu: k %g (want %g), v %g (want %g)\n", t,
                        slot[t], c, kg, bf16_to_f32(ok[1][ti]), vg, bf16_to_f32(v[ti]));
        }
    }
    for (long long sl = 0; sl < (long long)np * PS; sl++)
        if (!owned[sl])
            for (size_t b = 0; b < prow * es; b++)
                if ((ko[1][sl * prow * es + b] != 0x7f || vo[1][sl * prow * es + b] != 0x7f) && bad++ < 3)
                    fprintf(stderr, "qk_norm_rope_kv: pool slot %lld (no token's) was written\n", sl);
    /* q and k rows against the host */
    const int half = rot >= 2 ? rot / 2 : 0, rd = rot >= 2 ? rot : 0;
    double *row = malloc(hd * sizeof *row);
    for (int t = 0; t < nt; t = t + 53 < nt || t == nt - 1 ? t + 53 : nt - 1) {
        for (int h = 0; h < nh + nkv; h++) {
            const int isk = h >= nh;
            const uint16_t *xi = isk ? k + ((size_t)t * nkv + h - nh) * hd : q + ((size_t)t * nh + h) * hd;
            const uint16_t *xo = isk ? ok[1] + ((size_t)t * nkv + h - nh) * hd : oq[1] + ((size_t)t * nh + h) * hd;
            const float *w = isk ? kw : qw;
            double ss = 0;
            for (int c = 0; c < hd; c++) ss += (double)bf16_to_f32(xi[c]) * bf16_to_f32(xi[c]);
            const double sc = 1.0 / sqrt(ss / hd + eps);
            for (int c = 0; c < hd; c++) {
                const double xh = bf16_to_f32(xi[c]) * sc;
                row[c] = kind == RMS_ZC ? xh * (1.0 + w[c]) : w[c] * xh;
            }
            for (int c = 0; c < hd; c++) {
                double ref = row[c];
                if (c < rd) {
                    const int j = c < half ? c : c - half;
                    const float ang = (float)pos[t] * (float)(1.0 / pow(theta, (double)(2 * j) / rd));
                    ref = c < half ? row[c] * cos(ang) - row[c + half] * sin(ang) : row[c] * cos(ang) + row[c - half] * sin(ang);
                }
                const double got = bf16_to_f32(xo[c]);
                if (!(fabs(got - ref) <= fabs(ref) / 128 + 1e-4) && bad++ < 3)
                    fprintf(stderr, "qk_norm_rope_kv: token %d head %d col %d: %g, host %g\n", t, h, c, got, ref);
            }
        }
    }
    assert_int_equal(bad, 0);
    free(row); free(owned);
    for (int f = 0; f < NF; f++) {
        g_mem->free(dq[f]); g_mem->free(dk[f]); g_mem->free(kp[f]); g_mem->free(vp[f]);
        free(oq[f]); free(ok[f]); free(ko[f]); free(vo[f]);
    }
    g_mem->free(dv); g_mem->free(dqw); g_mem->free(dkw); g_mem->free(dpos); g_mem->free(dseqs);
    g_mem->free(dpg0); g_mem->free(dpg1);
    free(pg0); free(pg1); free(pos); free(slot); free(q); free(k); free(v); free(qw); free(kw); free(poison);
}

/* qk_norm_rope (one head set, no KV) by both forms: the same bytes. */
static void rows_qk1_case(int nt, int nh, int hd, int rot, rms_kind kind) {
    const small_ops *fm[NF] = {&small_cuda_block, &small_cuda_rows};
    const size_t n = (size_t)nt * nh * hd;
    uint16_t *x = malloc(n * 2), *o[NF] = {malloc(n * 2), malloc(n * 2)};
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(urand() * 2.f);
    float *w = malloc(hd * 4);
    for (int i = 0; i < hd; i++) w[i] = 0.5f * urand();
    int32_t *pos = malloc(nt * 4);
    for (int t = 0; t < nt; t++) pos[t] = 3 * t + 1;
    float *dw = dev_copy(w, hd * 4);
    int32_t *dpos = dev_copy(pos, nt * 4);
    for (int f = 0; f < NF; f++) {
        void *dx = dev_copy(x, n * 2);
        assert_int_equal(fm[f]->qk_norm_rope(nt, nh, hd, dx, dw, kind, 1e-6f, rot, dpos, 1e6, ACT_BF16, g_st), 0);
        dev_fetch(o[f], dx, n * 2);
        g_mem->free(dx);
    }
    for (int f = 1; f < NF; f++) {
        const int d = first_diff(o[0], o[f], n * 2, 2);
        if (d >= 0)
            fprintf(stderr, "qk_norm_rope [%d x %d x %d, rot %d]: %s differs at %d\n", nt, nh, hd, rot, fm[f]->name, d);
        assert_int_equal(d, -1);
    }
    g_mem->free(dw); g_mem->free(dpos);
    for (int f = 0; f < NF; f++) free(o[f]);
    free(x); free(w); free(pos);
}
#endif

/* qk_norm_rope_kv / qk_norm_rope: one warp a row = one block a row, bit for bit, and the host. */
static void test_rows_qk_equal_the_block_form(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    rows_qk_case(2048, 16, 2, 256, 64, RMS_ZC, ACT_BF16); /* the 35B's attention, 2048 tokens */
    rows_qk_case(9, 16, 2, 256, 64, RMS_ZC, ACT_BF16);    /* decode-sized */
    rows_qk_case(700, 8, 4, 128, 128, RMS_PLAIN, ACT_F32); /* rot_dim = head_dim, fp32 pool */
    rows_qk_case(301, 4, 2, 64, 16, RMS_ZC, ACT_F32);      /* partner in another lane */
    rows_qk_case(99, 6, 3, 96, 32, RMS_PLAIN, ACT_BF16);   /* head_dim 96: half 16 */
    rows_qk_case(50, 4, 1, 80, 80, RMS_ZC, ACT_BF16);      /* half 40 */
    rows_qk_case(40, 2, 2, 128, 1, RMS_ZC, ACT_BF16);      /* no rotation */
    rows_qk_case(30, 2, 1, 512, 64, RMS_ZC, ACT_BF16);     /* head_dim > 256: both the block kernel */
    rows_qk1_case(1200, 16, 256, 64, RMS_ZC);
    rows_qk1_case(77, 3, 128, 128, RMS_PLAIN);
    rows_qk1_case(13, 5, 48, 16, RMS_ZC);
#else
    skip();
#endif
}

int main(void) {
    /* LS_TEST_FILTER: run only the tests whose name matches (bench/device/smallops.sh) */
    const char *f = getenv("LS_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
    setenv("LASTSTAND_SMALL_QKV", "1", 0);
    setenv("LASTSTAND_SMALL_ADDNORM", "1", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qk_norm_rope_kv_equals_the_three_ops),
        cmocka_unit_test(test_add_rmsnorm_matches_the_host),
        cmocka_unit_test(test_rows_norms_equal_the_block_form),
        cmocka_unit_test(test_rows_qk_equal_the_block_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
