/* spec.h: speculative decoding's draft sources (the verification and the
 * rollback are the engine's, engine_spec.c).
 *
 * NGRAM (prompt lookup, SGLang's --speculative-algorithm NGRAM): the tokens
 * that followed the most recent earlier occurrence of the sequence's last w
 * tokens are proposed as the next ones, for the longest w in [min_w, max_w]
 * that occurs. No model, no memory: it pays where outputs repeat their input
 * (code edits, extraction, summaries that quote, JSON that echoes keys).
 */
#ifndef LS_ENGINE_SPEC_H
#define LS_ENGINE_SPEC_H

#include <stdint.h>

#define SPEC_DRAFT_MAX 8      /* draft tokens a sequence may verify in one step */
#define SPEC_NGRAM_SCAN 65536 /* how far back (tokens) the lookup searches */
#define SPEC_COST_BS 64       /* step sizes (decode rows) whose cost the engine tracks */

/* Propose up to k (<= SPEC_DRAFT_MAX) tokens to follow tok[0 .. n): for w = max_w down to min_w,
 * the latest p with tok[p .. p + w) == tok[n - w .. n) and p + w < n (at least one token after it;
 * p >= n - w - SPEC_NGRAM_SCAN); the proposal is tok[p + w ..), continued past n with the
 * match's period d = n - w - p (out[j] = out[j - d]). Returns k (0: no match, or bad
 * arguments: 1 <= min_w <= max_w, k >= 1). */
int spec_ngram_propose(const int32_t *tok, int n, int min_w, int max_w, int k, int32_t *out);

#endif
