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
/* Nothing but a terminator may follow: min_tokens must not ban it. */
int eg_only_end(const ereq *r);
/* After the token was appended (engine thread). */
void eg_commit(ereq *r, int32_t t);
void eg_engine_free(ls_engine *e);

#endif
