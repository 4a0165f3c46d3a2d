/* cpu.h: helpers shared by the CPU backends (reference and fast), and the
 * registration entry points ops.c calls. Internal to src/ops.
 */
#ifndef LS_OPS_CPU_H
#define LS_OPS_CPU_H

#include "ops/ops.h"

#include <math.h>
#include <stdio.h>

/* Σ a[i]·b[i] in fp32 with eight independent partial sums (fixed order). */
static inline float cpu_dot(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

/* y[M, N] (+)= x[M, K] · Wᵀ on fp32 activations, threads over N (each thread
 * converts/dequantises a weight row once and reuses it for all M rows). */
void cpu_gemm_f32(int M, const float *x, const lin_w *w, float *y, int accumulate);

/* The same with the fastest CPU kernel available (AVX2/FMA when present). */
void cpu_gemm_fast_f32(int M, const float *x, const lin_w *w, float *y, int accumulate);

/* Gated DeltaNet, shared by the CPU backends: argument checks, and for one
 * sequence the conv + SiLU (updating the conv state), l2norm of q and k,
 * q ·= dk^-0.5, g and β:  c_out [n_new, conv_dim], gb_out [n_new, nv, 2] (g, β). */
int cpu_gdn_check_args(const gdn_args *a, ls_err *e);
int cpu_gdn_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n);
void cpu_gdn_prepare(const gdn_args *a, const gdn_seq *sq, float *c_out, float *gb_out);
/* S [dk, dv] of (slot, v head j) in fp32 for a call's worker: the state itself (fp32 state), or
 * buf [dk·dv] filled from the BF16 state (gdn_state.rec16); cpu_gdn_S_store rounds buf back into
 * the BF16 state (nearest even) at the end of the call, a no-op for an fp32 state. */
float *cpu_gdn_S_load(const gdn_state *st, int nv, int dk, int dv, int slot, int j, float *buf);
void cpu_gdn_S_store(const gdn_state *st, int nv, int dk, int dv, int slot, int j, const float *S);

/* Reject non-fp32 activations with a message (every CPU backend). */
int cpu_supports_dt(act_dtype dt, char *why, size_t n);

void cpu_register_all(void);    /* fast CPU backends, in preference order */
void cpu_register_avx2(void);   /* gemm/fp4_gemm "cpu_avx2" when the CPU has AVX2+FMA */
void cpu_register_broken(void); /* test-only broken moe backends */

#endif
