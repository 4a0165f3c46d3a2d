/* engine_grammar.h: the engine's side of constrained decoding and logit_bias
 * (engine_grammar.c): per-request matcher and bias copies, the mask handed to
 * the host sampler each step, and the public ls_grammar_* functions.
 * engine.c calls these few hooks; the logic lives in engine_grammar.c and
 * src/grammar/. */
#ifndef LS_ENGINE_GRAMMAR_H
#define LS_ENGINE_GRAMMAR_H

#include "engine/engine_int.h"

/* At submit (any thread): validate and copy s's grammar / logit_bias into r. */
int eg_submit(ls_engine *e, ereq *r, const ls_sampling *s, char *err, size_t errn);
void eg_free(ereq *r);
/* The row needs the host sampler this step (a mask or a bias). */
int eg_host_only(const ereq *r);
/* Edits for this step's sampling (NULL: none); computes the grammar mask. */
const smp_edit *eg_edit(ereq *r, smp_edit *ed);
/* Device sampling of constrained rows (S9, engine.c run_step):
 * eg_dev_ok: the row's edits fit the device sampler (distinct logit_bias ids, a mask as wide
 * as the model's vocabulary); eg_stage_masks: e->sedp[i] = eg_edit of batch row i for each
 * i in e->scon[0 .. n_scon) (the grammar masks, on the thread pool when several), before the
 * forward; eg_stage_row: one row's mask and bias appended to e->stoks at n_toks with p's
 * offsets set (ops.h smp_row.n_mask / n_bias); returns the new length. */
int eg_dev_ok(const ls_engine *e, const ereq *r);
void eg_stage_masks(ls_engine *e);
int eg_stage_row(ls_engine *e, const smp_edit *ed, smp_row *p, int n_toks);
/* 1 when an id repeats in ids[n] */
int eg_bias_has_dup(const int32_t *ids, int n);
/* Nothing but a terminator may follow: min_tokens must not ban it. */
int eg_only_end(const ereq *r);
/* After the token was appended (engine thread). */
void eg_commit(ereq *r, int32_t t);
void eg_engine_free(ls_engine *e);

#endif
