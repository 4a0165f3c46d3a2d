/* api.c: the parts of include/laststand.h that do not run on the engine
 * thread: option defaults, model facts, tokenizer and chat template calls,
 * and the statistics snapshot. All of them only read state fixed at open
 * (tokenizer and template are immutable and thread-safe) or copy the
 * statistics under their lock, so any thread may call them at any time.
 */
#include "engine/engine_int.h"

#include <stdlib.h>
#include <string.h>

void ls_engine_opts_default(ls_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->tp = 1;
    o->max_running_requests = 0; /* auto: engine.c, model_auto_max_running (the CPU: 64) */
    o->chunked_prefill_size = 8192; /* SGLang's H100/H200 default; bench/RESULTS.md "Prefill: TTFT" */
    o->context_length = 0;
    o->mem_fraction_static = 0;  /* auto: 0.88 of GPU memory; CPU 0.5 of RAM, caches capped at 1 GiB */
    o->page_size = 16;
    o->max_queued_requests = 1024;
    o->max_total_tokens = 0;
}

void ls_engine_model_info(const ls_engine *e, ls_model_info *out) {
    memset(out, 0, sizeof *out);
    out->model_path = e->model_path;
    out->architecture = e->cfg->model_type;
    out->vocab_size = e->vocab;
    out->context_length = e->ctx;
    out->n_eos = e->n_eos;
    out->eos_ids = e->eos;
    out->device = e->device;
    out->tp = e->tp;
    out->tokenizer_path = e->tokenizer_path;
    out->has_chat_template = e->tmpl != NULL;
    out->max_running_requests = e->max_run;
    out->chunked_prefill_size = e->budget;
    out->page_size = e->page_size;
    out->max_total_tokens = e->n_pages * e->page_size;
    out->bos_token = e->tok ? tok_bos_token(e->tok) : NULL;
    out->eos_token = e->tok ? tok_eos_token(e->tok) : NULL;
}

static int no_tokenizer(char *err, size_t errn) {
    if (err && errn) snprintf(err, errn, "this model has no tokenizer (give --tokenizer-path)");
    return LS_ERR_INVAL;
}

int ls_tokenize(const ls_engine *e, const char *text, int32_t **ids, char *err, size_t errn) {
    *ids = NULL;
    if (!e->tok) return no_tokenizer(err, errn);
    ls_err le = {0};
    int n = tok_encode(e->tok, text, strlen(text), ids, &le);
    if (n < 0 && err && errn) snprintf(err, errn, "%s", le.msg);
    return n;
}

char *ls_detokenize(const ls_engine *e, const int32_t *ids, int n, int skip_special) {
    if (!e->tok) return xstrdup("");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(e->tok)) return NULL;
    return tok_decode(e->tok, ids, n, skip_special);
}

int ls_apply_chat_template(const ls_engine *e, const char *request_json, char **out, char *err,
                           size_t errn) {
    *out = NULL;
    if (!e->tmpl) {
        if (err && errn)
            snprintf(err, errn, "%s", e->tmpl_err ? e->tmpl_err
                                     : "the model has no chat template (give --chat-template FILE)");
        return LS_ERR_INVAL;
    }
    json_error_t je;
    json_t *req = json_loads(request_json, 0, &je);
    if (!req || !json_is_object(req)) {
        if (err && errn)
            snprintf(err, errn, "chat request: %s", req ? "not a JSON object" : je.text);
        json_decref(req);
        return LS_ERR_INVAL;
    }
    ls_err le = {0};
    int raised = 0;
    const char *bos = e->tok ? tok_bos_token(e->tok) : NULL;
    const char *eos = e->tok ? tok_eos_token(e->tok) : NULL;
    int rc = jinja_apply_chat(e->tmpl, req, bos, eos, out, &raised, &le);
    json_decref(req);
    if (rc < 0) {
        if (err && errn) {
            if (raised) snprintf(err, errn, "%s", le.msg);
            else snprintf(err, errn, "chat template: %s", le.msg);
        }
        *out = NULL;
        return rc == ERR_NOMEM ? LS_ERR_NOMEM : LS_ERR_INVAL;
    }
    return 0;
}

void ls_engine_stats(ls_engine *e, ls_stats *out) {
    pthread_mutex_lock(&e->stats_mu);
    *out = e->st;
    pthread_mutex_unlock(&e->stats_mu);
}
