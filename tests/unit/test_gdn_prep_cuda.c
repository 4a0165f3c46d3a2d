/* test_gdn_prep_cuda.c: gdn cuda_chunked's preparation (src/ops/cuda/gdn_chunked.cu) in its two
 * forms, through the test hook lsc_gdn_chunked_prep: the vector kernel gc_prep8_kernel
 * (LASTSTAND_GDN_PREP=1, the default) must give the old gc_prep_kernel's (=0) bits exactly: the
 * FP16 operands x16 (q̂ = l2norm(q)·dk^-0.5, k̂, βv), (g, β) and the rolled conv states, on copies
 * of the same inputs and states (non-zero conv states, scattered slots). The hook poisons the
 * workspace before each form, so a row one form leaves unwritten differs. Shapes: Qwen3.5-35B's
 * GDN (16 k / 32 v heads, dk = dv = 128, conv_dim 8192), Qwen3.5-397B's (16 / 64), dk = dv = 64,
 * and the fixture models' dk = dv = 32 (one warp holding q, k and v channels). Calls: one
 * 8192-token sequence (the long prefill: blocks split the tokens, the conv state kernel rolls the
 * state); sequences of 1, 63, 65, 3000 tokens and one of none; short ones (2, 5, 1: one block per
 * sequence rolls the state itself); rows of extremes (±3e38, ±1e-30, −1e4); and a misaligned qkv
 * (2 bytes off: the vector form must decline, the old kernel runs, form reported 0; 8 bytes off:
 * it runs). Every call must report the form that ran.
 * Then the whole cuda_chunked call (lsc_gdn_chunked_run) with form 0 against 1: outputs,
 * recurrent and conv states bitwise equal on 3000-token prompts (WY form).
 * Needs a CUDA GPU of compute capability 8.0+: every test is skipped without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 9091u
#include "cuda_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
#include "ops/cuda/gdn_prep_hook.h"

static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) { return cuda_test_gpu("test_gdn_prep_cuda", 8, &g_mem, &g_dev, &g_st); }

enum { PK = 4 };

/* Bytes of two device buffers equal; prints how many es-byte elements differ and the first. */
static int same_dev(const void *a, const void *b, size_t n, size_t es, const char *what, const char *tag) {
    size_t first = 0;
    const size_t bad = dev_diff_count(a, b, n, es, &first);
    if (bad)
        fprintf(stderr, "gdn prep (%s): %s differs between the vector and the old kernel at %zu of %zu elements "
                        "(first: %zu)\n", tag, what, bad, n / es, first);
    return bad == 0;
}

/* One call at one shape: seqs [n_seq] (host), n_tok rows, slots state slots; qkv at byte offset
 * qoff of its buffer (16 or 8: the vector form applies; 2: it declines). Runs form 0 (the old
 * kernel) and 1 (gc_prep8_kernel) on copies of the conv state; compares x16, gb and the states.
 * want[f]: the form call f must report having run. Rows 2-4 of qkv hold extremes (±3e38, ±1e-30, −1e4: SiLU's slow-path
 * division, infinities and NaN in the norms). */
enum { NF = 2 };
static void prep_case(int nk, int nv, int dk, int dv, const gdn_seq *seqs, int n_seq, int n_tok, int slots, int qoff,
                      const int want[NF], const char *tag) {
    const int D = 2 * nk * dk + nv * dv;
    const size_t nq = (size_t)n_tok * D, nab = (size_t)n_tok * nv, nconv = (size_t)slots * D * (PK - 1);
    uint16_t *qkv = malloc(nq * 2 + 16), *a = malloc(nab * 2), *b = malloc(nab * 2);
    float *cw = malloc((size_t)D * PK * 4), *al = malloc(nv * 4), *dt = malloc(nv * 4), *conv = malloc(nconv * 4);
    assert_true(qkv && a && b && cw && al && dt && conv);
    for (size_t i = 0; i < nq; i++) qkv[i] = f32_to_bf16(2.f * urand());
    for (size_t i = 0; i < nab; i++) a[i] = f32_to_bf16(4.f * urand());
    for (size_t i = 0; i < nab; i++) b[i] = f32_to_bf16(3.f * urand());
    for (size_t i = 0; i < (size_t)D * PK; i++) cw[i] = 0.5f * urand();
    for (int i = 0; i < nv; i++) al[i] = 0.5f * urand();
    for (int i = 0; i < nv; i++) dt[i] = 0.5f * urand();
    for (size_t i = 0; i < nconv; i++) conv[i] = urand();
    /* a row of exact zeros and a large a: SiLU of 0, softplus past its threshold 20; extremes */
    if (n_tok > 2) {
        memset(qkv + (size_t)1 * D, 0, (size_t)D * 2);
        a[(size_t)(n_tok - 1) * nv] = f32_to_bf16(30.f);
    }
    if (n_tok > 5)
        for (int c = 0; c < D; c++) {
            qkv[(size_t)2 * D + c] = f32_to_bf16(c % 3 ? 3e38f * (c % 2 ? 1.f : -1.f) : 1.f);
            qkv[(size_t)3 * D + c] = f32_to_bf16(c % 5 ? 1e-30f * (c % 2 ? 1.f : -1.f) : 0.5f);
            qkv[(size_t)4 * D + c] = f32_to_bf16(c % 7 ? -1e4f : 2.f);
        }
    ls_err e = {0};
    unsigned char *qbuf = g_mem->alloc(nq * 2 + 32, &e);
    assert_non_null(qbuf);
    void *dq = qbuf + qoff;
    assert_int_equal(g_mem->h2d(dq, qkv, nq * 2, g_st, &e), 0);
    void *da = dev_copy(a, nab * 2), *db = dev_copy(b, nab * 2);
    float *dcw = dev_copy(cw, (size_t)D * PK * 4), *dal = dev_copy(al, nv * 4), *ddt = dev_copy(dt, nv * 4);
    gdn_seq *dseqs = dev_copy(seqs, sizeof(gdn_seq) * n_seq);
    float *dconv[NF];
    void *dx[NF], *dg[NF];
    gdn_w w = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = PK, .conv_w = dcw, .A_log = dal, .dt_bias = ddt};
    for (int f = 0; f < NF; f++) {
        dconv[f] = dev_copy(conv, nconv * 4);
        dx[f] = g_mem->alloc(nq * 2, &e);
        dg[f] = g_mem->alloc(nab * 8, &e);
        assert_non_null(dx[f]);
        assert_non_null(dg[f]);
        gdn_state st = {.conv = dconv[f], .rec = NULL, .n_slots = slots};
        gdn_args ga = {.n_seq = n_seq, .seqs = dseqs, .seqs_host = seqs, .n_tok = n_tok, .w = &w, .qkv = dq,
                       .a = da, .b = db, .st = &st, .out = NULL, .dt = ACT_BF16};
        int form = f;
        const int rc = lsc_gdn_chunked_prep(&ga, &form, dx[f], dg[f], g_st, &e);
        if (rc) fprintf(stderr, "gdn prep (%s) form %d: %s\n", tag, f, e.msg);
        assert_int_equal(rc, 0);
        if (form != want[f]) fprintf(stderr, "gdn prep (%s): form %d asked, %d ran, %d expected\n", tag, f, form, want[f]);
        assert_int_equal(form, want[f]);
    }
    int ok = 1;
    for (int f = 1; f < NF; f++) {
        char t2[160];
        snprintf(t2, sizeof t2, "%s; form %d vs 0", tag, f);
        ok &= same_dev(dx[0], dx[f], nq * 2, 2, "x16 (q, k normed, beta v)", t2);
        ok &= same_dev(dg[0], dg[f], nab * 8, 4, "gb (g, beta)", t2);
        ok &= same_dev(dconv[0], dconv[f], nconv * 4, 4, "the conv states", t2);
    }
    /* the state did roll: a slot with new tokens differs from its start */
    float *after = malloc(nconv * 4);
    dev_fetch(after, dconv[0], nconv * 4);
    int rolled = 1;
    for (int i = 0; i < n_seq; i++)
        if (seqs[i].n_new > 0)
            rolled &= memcmp(after + (size_t)seqs[i].slot * D * (PK - 1), conv + (size_t)seqs[i].slot * D * (PK - 1),
                             (size_t)D * (PK - 1) * 4) != 0;
    if (!rolled) fprintf(stderr, "gdn prep (%s): a conv state with new tokens did not change\n", tag);
    ok &= rolled;
    free(after);
    for (int f = 0; f < NF; f++) {
        g_mem->free(dx[f]);
        g_mem->free(dg[f]);
        g_mem->free(dconv[f]);
    }
    void *dev[] = {qbuf, da, db, dcw, dal, ddt, dseqs};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) g_mem->free(dev[i]);
    free(qkv);
    free(a);
    free(b);
    free(cw);
    free(al);
    free(dt);
    free(conv);
    assert_true(ok);
}

static const int g_all[NF] = {0, 1};

typedef struct {
    int nk, nv, dk, dv;
    const char *name;
} gshape;
static const gshape g_shapes[] = {{16, 32, 128, 128, "35B"}, {16, 64, 128, 128, "397B"}, {4, 8, 64, 64, "dk64"},
                                  {2, 4, 32, 32, "dk32"}};

/* Rows laid out back to back from lens[], in slots slot0, slot0 + 2, ... */
static int lay_out(gdn_seq *q, const int *lens, int n, int slot0) {
    int row = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (gdn_seq){.slot = slot0 + 2 * i, .n_new = lens[i], .row0 = row};
        row += lens[i];
    }
    return row;
}

static void test_prep_vector_form_same_bits_on_one_8k_prefill(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const gdn_seq q[1] = {{.slot = 1, .n_new = 8192, .row0 = 0}};
    prep_case(16, 32, 128, 128, q, 1, 8192, 3, 16, g_all, "35B, one 8192-token sequence");
}

static void test_prep_vector_form_same_bits_on_mixed_lengths(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const int lens[] = {1, 63, 65, 3000, 0};
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++) {
        const gshape *g = &g_shapes[s];
        gdn_seq q[5];
        const int n_tok = lay_out(q, lens, 5, 1);
        char tag[96];
        snprintf(tag, sizeof tag, "%s, sequences of 1, 63, 65, 3000, 0 tokens", g->name);
        prep_case(g->nk, g->nv, g->dk, g->dv, q, 5, n_tok, 11, 16, g_all, tag);
    }
}

static void test_prep_vector_form_same_bits_on_short_sequences(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const int lens[] = {2, 5, 1};
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++) {
        const gshape *g = &g_shapes[s];
        gdn_seq q[3];
        const int n_tok = lay_out(q, lens, 3, 0);
        char tag[96];
        snprintf(tag, sizeof tag, "%s, sequences of 2, 5, 1 tokens", g->name);
        prep_case(g->nk, g->nv, g->dk, g->dv, q, 3, n_tok, 6, 16, g_all, tag);
    }
}

/* The whole cuda_chunked call with the old preparation (form 0) against the new (1), on copies of the
 * same inputs and states: outputs, recurrent and conv states bitwise equal. 35B shape, WY form
 * (auto: sequences of more than 512 tokens): one 3000-token sequence, then 3000 + 700 + 1 tokens. */
static void run_case(const gdn_seq *seqs, int n_seq, int n_tok, int slots, const char *tag) {
    const int nk = 16, nv = 32, dk = 128, dv = 128, D = 2 * nk * dk + nv * dv;
    const size_t nq = (size_t)n_tok * D, nab = (size_t)n_tok * nv, nconv = (size_t)slots * D * (PK - 1),
                 nrec = (size_t)slots * nv * dk * dv, nout = (size_t)n_tok * nv * dv * 2;
    uint16_t *qkv = malloc(nq * 2), *a = malloc(nab * 2), *b = malloc(nab * 2);
    float *cw = malloc((size_t)D * PK * 4), *al = malloc(nv * 4), *dt = malloc(nv * 4), *conv = malloc(nconv * 4),
          *rec = malloc(nrec * 4);
    assert_true(qkv && a && b && cw && al && dt && conv && rec);
    for (size_t i = 0; i < nq; i++) qkv[i] = f32_to_bf16(2.f * urand());
    for (size_t i = 0; i < nab; i++) a[i] = f32_to_bf16(2.f * urand());
    for (size_t i = 0; i < nab; i++) b[i] = f32_to_bf16(2.f * urand());
    for (size_t i = 0; i < (size_t)D * PK; i++) cw[i] = 0.5f * urand();
    for (int i = 0; i < nv; i++) al[i] = 0.5f * urand();
    for (int i = 0; i < nv; i++) dt[i] = 0.5f * urand();
    for (size_t i = 0; i < nconv; i++) conv[i] = urand();
    for (size_t i = 0; i < nrec; i++) rec[i] = 0.3f * urand();
    ls_err e = {0};
    void *dq = dev_copy(qkv, nq * 2), *da = dev_copy(a, nab * 2), *db = dev_copy(b, nab * 2);
    float *dcw = dev_copy(cw, (size_t)D * PK * 4), *dal = dev_copy(al, nv * 4), *ddt = dev_copy(dt, nv * 4);
    gdn_seq *dseqs = dev_copy(seqs, sizeof(gdn_seq) * n_seq);
    float *dconv[NF], *drec[NF];
    void *dout[NF];
    gdn_w w = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = PK, .conv_w = dcw, .A_log = dal, .dt_bias = ddt};
    for (int f = 0; f < NF; f++) {
        dconv[f] = dev_copy(conv, nconv * 4);
        drec[f] = dev_copy(rec, nrec * 4);
        dout[f] = g_mem->alloc(nout, &e);
        assert_non_null(dout[f]);
        assert_int_equal(g_mem->memset0(dout[f], nout, g_st, &e), 0);
        gdn_state st = {.conv = dconv[f], .rec = drec[f], .n_slots = slots};
        gdn_args ga = {.n_seq = n_seq, .seqs = dseqs, .seqs_host = seqs, .n_tok = n_tok, .w = &w, .qkv = dq,
                       .a = da, .b = db, .st = &st, .out = dout[f], .dt = ACT_BF16};
        const int rc = lsc_gdn_chunked_run(&ga, f, g_st, &e);
        if (rc) fprintf(stderr, "gdn cuda_chunked (%s) prep form %d: %s\n", tag, f, e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(g_mem->sync(g_st, &e), 0);
    }
    int ok = 1;
    for (int f = 1; f < NF; f++) {
        char t2[160];
        snprintf(t2, sizeof t2, "whole call, %s; form %d vs 0", tag, f);
        ok &= same_dev(dout[0], dout[f], nout, 2, "the output", t2);
        ok &= same_dev(drec[0], drec[f], nrec * 4, 4, "the recurrent states", t2);
        ok &= same_dev(dconv[0], dconv[f], nconv * 4, 4, "the conv states", t2);
    }
    for (int f = 0; f < NF; f++) {
        g_mem->free(dconv[f]);
        g_mem->free(drec[f]);
        g_mem->free(dout[f]);
    }
    void *dev[] = {dq, da, db, dcw, dal, ddt, dseqs};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) g_mem->free(dev[i]);
    free(qkv);
    free(a);
    free(b);
    free(cw);
    free(al);
    free(dt);
    free(conv);
    free(rec);
    assert_true(ok);
}

static void test_chunked_call_same_bits_with_every_prep_form(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const gdn_seq one[1] = {{.slot = 2, .n_new = 3000, .row0 = 0}};
    run_case(one, 1, 3000, 3, "one 3000-token sequence");
    const int lens[] = {3000, 700, 1};
    gdn_seq q[3];
    const int n_tok = lay_out(q, lens, 3, 0);
    run_case(q, 3, n_tok, 6, "sequences of 3000, 700, 1 tokens");
}

static void test_prep_vector_form_declines_a_misaligned_qkv(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const int lens[] = {65, 7};
    gdn_seq q[2];
    const int n_tok = lay_out(q, lens, 2, 0);
    const int none[NF] = {0, 0}, eight[NF] = {0, 1};
    prep_case(16, 32, 128, 128, q, 2, n_tok, 4, 2, none, "35B, qkv 2 bytes off 16-byte alignment");
    prep_case(16, 32, 128, 128, q, 2, n_tok, 4, 8, eight, "35B, qkv 8 bytes off 16-byte alignment");
}
#endif

int main(void) {
    /* LS_TEST_FILTER: run only the tests whose name matches (bench/device/gdnprep.sh profiles one) */
    const char *f = getenv("LS_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
#ifdef LS_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prep_vector_form_same_bits_on_one_8k_prefill),
        cmocka_unit_test(test_prep_vector_form_same_bits_on_mixed_lengths),
        cmocka_unit_test(test_prep_vector_form_same_bits_on_short_sequences),
        cmocka_unit_test(test_prep_vector_form_declines_a_misaligned_qkv),
        cmocka_unit_test(test_chunked_call_same_bits_with_every_prep_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    printf("test_gdn_prep_cuda: built without CUDA, nothing to test\n");
    return 0;
#endif
}
