/* test_gdn_decode_cuda.c: the gdn backend cuda_decode (src/ops/cuda/gdn_decode.cu) with the
 * layer's gated output norm fused into its kernel (gdn_args.z / norm_w / norm_done,
 * LASTSTAND_GDN_NORM=1, forced on here unless the caller set it) against the two ops it
 * replaces: cuda_decode without z, then the small op rmsnorm_gated on its output, on copies
 * of the same inputs and states. The normed output, the recurrent states and the conv
 * windows must come out bitwise identical (the fused kernel sums the squares in the small
 * op's order), and norm_done must say the norm was done. Shapes: Qwen3.5-35B's GDN (16 k /
 * 32 v heads, dk = dv = 128: clusters of 8 blocks of 2 warps, a v head over 4 blocks),
 * Qwen3.5-397B's (16 / 64: blocks of 4 warps, a head over 2 blocks), dk = dv = 64 and the
 * fixture models' dk = dv = 32 (a head over 2 one-warp blocks); sequences of 1 token, of 6
 * (a full group of 4 and a partial one), of none, in scattered state slots. A call with a
 * 65-token sequence goes to cuda_chunked, which does not fuse: norm_done must stay 0.
 * A decode step of 16 one-token sequences (gd_kernel1 where gd_kernel would need more than one
 * wave, LASTSTAND_GDN_T1=2, forced here unless the caller set it; 8-warp blocks there) must give
 * the bits of the same rows computed by gd_kernel (the same call with a 2-token sequence added)
 * and by a 3-sequence call (2-warp blocks); so must the streamed forms gd_kernel_p, which
 * LASTSTAND_GDN_STREAM=2 (auto) and 3 pick for that step, and gd_kernel_s (=4) (the switch is read
 * at every call: the tests set it).
 * gd_kernel_s for every call (LASTSTAND_GDN_STREAM=1) against gd_kernel (=0): outputs (with and
 * without the fused norm), states and windows bitwise equal at every shape, tokens 1, 6 and 0;
 * and its fused norm against its own output + rmsnorm_gated. The persistent form gd_kernel_p
 * (=3, decode steps) likewise, on decode steps with a sequence of no token, and on the wide step,
 * in each of its forms (LASTSTAND_GDN_PCFG 0 .. 3, read at every call) and by the unit count.
 * `test_gdn_decode_cuda --bench`: µs a call (CUDA events, L2 flushed before each) of the 16-sequence
 * decode step at the 35B and 397B shapes: gd_kernel, gd_kernel_p.
 * Needs a CUDA GPU of compute capability 9.0+: every test is skipped without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 4242u
#include "cuda_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) { return cuda_test_gpu("test_gdn_decode_cuda", 9, &g_mem, &g_dev, &g_st); }

static uint16_t *bf16_rand(size_t n, float scale) {
    uint16_t *p = malloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(scale * urand());
    return p;
}

static float *f32_rand(size_t n, float scale, float bias) {
    float *p = malloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = bias + scale * urand();
    return p;
}

/* Compares n bytes of two device buffers; prints how many elements of size es differ. */
static int same_dev(const void *a, const void *b, size_t n, size_t es, const char *what, int nk, int nv, int dk) {
    size_t first = 0;
    const size_t bad = dev_diff_count(a, b, n, es, &first);
    if (bad)
        fprintf(stderr, "gdn cuda_decode + fused norm (nk %d nv %d dk %d): %s differs from the two ops at %zu of %zu "
                        "elements (first: %zu)\n", nk, nv, dk, what, bad, n / es, first);
    return bad == 0;
}

/* One shape's inputs, random (drawn in this order, so every case keeps the inputs it was written
 * with: qkv, a, b, z, conv_w, A_log, dt_bias, the norm's weight, the conv and recurrent states),
 * on the host and the device, with nc device copies of the states and of the output (poisoned
 * with z), one for each call a case compares. */
enum { GC_MAX = 3, GC_K = 4 };
typedef struct {
    int nk, nv, dk, dv, D, n_tok, nc;
    size_t nconv, nrec, nout; /* floats of the states, bytes of the output */
    uint16_t *qkv, *a, *b, *z;
    float *conv_w, *A_log, *dt_bias, *nw, *conv, *rec;
    void *dqkv, *da, *db, *dz, *dout[GC_MAX];
    float *dcw, *dal, *ddt, *dnw, *dconv[GC_MAX], *drec[GC_MAX];
    gdn_seq *dseqs;
    gdn_w w;
    gdn_state st[GC_MAX];
} gdn_case;

static void gc_init(gdn_case *c, int nk, int nv, int dk, int dv, int n_tok, int slots, const gdn_seq *seqs,
                    int n_seq, int nc) {
    const int D = 2 * nk * dk + nv * dv, K = GC_K;
    *c = (gdn_case){.nk = nk, .nv = nv, .dk = dk, .dv = dv, .D = D, .n_tok = n_tok, .nc = nc,
                    .nconv = (size_t)slots * D * (K - 1), .nrec = (size_t)slots * nv * dk * dv,
                    .nout = (size_t)n_tok * nv * dv * 2};
    c->qkv = bf16_rand((size_t)n_tok * D, 2.f);
    c->a = bf16_rand((size_t)n_tok * nv, 2.f);
    c->b = bf16_rand((size_t)n_tok * nv, 2.f);
    c->z = bf16_rand((size_t)n_tok * nv * dv, 3.f);
    c->conv_w = f32_rand((size_t)D * K, 0.5f, 0.f);
    c->A_log = f32_rand(nv, 0.5f, 0.f);
    c->dt_bias = f32_rand(nv, 0.5f, 0.f);
    c->nw = f32_rand(dv, 0.3f, 1.f);
    c->conv = f32_rand(c->nconv, 1.f, 0.f);
    c->rec = f32_rand(c->nrec, 0.3f, 0.f);
    c->dqkv = dev_copy(c->qkv, (size_t)n_tok * D * 2);
    c->da = dev_copy(c->a, (size_t)n_tok * nv * 2);
    c->db = dev_copy(c->b, (size_t)n_tok * nv * 2);
    c->dz = dev_copy(c->z, c->nout);
    c->dcw = dev_copy(c->conv_w, (size_t)D * K * 4);
    c->dal = dev_copy(c->A_log, nv * 4);
    c->ddt = dev_copy(c->dt_bias, nv * 4);
    c->dnw = dev_copy(c->nw, dv * 4);
    c->dseqs = dev_copy(seqs, sizeof(gdn_seq) * n_seq);
    c->w = (gdn_w){.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = K, .conv_w = c->dcw, .A_log = c->dal,
                   .dt_bias = c->ddt};
    for (int s = 0; s < nc; s++) {
        c->dconv[s] = dev_copy(c->conv, c->nconv * 4);
        c->drec[s] = dev_copy(c->rec, c->nrec * 4);
        c->dout[s] = dev_copy(c->z, c->nout); /* poison: z */
        c->st[s] = (gdn_state){.conv = c->dconv[s], .rec = c->drec[s], .n_slots = slots};
    }
}

/* The call on copy s of the states and output: the first n_seq of seqs (the host copy of the
 * device table), n_tok rows; with the fused norm when done is not NULL */
static gdn_args gc_args(gdn_case *c, int s, const gdn_seq *seqs, int n_seq, int n_tok, int *done) {
    gdn_args ga = {.n_seq = n_seq, .seqs = c->dseqs, .seqs_host = seqs, .n_tok = n_tok, .w = &c->w, .qkv = c->dqkv,
                   .a = c->da, .b = c->db, .st = &c->st[s], .out = c->dout[s], .dt = ACT_BF16};
    if (done) {
        ga.z = c->dz;
        ga.norm_w = c->dnw;
        ga.norm_eps = 1e-6f;
        ga.norm_done = done;
    }
    return ga;
}

static void gc_free(gdn_case *c) {
    for (int s = 0; s < c->nc; s++) {
        g_mem->free(c->dconv[s]);
        g_mem->free(c->drec[s]);
        g_mem->free(c->dout[s]);
    }
    void *dev[] = {c->dqkv, c->da, c->db, c->dz, c->dcw, c->dal, c->ddt, c->dnw, c->dseqs};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) g_mem->free(dev[i]);
    void *host[] = {c->qkv, c->a, c->b, c->z, c->conv_w, c->A_log, c->dt_bias, c->nw, c->conv, c->rec};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

/* copies 0 and s of the case bitwise equal: output (the first nout bytes), states, windows */
static int gc_same(const gdn_case *c, int s, size_t nout, const char *out_what, const char *tag) {
    char w1[96], w2[96];
    snprintf(w1, sizeof w1, "the recurrent state%s", tag);
    snprintf(w2, sizeof w2, "the conv windows%s", tag);
    int ok = same_dev(c->dout[0], c->dout[s], nout, 2, out_what, c->nk, c->nv, c->dk);
    ok &= same_dev(c->drec[0], c->drec[s], c->nrec * 4, 4, w1, c->nk, c->nv, c->dk);
    ok &= same_dev(c->dconv[0], c->dconv[s], c->nconv * 4, 4, w2, c->nk, c->nv, c->dk);
    return ok;
}

/* One shape; seqs [n_seq] in host memory, n_tok rows. Returns norm_done of the fused call. */
static int fused_case(int nk, int nv, int dk, int dv, int n_seq, const gdn_seq *seqs, int n_tok, int expect_same) {
    const gdn_impl *g = ops_gdn_find("cuda_decode");
    const small_ops *so = ops_small_find("cuda");
    assert_non_null(g);
    assert_non_null(so);
    ls_err e = {0};
    gdn_case c;
    gc_init(&c, nk, nv, dk, dv, n_tok, 4, seqs, n_seq, 2);
    /* the two ops */
    gdn_args ga = gc_args(&c, 0, seqs, n_seq, n_tok, NULL);
    assert_int_equal(g->run(&ga, g_st, &e), 0);
    assert_int_equal(so->rmsnorm_gated(n_tok * nv, dv, c.dout[0], c.dz, c.dnw, 1e-6f, c.dout[0], ACT_BF16, g_st), 0);
    /* the fused call */
    int done = 0;
    gdn_args gb = gc_args(&c, 1, seqs, n_seq, n_tok, &done);
    assert_int_equal(g->run(&gb, g_st, &e), 0);
    if (!done) {
        const int rc = so->rmsnorm_gated(n_tok * nv, dv, c.dout[1], c.dz, c.dnw, 1e-6f, c.dout[1], ACT_BF16, g_st);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    if (expect_same) assert_true(gc_same(&c, 1, c.nout, "the normed output", ""));
    gc_free(&c);
    return done;
}

/* The same call under LASTSTAND_GDN_STREAM=0 (gd_kernel) and =mode ("1": gd_kernel_s, "3":
 * gd_kernel_p for decode steps), on copies of the same inputs and states, fused norm or not:
 * outputs, states and windows must be bitwise equal. */
static void stream_case(int nk, int nv, int dk, int dv, int n_seq, const gdn_seq *seqs, int n_tok, int fuse,
                        const char *mode) {
    const gdn_impl *g = ops_gdn_find("cuda_decode");
    assert_non_null(g);
    ls_err e = {0};
    gdn_case c;
    gc_init(&c, nk, nv, dk, dv, n_tok, 4, seqs, n_seq, 2);
    int done[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        gdn_args ga = gc_args(&c, s, seqs, n_seq, n_tok, fuse ? &done[s] : NULL);
        setenv("LASTSTAND_GDN_STREAM", s ? mode : "0", 1);
        assert_int_equal(g->run(&ga, g_st, &e), 0);
    }
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    assert_int_equal(done[0], done[1]);
    assert_true(gc_same(&c, 1, c.nout, fuse ? "the normed output (streamed)" : "the output (streamed)", " (streamed)"));
    gc_free(&c);
}

/* A decode step of n one-token sequences (scattered slots) against the same rows inside a call
 * that also carries a 2-token sequence, and against its first 3 sequences alone: the first call
 * is a pure decode step, which gd_kernel1 runs where its grid is wider than the GPU holds of
 * gd_kernel (LASTSTAND_GDN_T1=2, set by main unless the caller set it) and which takes 8-warp
 * blocks when wide (LASTSTAND_GDN_NW unset), the second is gd_kernel's (groups of 4 tokens), the
 * third a narrow grid (2-warp blocks at the 35B shape). Outputs (fused norm), recurrent states
 * and conv windows of those sequences must be bitwise equal. */
static void t1_case(int nk, int nv, int dk, int dv, int n) {
    const gdn_impl *g = ops_gdn_find("cuda_decode");
    assert_non_null(g);
    enum { K = GC_K };
    const int slots = n + 3, D = 2 * nk * dk + nv * dv, n_tok = n + 2;
    ls_err e = {0};
    gdn_seq *seqs = calloc((size_t)n + 1, sizeof *seqs);
    for (int i = 0; i < n; i++) seqs[i] = (gdn_seq){.slot = (i * 7 + 3) % slots, .n_new = 1, .row0 = i};
    int extra = 0; /* a slot none of the n uses */
    for (int used = 1; used;) {
        used = 0;
        for (int i = 0; i < n; i++) used |= seqs[i].slot == extra;
        if (used) extra++;
    }
    seqs[n] = (gdn_seq){.slot = extra, .n_new = 2, .row0 = n};
    gdn_case c;
    gc_init(&c, nk, nv, dk, dv, n_tok, slots, seqs, n + 1, 3);
    int done[3] = {0, 0, 0};
    /* 0: the n-sequence decode step; 1: with the 2-token sequence; 2: the first 3 sequences alone
     * (a narrow grid: the fewest warps a block, where the wide step takes 8-warp blocks) */
    const int ns[3] = {n, n + 1, 3}, nt[3] = {n, n_tok, 3};
    for (int s = 0; s < 3; s++) {
        gdn_args ga = gc_args(&c, s, seqs, ns[s], nt[s], &done[s]);
        assert_int_equal(g->run(&ga, g_st, &e), 0);
    }
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    assert_int_equal(done[0], done[1]);
    assert_int_equal(done[0], done[2]);
    /* the n sequences' rows, and their slots' states (the extra slot's differ: only the second call has it) */
    int ok = same_dev(c.dout[0], c.dout[1], (size_t)n * nv * dv * 2, 2, "the decode rows' output (t1)", nk, nv, dk);
    ok &= same_dev(c.dout[0], c.dout[2], (size_t)3 * nv * dv * 2, 2, "the first 3 rows' output (block size)", nk, nv,
                   dk);
    const size_t nconv = c.nconv, nrec = c.nrec;
    float *r0 = malloc(nrec * 4), *r1 = malloc(nrec * 4), *c0 = malloc(nconv * 4), *c1 = malloc(nconv * 4);
    const size_t rs = (size_t)nv * dk * dv, cs = (size_t)D * (K - 1);
    dev_fetch(r0, c.drec[0], nrec * 4);
    dev_fetch(c0, c.dconv[0], nconv * 4);
    for (int s = 1; s < 3; s++) {
        dev_fetch(r1, c.drec[s], nrec * 4);
        dev_fetch(c1, c.dconv[s], nconv * 4);
        for (int i = 0; i < (s == 1 ? n : 3); i++) {
            const int sl = seqs[i].slot;
            if (memcmp(r0 + sl * rs, r1 + sl * rs, rs * 4) || memcmp(c0 + sl * cs, c1 + sl * cs, cs * 4)) {
                fprintf(stderr, "gdn cuda_decode (nk %d nv %d dk %d): sequence %d (slot %d): state differs between "
                                "the decode step and the %s\n", nk, nv, dk, i, sl,
                        s == 1 ? "mixed call" : "3-sequence call");
                ok = 0;
            }
        }
    }
    assert_true(ok);
    gc_free(&c);
    void *host[] = {seqs, r0, r1, c0, c1};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}
#endif

/* A wide decode step (16 one-token sequences of Qwen3.5-35B's and -397B's GDN: gd_kernel1 under
 * LASTSTAND_GDN_T1=2 or 1) gives the bits gd_kernel gives the same rows. */
static void test_wide_decode_step_equals_the_group_kernel(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    /* 0: gd_kernel1 (LASTSTAND_GDN_T1=2) for the wide step; 2 (auto), 3: gd_kernel_p (in each of its
     * forms, LASTSTAND_GDN_PCFG 0 .. 3, and by the unit count); 4: gd_kernel_s */
    static const char *const modes[] = {"0", "2", "3", "3", "3", "3", "3", "4"};
    static const char *const forms[] = {"", "", "", "0", "1", "2", "3", ""};
    for (int v = 0; v < 8; v++) {
        setenv("LASTSTAND_GDN_STREAM", modes[v], 1);
        if (forms[v][0]) setenv("LASTSTAND_GDN_PCFG", forms[v], 1);
        else unsetenv("LASTSTAND_GDN_PCFG");
        t1_case(16, 32, 128, 128, 16);
        t1_case(16, 64, 128, 128, 16);
        t1_case(2, 4, 32, 32, 5); /* the fixtures' shape: a narrow grid (gd_kernel every time) */
    }
    unsetenv("LASTSTAND_GDN_STREAM");
    unsetenv("LASTSTAND_GDN_PCFG");
#else
    skip();
#endif
}

/* The fused gated norm equals cuda_decode + rmsnorm_gated, bit for bit, at every shape. */
static void test_fused_norm_equals_the_two_ops(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    /* sequence 0: 1 token in slot 2 (a decode row); 1: 6 tokens in slot 0 (rows 1..6: a group
     * of 4 and one of 2); 2: no token (slot 3: its state must come back unchanged) */
    const gdn_seq seqs[3] = {{.slot = 2, .n_new = 1, .row0 = 0}, {.slot = 0, .n_new = 6, .row0 = 1},
                             {.slot = 3, .n_new = 0, .row0 = 7}};
    static const int shapes[][4] = {{16, 32, 128, 128}, {16, 64, 128, 128}, {4, 8, 64, 64}, {2, 4, 32, 32}};
    for (int v = 0; v < 2; v++) { /* gd_kernel, then gd_kernel_s (LASTSTAND_GDN_STREAM=1) */
        setenv("LASTSTAND_GDN_STREAM", v ? "1" : "0", 1);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int *s = shapes[i];
            assert_int_equal(fused_case(s[0], s[1], s[2], s[3], 3, seqs, 7, 1), 1);
            assert_int_equal(fused_case(s[0], s[1], s[2], s[3], 1, seqs, 1, 1), 1); /* M = 1 alone */
        }
    }
    unsetenv("LASTSTAND_GDN_STREAM");
#else
    skip();
#endif
}

/* gd_kernel_s for every call (LASTSTAND_GDN_STREAM=1) gives gd_kernel's bits: outputs (the fused
 * norm's and the plain ones), states and windows, with sequences of 1, 6 and 0 tokens; so does
 * gd_kernel_p (=3) on decode steps. */
static void test_streamed_equals_the_group_kernel(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    const gdn_seq seqs[3] = {{.slot = 2, .n_new = 1, .row0 = 0}, {.slot = 0, .n_new = 6, .row0 = 1},
                             {.slot = 3, .n_new = 0, .row0 = 7}};
    /* a decode step with a sequence of no token between (gd_kernel_p skips it) */
    const gdn_seq dec[4] = {{.slot = 2, .n_new = 1, .row0 = 0}, {.slot = 0, .n_new = 0, .row0 = 1},
                            {.slot = 3, .n_new = 1, .row0 = 1}, {.slot = 1, .n_new = 1, .row0 = 2}};
    static const int shapes[][4] = {{16, 32, 128, 128}, {16, 64, 128, 128}, {4, 8, 64, 64}, {2, 4, 32, 32}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int fuse = 0; fuse < 2; fuse++) {
            const int *s = shapes[i];
            stream_case(s[0], s[1], s[2], s[3], 3, seqs, 7, fuse, "1");
            stream_case(s[0], s[1], s[2], s[3], 1, seqs, 1, fuse, "1"); /* M = 1 alone */
            stream_case(s[0], s[1], s[2], s[3], 4, dec, 3, fuse, "1");
            for (int f = -1; f < 4; f++) { /* gd_kernel_p by the unit count, then in each form */
                char fs[2] = {(char)('0' + f), 0};
                if (f < 0) unsetenv("LASTSTAND_GDN_PCFG");
                else setenv("LASTSTAND_GDN_PCFG", fs, 1);
                stream_case(s[0], s[1], s[2], s[3], 4, dec, 3, fuse, "3");
                stream_case(s[0], s[1], s[2], s[3], 1, seqs, 1, fuse, "3");
            }
            unsetenv("LASTSTAND_GDN_PCFG");
        }
    unsetenv("LASTSTAND_GDN_STREAM");
#else
    skip();
#endif
}

/* A prompt chunk over the decode kernel's limit goes to cuda_chunked, which leaves the norm
 * to the caller (norm_done stays 0). */
static void test_chunked_hand_over_leaves_the_norm(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    const gdn_seq seqs[1] = {{.slot = 1, .n_new = 65, .row0 = 0}};
    assert_int_equal(fused_case(2, 4, 32, 32, 1, seqs, 65, 0), 0);
#else
    skip();
#endif
}

#ifdef LS_HAVE_CUDA
/* `test_gdn_decode_cuda --bench`: µs a call (CUDA events around the backend's run, the L2 flushed
 * by a 256 MB memset before each, as the state of a 40-layer step comes from DRAM) of a decode
 * step of n (1, 4, 8, 16, 64) one-token sequences (fused norm) at Qwen3.5-35B's (16 / 32 heads)
 * and -397B's (16 / 64) GDN shapes: gd_kernel (LASTSTAND_GDN_STREAM=0) and gd_kernel_p (=3).
 * The forms take turns call by call, each on its own copy of the states (so after the same number
 * of calls their outputs and states must be equal: printed); median and min of IT calls each. */
#include <cuda_runtime_api.h>
static int bench(void) {
    if (!have_gpu()) return 1;
    const gdn_impl *g = ops_gdn_find("cuda_decode");
    if (!g) return 1;
    enum { IT = 40, NF = 2 };
    static const char *const fname[NF] = {"gd_kernel", "gd_kernel_p"}, *const fst[NF] = {"0", "3"};
    static const int shapes[][2] = {{16, 32}, {16, 64}}, ns[] = {1, 4, 8, 16, 64};
    ls_err e = {0};
    const size_t nflush = (size_t)256 << 20;
    void *flush = g_mem->alloc(nflush, &e);
    cudaEvent_t e0, e1;
    if (!flush || cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        fprintf(stderr, "bench: no memory or events (%s)\n", e.msg);
        return 1;
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int nk = shapes[si][0], nv = shapes[si][1], n = ns[ni];
            gdn_seq *seqs = calloc(n, sizeof *seqs);
            for (int i = 0; i < n; i++) seqs[i] = (gdn_seq){.slot = (i * 7 + 3) % n, .n_new = 1, .row0 = i};
            gdn_case c;
            gc_init(&c, nk, nv, 128, 128, n, n, seqs, n, NF);
            float us[NF][IT];
            int done = 0;
            for (int it = -3; it < IT; it++)
                for (int f = 0; f < NF; f++) {
                    setenv("LASTSTAND_GDN_STREAM", fst[f], 1);
                    gdn_args ga = gc_args(&c, f, seqs, n, n, &done);
                    float ms = 0.f;
                    g_mem->memset0(flush, nflush, g_st, &e);
                    cudaEventRecord(e0, (cudaStream_t)g_st);
                    const int rc = g->run(&ga, g_st, &e);
                    cudaEventRecord(e1, (cudaStream_t)g_st);
                    if (rc || g_mem->sync(g_st, &e)) {
                        fprintf(stderr, "bench: %s\n", e.msg);
                        return 1;
                    }
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (it >= 0) us[f][it] = 1000.f * ms;
                }
            printf("gdn decode step nk %d nv %d dk 128, %2d sequences (L2 flushed), us median / min:", nk, nv, n);
            for (int f = 0; f < NF; f++) {
                float *v = us[f];
                for (int i = 1; i < IT; i++) /* insertion sort */
                    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                        const float t = v[j];
                        v[j] = v[j - 1];
                        v[j - 1] = t;
                    }
                printf(" %s %.2f / %.2f;", fname[f], v[IT / 2], v[0]);
            }
            int ok = 1;
            for (int f = 1; f < NF; f++) ok &= gc_same(&c, f, c.nout, "the output (bench)", " (bench)");
            printf(" outputs and states after %d calls: %s\n", IT + 3, ok ? "equal" : "DIFFER");
            gc_free(&c);
            free(seqs);
        }
    unsetenv("LASTSTAND_GDN_STREAM");
    g_mem->free(flush);
    return 0;
}
#endif

int main(int argc, char **argv) {
    /* LS_TEST_FILTER: run only the tests whose name matches (bench/device/gdn16.sh profiles one) */
    const char *f = getenv("LS_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
    setenv("LASTSTAND_GDN_NORM", "1", 0);
#ifdef LS_HAVE_CUDA
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(); /* the engine's T1 default */
#else
    (void)argv;
    if (argc > 1) return 0;
#endif
    setenv("LASTSTAND_GDN_T1", "2", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_norm_equals_the_two_ops),
        cmocka_unit_test(test_wide_decode_step_equals_the_group_kernel),
        cmocka_unit_test(test_streamed_equals_the_group_kernel),
        cmocka_unit_test(test_chunked_hand_over_leaves_the_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
