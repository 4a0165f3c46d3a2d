/* gdn_chunked.c: the "cpu_chunked" Gated DeltaNet backend: the chunkwise
 * (WY) form of the gated delta rule that prefill kernels use (transformers'
 * torch_chunk_gated_delta_rule, reference section 2.4 step 7), chunks of 64.
 *
 * Per value head and chunk of L tokens with state S [dk, dv] on entry, γ the
 * in-chunk cumulative sum of g, kβ_i = β_i k_i, vβ_i = β_i v_i:
 *   A[i][c] = −(kβ_i·k_c)·exp(γ_i − γ_c) for c < i, else 0
 *   T       = (I − strict part)⁻¹ by forward substitution (row i uses rows < i)
 *   U = T vβ,   W = T (kβ ⊙ exp(γ))
 *   V' = U − W S
 *   o_i = exp(γ_i)·(q_i S) + Σ_{c ≤ i} (q_i·k_c)·exp(γ_i − γ_c)·V'_c
 *   S  ← exp(γ_L)·S + Σ_c exp(γ_L − γ_c)·k_c ⊗ V'_c
 * Mathematically equal to the token-by-token recurrence of cpu_ref (the test
 * oracle); conv, l2norm, g and β come from the shared cpu_gdn_prepare.
 * Threads split the value heads. Not "auto" on the CPU (see the impl below).
 */
#include "ops/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 64

typedef struct chunk_ctx {
    const gdn_args *a;
    const gdn_seq *sq;
    const float *c;  /* [n_new, conv_dim] */
    const float *gb; /* [n_new, nv, 2] */
} chunk_ctx;

static void chunk_heads(void *p, int64_t h0, int64_t h1) {
    const chunk_ctx *cx = p;
    const gdn_args *a = cx->a;
    const gdn_w *w = a->w;
    const int nk = w->nk, nv = w->nv, dk = w->dk, dv = w->dv;
    const int D = 2 * nk * dk + nv * dv, ratio = nv / nk, T = cx->sq->n_new;
    double *A = xmalloc(sizeof(double) * CHUNK * CHUNK);
    float *gam = xmalloc(sizeof(float) * CHUNK);
    float *U = xmalloc(sizeof(float) * CHUNK * dv), *W = xmalloc(sizeof(float) * CHUNK * dk);
    float *Vp = xmalloc(sizeof(float) * CHUNK * dv);
    float *vb = xmalloc(sizeof(float) * CHUNK * dv), *kbe = xmalloc(sizeof(float) * CHUNK * dk);
    float *sbuf = a->st->rec16 ? xmalloc(sizeof(float) * dk * dv) : NULL;
    for (int64_t j = h0; j < h1; j++) {
        const int kh = (int)j / ratio;
        float *S = cpu_gdn_S_load(a->st, nv, dk, dv, cx->sq->slot, (int)j, sbuf); /* [dk, dv] */
#define Q(t) (cx->c + (size_t)(t) * D + (size_t)kh * dk)
#define K(t) (cx->c + (size_t)(t) * D + (size_t)nk * dk + (size_t)kh * dk)
#define V(t) (cx->c + (size_t)(t) * D + (size_t)2 * nk * dk + (size_t)j * dv)
#define G(t) (cx->gb[((size_t)(t) * nv + j) * 2])
#define B(t) (cx->gb[((size_t)(t) * nv + j) * 2 + 1])
        for (int t0 = 0; t0 < T; t0 += CHUNK) {
            const int L = T - t0 < CHUNK ? T - t0 : CHUNK;
            float acc = 0;
            for (int i = 0; i < L; i++) gam[i] = (acc += G(t0 + i));
            /* A: strictly lower, then the forward substitution of transformers */
            for (int i = 0; i < L; i++)
                for (int c = 0; c < L; c++)
                    A[i * CHUNK + c] = c < i ? -(double)B(t0 + i) * cpu_dot(K(t0 + i), K(t0 + c), dk) *
                                                   exp((double)gam[i] - gam[c])
                                             : 0.0;
            for (int i = 1; i < L; i++) {
                double row[CHUNK];
                for (int c = 0; c < i; c++) row[c] = A[i * CHUNK + c];
                for (int c = 0; c < i; c++) {
                    double s = row[c];
                    for (int m = c + 1; m < i; m++) s += row[m] * A[m * CHUNK + c];
                    A[i * CHUNK + c] = s;
                }
            }
            for (int i = 0; i < L; i++) A[i * CHUNK + i] = 1.0; /* T = A + I */
            /* U = T vβ, W = T (kβ ⊙ exp γ); vb, kbe hold vβ and kβ ⊙ exp γ */
            for (int c = 0; c < L; c++) {
                const float bc = B(t0 + c), ec = expf(gam[c]);
                for (int d = 0; d < dv; d++) vb[c * dv + d] = bc * V(t0 + c)[d];
                for (int d = 0; d < dk; d++) kbe[c * dk + d] = bc * K(t0 + c)[d] * ec;
            }
            for (int i = 0; i < L; i++) {
                for (int d = 0; d < dv; d++) U[i * dv + d] = 0;
                for (int d = 0; d < dk; d++) W[i * dk + d] = 0;
                for (int c = 0; c <= i; c++) {
                    const float t = (float)A[i * CHUNK + c];
                    for (int d = 0; d < dv; d++) U[i * dv + d] += t * vb[c * dv + d];
                    for (int d = 0; d < dk; d++) W[i * dk + d] += t * kbe[c * dk + d];
                }
            }
            /* V' = U − W S */
            for (int i = 0; i < L; i++) {
                float *vp = Vp + i * dv;
                memcpy(vp, U + i * dv, sizeof(float) * dv);
                for (int r = 0; r < dk; r++) {
                    const float wr = W[i * dk + r];
                    const float *sr = S + (size_t)r * dv;
                    for (int d = 0; d < dv; d++) vp[d] -= wr * sr[d];
                }
            }
            /* outputs: o_i = exp(γ_i)(q_i S) + Σ_{c≤i} (q_i·k_c) exp(γ_i − γ_c) V'_c */
            for (int i = 0; i < L; i++) {
                float *o = (float *)a->out + ((size_t)(cx->sq->row0 + t0 + i) * nv + j) * dv;
                const float *q = Q(t0 + i);
                const float eg = expf(gam[i]);
                for (int d = 0; d < dv; d++) o[d] = 0;
                for (int r = 0; r < dk; r++) {
                    const float qr = q[r] * eg;
                    const float *sr = S + (size_t)r * dv;
                    for (int d = 0; d < dv; d++) o[d] += qr * sr[d];
                }
                for (int c = 0; c <= i; c++) {
                    const float qk = cpu_dot(q, K(t0 + c), dk) * expf(gam[i] - gam[c]);
                    for (int d = 0; d < dv; d++) o[d] += qk * Vp[c * dv + d];
                }
            }
            /* state: S ← exp(γ_L) S + Σ_c exp(γ_L − γ_c) k_c ⊗ V'_c */
            const float eL = expf(gam[L - 1]);
            for (int i = 0; i < dk * dv; i++) S[i] *= eL;
            for (int c = 0; c < L; c++) {
                const float dc = expf(gam[L - 1] - gam[c]);
                const float *kc = K(t0 + c);
                for (int r = 0; r < dk; r++) {
                    const float kr = dc * kc[r];
                    float *sr = S + (size_t)r * dv;
                    for (int d = 0; d < dv; d++) sr[d] += kr * Vp[c * dv + d];
                }
            }
        }
#undef Q
#undef K
#undef V
#undef G
#undef B
        cpu_gdn_S_store(a->st, nv, dk, dv, cx->sq->slot, (int)j, S);
    }
    free(A); free(gam); free(U); free(W); free(Vp); free(vb); free(kbe); free(sbuf);
}

static int chunked_run(const gdn_args *a, ls_stream s, ls_err *e) {
    int rc = cpu_gdn_check_args(a, e);
    if (rc) return rc;
    const gdn_w *w = a->w;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    for (int si = 0; si < a->n_seq; si++) {
        const gdn_seq *sq = &a->seqs[si];
        if (sq->n_new == 0) continue;
        float *c = xmalloc(sizeof(float) * sq->n_new * D), *gb = xmalloc(sizeof(float) * sq->n_new * w->nv * 2);
        cpu_gdn_prepare(a, sq, c, gb);
        chunk_ctx cx = {a, sq, c, gb};
        pool_for(w->nv, 1, chunk_heads, &cx);
        free(c);
        free(gb);
    }
    return 0;
}

/* test_only: on a CPU the chunked form does about as much work as the
 * recurrence and is not faster, so "auto" keeps cpu_ref; it stays selectable
 * (--gdn-backend cpu_chunked) and is the CPU oracle for chunked GPU kernels. */
const gdn_impl gdn_cpu_chunked = {"cpu_chunked", DEV_CPU, 1, cpu_gdn_supported, chunked_run};
