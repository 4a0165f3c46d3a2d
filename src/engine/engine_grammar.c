/* engine_grammar.c: constrained decoding and logit_bias in the engine.
 *
 * Owns: the engine's vocabulary trie (e->gvocab, built once under g_mu on the
 * first ls_grammar_* call, freed with the engine), each request's matcher,
 * mask buffer and logit_bias copies (freed with the request).
 * Flow: ls_submit -> eg_submit (matcher from the request's grammar, which the
 * caller may free right after); every sampling step of a constrained request
 * -> eg_edit (the matcher's mask, computed on the sampling worker that runs
 * that request) -> smp_sample_ex; the committed token -> eg_commit (the
 * matcher advances). Rows with a mask or a bias are sampled on the host, also
 * when the engine samples on the device: a step holding such a row runs
 * without device sampling (engine.c run_step), see bench/RESULTS.md S8 for
 * its cost.
 */
#include "engine/engine_grammar.h"
#include "grammar/gr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ls_grammar { gr_grammar *g; };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int set_err(char *err, size_t errn, int code, const char *msg) {
    if (err && errn) snprintf(err, errn, "%s", msg);
    return code;
}

/* The vocabulary trie; NULL (err filled) without a tokenizer. */
static gr_vocab *vocab(ls_engine *e, char *err, size_t errn) {
    if (!e->tok) {
        set_err(err, errn, LS_ERR_INVAL, "constrained decoding needs a tokenizer, and this model has none");
        return NULL;
    }
    pthread_mutex_lock(&g_mu);
    if (!e->gvocab) {
        double t0 = now_sec();
        e->gvocab = gr_vocab_new(e->tok, e->vocab, e->eos, e->n_eos);
        log_info("grammar: vocabulary trie of %d ids built in %.0f ms", e->vocab, (now_sec() - t0) * 1e3);
    }
    gr_vocab *v = e->gvocab;
    pthread_mutex_unlock(&g_mu);
    return v;
}

static int wrap(gr_grammar *g, ls_grammar **out) {
    *out = xmalloc(sizeof **out);
    (*out)->g = g;
    return 0;
}

int ls_grammar_json_schema(ls_engine *e, const char *schema_json, int strict, const char *path,
                           ls_grammar **out, char *err, size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    json_error_t je;
    json_t *s = json_loads(schema_json ? schema_json : "", JSON_DECODE_ANY, &je);
    if (!s) {
        char m[400];
        snprintf(m, sizeof m, "%s: not JSON: %s", path ? path : "schema", je.text);
        return set_err(err, errn, LS_ERR_INVAL, m);
    }
    gr_grammar *g = NULL;
    ls_err le = {0};
    int rc = gr_compile_json_schema(s, strict, path, &g, &le);
    json_decref(s);
    if (rc < 0) return set_err(err, errn, LS_ERR_INVAL, le.msg);
    return wrap(g, out);
}

int ls_grammar_json_object(ls_engine *e, ls_grammar **out, char *err, size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    return wrap(gr_compile_json_object(), out);
}

int ls_grammar_tool_calls(ls_engine *e, const char *tools_json, const char *only, const char *format,
                          int min_calls, int max_calls, const char *path, ls_grammar **out, char *err,
                          size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    int f = format && !strcmp(format, "hermes") ? GR_TOOLS_HERMES
          : format && !strcmp(format, "qwen3_coder") ? GR_TOOLS_XML : 0;
    if (!f) return set_err(err, errn, LS_ERR_INVAL, "tool calls: format must be hermes or qwen3_coder");
    json_t *tools = json_loads(tools_json ? tools_json : "", 0, NULL);
    if (!json_is_array(tools)) {
        json_decref(tools);
        return set_err(err, errn, LS_ERR_INVAL, "tools: expected an array");
    }
    gr_grammar *g = NULL;
    ls_err le = {0};
    int rc = gr_compile_tool_calls(tools, only, f, min_calls, max_calls, path, &g, &le);
    json_decref(tools);
    if (rc < 0) return set_err(err, errn, LS_ERR_INVAL, le.msg);
    return wrap(g, out);
}

void ls_grammar_free(ls_grammar *g) {
    if (!g) return;
    gr_unref(g->g);
    free(g);
}

/* ---- per request ---------------------------------------------------------------------- */

int eg_submit(ls_engine *e, ereq *r, const ls_sampling *s, char *err, size_t errn) {
    r->sp.grammar = NULL;
    r->sp.grammar_gate = NULL;
    r->sp.logit_bias_ids = NULL;
    r->sp.logit_bias = NULL;
    r->sp.n_logit_bias = 0;
    if (s->n_logit_bias < 0 || (s->n_logit_bias > 0 && (!s->logit_bias_ids || !s->logit_bias)))
        return set_err(err, errn, LS_ERR_INVAL, "logit_bias: bad list");
    for (int i = 0; i < s->n_logit_bias; i++) {
        char m[200];
        if (s->logit_bias_ids[i] < 0 || s->logit_bias_ids[i] >= e->vocab) {
            snprintf(m, sizeof m, "logit_bias: token id %d is outside the vocabulary [0, %d)", s->logit_bias_ids[i], e->vocab);
            return set_err(err, errn, LS_ERR_INVAL, m);
        }
        if (!(s->logit_bias[i] >= -100 && s->logit_bias[i] <= 100)) {
            snprintf(m, sizeof m, "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                     s->logit_bias_ids[i], (double)s->logit_bias[i]);
            return set_err(err, errn, LS_ERR_INVAL, m);
        }
    }
    if (s->n_logit_bias > 0) {
        r->n_lb = s->n_logit_bias;
        r->lb_ids = xmalloc((size_t)r->n_lb * sizeof *r->lb_ids);
        r->lb = xmalloc((size_t)r->n_lb * sizeof *r->lb);
        memcpy(r->lb_ids, s->logit_bias_ids, (size_t)r->n_lb * sizeof *r->lb_ids);
        memcpy(r->lb, s->logit_bias, (size_t)r->n_lb * sizeof *r->lb);
    }
    if (s->grammar) {
        gr_vocab *v = vocab(e, err, errn);
        if (!v) return LS_ERR_INVAL;
        r->gm = gr_matcher_new(s->grammar->g, v, s->grammar_gate);
        r->gmask = xmalloc((size_t)gr_mask_words(v) * sizeof *r->gmask);
    }
    return 0;
}

void eg_free(ereq *r) {
    gr_matcher_free(r->gm);
    free(r->gmask);
    free(r->lb_ids);
    free(r->lb);
    r->gm = NULL;
    r->gmask = NULL;
    r->lb_ids = NULL;
    r->lb = NULL;
    r->n_lb = 0;
}

/* While a reasoning gate is closed the step is unconstrained: the device sampler may take it. */
int eg_host_only(const ereq *r) { return r->n_lb || (r->gm && !gr_matcher_gated(r->gm)); }

const smp_edit *eg_edit(ereq *r, smp_edit *ed) {
    if (!r->gm && !r->n_lb) return NULL;
    memset(ed, 0, sizeof *ed);
    if (r->gm && gr_matcher_fill_mask(r->gm, r->gmask)) {
        ed->allow = r->gmask;
        /* the request's stop ids end it like EOS: allowed exactly where the grammar accepts */
        int acc = gr_matcher_accepting(r->gm) || gr_matcher_failed(r->gm);
        for (int i = 0; i < r->sp.n_stop_ids && !r->sp.ignore_eos; i++) {
            int32_t id = r->sp.stop_ids[i];
            if (acc) r->gmask[id >> 5] |= 1u << (id & 31);
            else r->gmask[id >> 5] &= ~(1u << (id & 31));
        }
        int any = 0;
        for (int w = 0; w < gr_mask_words(gr_matcher_vocab(r->gm)) && !any; w++) any = r->gmask[w] != 0;
        for (int i = 0; i < r->sp.n_stop_ids && !any; i++) /* never an empty mask */
            r->gmask[r->sp.stop_ids[i] >> 5] |= 1u << (r->sp.stop_ids[i] & 31);
    }
    ed->bias_ids = r->lb_ids;
    ed->bias = r->lb;
    ed->n_bias = r->n_lb;
    return ed;
}

int eg_only_end(const ereq *r) { return r->gm && (gr_matcher_done(r->gm) || gr_matcher_failed(r->gm)); }

void eg_commit(ereq *r, int32_t t) {
    for (int i = 0; i < r->sp.n_stop_ids; i++)
        if (r->sp.stop_ids[i] == t) return; /* it ends the request */
    if (r->gm && !gr_matcher_failed(r->gm) && gr_matcher_accept_token(r->gm, t) < 0)
        log_warn("engine: token %d does not follow the request's grammar (a forced token?); only EOS is allowed "
                 "from here", t);
}

void eg_engine_free(ls_engine *e) {
    gr_vocab_free(e->gvocab);
    e->gvocab = NULL;
}
