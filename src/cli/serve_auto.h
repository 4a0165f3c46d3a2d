/* serve_auto.h: serve's start-up backend validation (DESIGN.md section 4,
 * last paragraphs): the doctor's decision (cached, or run now in bounded
 * time) for every backend flag left at `auto`, then an end-to-end smoke test
 * (chosen backends vs the reference backends on a fixed greedy prompt, plus
 * degenerate-output checks) with fallback to the next candidate of the
 * family at fault. Explicitly named backends that fail are refused.
 */
#ifndef LS_SERVE_AUTO_H
#define LS_SERVE_AUTO_H

#include <stddef.h>

/* The op families whose backend serve decides, in the order of the "last backend
 * standing" table. SA_GEMM (BF16/F16 weights: cuBLASLt, cuda_gemv, ...) came last, then
 * SA_LM_HEAD: the lm_head's own gemm backend or plan (its M: the rows that want logits),
 * judged by the doctor's "lm_head" row group, so that the vocab projection's plan is not
 * the projections'. */
enum { SA_FP4_GEMM = 0, SA_MOE, SA_ATTENTION, SA_GDN, SA_GEMM, SA_LM_HEAD, SA_NFAM };

struct ls_engine_opts;
struct model_opts;

/* One family's names, the single table every command's backend flags go through:
 * `fam` the doctor's and ops' family name ("gemm"), `flag` the command-line flag
 * ("--gemm-backend"), `ops_fam` its OPS_FAM_* (ops.h; the ops_sel.auto_fam /
 * ls_engine_opts.auto_families bit is 1u << ops_fam). */
typedef struct serve_auto_family {
    const char *fam;
    const char *flag;
    int ops_fam;
    unsigned auto_bit;  /* (additive) its ls_engine_opts.auto_families bit: 1u << ops_fam, but the
                           lm_head's (MODEL_AUTO_LM_HEAD, 32: its ops family is gemm's) */
} serve_auto_family;
extern const serve_auto_family serve_auto_families[SA_NFAM];

/* The family of a backend flag ("--gdn-backend"), or -1. */
int serve_auto_flag_family(const char *flag);
/* Family f's backend name field in the engine's / the model's options. */
const char **serve_auto_engine_name(struct ls_engine_opts *o, int f);
const char **serve_auto_model_name(struct model_opts *o, int f);

typedef struct serve_auto_opts {
    const char *model_path;       /* folder or synth:NAME */
    const char *tokenizer_path;   /* NULL: model_path */
    const char *device;           /* "cpu" | "cuda" | NULL: cuda when a GPU answers */
    const char *names[SA_NFAM];   /* in: the flags (NULL or "auto" = auto; a name; a per-M plan
                                     "NAME:MAXM,...,NAME"); out: the backend or plan to serve with */
    int trust_backend;            /* serve named backends that fail, with a warning */
    double timeout_s;             /* per doctor trial job and per smoke child; <= 0: device default */
    const char *buckets;          /* doctor buckets "1,16"; NULL: device default */
    int steps;                    /* smoke-test greedy steps; <= 0: 8 */
    int tp;                       /* tensor-parallel size the server runs with (the smoke runs use it too) */
    const char *mamba_ssm_dtype;  /* (additive) the GDN state storage serve runs with (the smoke runs too) */
    int drafts;                   /* (additive) speculative decoding on (S27: the CUDA default buckets added 2
                                     and 4 for it; since S28 they always include them) */
    /* out (additive): backends the doctor or the smoke test eliminated, "FAMILY:NAME,..."
     * (ls_engine_opts.banned_backends), or NULL */
    const char *banned;
} serve_auto_opts;

/* Decide and validate. Returns 0 (o->names filled), 1 when no combination
 * passes (err says why), 2 when a named backend is refused or the options are
 * bad (err names the flag, the backend and the reason). */
int serve_auto_select(serve_auto_opts *o, char *err, size_t errn);

/* The hidden child `laststand serve --smoke-trial ...`: one model load with
 * the given backends, a prefill of the prompt and greedy (or teacher-forced)
 * decode steps; writes ids and logits rows to --smoke-out. Exit 0 or 1. */
int serve_smoke_child_main(int argc, char **argv);

#endif
