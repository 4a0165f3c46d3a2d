/* doctor.h: the backend elimination of DESIGN.md section 4.
 *
 * For each op family and each batch-size bucket M the doctor decides which
 * backends (1) run at all, (2) compute the right numbers and (3) are fastest,
 * on the device it runs on, at the model's real shapes:
 *   - every backend is tried in a child process (the laststand binary itself,
 *     `doctor --trial ...`), so a crash, an illegal address or a hang becomes
 *     a verdict with its log tail and the doctor lives on;
 *   - outputs are poisoned (NaN) first; NaN/Inf, all-zero and unwritten
 *     outputs fail; the rest is compared in fp64 with the CPU reference, or,
 *     for shapes too large for the CPU, with the GPU reference kernel once it
 *     has itself passed against the CPU on the smaller ones (chain of trust);
 *   - the time is the median of repeated timings (CUDA events on the GPU) over
 *     rotating buffer sets larger than the L2.
 * The result is a matrix (stdout), a JSON report and a cache file keyed by
 * the device, driver, build and shapes.
 */
#ifndef LS_DOCTOR_H
#define LS_DOCTOR_H

#include "base/base.h"
#include "ops/ops.h"

#define DOC_MAX_LIN 24
#define DOC_MAX_M 32
/* The lm_head row group's largest bucket: its M is the rows that want logits (one per
 * sequence of a step); a plan's last entry takes every larger M. Its buckets are the
 * requested ones up to this (the smallest requested when none is). */
#define DOC_LM_HEAD_MAX_M 512

/* The shapes the doctor tests: one model's (or preset's) op shapes. */
typedef struct doc_lin {
    int N, K;
    char label[96]; /* which linears have this shape, e.g. "experts gate/up" */
    int fp8;        /* (additive) a gemm shape whose weight is FP8 (E4M3 codes, fp32 scales per
                       128 x 128 block in the trials), not BF16 */
} doc_lin;

typedef struct doc_shapes {
    char model[256];     /* model path or preset name */
    int nvfp4;           /* the model's experts are NVFP4 */
    int hidden;
    /* moe */
    int n_experts, top_k, moe_inter, shared_inter, norm_topk, has_sh_gate;
    /* attention */
    int n_heads, n_kv_heads, head_dim, gated;
    /* gdn */
    int nk, nv, dk, dv, conv_k;
    doc_lin fp4[DOC_MAX_LIN]; /* fp4_gemm shapes (NVFP4 linears) */
    int n_fp4;
    doc_lin bf16[DOC_MAX_LIN]; /* gemm shapes (BF16 linears, and FP8 ones: doc_lin.fp8) */
    int n_bf16;
    int sh_nvfp4;        /* (additive) the shared expert is NVFP4; 0 = BF16 (ModelOpt
                            NVFP4 checkpoints may exclude it, synth does); only
                            meaningful with nvfp4 and shared_inter > 0 */
    int state_bf16;      /* (additive) the GDN recurrent state stored in BF16 (mamba_ssm_dtype; the gdn
                            trials run on it) */
    int vocab;           /* (additive) vocab_size: the lm_head is a BF16 gemm of [vocab x hidden]
                            (tied or not; NVFP4 checkpoints keep it BF16), timed as its own row
                            group "lm_head" with its own choice; 0: no lm_head row */
} doc_shapes;

/* Shapes from a model folder (config.json), "synth:NAME[,...]" or a preset
 * name (qwen3.5-397b-a17b, qwen3.5-122b-a10b, qwen3.5-35b-a3b,
 * qwen3-next-80b-a3b, qwen3-30b-a3b). */
int doc_shapes_from_model(const char *path, doc_shapes *s, ls_err *e);
int doc_shapes_from_preset(const char *name, doc_shapes *s, ls_err *e);
/* Replace the fp4_gemm shapes by "NxK[,NxK...]" (bench and acceptance runs). */
int doc_shapes_set_fp4(doc_shapes *s, const char *list, ls_err *e);
/* JSON text of the shapes (caller frees); parsing it back for the children. */
char *doc_shapes_json(const doc_shapes *s);
int doc_shapes_parse_json(const char *text, doc_shapes *s, ls_err *e);

typedef struct doctor_opts {
    const char *device;      /* "cuda" | "cpu" */
    const char *json_path;   /* NULL: no report file */
    const char *families;    /* comma list of fp4_gemm,gemm,moe,attention,gdn,lm_head; NULL = all */
    const char *backends;    /* comma list to restrict to; NULL = all of the device */
    int ms[DOC_MAX_M];       /* buckets */
    int n_ms;
    double trial_timeout_s;  /* per (shape, M) job */
    int use_cache;           /* print the cached decision if one matches */
    const char *self_exe;    /* the laststand binary (for the children) */
    uint64_t seed;
} doctor_opts;

/* Default buckets: 1 2 4 ... 8192 with 3072. */
void doctor_default_ms(doctor_opts *o);

/* The whole elimination; prints the matrix to stdout. Returns 0 when every
 * family tested has a correct backend at every bucket, 1 when some bucket has
 * none, negative ERR_* on failure to run at all (no GPU, bad shapes). */
int doctor_run(const doctor_opts *o, const doc_shapes *s, ls_err *e);

/* Print a report (doctor_run's JSON form, or a cached one) as the matrix. */
#include <stdio.h>
#include <jansson.h>
void doctor_render(json_t *report, FILE *f);

/* The hidden child side: `laststand doctor --trial ...` (see trial.c). */
int doctor_trial_main(int argc, char **argv);

/* For serve with `auto`: the cached report of a previous run with the same
 * device, driver, build, shapes, buckets and families (o->device, o->ms,
 * o->families, o->self_exe as for doctor_run), or NULL with e filled. path
 * (may be NULL) receives the cache file's name. */
json_t *doctor_cache_lookup(const doctor_opts *o, const doc_shapes *s, char *path, size_t pn, ls_err *e);
/* The backend a report chose for family at a batch of M tokens: the choice of
 * the smallest bucket >= M (the largest bucket above the last); NULL when no
 * backend was correct there. The string lives as long as the report. */
const char *doctor_pick(json_t *report, const char *family, int M);

/* The file of a job's shared CPU reference in one doctor run (trial.h td_ref_load): prefix is
 * the run's shapes file. */
void doctor_ref_path(const char *prefix, const char *family, int job, char *out, size_t n);

/* Cache file path for a key (~/.cache/laststand/doctor-<hash>.json). */
void doctor_cache_path(const char *key, char *out, size_t n);

#endif
