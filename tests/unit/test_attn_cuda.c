/* test_attn_cuda.c: the CUDA attention backends (src/ops/cuda/attention*.cu)
 * under CUDA graph replay, at the Qwen3.5 35B-A3B and 397B-A17B attention
 * shapes (16 or 32 query heads over 2 kv heads of 256, output gate, 16-token
 * pages in a shuffled order):
 *   - one decode step captured once with device planning (ctx_cap) at short
 *     contexts, then replayed with the device sequences rewritten to other
 *     contexts (longer and shorter than at capture, across the split
 *     boundaries): every replay matches an fp64 reference computed here from
 *     the same BF16 inputs (a replay reading stale or out-of-range data fails
 *     this), and gives the bits of the eager call (host planning) on the same
 *     inputs: always for cuda_flash_decode (its device planning cuts the same
 *     256-position chunks up to 256 x its split count), for cuda_flash_prefill
 *     under the row plan (LASTSTAND_FP_PLAN unset or "rows"; with its decode
 *     kernel unless LASTSTAND_FP_DEC=0); under "round" the count of
 *     differing outputs is printed, not asserted;
 *   - decode timings (printed, not asserted): per backend, M = 1, 8, 64
 *     sequences, context 512 .. 32768, one call replayed from a graph of 20
 *     calls (device planning at the engine's ctx_cap) and one eager call.
 * LS_ATTN_TEST (device scripts): "check" runs only the first, "time" only the
 * second, "quick" the second at M = 1, 8 and two contexts, cuda_flash_prefill.
 * Needs a CUDA GPU of cc >= 9.0: every test is skipped without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 2024u
#include "cuda_test.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/graph.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
enum { P = 16, HD = 256, NKV = 2, NPAGE = 32768, MAXB = 64 };

static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;
static uint16_t *g_k, *g_v; /* host [NPAGE, P, NKV, HD] BF16 */
static void *g_dk, *g_dv;
static kv_layer g_kv;

static int have_gpu(void) {
    static int state = -1;
    if (state >= 0) return state;
    state = 0;
    if (!cuda_test_gpu("test_attn_cuda", 9, &g_mem, &g_dev, &g_st)) return state;
    ls_err e = {0};
    const size_t n = (size_t)NPAGE * P * NKV * HD;
    g_k = malloc(n * 2);
    g_v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        g_k[i] = f32_to_bf16(urand());
        g_v[i] = f32_to_bf16(urand());
    }
    g_dk = g_mem->alloc(n * 2, &e);
    g_dv = g_mem->alloc(n * 2, &e);
    if (!g_dk || !g_dv || g_mem->h2d(g_dk, g_k, n * 2, g_st, &e) || g_mem->h2d(g_dv, g_v, n * 2, g_st, &e) ||
        g_mem->sync(g_st, &e)) {
        fprintf(stderr, "test_attn_cuda: KV pool: %s\n", e.msg);
        return state;
    }
    g_kv = (kv_layer){.k = g_dk, .v = g_dv, .n_pages = NPAGE, .page_size = P, .dt = ACT_BF16};
    state = 1;
    return state;
}

/* B decode rows (one new token each) of nh heads; sequence s owns the pages
 * pg[s·ppseq ..], a shuffled (strided) set of the pool's pages, enough for cap positions. */
typedef struct dcase {
    int B, nh, cap, ppseq;
    int32_t *pg;       /* host [B·ppseq] */
    int32_t *dpg;      /* device copy */
    attn_seq *hs, *ds; /* host seqs (host page pointers), their device twin (device page pointers) */
    attn_seq *dsh;     /* host staging of ds */
    uint16_t *q, *gate;
    void *dq, *dgate, *dout, *scratch;
    size_t scratch_bytes;
} dcase;

static void dcase_new(dcase *c, int B, int nh, int cap) {
    memset(c, 0, sizeof *c);
    c->B = B, c->nh = nh, c->cap = cap;
    c->ppseq = (cap + P - 1) / P;
    ls_err e = {0};
    const size_t np = (size_t)B * c->ppseq;
    c->pg = malloc(sizeof(int32_t) * np);
    for (size_t i = 0; i < np; i++) c->pg[i] = (int32_t)((i * 7919 + 13) % NPAGE); /* 7919 prime: a shuffle */
    c->dpg = g_mem->alloc(sizeof(int32_t) * np, &e);
    assert_non_null(c->dpg);
    assert_int_equal(g_mem->h2d(c->dpg, c->pg, sizeof(int32_t) * np, g_st, &e), 0);
    c->hs = calloc(B, sizeof *c->hs);
    c->dsh = calloc(B, sizeof *c->dsh);
    c->ds = g_mem->alloc(sizeof(attn_seq) * B, &e);
    const size_t nq = (size_t)B * nh * HD;
    c->q = malloc(nq * 2);
    c->gate = malloc(nq * 2);
    for (size_t i = 0; i < nq; i++) {
        c->q[i] = f32_to_bf16(2.f * urand());
        c->gate[i] = f32_to_bf16(2.f * urand());
    }
    c->dq = g_mem->alloc(nq * 2, &e);
    c->dgate = g_mem->alloc(nq * 2, &e);
    c->dout = g_mem->alloc(nq * 2, &e);
    assert_non_null(c->dout);
    assert_int_equal(g_mem->h2d(c->dq, c->q, nq * 2, g_st, &e), 0);
    assert_int_equal(g_mem->h2d(c->dgate, c->gate, nq * 2, g_st, &e), 0);
    c->scratch_bytes = attn_cuda_scratch_bytes(B, nh, NKV, HD, cap);
    c->scratch = g_mem->alloc(c->scratch_bytes, &e);
    assert_non_null(c->scratch);
}

static void dcase_free(dcase *c) {
    g_mem->free(c->dpg);
    g_mem->free(c->ds);
    g_mem->free(c->dq);
    g_mem->free(c->dgate);
    g_mem->free(c->dout);
    g_mem->free(c->scratch);
    free(c->pg); free(c->hs); free(c->dsh); free(c->q); free(c->gate);
}

/* Set the contexts (n_past = ctx[s] - 1, one new token) in both seqs arrays (device: h2d on g_st). */
static void dcase_ctx(dcase *c, const int *ctx) {
    for (int s = 0; s < c->B; s++) {
        assert_true(ctx[s] >= 1 && ctx[s] <= c->cap);
        c->hs[s] = (attn_seq){.n_past = ctx[s] - 1, .n_new = 1, .row0 = s, .pages = c->pg + (size_t)s * c->ppseq};
        c->dsh[s] = c->hs[s];
        c->dsh[s].pages = c->dpg + (size_t)s * c->ppseq;
    }
    ls_err e = {0};
    assert_int_equal(g_mem->h2d(c->ds, c->dsh, sizeof(attn_seq) * c->B, g_st, &e), 0);
}

static attn_args dcase_args(dcase *c, int device_plan) {
    attn_args a = {.n_seq = c->B, .seqs = c->ds, .n_tok = c->B, .n_heads = c->nh, .n_kv_heads = NKV,
                   .head_dim = HD, .scale = 1.f / 16.f, .q = c->dq, .gate = c->dgate, .kv = &g_kv,
                   .out = c->dout, .dt = ACT_BF16, .seqs_host = c->hs};
    if (device_plan) {
        a.ctx_cap = c->cap;
        a.scratch = c->scratch;
        a.scratch_bytes = c->scratch_bytes;
        a.seqs_host = NULL;
    }
    return a;
}

/* fp64 reference of row (s, h): [HD] */
static void ref_row(const dcase *c, int s, int h, double *o) {
    const int n = c->hs[s].n_past + 1, kvh = h / (c->nh / NKV);
    const uint16_t *q = c->q + ((size_t)s * c->nh + h) * HD, *g = c->gate + ((size_t)s * c->nh + h) * HD;
    double *sc = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        const size_t off = (((size_t)c->hs[s].pages[j / P] * P + j % P) * NKV + kvh) * HD;
        double d = 0;
        for (int i = 0; i < HD; i++) d += (double)bf16_to_f32(q[i]) * bf16_to_f32(g_k[off + i]);
        sc[j] = d / 16.0;
        if (sc[j] > mx) mx = sc[j];
    }
    for (int i = 0; i < HD; i++) o[i] = 0;
    for (int j = 0; j < n; j++) {
        const double p = exp(sc[j] - mx);
        sum += p;
        const size_t off = (((size_t)c->hs[s].pages[j / P] * P + j % P) * NKV + kvh) * HD;
        for (int i = 0; i < HD; i++) o[i] += p * bf16_to_f32(g_v[off + i]);
    }
    for (int i = 0; i < HD; i++) o[i] = o[i] / sum / (1.0 + exp(-(double)bf16_to_f32(g[i])));
    free(sc);
}

/* The fp64 reference of rows [i0, i1) of (s, h) pairs, on the thread pool. */
typedef struct refjob {
    const dcase *c;
    double *out; /* [B·nh·HD] */
} refjob;
static void ref_rows(void *ctx, int64_t i0, int64_t i1) {
    const refjob *j = ctx;
    for (int64_t i = i0; i < i1; i++) ref_row(j->c, (int)(i / j->c->nh), (int)(i % j->c->nh), j->out + i * HD);
}

/* The plan and knobs in force (LASTSTAND_FP_PLAN / _DEC / _CHUNK / _PDL), for the printed lines. */
static const char *plan_name(void) {
    static char buf[96];
    const char *v = getenv("LASTSTAND_FP_PLAN"), *c = getenv("LASTSTAND_FP_CHUNK"), *p = getenv("LASTSTAND_FP_PDL");
    const char *d = getenv("LASTSTAND_FP_DEC"), *g = getenv("LASTSTAND_FP_STAGES");
    snprintf(buf, sizeof buf, "%s%s%s%s%s%s%s%s%s", v && *v ? v : "default", d && *d ? "/dec" : "", d && *d ? d : "",
             c && *c ? "/c" : "", c && *c ? c : "", p && *p ? "/pdl" : "", p && *p ? p : "", g && *g ? "/stg" : "",
             g && *g ? g : "");
    return buf;
}

/* The graph-vs-eager check of one backend and shape: capture at ctx0, replay at each row of ctxs. */
/* ctx0 [B]: the contexts at capture; ctxs [nsteps][B]: the replays'. */
static void graph_check(const char *backend, int B, int nh, int cap, const int *ctx0, const int *ctxs,
                        int nsteps, int want_bits) {
    const attn_impl *impl = ops_attn_find(backend);
    assert_non_null(impl);
    dcase c;
    dcase_new(&c, B, nh, cap);
    ls_err e = {0};
    ls_stream cs;
    assert_int_equal(cug_stream_new(&cs, &e), 0);
    /* warm-up (shared-memory opt-in, workspaces) eagerly, then the capture at ctx0 */
    dcase_ctx(&c, ctx0);
    attn_args ea = dcase_args(&c, 0), ga = dcase_args(&c, 1);
    assert_int_equal(impl->run(&ea, g_st, &e), 0);
    assert_int_equal(impl->run(&ga, g_st, &e), 0);
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    assert_int_equal(cug_begin(cs, &e), 0);
    int rc = impl->run(&ga, cs, &e);
    void *exec = NULL;
    int rc2 = cug_end(cs, rc == 0, &exec, &e);
    if (rc || rc2) fprintf(stderr, "capture %s: %s\n", backend, e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(rc2, 0);
    const size_t n = (size_t)B * nh * HD;
    uint16_t *gr = malloc(n * 2), *eg = malloc(n * 2);
    double *ref = malloc(sizeof(double) * n);
    for (int st = 0; st < nsteps; st++) {
        const int *cx = ctxs + (size_t)st * B;
        dcase_ctx(&c, cx);
        assert_int_equal(g_mem->memset0(c.dout, n * 2, g_st, &e), 0);
        assert_int_equal(g_mem->sync(g_st, &e), 0);
        assert_int_equal(cug_launch(exec, cs, &e), 0);
        assert_int_equal(g_mem->sync(cs, &e), 0);
        dev_fetch(gr, c.dout, n * 2);
        assert_int_equal(g_mem->memset0(c.dout, n * 2, g_st, &e), 0);
        assert_int_equal(impl->run(&ea, g_st, &e), 0);
        dev_fetch(eg, c.dout, n * 2);
        size_t ndiff = 0;
        double dmax = 0, err_g = 0, err_e = 0, rmax = 0;
        for (size_t i = 0; i < n; i++)
            if (gr[i] != eg[i]) {
                ndiff++;
                double d = fabs((double)bf16_to_f32(gr[i]) - bf16_to_f32(eg[i]));
                if (d > dmax) dmax = d;
            }
        refjob rj = {.c = &c, .out = ref};
        pool_for((int64_t)B * nh, 1, ref_rows, &rj);
        for (int s = 0; s < B; s++)
            for (int h = 0; h < nh; h++) {
                const double *rf = ref + ((size_t)s * nh + h) * HD;
                for (int i = 0; i < HD; i++) {
                    const size_t at = ((size_t)s * nh + h) * HD + i;
                    err_g = fmax(err_g, fabs(bf16_to_f32(gr[at]) - rf[i]));
                    err_e = fmax(err_e, fabs(bf16_to_f32(eg[at]) - rf[i]));
                    rmax = fmax(rmax, fabs(rf[i]));
                }
            }
        printf("attn: %-18s plan %-16s nh %2d B %d ctx %5d %5d %5d %5d: replay vs eager %5zu/%zu outputs differ "
               "(max %.2e); vs fp64 rel replay %.2e eager %.2e\n",
               backend, plan_name(), nh, B, cx[0], B > 1 ? cx[1] : 0, B > 2 ? cx[2] : 0, B > 3 ? cx[3] : 0, ndiff,
               n, dmax, err_g / rmax, err_e / rmax);
        assert_true(err_g <= 1e-2 * rmax); /* the replay reads the right keys, all of them */
        assert_true(err_e <= 1e-2 * rmax);
        if (want_bits) assert_int_equal(ndiff, 0);
    }
    fflush(stdout);
    free(gr); free(eg); free(ref);
    cug_destroy(exec);
    cug_stream_free(cs);
    dcase_free(&c);
}

static int want(const char *part) {
    const char *v = getenv("LS_ATTN_TEST");
    if (!v || !*v) return 1;
    if (!strcmp(part, "check")) return !strcmp(v, "check");
    return !strcmp(v, "time") || !strcmp(v, "quick");
}

/* The row plan is in force (the default; LASTSTAND_FP_PLAN=round or a split count leave it). */
static int rows_plan(void) {
    const char *v = getenv("LASTSTAND_FP_PLAN");
    return !v || !*v || !strcmp(v, "rows");
}
#endif

static void test_graph_replay_at_other_contexts_gives_the_eager_bits(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!want("check") || !have_gpu()) skip();
    /* captured at short contexts; replayed longer (across 32/64/128/256-key chunk edges), back to
     * 1, and near the cap */
    int c0[MAXB];
    for (int i = 0; i < MAXB; i++) c0[i] = 3 + (i * 13) % 50;
    static const int steps1[] = {33, 64, 65, 129, 168, 1000, 4097, 1, 8191, 8192};
    static const int steps4[][4] = {{1, 128, 129, 257}, {2000, 33, 8192, 500}, {7, 4096, 6000, 64}};
    /* a 64-row bucket: cuda_flash_decode's device planning once gave it 5 splits of 256 positions
     * (1280) before cutting longer chunks; contexts up to the cap */
    int steps64[MAXB];
    for (int i = 0; i < MAXB; i++) steps64[i] = i % 16 == 5 ? 8192 - 97 * i : 1 + (i * 37) % 1500;
    const char *be[] = {"cuda_flash_prefill", "cuda_flash_decode"};
    for (int b = 0; b < 2; b++) {
        const int bits = b == 1 || rows_plan();
        for (int nh = 16; nh <= 32; nh += 16) {
            graph_check(be[b], 1, nh, 8192, c0, steps1, (int)(sizeof steps1 / sizeof steps1[0]), bits);
            graph_check(be[b], 4, nh, 8192, c0, &steps4[0][0], (int)(sizeof steps4 / sizeof steps4[0]), bits);
        }
        graph_check(be[b], MAXB, 16, 8192, c0, steps64, 1, bits);
    }
#else
    skip();
#endif
}

static void test_decode_timings(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!want("time") || !have_gpu()) skip();
    const char *be[] = {"cuda_flash_prefill", "cuda_flash_decode"};
    static const int Ms[] = {1, 8, 64}, ctxs[] = {512, 2048, 8192, 32768};
    const char *mode = getenv("LS_ATTN_TEST");
    const int quick = mode && !strcmp(mode, "quick");
    enum { CALLS = 20, REPS = 5, CAP = 262144 };
    ls_err e = {0};
    ls_stream cs;
    assert_int_equal(cug_stream_new(&cs, &e), 0);
    for (int nh = 32; nh >= 16; nh -= 16)
        for (int b = 0; b < (quick ? 1 : 2); b++)
            for (size_t mi = 0; mi < (quick ? 2 : sizeof Ms / sizeof Ms[0]); mi++) {
                const int M = Ms[mi];
                dcase c;
                dcase_new(&c, M, nh, 32768);
                /* the engine's ctx_cap (the synth pool: 262144): the scratch for it */
                g_mem->free(c.scratch);
                c.scratch_bytes = attn_cuda_scratch_bytes(M, nh, NKV, HD, CAP);
                c.scratch = g_mem->alloc(c.scratch_bytes, &e);
                assert_non_null(c.scratch);
                for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++) {
                    if (quick && (ci & 1)) continue;
                    int ctx[MAXB];
                    for (int s = 0; s < M; s++) ctx[s] = ctxs[ci];
                    dcase_ctx(&c, ctx);
                    attn_args ea = dcase_args(&c, 0), ga = dcase_args(&c, 1);
                    ga.ctx_cap = CAP;
                    const attn_impl *impl = ops_attn_find(be[b]);
                    assert_int_equal(impl->run(&ea, g_st, &e), 0);
                    assert_int_equal(impl->run(&ga, cs, &e), 0);
                    assert_int_equal(g_mem->sync(g_st, &e), 0);
                    assert_int_equal(g_mem->sync(cs, &e), 0);
                    assert_int_equal(cug_begin(cs, &e), 0);
                    int rc = 0;
                    for (int k = 0; k < CALLS && !rc; k++) rc = impl->run(&ga, cs, &e);
                    void *exec = NULL;
                    assert_int_equal(cug_end(cs, rc == 0, &exec, &e), 0);
                    assert_int_equal(rc, 0);
                    assert_int_equal(cug_launch(exec, cs, &e), 0);
                    assert_int_equal(g_mem->sync(cs, &e), 0);
                    double t0 = now_sec();
                    for (int r = 0; r < REPS; r++) assert_int_equal(cug_launch(exec, cs, &e), 0);
                    assert_int_equal(g_mem->sync(cs, &e), 0);
                    const double tg = (now_sec() - t0) / (REPS * CALLS);
                    t0 = now_sec();
                    for (int r = 0; r < REPS * CALLS; r++) assert_int_equal(impl->run(&ea, g_st, &e), 0);
                    assert_int_equal(g_mem->sync(g_st, &e), 0);
                    const double te = (now_sec() - t0) / (REPS * CALLS);
                    const double bytes = 2.0 * M * ctxs[ci] * NKV * HD * 2;
                    printf("attn: time %-18s plan %-16s nh %2d M %2d ctx %5d: graph %7.1f us (%5.0f GB/s), "
                           "eager %7.1f us\n",
                           be[b], plan_name(), nh, M, ctxs[ci], tg * 1e6, bytes / tg / 1e9, te * 1e6);
                    fflush(stdout);
                    cug_destroy(exec);
                }
                dcase_free(&c);
            }
    cug_stream_free(cs);
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_replay_at_other_contexts_gives_the_eager_bits),
        cmocka_unit_test(test_decode_timings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
