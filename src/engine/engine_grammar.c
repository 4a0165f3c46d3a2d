/* engine_grammar.c: constrained decoding and logit_bias in the engine.
 *
 * Owns: the engine's vocabulary trie (e->gvocab, built once under g_mu on the
 * first ls_grammar_* call, freed with the engine), the last 64 compiled grammars
 * by request text (e->gcache, a reference each), each request's matcher,
 * mask buffer and logit_bias copies (freed with the request).
 * Flow: ls_submit -> eg_submit (matcher from the request's grammar, which the
 * caller may free right after); every sampling step of a constrained request
 * -> eg_edit (the matcher's mask, computed on the sampling worker that runs
 * that request) -> smp_sample_ex; the committed token -> eg_commit (the
 * matcher advances). With device sampling (unless LASTSTAND_GRAMMAR_DEVICE=0;
 * S9), engine.c run_step computes the step's masks BEFORE the forward
 * (eg_stage_masks: they depend only on committed tokens; several rows on the
 * thread pool) and stages them with the biases into the device sampler's
 * token table (ops.h smp_row.n_mask / n_bias), so the logits never come back;
 * otherwise (or for a row eg_dev_ok refuses) the step samples every row on
 * the host from downloaded logits (bench/RESULTS.md S8 for its cost).
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

/* Compiled grammars by their request text (kind, options and text joined in key): agents send
 * the same schema or tools with every request, and a grammar keeps the masks of the string and
 * regex states it has met, so a hit skips the compile and starts with warm masks. The least
 * recently used of 64 goes. Compile errors are not kept. */
#define GCACHE_N ((int)(sizeof ((ls_engine *)0)->gcache / sizeof ((ls_engine *)0)->gcache[0]))

static gr_grammar *gcache_get(ls_engine *e, const char *key) {
    pthread_mutex_lock(&g_mu);
    gr_grammar *g = NULL;
    for (int i = 0; i < GCACHE_N && !g; i++)
        if (e->gcache[i].key && !strcmp(e->gcache[i].key, key)) {
            e->gcache[i].used = ++e->gcache_clock;
            g = gr_ref(e->gcache[i].g);
        }
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&e->stats_mu);
    if (g) e->st.grammar_cache_hits_total++;
    else e->st.grammar_compiles_total++;
    pthread_mutex_unlock(&e->stats_mu);
    return g;
}

static void gcache_put(ls_engine *e, const char *key, gr_grammar *g) {
    pthread_mutex_lock(&g_mu);
    int slot = 0;
    for (int i = 0; i < GCACHE_N; i++) {
        if (e->gcache[i].key && !strcmp(e->gcache[i].key, key)) { slot = -1; break; } /* raced: kept already */
        if (!e->gcache[i].key) { slot = i; break; }
        if (e->gcache[i].used < e->gcache[slot].used) slot = i;
    }
    if (slot >= 0) {
        free(e->gcache[slot].key);
        gr_unref(e->gcache[slot].g);
        e->gcache[slot].key = xstrdup(key);
        e->gcache[slot].g = gr_ref(g);
        e->gcache[slot].used = ++e->gcache_clock;
    }
    pthread_mutex_unlock(&g_mu);
}

static char *gkey(const char *kind, const char *opts, const char *text) {
    buf b; buf_init(&b);
    buf_puts(&b, kind);
    buf_putc(&b, '\x1f');
    buf_puts(&b, opts ? opts : "");
    buf_putc(&b, '\x1f');
    buf_puts(&b, text ? text : "");
    return buf_detach(&b);
}

int ls_grammar_json_schema(ls_engine *e, const char *schema_json, int strict, const char *path,
                           ls_grammar **out, char *err, size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    char *key = gkey("schema", strict ? "strict" : "", schema_json);
    gr_grammar *hit = gcache_get(e, key);
    if (hit) { free(key); return wrap(hit, out); }
    json_error_t je;
    json_t *s = json_loads(schema_json ? schema_json : "", JSON_DECODE_ANY, &je);
    if (!s) {
        char m[400];
        snprintf(m, sizeof m, "%s: not JSON: %s", path ? path : "schema", je.text);
        free(key);
        return set_err(err, errn, LS_ERR_INVAL, m);
    }
    gr_grammar *g = NULL;
    ls_err le = {0};
    int rc = gr_compile_json_schema(s, strict, path, &g, &le);
    json_decref(s);
    if (rc < 0) { free(key); return set_err(err, errn, LS_ERR_INVAL, le.msg); }
    gcache_put(e, key, g);
    free(key);
    return wrap(g, out);
}

int ls_grammar_json_object(ls_engine *e, ls_grammar **out, char *err, size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    return wrap(gr_compile_json_object(), out);
}

/* A grammar from one text (a regex, an EBNF), from the cache or compiled by fn and cached. */
static int text_grammar(ls_engine *e, const char *kind, const char *text, const char *path,
                        int (*fn)(const char *, const char *, gr_grammar **, ls_err *), ls_grammar **out, char *err,
                        size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    char *key = gkey(kind, NULL, text);
    gr_grammar *g = gcache_get(e, key);
    if (!g) {
        ls_err le = {0};
        if (fn(text ? text : "", path, &g, &le) < 0) {
            free(key);
            return set_err(err, errn, LS_ERR_INVAL, le.msg);
        }
        gcache_put(e, key, g);
    }
    free(key);
    return wrap(g, out);
}

int ls_grammar_regex(ls_engine *e, const char *pattern, const char *path, ls_grammar **out, char *err, size_t errn) {
    return text_grammar(e, "regex", pattern, path, gr_compile_regex, out, err, errn);
}

int ls_grammar_ebnf(ls_engine *e, const char *text, const char *path, ls_grammar **out, char *err, size_t errn) {
    return text_grammar(e, "ebnf", text, path, gr_compile_ebnf, out, err, errn);
}

int ls_grammar_tool_calls(ls_engine *e, const char *tools_json, const char *only, const char *format,
                          int min_calls, int max_calls, const char *path, ls_grammar **out, char *err,
                          size_t errn) {
    *out = NULL;
    if (!vocab(e, err, errn)) return LS_ERR_INVAL;
    int f = format && !strcmp(format, "hermes") ? GR_TOOLS_HERMES
          : format && !strcmp(format, "qwen3_coder") ? GR_TOOLS_XML : 0;
    if (!f) return set_err(err, errn, LS_ERR_INVAL, "tool calls: format must be hermes or qwen3_coder");
    char opts[160];
    snprintf(opts, sizeof opts, "%d %d %d %s", f, min_calls, max_calls, only ? only : "");
    char *key = gkey("tools", opts, tools_json);
    gr_grammar *g = gcache_get(e, key);
    if (g) { free(key); return wrap(g, out); }
    json_t *tools = json_loads(tools_json ? tools_json : "", 0, NULL);
    if (!json_is_array(tools)) {
        json_decref(tools);
        free(key);
        return set_err(err, errn, LS_ERR_INVAL, "tools: expected an array");
    }
    ls_err le = {0};
    int rc = gr_compile_tool_calls(tools, only, f, min_calls, max_calls, path, &g, &le);
    json_decref(tools);
    if (rc < 0) { free(key); return set_err(err, errn, LS_ERR_INVAL, le.msg); }
    gcache_put(e, key, g);
    free(key);
    return wrap(g, out);
}

void ls_grammar_free(ls_grammar *g) {
    if (!g) return;
    gr_unref(g->g);
    free(g);
}

/* ---- per request ---------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int eg_bias_has_dup(const int32_t *ids, int n) {
    if (n < 2) return 0;
    int32_t *s = xmalloc((size_t)n * sizeof *s);
    memcpy(s, ids, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_i32);
    int dup = 0;
    for (int i = 1; i < n && !dup; i++) dup = s[i] == s[i - 1];
    free(s);
    return dup;
}

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
        r->lb_dup = eg_bias_has_dup(r->lb_ids, r->n_lb);
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
    r->lb_dup = 0;
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

int eg_dev_ok(const ls_engine *e, const ereq *r) {
    if (r->lb_dup) return 0;
    return !r->gm || gr_mask_words(gr_matcher_vocab(r->gm)) == (e->vocab + 31) / 32;
}

static void stage_worker(void *ctx, int64_t i0, int64_t i1) {
    ls_engine *e = ctx;
    for (int64_t k = i0; k < i1; k++) {
        int i = e->scon[k];
        e->sedp[i] = eg_edit(e->batch[i], &e->sedit[i]);
    }
}

void eg_stage_masks(ls_engine *e) {
    /* a mask is ~10-50 µs (cached string states: less): the pool only pays from two rows */
    if (e->n_scon >= 2 && pool_threads() > 1) pool_for(e->n_scon, 1, stage_worker, e);
    else stage_worker(e, 0, e->n_scon);
}

int eg_stage_row(ls_engine *e, const smp_edit *ed, smp_row *p, int n_toks) {
    const int words = (e->vocab + 31) / 32;
    int need = n_toks + (ed->allow ? words : 0) + 2 * ed->n_bias;
    if (need > e->cap_stoks) {
        e->cap_stoks = need > 2 * e->cap_stoks ? need : 2 * e->cap_stoks;
        e->stoks = xrealloc(e->stoks, (size_t)e->cap_stoks * sizeof *e->stoks);
    }
    if (ed->allow) {
        p->mask_off = n_toks;
        p->n_mask = words;
        memcpy(e->stoks + n_toks, ed->allow, (size_t)words * sizeof *ed->allow);
        n_toks += words;
    }
    if (ed->n_bias > 0) { /* distinct ids (eg_dev_ok), then the biases' bits */
        p->bias_off = n_toks;
        p->n_bias = ed->n_bias;
        memcpy(e->stoks + n_toks, ed->bias_ids, (size_t)ed->n_bias * sizeof *ed->bias_ids);
        memcpy(e->stoks + n_toks + ed->n_bias, ed->bias, (size_t)ed->n_bias * sizeof *ed->bias);
        n_toks += 2 * ed->n_bias;
    }
    return n_toks;
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
    for (int i = 0; i < GCACHE_N; i++) {
        free(e->gcache[i].key);
        gr_unref(e->gcache[i].g);
        e->gcache[i].key = NULL;
        e->gcache[i].g = NULL;
    }
    gr_vocab_free(e->gvocab);
    e->gvocab = NULL;
}
