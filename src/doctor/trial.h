/* trial.h: internals shared by the doctor's child side (trial.c) and its
 * per-family job drivers (trial_gemm.c, trial_moe.c, trial_seq.c): device memory on the
 * trial's device, timing, random inputs, comparison, result lines.
 */
#ifndef LS_DOCTOR_TRIAL_H
#define LS_DOCTOR_TRIAL_H

#include "doctor/doctor.h"

typedef struct td_res {
    const char *status; /* ok | wrong | unsupported | crash | unverified */
    char detail[512];   /* e.msg (1024) is copied in with a precision (e.g. "timing: %.503s")
                         * so the line fits in 511 chars: the truncation is intended */
    double ms, bytes, flops, rel, max;
    const char *ref;    /* what the output was compared with */
} td_res;

typedef struct td_job_ctx {
    const doc_shapes *s;
    const int32_t *ms;
    int n_ms;
    const char *backend;
    int gpu_ref_ok;     /* the parent found cuda_ref right on the small jobs */
    uint64_t seed;
    const char *ref_cache; /* path prefix of the run's reference cache (td_ref_load), or NULL */
} td_job_ctx;

/* Above this many multiply-adds the fp64 CPU oracle hands over to cuda_ref. */
#define TD_CPU_REF_MACS (1ull << 28)

void *td_alloc(size_t n, ls_err *e);
void td_free(void *p);
int td_put(void *dst, const void *src, size_t n, ls_err *e);
int td_get(void *dst, const void *src, size_t n, ls_err *e);
int td_copy(void *dst, const void *src, size_t n, ls_err *e);
int td_poison(void *dst, size_t n, ls_err *e);
int td_zero(void *dst, size_t n, ls_err *e);
int td_sync(ls_err *e);
size_t td_l2_bytes(void);
act_dtype td_act(void);
const dev_info *td_dev(void);
int td_put_act(void *dst, const float *src, size_t n, ls_err *e);
int td_get_act(float *dst, const void *src, size_t n, ls_err *e);

/* One timed call on rotating set `set`. */
typedef int (*td_call)(void *ctx, int set, ls_err *e);
int td_time(td_call fn, void *ctx, int nsets, double *median_ms, ls_err *e);
/* The timing method td_time uses, for the report: "chain8" (calls timed in chains
 * of 8, the default) or "isolated" (LASTSTAND_DOCTOR_TIMING=isolated). */
const char *td_timing_name(void);
int td_nsets(size_t set_bytes);

uint64_t td_rng_next(uint64_t *s);
float td_rng_unit(uint64_t *s);
void td_gen_act(float *x, int M, int K, uint64_t *rng);
/* n values uniform in (-amp, amp), generated in parallel; act_round: rounded as td_gen_act's
 * (inputs the device stores as activations), else fp32 (states) */
void td_gen_uniform(float *p, size_t n, float amp, int act_round, uint64_t *rng);
void td_gen_nvfp4(int N, int K, uint8_t *codes, uint8_t *scales, float *scale2, uint64_t *rng);
void td_gen_bf16(int N, int K, uint16_t *w, float amp, uint64_t *rng);
void td_gen_fp8(int N, int K, uint8_t *codes, float *scales, size_t n_scales, uint64_t *rng);

/* 1 if y matches ref; detail says why not (naming M). */
int td_check(const float *y, const float *ref, size_t rows, size_t cols, const unsigned char *skip_row,
             double tol_rel, double tol_max, int M, char *detail, size_t dn, double *rel_out,
             double *max_out);
void td_result(int job, const td_res *r);

/* A job's CPU reference, shared by the trial children of one doctor run: the first child
 * that computes it stores it (td_ref_store: written to a temporary name, then renamed), the
 * others load it (td_ref_load: 1 when a stored one of exactly n bytes with this key was read).
 * Only for references that are a function of (seed, family, job) alone; key = anything else
 * the bytes depend on (checked on load). The parent removes the files (doctor_ref_path). */
int td_ref_load(const td_job_ctx *c, const char *family, int job, uint64_t key, void *buf, size_t n);
void td_ref_store(const td_job_ctx *c, const char *family, int job, uint64_t key, const void *buf, size_t n);

int td_run_gemm_jobs(const td_job_ctx *c, int fp4, int start);
/* The lm_head row group: the gemm jobs of the one [vocab x hidden] BF16 shape. */
int td_run_lm_head_jobs(const td_job_ctx *c, int start);
int td_run_moe_jobs(const td_job_ctx *c, int start);
int td_run_attn_jobs(const td_job_ctx *c, int start);
int td_run_gdn_jobs(const td_job_ctx *c, int start);

#endif
