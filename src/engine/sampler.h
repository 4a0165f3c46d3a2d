/* sampler.h: next-token selection from one row of logits.
 *
 * Order of operations (SGLang's, which follows HF/vLLM for the penalties):
 *   1. raw logits checked for NaN/Inf (an error for the request, not a crash);
 *   2. banned ids (EOS and stop ids before min_tokens) set to -inf;
 *   3. repetition_penalty over the distinct tokens of prompt + output
 *      (positive logits divided, negative multiplied: HF semantics);
 *   4. frequency_penalty * count + presence_penalty subtracted for each
 *      distinct output token (OpenAI semantics);
 *   5. temperature: 0 = greedy (argmax, lowest id on ties), else logits / T;
 *   6. softmax, then top_k, then top_p (smallest set of most likely tokens
 *      whose mass reaches top_p, after top_k renormalisation), then min_p
 *      (drop tokens below min_p * p_max); renormalise and draw with the
 *      request's own RNG.
 * Logprobs (SGLang's default, not its "original logprob" mode) are
 * log_softmax of the logits after steps 2-5 (temperature applied, 1 when
 * greedy), before the top_k / top_p / min_p truncation. top_logprobs are
 * the highest of those.
 *
 * The RNG is per request (xoshiro256** seeded by splitmix64), advanced once
 * per sampled token, so a seeded request gives the same tokens whatever else
 * shares its batch.
 */
#ifndef LS_ENGINE_SAMPLER_H
#define LS_ENGINE_SAMPLER_H

#include "base/base.h"
#include "laststand.h"

#define SMP_MAX_TOP 20

typedef struct smp_rng { uint64_t s[4]; } smp_rng;
void smp_rng_seed(smp_rng *r, uint64_t seed);
double smp_rng_uniform(smp_rng *r);  /* [0, 1), 53 random bits */

/* Scratch for one sampling thread: sized for the vocabulary once. */
typedef struct smp_ctx smp_ctx;
smp_ctx *smp_new(int vocab);
void smp_free(smp_ctx *c);

/* Token history the penalties look at. */
typedef struct smp_hist {
    const int32_t *prompt; int n_prompt;
    const int32_t *out; int n_out;
} smp_hist;

typedef struct smp_result {
    int32_t token;
    float logprob;                       /* of token (see above) */
    int n_top;
    int32_t top_ids[SMP_MAX_TOP];        /* descending logprob, lowest id first on ties */
    float top_logprobs[SMP_MAX_TOP];
} smp_result;

/* Sample one token from logits [vocab] (not modified).
 * ban: ids to suppress (may be NULL). forced >= 0: that id is chosen instead
 * of drawing (its logprob is still reported; the RNG does not advance).
 * Returns 0, or ERR_RUNTIME when the row holds NaN/Inf (e->msg names the
 * first bad index and value). */
int smp_sample(smp_ctx *c, const float *logits, const ls_sampling *p, const smp_hist *h,
               const int32_t *ban, int n_ban, smp_rng *rng, int32_t forced, smp_result *res,
               ls_err *e);

/* Added (additive): the same with edits of the raw logits before step 2:
 * bias (OpenAI logit_bias: added) then allow (a bitmask of ids, bit i of word
 * i / 32; a clear bit sets the logit to -inf). Either may be absent (NULL / 0).
 * The edited logits are what the NaN check has already passed, so the -inf of
 * a masked token is never an error; top logprobs list only allowed tokens. */
typedef struct smp_edit {
    const uint32_t *allow;
    const int32_t *bias_ids; const float *bias; int n_bias;
} smp_edit;
int smp_sample_ex(smp_ctx *c, const float *logits, const ls_sampling *p, const smp_hist *h,
                  const int32_t *ban, int n_ban, const smp_edit *ed, smp_rng *rng, int32_t forced,
                  smp_result *res, ls_err *e);

/* ---- pieces, exposed for tests ------------------------------------------- */
/* Steps 3-4 in place on logits [vocab]. */
void smp_apply_penalties(smp_ctx *c, float *logits, const ls_sampling *p, const smp_hist *h);
/* Steps 5-6 for temperature > 0: the kept tokens with their renormalised
 * probabilities, sorted by descending probability (lowest id first on ties).
 * ids/probs must hold vocab entries. Returns the number kept (>= 1). */
int smp_filtered_dist(smp_ctx *c, const float *logits, const ls_sampling *p, int32_t *ids,
                      double *probs);

#endif
