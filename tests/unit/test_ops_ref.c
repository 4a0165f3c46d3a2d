/* test_ops_ref.c: the CPU reference ops on small cases worked out by hand
 * (RMSNorm flavours, RoPE, NVFP4 dequantisation, router top-k, attention
 * over scattered pages, one gated delta-rule step), the second MoE backend
 * against the reference, and the registry rules (reference last, auto never
 * picks test-only backends, unknown names listed). */
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

static void near(double got, double want, double tol, const char *what) {
    if (!(fabs(got - want) <= tol * (1 + fabs(want))))
        fail_msg("%s: got %.9g, want %.9g", what, got, want);
}

static double silu(double x) { return x / (1 + exp(-x)); }
static double sigm(double x) { return 1 / (1 + exp(-x)); }

static void test_rmsnorm_three_flavours(void **st) {
    const small_ops *so = &small_cpu_ref;
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 0.5f, 2, -1}, z[4] = {0, 1, -1, 2}, y[4];
    const double r = 1 / sqrt(7.5 + 1e-6); /* mean(x²) = 30/4 */
    so->rmsnorm(1, 4, x, w, RMS_PLAIN, 1e-6f, y, ACT_F32, NULL);
    for (int i = 0; i < 4; i++) near(y[i], w[i] * x[i] * r, 1e-6, "plain w·x̂");
    so->rmsnorm(1, 4, x, w, RMS_ZC, 1e-6f, y, ACT_F32, NULL);
    for (int i = 0; i < 4; i++) near(y[i], (1 + w[i]) * x[i] * r, 1e-6, "zero-centred (1+w)·x̂");
    so->rmsnorm_gated(1, 4, x, z, w, 1e-6f, y, ACT_F32, NULL);
    for (int i = 0; i < 4; i++) near(y[i], w[i] * x[i] * r * silu(z[i]), 1e-6, "gated w·x̂·silu(z)");
    /* in place, two rows */
    float xx[8] = {1, 2, 3, 4, 2, 2, 2, 2};
    so->rmsnorm(2, 4, xx, w, RMS_PLAIN, 0, xx, ACT_F32, NULL);
    near(xx[4], 1.0, 1e-6, "row 2 of constant 2s normalises to w·1");
    near(xx[7], -1.0, 1e-6, "row 2 last");
}

/* add_rmsnorm: h = x (init) or h + x in the fp32 residual, y = norm(h); y may alias x. */
static void test_add_rmsnorm_keeps_the_residual(void **st) {
    const small_ops *so = &small_cpu_ref;
    float h[4] = {9, 9, 9, 9}, x[4] = {1, 2, 3, 4}, w[4] = {1, 0.5f, 2, -1}, y[4];
    assert_int_equal(so->add_rmsnorm(1, 4, h, x, 1, w, RMS_ZC, 1e-6f, y, ACT_F32, NULL), 0);
    const double r = 1 / sqrt(7.5 + 1e-6);
    for (int i = 0; i < 4; i++) {
        near(h[i], x[i], 0, "init copies x into the residual");
        near(y[i], (1 + w[i]) * x[i] * r, 1e-6, "then the zero-centred norm of it");
    }
    /* the second add: h = 2x, normalised (the scale cancels); y written over x */
    assert_int_equal(so->add_rmsnorm(1, 4, h, x, 0, w, RMS_PLAIN, 1e-6f, x, ACT_F32, NULL), 0);
    const double r2 = 1 / sqrt(30 + 1e-6);
    for (int i = 0; i < 4; i++) {
        near(h[i], 2.0 * (i + 1), 0, "h += x");
        near(x[i], w[i] * 2.0 * (i + 1) * r2, 1e-6, "plain w·norm(h), in place over x");
    }
}

/* qk_norm_rope is exactly rmsnorm per head followed by rope. */
static void test_qk_norm_rope_is_norm_then_rope(void **st) {
    const small_ops *so = &small_cpu_ref;
    enum { T = 2, NH = 3, HD = 8 };
    float a[T * NH * HD], b[T * NH * HD], w[HD];
    const int32_t pos[T] = {5, 17};
    for (int i = 0; i < T * NH * HD; i++) a[i] = b[i] = sinf(0.7f * i) * (1 + i % 5);
    for (int i = 0; i < HD; i++) w[i] = 0.1f * i - 0.3f;
    assert_int_equal(so->rmsnorm(T * NH, HD, a, w, RMS_ZC, 1e-6f, a, ACT_F32, NULL), 0);
    assert_int_equal(so->rope(T, NH, HD, 4, pos, 1e4, a, ACT_F32, NULL), 0);
    assert_int_equal(so->qk_norm_rope(T, NH, HD, b, w, RMS_ZC, 1e-6f, 4, pos, 1e4, ACT_F32, NULL), 0);
    for (int i = 0; i < T * NH * HD; i++) near(b[i], a[i], 0, "fused = norm then rope");
    const float before = sinf(0.7f * (HD + 1)) * (1 + (HD + 1) % 5);
    assert_true(fabsf(b[HD + 1] - before) > 1e-3f); /* it did normalise and rotate x in place */
}

static void test_rope_partial_neox(void **st) {
    /* head_dim 6, rot_dim 4: pairs (0,2), (1,3) rotate; dims 4,5 pass through. */
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t pos[1] = {3};
    small_cpu_ref.rope(1, 1, 6, 4, pos, 10000.0, x, ACT_F32, NULL);
    const double a0 = 3 * 1.0, a1 = 3 * 0.01; /* theta^(-0/4) = 1, theta^(-2/4) = 0.01 */
    near(x[0], 1 * cos(a0) - 3 * sin(a0), 1e-5, "x0");
    near(x[2], 3 * cos(a0) + 1 * sin(a0), 1e-5, "x2");
    near(x[1], 2 * cos(a1) - 4 * sin(a1), 1e-5, "x1");
    near(x[3], 4 * cos(a1) + 2 * sin(a1), 1e-5, "x3");
    assert_true(x[4] == 5 && x[5] == 6);
    /* position 0 is the identity */
    float y[4] = {1, 2, 3, 4};
    int32_t p0[1] = {0};
    small_cpu_ref.rope(1, 1, 4, 4, p0, 10000.0, y, ACT_F32, NULL);
    assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4);
}

static void test_nvfp4_dequant_known_codes(void **st) {
    /* one row of K=32: two blocks of 16 codes; block scales fp8 e4m3 0x38 = 1.0, 0x40 = 2.0 */
    uint8_t codes[16], scale[2] = {0x38, 0x40};
    for (int i = 0; i < 16; i++) codes[i] = 0;
    codes[0] = 0x72;  /* element 0: code 2 (1.0), element 1: code 7 (6.0) */
    codes[1] = 0x9F;  /* element 2: code 15 (-6), element 3: code 9 (-0.5) */
    codes[8] = 0x35;  /* element 16: code 5 (3.0), element 17: code 3 (1.5) */
    lin_w w = {.kind = W_NVFP4, .N = 1, .K = 32, .data = codes, .scale = scale, .scale2 = 0.5f};
    float row[32];
    lin_row_f32(&w, 0, row);
    near(row[0], 1.0 * 1 * 0.5, 0, "e0");
    near(row[1], 6.0 * 1 * 0.5, 0, "e1");
    near(row[2], -6.0 * 1 * 0.5, 0, "e2");
    near(row[3], -0.5 * 1 * 0.5, 0, "e3");
    near(row[4], 0, 0, "e4");
    near(row[16], 3.0 * 2 * 0.5, 0, "e16");
    near(row[17], 1.5 * 2 * 0.5, 0, "e17");
    /* and fp4_gemm computes x · that row */
    float x[32], y;
    for (int i = 0; i < 32; i++) x[i] = (float)(i + 1);
    gemm_args a = {.M = 1, .x = x, .w = &w, .y = &y, .dt = ACT_F32};
    assert_int_equal(fp4_gemm_cpu_ref.run(&a, NULL, NULL), 0);
    near(y, 1 * 0.5 + 2 * 3.0 - 3 * 3.0 - 4 * 0.25 + 17 * 3.0 + 18 * 1.5, 1e-6, "fp4 gemm");
}

static void test_router_topk_renormalises(void **st) {
    /* softmax ∝ [1, 2, 4, 1]: top-2 = experts 2 (0.5) and 1 (0.25) */
    float lg[4] = {0, logf(2), logf(4), 0}, w[2];
    int32_t idx[2];
    moe_route(lg, 4, 2, 0, idx, w);
    assert_int_equal(idx[0], 2);
    assert_int_equal(idx[1], 1);
    near(w[0], 0.5, 1e-6, "p2");
    near(w[1], 0.25, 1e-6, "p1");
    moe_route(lg, 4, 2, 1, idx, w);
    near(w[0], 2.0 / 3, 1e-6, "renormalised p2");
    near(w[1], 1.0 / 3, 1e-6, "renormalised p1");
    /* ties go to the lower index */
    float tie[3] = {1, 1, 1};
    int32_t ti[2];
    moe_route(tie, 3, 2, 1, ti, w);
    assert_int_equal(ti[0], 0);
    assert_int_equal(ti[1], 1);
}

static void test_attention_over_scattered_pages(void **st) {
    /* one head, hd 2, page_size 1, the sequence's positions in pages 2 then 0 */
    float k[3 * 2] = {0}, v[3 * 2] = {0};
    kv_layer kv = {.k = k, .v = v, .n_pages = 3, .page_size = 1, .dt = ACT_F32};
    int32_t pages[2] = {2, 0};
    attn_seq s = {.n_past = 0, .n_new = 2, .row0 = 0, .pages = pages};
    float knew[4] = {1, 0, 0, 1}, vnew[4] = {10, 20, 30, 40};
    assert_int_equal(small_cpu_ref.kv_write(&kv, 1, &s, 1, 2, knew, vnew, ACT_F32, NULL), 0);
    assert_true(k[4] == 1 && v[4] == 10 && v[1] == 40); /* page 2 holds position 0 */
    float q[4] = {1, 2, 0.5f, -1}, gate[4] = {0, 0, 100, -100}, out[4];
    attn_args a = {.n_seq = 1, .seqs = &s, .seqs_host = &s, .n_tok = 2, .n_heads = 1, .n_kv_heads = 1,
                   .head_dim = 2, .scale = 0.5f, .q = q, .gate = gate, .kv = &kv, .out = out,
                   .dt = ACT_F32};
    assert_int_equal(attn_cpu_ref.run(&a, NULL, NULL), 0);
    /* token 0 sees only position 0 */
    near(out[0], 10 * sigm(0), 1e-6, "t0 d0");
    near(out[1], 20 * sigm(0), 1e-6, "t0 d1");
    /* token 1: scores 0.5·(0.5·1) = 0.25 and 0.5·(-1) = -0.5 */
    double p0 = exp(0.25) / (exp(0.25) + exp(-0.5)), p1 = 1 - p0;
    near(out[2], (p0 * 10 + p1 * 30) * sigm(100), 1e-6, "t1 d0");
    near(out[3], (p0 * 20 + p1 * 40) * sigm(-100), 1e-6, "t1 d1 gated off");
}

static void test_gated_delta_rule_one_step(void **st) {
    /* nk = nv = 1, dk = dv = 2, conv kernel 2; state S = [[1, 0], [0, 2]], conv state = previous input */
    const int D = 2 + 2 + 2;
    float conv_w[6 * 2], A_log[1] = {0.5f}, dt_bias[1] = {0.25f};
    for (int c = 0; c < D; c++) { conv_w[c * 2] = 0.5f; conv_w[c * 2 + 1] = 1.0f; }
    gdn_w w = {.nk = 1, .nv = 1, .dk = 2, .dv = 2, .conv_k = 2, .conv_w = conv_w, .A_log = A_log,
               .dt_bias = dt_bias};
    float conv_st[6] = {1, 0, -1, 2, 0, 1}; /* previous input per channel */
    float rec[4] = {1, 0, 0, 2};
    gdn_state gst = {.conv = conv_st, .rec = rec, .n_slots = 1};
    float x[6] = {0.5f, 1, 2, -1, 3, 1}, a_in[1] = {0.3f}, b_in[1] = {-0.2f}, out[2];
    gdn_seq s = {.slot = 0, .n_new = 1, .row0 = 0};
    gdn_args a = {.n_seq = 1, .seqs = &s, .seqs_host = &s, .n_tok = 1, .w = &w, .qkv = x, .a = a_in, .b = b_in,
                  .st = &gst, .out = out, .dt = ACT_F32};
    const float prev[6] = {1, 0, -1, 2, 0, 1};
    assert_int_equal(gdn_cpu_ref.run(&a, NULL, NULL), 0);

    /* by hand: c = silu(0.5·prev + 1·x) */
    double c[6];
    for (int i = 0; i < 6; i++) c[i] = silu(0.5 * prev[i] + x[i]);
    double qn = 1 / sqrt(c[0] * c[0] + c[1] * c[1] + 1e-6) / sqrt(2.0);
    double kn = 1 / sqrt(c[2] * c[2] + c[3] * c[3] + 1e-6);
    double q[2] = {c[0] * qn, c[1] * qn}, k[2] = {c[2] * kn, c[3] * kn}, v[2] = {c[4], c[5]};
    double g = -exp(0.5) * log1p(exp(0.3 + 0.25)), beta = sigm(-0.2), dec = exp(g);
    double S[2][2] = {{dec * 1, 0}, {0, dec * 2}};
    double m0 = S[0][0] * k[0] + S[1][0] * k[1], m1 = S[0][1] * k[0] + S[1][1] * k[1];
    double d0 = beta * (v[0] - m0), d1 = beta * (v[1] - m1);
    S[0][0] += k[0] * d0; S[0][1] += k[0] * d1; S[1][0] += k[1] * d0; S[1][1] += k[1] * d1;
    near(rec[0], S[0][0], 1e-5, "S00");
    near(rec[1], S[0][1], 1e-5, "S01");
    near(rec[2], S[1][0], 1e-5, "S10");
    near(rec[3], S[1][1], 1e-5, "S11");
    near(out[0], S[0][0] * q[0] + S[1][0] * q[1], 1e-5, "o0");
    near(out[1], S[0][1] * q[0] + S[1][1] * q[1], 1e-5, "o1");
    for (int i = 0; i < 6; i++) near(conv_st[i], x[i], 0, "conv state keeps the last input");
}

/* Random bf16 weights + NVFP4 copies for an 8-expert block; grouped == ref. */
static uint16_t rnd_bf16(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    float f = (float)((*s >> 40) & 0xFFFF) / 65536.0f - 0.5f;
    return f32_to_bf16(f * 0.5f);
}

static void fill_lin(lin_w *w, int N, int K, int nvfp4, uint64_t *s) {
    memset(w, 0, sizeof *w);
    w->N = N;
    w->K = K;
    if (nvfp4) {
        uint8_t *c = malloc((size_t)N * K / 2), *sc = malloc((size_t)N * K / 16);
        for (int i = 0; i < N * K / 2; i++) c[i] = (uint8_t)(rnd_bf16(s) & 0xFF);
        for (int i = 0; i < N * K / 16; i++) sc[i] = (uint8_t)(0x30 + (rnd_bf16(s) & 7));
        w->kind = W_NVFP4;
        w->data = c;
        w->scale = sc;
        w->scale2 = 0.2f;
    } else {
        uint16_t *d = malloc(sizeof(uint16_t) * N * K);
        for (int i = 0; i < N * K; i++) d[i] = rnd_bf16(s);
        w->kind = W_BF16;
        w->data = d;
    }
}

static void free_lin(lin_w *w) { free((void *)w->data); free((void *)w->scale); }

static void moe_backends_agree(int nvfp4) {
    enum { H = 32, E = 8, K = 3, I = 16, IS = 32, M = 7 };
    uint64_t s = 42 + nvfp4;
    lin_w gate[E], up[E], down[E];
    moe_w w = {.hidden = H, .n_experts = E, .top_k = K, .inter = I, .norm_topk = 1,
               .gate = gate, .up = up, .down = down, .shared_inter = IS, .has_sh_gate = 1};
    fill_lin(&w.router, E, H, 0, &s);
    for (int e = 0; e < E; e++) {
        fill_lin(&gate[e], I, H, nvfp4, &s);
        fill_lin(&up[e], I, H, nvfp4, &s);
        fill_lin(&down[e], H, I, nvfp4, &s);
    }
    fill_lin(&w.sh_gate, IS, H, nvfp4, &s);
    fill_lin(&w.sh_up, IS, H, nvfp4, &s);
    fill_lin(&w.sh_down, H, IS, nvfp4, &s);
    fill_lin(&w.sh_gate_w, 1, H, 0, &s);
    float x[M * H], y0[M * H], y1[M * H], tw0[M * K], tw1[M * K];
    int32_t ti0[M * K], ti1[M * K];
    for (int i = 0; i < M * H; i++) x[i] = bf16_to_f32(rnd_bf16(&s)) * 4;
    const moe_impl *g = ops_moe_find("cpu_grouped");
    assert_non_null(g);
    moe_args a = {.M = M, .x = x, .y = y0, .w = &w, .dt = ACT_F32, .topk_idx = ti0, .topk_w = tw0};
    assert_int_equal(moe_cpu_ref.run(&a, NULL, NULL), 0);
    a.y = y1; a.topk_idx = ti1; a.topk_w = tw1;
    assert_int_equal(g->run(&a, NULL, NULL), 0);
    double mx = 0, err = 0;
    for (int i = 0; i < M * H; i++) {
        mx = fmax(mx, fabs(y0[i]));
        err = fmax(err, fabs(y0[i] - y1[i]));
    }
    assert_true(mx > 1e-3); /* not trivially zero */
    if (err > 1e-5 * mx) fail_msg("cpu_grouped differs from cpu_ref: %g of %g", err, mx);
    assert_memory_equal(ti0, ti1, sizeof ti0);
    for (int i = 0; i < M * K; i++) near(tw0[i], tw1[i], 1e-7, "top-k weight");
    free_lin(&w.router); free_lin(&w.sh_gate); free_lin(&w.sh_up); free_lin(&w.sh_down);
    free_lin(&w.sh_gate_w);
    for (int e = 0; e < E; e++) { free_lin(&gate[e]); free_lin(&up[e]); free_lin(&down[e]); }
}

static void test_moe_grouped_matches_ref_bf16(void **st) { moe_backends_agree(0); }
static void test_moe_grouped_matches_ref_nvfp4(void **st) { moe_backends_agree(1); }

/* Every gemm / fp4_gemm backend of the CPU equals the reference, including
 * row-block and K tails (N = 7, K = 40 / 48). */
/* W_FP8: known E4M3 codes times block scales; a tensor-parallel view (fs_r0 / fs_c0 into the whole
 * tensor's scales) gives the whole tensor's rows and columns; every CPU gemm backend agrees. */
static void test_fp8_rows_blocks_and_views(void **st) {
    enum { N = 6, K = 10, BR = 4, BC = 3, SC = (K + BC - 1) / BC };
    uint8_t codes[N * K];
    float sc[((N + BR - 1) / BR) * SC];
    for (int i = 0; i < N * K; i++) codes[i] = (uint8_t)((i * 37 + 11) % 256);
    for (int i = 0; i < N * K; i++)
        if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1; /* no NaN codes */
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) sc[i] = 0.25f * (float)(i + 1);
    codes[0] = 0x38; /* 1.0 */
    codes[1] = 0xC0; /* -2.0 */
    codes[3] = 0x01; /* 2^-9, the smallest subnormal */
    codes[K + 9] = 0x7e; /* 448 */
    lin_w w = {.kind = W_FP8, .N = N, .K = K, .data = codes, .fscale = sc, .fs_br = BR, .fs_bc = BC,
               .fs_cols = SC, .fs_n = sizeof sc / sizeof sc[0]};
    float row[K];
    lin_row_f32(&w, 0, row);
    near(row[0], 1.0 * 0.25, 0, "e0");
    near(row[1], -2.0 * 0.25, 0, "e1");
    near(row[3], ldexp(1.0, -9) * 0.5, 0, "e3 (next block)");
    lin_row_f32(&w, 1, row);
    near(row[9], 448.0 * 1.0, 0, "row 1, e9 (block column 3)");
    assert_int_equal((int)lin_bytes(&w), N * K + (int)sizeof sc);
    /* rows 2..5, columns 4..9 as a view: the codes copied, the scales shared */
    uint8_t sub[4 * 6];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++) sub[r * 6 + c] = codes[(2 + r) * K + 4 + c];
    lin_w v = w;
    v.N = 4, v.K = 6, v.data = sub, v.fs_r0 = 2, v.fs_c0 = 4;
    for (int r = 0; r < 4; r++) {
        float full[K], part[6];
        lin_row_f32(&w, 2 + r, full);
        lin_row_f32(&v, r, part);
        for (int c = 0; c < 6; c++) near(part[c], full[4 + c], 0, "view");
    }
    /* every CPU gemm backend: y = x · Wᵀ of those values */
    float x[2 * K], y[2 * N], ref[2 * N];
    for (int i = 0; i < 2 * K; i++) x[i] = (float)(i % 7) - 3.0f;
    for (int m = 0; m < 2; m++)
        for (int n = 0; n < N; n++) {
            double d = 0;
            lin_row_f32(&w, n, row);
            for (int k = 0; k < K; k++) d += (double)row[k] * x[m * K + k];
            ref[m * N + n] = (float)d;
        }
    gemm_shape sh = {.M = 2, .N = N, .K = K, .wk = W_FP8, .dt = ACT_F32};
    dev_info d;
    ops_cpu_dev(&d);
    for (int i = 0; i < ops_gemm_count(); i++) {
        const gemm_impl *g = ops_gemm_at(i);
        if (g->dev != DEV_CPU || !g->supported(&d, &sh, NULL, 0)) continue;
        gemm_args a = {.M = 2, .x = x, .w = &w, .y = y, .dt = ACT_F32};
        assert_int_equal(g->run(&a, NULL, NULL), 0);
        for (int j = 0; j < 2 * N; j++) near(y[j], ref[j], 1e-5 * (fabs(ref[j]) + 1), g->name);
    }
}

static void test_cpu_gemm_backends_match_ref(void **st) {
    uint64_t s = 7;
    for (int nv = 0; nv < 2; nv++) {
        const int M = 5, N = 7, K = nv ? 48 : 40;
        lin_w w;
        fill_lin(&w, N, K, nv, &s);
        float x[5 * 48], y0[5 * 7], y1[5 * 7];
        for (int i = 0; i < M * K; i++) x[i] = bf16_to_f32(rnd_bf16(&s));
        gemm_args a = {.M = M, .x = x, .w = &w, .y = y0, .dt = ACT_F32};
        const gemm_impl *ref = nv ? &fp4_gemm_cpu_ref : &gemm_cpu_ref;
        assert_int_equal(ref->run(&a, NULL, NULL), 0);
        int n = nv ? ops_fp4_gemm_count() : ops_gemm_count();
        for (int i = 0; i < n; i++) {
            const gemm_impl *g = nv ? ops_fp4_gemm_at(i) : ops_gemm_at(i);
            if (g->dev != DEV_CPU || g == ref) continue;
            for (int acc = 0; acc < 2; acc++) {
                for (int j = 0; j < M * N; j++) y1[j] = acc ? 1.0f : NAN;
                a.y = y1;
                a.accumulate = acc;
                assert_int_equal(g->run(&a, NULL, NULL), 0);
                for (int j = 0; j < M * N; j++) near(y1[j], y0[j] + acc, 1e-5, g->name);
            }
        }
        free_lin(&w);
    }
}

/* The chunked GDN form equals the token-by-token recurrence: two sequences of
 * 150 (three chunks, the last partial) and 1 tokens, with non-zero starting
 * state, outputs and final conv + recurrent states compared. */
static void test_gdn_chunked_matches_recurrence(void **st) {
    enum { NK = 2, NV = 4, DK = 16, DV = 8, CK = 4, D = 2 * NK * DK + NV * DV, T = 151, SL = 3 };
    uint64_t s = 99;
    static float conv_w[D * CK], A_log[NV], dt_bias[NV];
    for (int i = 0; i < D * CK; i++) conv_w[i] = bf16_to_f32(rnd_bf16(&s));
    for (int i = 0; i < NV; i++) { A_log[i] = bf16_to_f32(rnd_bf16(&s)); dt_bias[i] = bf16_to_f32(rnd_bf16(&s)); }
    gdn_w w = {.nk = NK, .nv = NV, .dk = DK, .dv = DV, .conv_k = CK, .conv_w = conv_w, .A_log = A_log,
               .dt_bias = dt_bias};
    static float qkv[T * D], av[T * NV], bv[T * NV], o0[T * NV * DV], o1[T * NV * DV];
    static float conv0[SL * D * (CK - 1)], rec0[SL * NV * DK * DV], conv1[SL * D * (CK - 1)],
        rec1[SL * NV * DK * DV];
    for (int i = 0; i < T * D; i++) qkv[i] = 4 * bf16_to_f32(rnd_bf16(&s));
    for (int i = 0; i < T * NV; i++) { av[i] = 4 * bf16_to_f32(rnd_bf16(&s)); bv[i] = 4 * bf16_to_f32(rnd_bf16(&s)); }
    for (size_t i = 0; i < sizeof conv0 / 4; i++) conv0[i] = conv1[i] = bf16_to_f32(rnd_bf16(&s));
    for (size_t i = 0; i < sizeof rec0 / 4; i++) rec0[i] = rec1[i] = bf16_to_f32(rnd_bf16(&s));
    gdn_seq seqs[2] = {{.slot = 2, .n_new = 150, .row0 = 1}, {.slot = 0, .n_new = 1, .row0 = 0}};
    gdn_state s0 = {.conv = conv0, .rec = rec0, .n_slots = SL}, s1 = {.conv = conv1, .rec = rec1, .n_slots = SL};
    gdn_args a = {.n_seq = 2, .seqs = seqs, .seqs_host = seqs, .n_tok = T, .w = &w, .qkv = qkv, .a = av, .b = bv,
                  .st = &s0, .out = o0, .dt = ACT_F32};
    assert_int_equal(gdn_cpu_ref.run(&a, NULL, NULL), 0);
    const gdn_impl *ch = ops_gdn_find("cpu_chunked");
    assert_non_null(ch);
    a.st = &s1;
    a.out = o1;
    assert_int_equal(ch->run(&a, NULL, NULL), 0);
    double mx = 0, err = 0;
    for (int i = 0; i < T * NV * DV; i++) { mx = fmax(mx, fabs(o0[i])); err = fmax(err, fabs(o0[i] - o1[i])); }
    assert_true(mx > 1e-2);
    if (err > 1e-4 * mx) fail_msg("outputs differ: %g of %g", err, mx);
    mx = err = 0;
    for (size_t i = 0; i < sizeof rec0 / 4; i++) { mx = fmax(mx, fabs(rec0[i])); err = fmax(err, fabs(rec0[i] - rec1[i])); }
    if (err > 1e-4 * mx) fail_msg("states differ: %g of %g", err, mx);
    assert_memory_equal(conv0, conv1, sizeof conv0);
}

/* A BF16 recurrent state (gdn_state.rec16, --mamba-ssm-dtype bfloat16) on both CPU backends: a
 * call is the fp32 call started from the stored (BF16) state, its outputs bit for bit, and its
 * final state that call's fp32 state rounded to nearest even once (so a 150-token chunk is not
 * rounded token by token). */
static void test_gdn_bf16_state_rounds_once_a_call(void **st) {
    enum { NK = 2, NV = 4, DK = 16, DV = 8, CK = 4, D = 2 * NK * DK + NV * DV, T = 151, SL = 3, RN = SL * NV * DK * DV };
    uint64_t s = 7;
    static float conv_w[D * CK], A_log[NV], dt_bias[NV];
    for (int i = 0; i < D * CK; i++) conv_w[i] = bf16_to_f32(rnd_bf16(&s));
    for (int i = 0; i < NV; i++) { A_log[i] = bf16_to_f32(rnd_bf16(&s)); dt_bias[i] = bf16_to_f32(rnd_bf16(&s)); }
    gdn_w w = {.nk = NK, .nv = NV, .dk = DK, .dv = DV, .conv_k = CK, .conv_w = conv_w, .A_log = A_log,
               .dt_bias = dt_bias};
    static float qkv[T * D], av[T * NV], bv[T * NV], of[T * NV * DV], ob[T * NV * DV];
    static float convf[SL * D * (CK - 1)], convb[SL * D * (CK - 1)], recf[RN];
    static uint16_t recb[RN];
    for (int i = 0; i < T * D; i++) qkv[i] = 4 * bf16_to_f32(rnd_bf16(&s));
    for (int i = 0; i < T * NV; i++) { av[i] = 4 * bf16_to_f32(rnd_bf16(&s)); bv[i] = 4 * bf16_to_f32(rnd_bf16(&s)); }
    for (int be = 0; be < 2; be++) {
        const gdn_impl *g = be ? ops_gdn_find("cpu_chunked") : &gdn_cpu_ref;
        assert_non_null(g);
        for (size_t i = 0; i < sizeof convf / 4; i++) convf[i] = convb[i] = bf16_to_f32(rnd_bf16(&s));
        for (int i = 0; i < RN; i++) {
            recb[i] = f32_to_bf16(0.37f * (float)((i * 7919) % 101 - 50) / 50.f); /* not all BF16-exact in fp32 sums */
            recf[i] = bf16_to_f32(recb[i]);
        }
        gdn_seq seqs[2] = {{.slot = 2, .n_new = 150, .row0 = 1}, {.slot = 0, .n_new = 1, .row0 = 0}};
        gdn_state sf = {.conv = convf, .rec = recf, .n_slots = SL}, sb = {.conv = convb, .n_slots = SL, .rec16 = recb};
        gdn_args a = {.n_seq = 2, .seqs = seqs, .seqs_host = seqs, .n_tok = T, .w = &w, .qkv = qkv, .a = av, .b = bv,
                      .st = &sf, .out = of, .dt = ACT_F32};
        assert_int_equal(g->run(&a, NULL, NULL), 0);
        a.st = &sb;
        a.out = ob;
        gdn_shape sh = {.n_tok = T, .n_seq = 2, .nk = NK, .nv = NV, .dk = DK, .dv = DV, .conv_k = CK, .dt = ACT_F32,
                        .state_bf16 = 1};
        assert_true(g->supported(&(dev_info){.kind = DEV_CPU}, &sh, NULL, 0));
        assert_int_equal(g->run(&a, NULL, NULL), 0);
        assert_memory_equal(of, ob, sizeof of);       /* the same fp32 math from the same start */
        assert_memory_equal(convf, convb, sizeof convf); /* the conv state stays fp32 */
        int changed = 0;
        for (int i = 0; i < RN; i++) {
            if (recb[i] != f32_to_bf16(recf[i]))
                fail_msg("%s: state %d is %#x, the fp32 call's rounded %#x", g->name, i, recb[i], f32_to_bf16(recf[i]));
            changed += recf[i] != bf16_to_f32(recb[i]); /* what rounding dropped */
        }
        assert_true(changed > 0); /* the fp32 states were not all BF16 values: rounding happened */
    }
}

static void test_registry_reference_last_and_selection(void **st) {
    assert_string_equal(ops_gemm_at(ops_gemm_count() - 1)->name, "cpu_ref");
    assert_string_equal(ops_fp4_gemm_at(ops_fp4_gemm_count() - 1)->name, "cpu_ref");
    assert_string_equal(ops_moe_at(ops_moe_count() - 1)->name, "cpu_ref");
    assert_string_equal(ops_attn_at(ops_attn_count() - 1)->name, "cpu_ref");
    assert_string_equal(ops_gdn_at(ops_gdn_count() - 1)->name, "cpu_ref");
    assert_string_equal(ops_small_at(ops_small_count() - 1)->name, "cpu_ref");
    /* a late registration lands before the reference */
    static const moe_impl extra = {"test_extra", DEV_CPU, 1, NULL, NULL};
    assert_int_equal(ops_moe_register(&extra), 0);
    assert_int_equal(ops_moe_register(&extra), ERR_INVAL); /* duplicate name */
    assert_string_equal(ops_moe_at(ops_moe_count() - 1)->name, "cpu_ref");
    assert_ptr_equal(ops_moe_find("test_extra"), &extra);

    dev_info d;
    ops_cpu_dev(&d);
    ops_sel sel;
    ls_err e = {0};
    assert_int_equal(ops_select(&d, NULL, &sel, &e), 0);
    assert_string_equal(sel.moe->name, "cpu_grouped"); /* auto: first non-test-only */
    ops_names n = {.moe = "cpu_ref"};
    assert_int_equal(ops_select(&d, &n, &sel, &e), 0);
    assert_ptr_equal(sel.moe, &moe_cpu_ref);
    n.moe = "nope";
    assert_int_equal(ops_select(&d, &n, &sel, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "moe backend 'nope'"));
    assert_non_null(strstr(e.msg, "cpu_grouped"));
    assert_non_null(strstr(e.msg, "cpu_ref"));
    /* without the env var the broken backends do not exist */
    assert_null(ops_moe_find("cpu_broken_nan"));
}

int main(void) {
    unsetenv("LASTSTAND_TEST_BROKEN_BACKENDS");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_three_flavours),
        cmocka_unit_test(test_add_rmsnorm_keeps_the_residual),
        cmocka_unit_test(test_qk_norm_rope_is_norm_then_rope),
        cmocka_unit_test(test_rope_partial_neox),
        cmocka_unit_test(test_nvfp4_dequant_known_codes),
        cmocka_unit_test(test_router_topk_renormalises),
        cmocka_unit_test(test_attention_over_scattered_pages),
        cmocka_unit_test(test_gated_delta_rule_one_step),
        cmocka_unit_test(test_moe_grouped_matches_ref_bf16),
        cmocka_unit_test(test_moe_grouped_matches_ref_nvfp4),
        cmocka_unit_test(test_fp8_rows_blocks_and_views),
        cmocka_unit_test(test_cpu_gemm_backends_match_ref),
        cmocka_unit_test(test_gdn_chunked_matches_recurrence),
        cmocka_unit_test(test_gdn_bf16_state_rounds_once_a_call),
        cmocka_unit_test(test_registry_reference_last_and_selection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
