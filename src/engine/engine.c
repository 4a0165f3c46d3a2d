/* engine.c: the engine thread: continuous batching over a paged KV pool and
 * GDN state slots, preemption, cancellation, sampling and stop handling.
 *
 * Owns: the model, the tokenizer and chat template (read-only after open),
 * every request once submitted, the page and slot free lists.
 * Threads: ls_submit / ls_cancel / ls_engine_stats run on any thread and only
 * touch the submit queue, the cancel list and the statistics, under locks.
 * Everything else (scheduler, caches, model_forward, callbacks) runs on the
 * engine thread; callbacks are made with no lock held.
 *
 * One step:
 *   1. take new requests and cancellations from the shared queues;
 *   2. running requests in id order (oldest first): a decode row (1 token) or
 *      the next chunk of a (re-)prefill under the token budget; pages are
 *      taken from the free list as sequences grow, and when it is empty the
 *      newest running request is preempted (pages and slot freed, its tokens
 *      kept, back to the waiting list to be recomputed later);
 *   3. admit waiting requests (oldest first) while slots, budget and pages
 *      last (one page of headroom per running request is kept); with the
 *      prefix cache (prefix_engine.c) a request first shares the cached pages
 *      (and GDN state snapshot) of its prompt's longest cached prefix, full
 *      pages are published after each step, and unreferenced cached pages are
 *      reclaimed before anyone is preempted;
 *   4. one model_forward over the mixed batch;
 *   5. every request whose whole token list is now cached samples its next
 *      token: on the device inside the forward pass (--sampling-backend
 *      device: the rows' parameters and token lists go down with the step,
 *      only the chosen ids and logprobs come back; seeded by the request's
 *      seed and completion index), or on the host (the samplers run in
 *      parallel on the worker pool, each request with its own RNG; a step
 *      holding a row with a grammar mask or logit_bias samples all its rows
 *      there: engine_grammar.c); then, in
 *      batch order on the engine thread, the token is appended, its event
 *      emitted, and the request may finish.
 * Speculative decoding (engine_spec.c) makes a decode row carry drafts (n-gram or the MTP
 * head's), commits the verified ones and rolls the rest back; the MTP head's passes follow
 * each step's commits.
 * Pure-decode steps on a GPU replay CUDA graphs per batch-size bucket
 * (model.c; with --tp every rank replays its own, NCCL all-reduces inside;
 * --disable-cuda-graph turns them off). Graphs are captured and checked
 * against eager steps at start-up; any failure there turns them off with a
 * logged reason and the engine runs eagerly, it never fails the start.
 * Invariants: the oldest running request can always make progress (the pool
 * holds at least one full context, and it may preempt every newer one), so
 * memory pressure never fails a request; a request's tokens depend only on
 * its own inputs, seed and RNG, never on the batch it ran in.
 */
#include "engine/engine_int.h"
#include "engine/engine_grammar.h"
#include "engine/stats.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int eng_set_err(char *err, size_t errn, int code, const char *fmt, ...) {
    if (err && errn) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errn, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* ==== memory sizing ========================================================= */

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, res = 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

static size_t safetensors_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0) total += (size_t)sb.st_size;
    }
    closedir(d);
    return total;
}

/* Bytes available to the KV pool + GDN slots.
 * CPU: mem_fraction of physical RAM minus the weights (the larger of the RSS
 * growth across model_open and the safetensors on disk); with the default
 * fraction the caches are also capped at 1 GiB so tests and laptops stay small.
 * CUDA: mem_fraction of device memory minus what is already in use, on the tightest GPU
 * (model_gpu_mem: with --tp every rank's GPU holds an equal share of the caches, whose sizes
 * model_kv_page_bytes / model_slot_bytes give summed over the ranks: so the budget is tp times
 * that GPU's). gpu / gpu_free / gpu_total: that GPU (-1 on the CPU). */
static double cache_budget(const ls_engine_opts *o, model *m, int tp, int cuda, size_t weights, int *gpu,
                           double *gpu_free, double *gpu_total) {
    double frac = o->mem_fraction_static;
    int auto_frac = !(frac > 0);
    if (auto_frac) frac = cuda ? 0.88 : 0.5;
    *gpu = -1;
    *gpu_free = *gpu_total = 0;
    if (cuda) {
        size_t fr = 0, tot = 0;
        if (model_gpu_mem(m, gpu, &fr, &tot) == 0) {
            *gpu_free = (double)fr;
            *gpu_total = (double)tot;
            return (frac * (double)tot - (double)(tot - fr)) * (tp > 1 ? tp : 1);
        }
    }
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double b = frac * ram - (double)weights;
    if (auto_frac && b > (double)(1u << 30)) b = (double)(1u << 30);
    return b;
}

/* ==== open / close ============================================================ */

static void *engine_main(void *arg);

static void add_eos(ls_engine *e, int32_t id) {
    if (id < 0 || id >= e->vocab) return;
    for (int i = 0; i < e->n_eos; i++) if (e->eos[i] == id) return;
    if (e->n_eos < CFG_MAX_EOS + 1) e->eos[e->n_eos++] = id;
}

static void engine_free(ls_engine *e) {
    if (!e) return;
    if (e->m) model_close(e->m);
    tok_free(e->tok);
    jinja_free(e->tmpl);
    free(e->model_path); free(e->tokenizer_path); free(e->device); free(e->tmpl_err);
    kvpool_free(&e->pages); kvpool_free(&e->slots);
    pfx_free(&e->pfx);
    for (int i = 0; i < e->n_smp; i++) smp_free(e->smps[i]);
    free(e->smps);
    free(e->jobs);
    free(e->logits); free(e->seqs); free(e->ids); free(e->batch); free(e->batch_new);
    free(e->running); free(e->cancels);
    free(e->srows); free(e->sres); free(e->stoks); free(e->smark); free(e->scnt);
    free(e->sedit); free(e->sedp); free(e->scon);
    free(e->mtp_req); free(e->mtp_row0); free(e->mtp_past); free(e->mtp_job); free(e->mtp_idx); free(e->mtp_src);
    eg_engine_free(e);
    buf_free(&e->text);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->stats_mu);
    free(e);
}

static int load_tokenizer_and_template(ls_engine *e, const ls_engine_opts *o, char *err, size_t errn) {
    ls_err le = {0};
    const char *tdir = o->tokenizer_path ? o->tokenizer_path : o->model_path;
    int synth = strncmp(o->model_path, "synth:", 6) == 0;
    if (!(synth && !o->tokenizer_path)) {
        int rc = tok_load_dir(tdir, &e->tok, &le);
        if (rc < 0) {
            if (o->tokenizer_path)
                return eng_set_err(err, errn, rc, "--tokenizer-path %s: %s", tdir, le.msg);
            log_warn("engine: no tokenizer in %s (%s); serving token ids only", tdir, le.msg);
            e->tok = NULL;
        } else {
            e->tokenizer_path = xstrdup(tdir);
        }
    }
    char *src = NULL;
    if (o->chat_template) {
        src = read_file(o->chat_template, NULL, &le);
        if (!src) return eng_set_err(err, errn, LS_ERR_INVAL, "--chat-template %s: %s", o->chat_template, le.msg);
    } else if (e->tokenizer_path) {
        src = jinja_find_chat_template(e->tokenizer_path, &le);
    }
    if (src) {
        int rc = jinja_parse(src, &e->tmpl, &le);
        free(src);
        if (rc < 0) {
            e->tmpl = NULL;
            if (o->chat_template)
                return eng_set_err(err, errn, LS_ERR_INVAL, "--chat-template %s: %s", o->chat_template, le.msg);
            log_warn("engine: the chat template of %s does not parse (%s); chat requests will fail",
                     e->tokenizer_path, le.msg);
            char m[1200];
            snprintf(m, sizeof m, "the chat template of %s does not parse: %s (give --chat-template FILE)",
                     e->tokenizer_path, le.msg);
            e->tmpl_err = xstrdup(m);
        }
    }
    return 0;
}

/* The GPU sampler against the host sampler at start-up, on the model's real
 * vocabulary: an 8-token prefill on slot 0 and the first pages (nothing runs yet) is
 * sampled on the device (plain greedy; greedy with logprobs and top 5; four
 * seeded draws at T 1, top_p 0.9) and once more with its logits brought back
 * for smp_sample. The same eager kernels run each time, so the logits are the
 * same: greedy ids and top ids must be equal, logprobs within 1e-3, and every
 * draw inside the host's kept set. 0, or 1 with why filled. */
/* While the CUDA graphs of a --tp > 1 model are captured and checked at start-up: a warning
 * each minute, so a collective that never completes (every rank must reach each one) shows in
 * the log with the flags that run the steps eagerly, instead of a silent hang. */
typedef struct graph_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, tp;
    double t0;
    pthread_t th;
} graph_watch;

static void *graph_watch_main(void *p) {
    graph_watch *w = p;
    pthread_mutex_lock(&w->mu);
    while (!w->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 60;
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && !w->done)
            log_warn("engine: capturing and checking the CUDA graphs of --tp %d has taken %.0f s so far (a stuck "
                     "NCCL collective? --disable-cuda-graph or LASTSTAND_TP_GRAPHS=0 runs the steps eagerly)",
                     w->tp, now_sec() - w->t0);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int graph_watch_start(graph_watch *w, int tp) {
    *w = (graph_watch){.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .tp = tp, .t0 = now_sec()};
    return pthread_create(&w->th, NULL, graph_watch_main, w) == 0;
}

static void graph_watch_stop(graph_watch *w) {
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
}

static int dev_sampler_check(ls_engine *e, char *why, size_t n) {
    enum { P = 8, D = 4 };
    int32_t ids[P];
    for (int i = 0; i < P; i++) ids[i] = (int32_t)(((uint64_t)(i + 1) * 2654435761u) % (uint64_t)e->vocab);
    int32_t pages[P];
    for (int i = 0; i < P; i++) pages[i] = i;
    if (ceil_div(P, e->page_size) > e->n_pages) return 0; /* a pool too small to hold the prompt */
    fwd_seq s = {.slot = 0, .n_past = 0, .n_new = P, .pages = pages};
    ls_sampling sp;
    ls_sampling_default(&sp);
    smp_row rows[2 + D];
    smp_out res[2 + D];
    for (int k = 0; k < 2 + D; k++) {
        rows[k] = (smp_row){.temperature = 0, .top_p = 1, .top_k = -1, .rep_pen = 1, .forced = -1};
        if (k == 1) { rows[k].want_lp = 1; rows[k].n_top = 5; }
        if (k >= 2) { rows[k].temperature = 1; rows[k].top_p = 0.9f; rows[k].seed = 77 + k; }
    }
    ls_err le = {0};
    float *lg = xmalloc(sizeof(float) * (size_t)e->vocab);
    for (int k = 0; k <= 2 + D; k++) {
        model_slot_reset(e->m, 0);
        fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = ids, .logits = lg};
        if (k < 2 + D) { b.smp = &rows[k]; b.smp_res = &res[k]; }
        if (model_forward(e->m, &b, &le) < 0) {
            snprintf(why, n, "%s", le.msg);
            model_slot_reset(e->m, 0);
            free(lg);
            return 1;
        }
    }
    model_slot_reset(e->m, 0);
    smp_ctx *c = smp_new(e->vocab);
    smp_hist h = {0};
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    smp_result hr;
    sp.temperature = 0;
    sp.logprobs = 1;
    sp.top_logprobs = 5;
    int bad = smp_sample(c, lg, &sp, &h, NULL, 0, &rng, -1, &hr, &le) != 0;
    if (bad) snprintf(why, n, "host sampler: %s", le.msg);
    else if (res[0].token != hr.token || res[1].token != hr.token)
        snprintf(why, n, "greedy id %d / %d on the device, %d on the host", res[0].token, res[1].token, hr.token), bad = 1;
    else if (!(fabsf(res[1].logprob - hr.logprob) <= 1e-3f) || res[1].n_top != hr.n_top)
        snprintf(why, n, "logprob %.5f on the device, %.5f on the host", res[1].logprob, hr.logprob), bad = 1;
    for (int i = 0; !bad && i < hr.n_top; i++)
        if (res[1].top_ids[i] != hr.top_ids[i] || !(fabsf(res[1].top_lp[i] - hr.top_logprobs[i]) <= 1e-3f))
            snprintf(why, n, "top logprob %d: id %d (%.5f) on the device, %d (%.5f) on the host", i,
                     res[1].top_ids[i], res[1].top_lp[i], hr.top_ids[i], hr.top_logprobs[i]), bad = 1;
    if (!bad) {
        int32_t *kid = xmalloc(sizeof *kid * (size_t)e->vocab);
        double *kp = xmalloc(sizeof *kp * (size_t)e->vocab);
        sp.temperature = 1;
        sp.top_p = 0.9f;
        int kn = smp_filtered_dist(c, lg, &sp, kid, kp);
        for (int k = 2; !bad && k < 2 + D; k++) {
            int in = 0;
            for (int i = 0; i < kn && !in; i++) in = kid[i] == res[k].token;
            if (!in)
                snprintf(why, n, "a draw (id %d) outside the host's top_p 0.9 set of %d ids", res[k].token, kn), bad = 1;
        }
        free(kid);
        free(kp);
    }
    smp_free(c);
    free(lg);
    return bad;
}

int ls_engine_open(const ls_engine_opts *o, ls_engine **out, char *err, size_t errn) {
    *out = NULL;
    if (!o || !o->model_path || !*o->model_path)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--model-path is required");
    ls_engine_opts d;
    ls_engine_opts_default(&d);
    int page_size = o->page_size > 0 ? o->page_size : d.page_size;
    int max_run = o->max_running_requests; /* <= 0: auto, decided with the memory plan below */
    int max_queued = o->max_queued_requests > 0 ? o->max_queued_requests : d.max_queued_requests;
    if (o->mem_fraction_static < 0 || o->mem_fraction_static > 1)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--mem-fraction-static %g is outside (0, 1]",
                           o->mem_fraction_static);
    if (o->context_length < 0)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--context-length %d is negative", o->context_length);
    if (o->max_total_tokens < 0)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--max-total-tokens %d is negative", o->max_total_tokens);

    ls_engine *e = xcalloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    buf_init(&e->text);
    e->next_id = 1;
    e->tp = o->tp > 0 ? o->tp : 1;
    e->model_path = xstrdup(o->model_path);
    e->device = xstrdup(o->device ? o->device : "cpu");
    const char *fe = getenv("LASTSTAND_TEST_FORCE_IDS");
    e->force_ok = fe && strcmp(fe, "1") == 0;

    /* model */
    model_opts mo = {0};
    mo.device = o->device;
    mo.tp = e->tp;
    mo.fp4_gemm_backend = o->fp4_gemm_backend;
    mo.moe_backend = o->moe_backend;
    mo.attention_backend = o->attention_backend;
    mo.gdn_backend = o->gdn_backend;
    mo.gemm_backend = o->gemm_backend;
    mo.lm_head_backend = o->lm_head_backend;
    mo.mamba_ssm_dtype = o->mamba_ssm_dtype;
    mo.trust_backend = o->trust_backend;
    mo.auto_families = o->auto_families;
    mo.banned_backends = o->banned_backends;
    mo.mtp = ls_spec_algo_is_mtp(o->speculative_algorithm); /* the MTP head loads only to draft */
    ls_err le = {0};
    size_t rss0 = rss_bytes();
    int rc = model_open(o->model_path, &mo, &e->m, &le);
    if (rc < 0) {
        e->m = NULL;
        eng_set_err(err, errn, rc, "%s", le.msg);
        engine_free(e);
        return rc;
    }
    size_t rss1 = rss_bytes();
    e->cfg = model_cfg(e->m);
    e->vocab = e->cfg->vocab;
    free(e->device);
    e->device = xstrdup(model_device(e->m)); /* what "auto" resolved to */
    const char *sb = o->sampling_backend;
    if (sb && *sb && strcmp(sb, "auto") && strcmp(sb, "host") && strcmp(sb, "device")) {
        eng_set_err(err, errn, LS_ERR_INVAL, "--sampling-backend '%s': expected auto, host or device", sb);
        engine_free(e);
        return LS_ERR_INVAL;
    }
    if (sb && !strcmp(sb, "device") && !model_samples_on_device(e->m)) {
        eng_set_err(err, errn, LS_ERR_INVAL, "--sampling-backend device: the %s device has no sampler (use host)",
                    e->device);
        engine_free(e);
        return LS_ERR_INVAL;
    }
    /* auto: on the device when it has a sampler (a GPU), else on the host */
    e->dev_smp = model_samples_on_device(e->m) && !(sb && !strcmp(sb, "host"));

    rc = load_tokenizer_and_template(e, o, err, errn);
    if (rc < 0) { engine_free(e); return rc; }
    for (int i = 0; i < e->cfg->n_eos; i++) add_eos(e, e->cfg->eos[i]);
    if (e->tok && tok_eos_token(e->tok)) add_eos(e, tok_id(e->tok, tok_eos_token(e->tok)));

    /* context and cache sizes */
    int model_ctx = e->cfg->max_pos > 0 ? e->cfg->max_pos : 32768;
    if (o->context_length > model_ctx) {
        eng_set_err(err, errn, LS_ERR_INVAL,
                    "--context-length %d exceeds the model's max_position_embeddings %d",
                    o->context_length, model_ctx);
        engine_free(e);
        return LS_ERR_INVAL;
    }
    int ctx = o->context_length > 0 ? o->context_length : model_ctx;
    size_t page_bytes = model_kv_page_bytes(e->m, page_size);
    size_t slot_bytes = model_slot_bytes(e->m);
    size_t weights = rss1 > rss0 ? rss1 - rss0 : 0;
    size_t st_bytes = safetensors_bytes(o->model_path);
    if (st_bytes > weights) weights = st_bytes;
    int cuda = strcmp(e->device, "cuda") == 0; /* the resolved device, so --device auto budgets a GPU as one */
    /* speculative decoding: the drafts a row verifies, and on GDN models a spare state slot each */
    rc = eng_spec_config(e, o, slot_bytes > 0, err, errn);
    if (rc) { engine_free(e); return rc; }
    const int slots_per_run = 1 + (e->spec_gdn ? e->spec_k : 0);
    int gpu;
    double gpu_free, gpu_total;
    double budget = cache_budget(o, e->m, e->tp, cuda, weights, &gpu, &gpu_free, &gpu_total);
    const double budget0 = budget;
    if (gpu >= 0)
        log_info("engine: memory plan: GPU %d (the tightest%s) has %.2f of %.2f GiB free after the weights; "
                 "--mem-fraction-static %.2f leaves the caches %.2f GiB per GPU", gpu,
                 e->tp > 1 ? " of the tensor-parallel ranks" : "", gpu_free / 1073741824.0, gpu_total / 1073741824.0,
                 o->mem_fraction_static > 0 ? o->mem_fraction_static : 0.88, budget / e->tp / 1073741824.0);
    if (max_run <= 0) {
        max_run = cuda ? model_auto_max_running(budget, (double)slot_bytes * slots_per_run) : MODEL_CPU_RUN_DEFAULT;
        if (cuda)
            log_info("engine: --max-running-requests auto: %d (%s, at most %d)", max_run,
                     slot_bytes ? "the GDN state of a quarter of the cache memory" : "no GDN state", MODEL_AUTO_RUN_MAX);
    }
    budget -= (double)max_run * slots_per_run * (double)slot_bytes;
    e->n_logit_rows = max_run + (e->spec ? (max_run < e->spec_max_bs ? max_run : e->spec_max_bs) * e->spec_k : 0);
    budget -= (double)e->n_logit_rows * (double)e->vocab * sizeof(float);
    if (cuda) budget -= (double)slot_bytes + (double)page_bytes; /* the CUDA graphs' padding slot and page */
    /* the prefix cache: on by default (CPU and CUDA; S8 device round R3 validated the CUDA path:
     * tests/test_gpu_prefix_cache.py). GDN models need state snapshot slots (a tenth of the cache budget by default,
     * at most two per running request): a hit is usable only where one exists. */
    int pfx_on = o->prefix_cache >= 0;
    const char *pfx_why = o->prefix_cache < 0 ? " (--prefix-cache off)" : "";
    int n_snap = 0;
    if (o->prefix_cache < -1 || o->prefix_cache > 1 || o->prefix_snapshots < -1) {
        eng_set_err(err, errn, LS_ERR_INVAL, "--prefix-cache %d / --prefix-snapshots %d: out of range", o->prefix_cache,
                    o->prefix_snapshots);
        engine_free(e);
        return LS_ERR_INVAL;
    }
    if (pfx_on && slot_bytes > 0) {
        if (o->prefix_snapshots > 0) {
            n_snap = o->prefix_snapshots;
        } else if (o->prefix_snapshots == 0) {
            double fit = budget > 0 ? floor(0.1 * budget / (double)slot_bytes) : 0;
            n_snap = fit < 2.0 * max_run ? (int)fit : 2 * max_run;
        }
        if (n_snap <= 0) {
            pfx_why = " (the model has GDN layers and no state snapshot slot fits: --prefix-snapshots)";
            pfx_on = 0;
        } else {
            budget -= (double)n_snap * (double)slot_bytes;
        }
    }
    int n_pages;
    if (o->max_total_tokens > 0) {
        n_pages = ceil_div(o->max_total_tokens, page_size);
    } else {
        double cap = (double)max_run * ceil_div(ctx, page_size);
        double fit = page_bytes ? floor(budget / (double)page_bytes) : cap;
        n_pages = (int)(fit < cap ? (fit > 0 ? fit : 0) : cap);
    }
    if (n_pages * page_size < ctx) {
        if (o->context_length > 0 || n_pages * page_size < 2 * page_size) {
            char where[320] = "";
            if (gpu >= 0) /* what the GPU had and what the state slots took from it */
                snprintf(where, sizeof where, " (GPU %d: %.2f GiB free after the weights, %.2f GiB for the caches "
                         "per GPU at --mem-fraction-static, %.2f GiB of it GDN state for %d running requests)", gpu,
                         gpu_free / 1073741824.0, budget0 / e->tp / 1073741824.0,
                         (double)max_run * (double)slot_bytes / e->tp / 1073741824.0, max_run);
            eng_set_err(err, errn, LS_ERR_INVAL,
                        "the KV pool holds %d tokens (%d pages of %d), less than one sequence of "
                        "--context-length %d%s: raise --mem-fraction-static / --max-total-tokens, lower "
                        "--max-running-requests or --context-length", n_pages * page_size, n_pages, page_size, ctx, where);
            engine_free(e);
            return LS_ERR_INVAL;
        }
        ctx = n_pages * page_size; /* default context: what fits */
    }
    e->ctx = ctx;
    e->page_size = page_size;
    e->max_run = max_run;
    e->n_pages = n_pages;
    e->max_queued = max_queued;
    e->budget = o->chunked_prefill_size > 0 ? o->chunked_prefill_size
              : o->chunked_prefill_size < 0 ? ctx : d.chunked_prefill_size;

    /* slots: [0, max_run x slots_per_run) the requests' own and their drafts' spares (one pool,
     * e->slots: a rollback swaps a request's slot with a spare), then the prefix snapshots */
    model_cache_opts co = {.page_size = page_size, .n_pages = n_pages, .n_slots = max_run * slots_per_run + n_snap,
                           .ctx_cap = ctx, .max_seqs = max_run, .max_sample_rows = e->n_logit_rows};
    /* the workspace for the largest step (a budget of prefill plus a decode row per request) up
     * front, so steps do not grow it and invalidate the CUDA graphs; capped for huge budgets */
    co.max_tokens = e->budget + max_run < 16384 ? e->budget + max_run : 16384;
    /* with --tp the ranks capture together (model_tp.c), or the model says why they cannot */
    int graphs = e->dev_smp && !o->disable_cuda_graph;
    if (graphs) co.graph_max_bs = o->cuda_graph_max_bs > 0 && o->cuda_graph_max_bs < max_run ? o->cuda_graph_max_bs
                                                                                              : max_run;
    rc = model_cache_init(e->m, &co, &le);
    if (rc < 0) {
        eng_set_err(err, errn, rc, "KV cache (%d pages of %d tokens, %d slots): %s", n_pages, page_size,
                    co.n_slots, le.msg);
        engine_free(e);
        return rc;
    }
    if (e->dev_smp) {
        char why[1200];
        if (dev_sampler_check(e, why, sizeof why)) {
            log_warn("engine: sampling on the host: the GPU sampler disagrees with it (%s)", why);
            e->dev_smp = 0;
            if (graphs) model_graphs_off(e->m);
            graphs = 0;
        }
    }
    if (graphs) {
        /* every bucket at start-up: no capture stalls in the decode loop, and the log says up
         * front which buckets replay and which run eagerly */
        double t0 = now_sec();
        model_graph_stats gs;
        char why[1200];
        graph_watch gw;
        int watching = e->tp > 1 && graph_watch_start(&gw, e->tp);
        if ((rc = model_graphs_capture(e->m, &le)) < 0) {
            /* a failed capture or warm-up pass costs the graphs, not the start-up */
            log_warn("engine: CUDA graphs off: %s (decode steps run eagerly)", le.msg);
            model_graphs_off(e->m);
            graphs = 0;
        } else if (model_graph_stats_get(e->m, &gs), gs.captured == 0) {
            log_info("engine: CUDA graphs off: no decode batch bucket was captured (decode steps run eagerly)");
            model_graphs_off(e->m);
            graphs = 0;
        } else if (model_graphs_check(e->m, why, sizeof why)) {
            /* never serve a graph that disagrees with the eager step it replays */
            log_warn("engine: CUDA graphs off: the replayed decode step disagrees with the eager one (%s)", why);
            model_graphs_off(e->m);
            graphs = 0;
        } else {
            log_info("engine: %lld CUDA graphs captured%s and checked against eager steps in %.2f s",
                     (long long)gs.captured, e->tp > 1 ? " on every tensor-parallel rank" : "", now_sec() - t0);
        }
        if (watching) graph_watch_stop(&gw);
    }
    kvpool_init(&e->pages, n_pages);
    kvpool_init(&e->slots, max_run * slots_per_run);
    e->pfx_on = pfx_on;
    e->pfx_gdn = slot_bytes > 0;
    e->snap_base = max_run * slots_per_run;
    pfx_init(&e->pfx, pfx_on ? n_pages : 0, page_size, n_snap);
    e->pfx_instep = pfxe_instep_mode(e);
    e->st.prefix_snapshots_total = n_snap;
    e->n_smp = pool_threads() < max_run ? pool_threads() : max_run;
    if (e->n_smp < 1) e->n_smp = 1;
    e->smps = xcalloc((size_t)e->n_smp, sizeof *e->smps);
    for (int i = 0; i < e->n_smp; i++) e->smps[i] = smp_new(e->vocab);
    e->jobs = xcalloc((size_t)max_run, sizeof *e->jobs);
    e->logits = xmalloc((size_t)e->n_logit_rows * (size_t)e->vocab * sizeof(float));
    e->seqs = xcalloc((size_t)max_run, sizeof *e->seqs);
    e->ids = xmalloc((size_t)(e->budget + max_run) * sizeof *e->ids);
    e->batch = xcalloc((size_t)max_run, sizeof *e->batch);
    e->batch_new = xcalloc((size_t)max_run, sizeof *e->batch_new);
    if (e->spec_mtp) {
        e->mtp_req = xcalloc((size_t)max_run, sizeof *e->mtp_req);
        e->mtp_row0 = xcalloc((size_t)max_run, sizeof(int));
        e->mtp_past = xcalloc((size_t)max_run, sizeof(int));
        e->mtp_job = xcalloc((size_t)max_run, sizeof(int));
        e->mtp_idx = xcalloc((size_t)max_run, sizeof(int));
        e->mtp_src = xmalloc((size_t)(e->budget + max_run) * sizeof *e->mtp_src);
    }
    if (e->dev_smp) {
        e->srows = xcalloc((size_t)e->n_logit_rows, sizeof *e->srows);
        e->sres = xcalloc((size_t)e->n_logit_rows, sizeof *e->sres);
        e->smark = xcalloc((size_t)e->vocab, sizeof *e->smark);
        e->scnt = xcalloc((size_t)e->vocab, sizeof *e->scnt);
        e->sedit = xcalloc((size_t)max_run, sizeof *e->sedit);
        e->sedp = xcalloc((size_t)max_run, sizeof *e->sedp);
        e->scon = xcalloc((size_t)max_run, sizeof *e->scon);
        /* grammar masks and logit_bias on the device sampler (S9, the default since H200 round
         * S9-R1: the same greedy tokens and logprobs as the host path); =0: the host path */
        const char *gd = getenv("LASTSTAND_GRAMMAR_DEVICE");
        e->gdev = gd && *gd ? strcmp(gd, "0") != 0 : 1;
        if (!e->gdev) log_info("engine: grammar masks and logit_bias sampled on the host (LASTSTAND_GRAMMAR_DEVICE=0)");
    }
    e->running = xcalloc((size_t)max_run, sizeof *e->running);
    stats_hist_init(&e->st.ttft, STATS_TTFT);
    stats_hist_init(&e->st.itl, STATS_ITL);
    stats_hist_init(&e->st.e2e, STATS_E2E);
    e->st.kv_pages_total = n_pages;

    log_info("engine: %s, context %d, KV pool %d pages x %d tokens (%.1f MiB), %d GDN slots "
             "(%.1f MiB), budget %d tokens/step, sampling on the %s, CUDA graphs %s%s", e->model_path, ctx,
             n_pages, page_size, (double)n_pages * (double)page_bytes / 1048576.0, max_run,
             (double)max_run * (double)slot_bytes / 1048576.0, e->budget, e->dev_smp ? "device" : "host",
             graphs ? "on" : "off", e->force_ok ? ", test id forcing ON" : "");
    if (e->spec && e->spec_mtp)
        log_info("engine: speculative decoding: the checkpoint's MTP head drafts up to %d tokens a request and step "
                 "(a chain of %d head passes after each step), verified while at most %d requests run%s", e->spec_k,
                 e->spec_k, e->spec_max_bs, e->spec_gdn ? "; a spare GDN state slot per draft" : "");
    else if (e->spec)
        log_info("engine: speculative decoding: ngram, up to %d draft tokens a request and step (suffix windows "
                 "%d..%d), while at most %d requests run%s", e->spec_k, e->spec_minw, e->spec_maxw, e->spec_max_bs,
                 e->spec_gdn ? "; a spare GDN state slot per draft" : "");
    if (pfx_on && n_snap)
        log_info("engine: prefix cache on: up to %d pages (%d tokens) shared by hash of their token run, %d GDN "
                 "state snapshots (%.1f MiB, %.2f MiB each) at page boundaries, %s", n_pages, n_pages * page_size,
                 n_snap, (double)n_snap * (double)slot_bytes / 1048576.0, (double)slot_bytes / 1048576.0,
                 e->pfx_instep ? "taken inside the prefill step" : "the prefill cut at them");
    else if (pfx_on)
        log_info("engine: prefix cache on: up to %d pages (%d tokens) shared by hash of their token run", n_pages,
                 n_pages * page_size);
    else
        log_info("engine: prefix cache off%s", pfx_why);

    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        eng_set_err(err, errn, LS_ERR_RUNTIME, "cannot start the engine thread: %s", strerror(errno));
        engine_free(e);
        return LS_ERR_RUNTIME;
    }
    e->thread_started = 1;
    *out = e;
    return 0;
}

void ls_engine_close(ls_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->closing = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    if (e->m) {
        model_graph_stats gs;
        model_graph_stats_get(e->m, &gs);
        if (gs.captured || gs.replayed || gs.eager)
            log_info("engine: CUDA graphs: %lld steps replayed, %lld steps eager, %lld graphs captured",
                     (long long)gs.replayed, (long long)gs.eager, (long long)gs.captured);
        if (e->st.spec_verify_rows_total)
            log_info("engine: speculative decoding: %llu rows verified %llu drafts, %llu accepted (%.1f%%, %.2f "
                     "tokens a verifying row and step)", (unsigned long long)e->st.spec_verify_rows_total,
                     (unsigned long long)e->st.spec_draft_tokens_total,
                     (unsigned long long)e->st.spec_accepted_tokens_total,
                     100.0 * (double)e->st.spec_accepted_tokens_total / (double)e->st.spec_draft_tokens_total,
                     1.0 + (double)e->st.spec_accepted_tokens_total / (double)e->st.spec_verify_rows_total);
        if (e->n_mtp_passes)
            log_info("engine: %lld MTP head passes, %.3f ms each", (long long)e->n_mtp_passes,
                     e->t_mtp * 1e3 / (double)e->n_mtp_passes);
        if (e->n_dec_steps)
            log_info("engine: %lld decode steps of %.2f sequences on average, %.3f ms each (forward + sampling)",
                     (long long)e->n_dec_steps, (double)e->n_dec_rows / e->n_dec_steps,
                     e->t_dec * 1e3 / e->n_dec_steps);
        if (e->n_staged)
            log_info("engine: %lld constrained rows sampled on the device; on the host before the forward, %.1f us "
                     "a row for their masks, %.1f us a row with the sampling tables",
                     (long long)e->n_staged, e->t_mask * 1e6 / e->n_staged, e->t_stage * 1e6 / e->n_staged);
    }
    engine_free(e);
}

/* ==== requests ================================================================= */

static void req_free(ereq *r) {
    if (!r) return;
    for (int i = 0; i < r->sp.n_stop; i++) free((char *)r->sp.stop[i]);
    free((void *)r->sp.stop);
    free((void *)r->sp.stop_ids);
    free((void *)r->sp.force_ids);
    free(r->ban);
    free(r->tok);
    free(r->pages);
    free(r->pent);
    if (r->ts) tok_stream_free(r->ts);
    stop_free(&r->sm);
    eg_free(r);
    free(r);
}

static int validate(const ls_engine *e, const ls_sampling *s, char *err, size_t errn) {
#define BAD(...) return eng_set_err(err, errn, LS_ERR_INVAL, __VA_ARGS__)
        if (!(s->temperature >= 0) || !isfinite(s->temperature)) BAD("temperature must be >= 0, got %g", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1)) BAD("top_p must be in (0, 1], got %g", s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1)) BAD("min_p must be in [0, 1], got %g", s->min_p);
    if (!(s->repetition_penalty > 0 && s->repetition_penalty <= 2))
        BAD("repetition_penalty must be in (0, 2], got %g", s->repetition_penalty);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        BAD("presence_penalty must be in [-2, 2], got %g", s->presence_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        BAD("frequency_penalty must be in [-2, 2], got %g", s->frequency_penalty);
    if (s->min_tokens < 0) BAD("min_tokens must be >= 0, got %d", s->min_tokens);
    if (s->max_tokens > 0 && s->min_tokens > s->max_tokens)
        BAD("min_tokens %d is larger than max_tokens %d", s->min_tokens, s->max_tokens);
    if (s->top_logprobs < 0 || s->top_logprobs > SMP_MAX_TOP)
        BAD("top_logprobs must be in [0, %d], got %d", SMP_MAX_TOP, s->top_logprobs);
    if (s->n_stop < 0 || (s->n_stop > 0 && !s->stop)) BAD("stop: bad list");
    for (int i = 0; i < s->n_stop; i++) {
        if (!s->stop[i] || !*s->stop[i]) BAD("stop[%d] is empty", i);
        if (strlen(s->stop[i]) > 4096) BAD("stop[%d] is longer than 4096 bytes", i);
    }
    if (s->n_stop > 0 && !e->tok) BAD("stop strings need a tokenizer, and this model has none");
    if (s->n_stop_ids < 0 || (s->n_stop_ids > 0 && !s->stop_ids)) BAD("stop_token_ids: bad list");
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] < 0 || s->stop_ids[i] >= e->vocab)
            BAD("stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", i, s->stop_ids[i], e->vocab);
    if (s->n_force < 0 || (s->n_force > 0 && !s->force_ids)) BAD("force_ids: bad list");
    for (int i = 0; i < s->n_force; i++)
        if (s->force_ids[i] < -1 || s->force_ids[i] >= e->vocab)
            BAD("force_ids[%d] = %d is outside the vocabulary [0, %d) (or -1: NaN logits)", i,
                s->force_ids[i], e->vocab);
    return 0;
#undef BAD
}

int64_t ls_submit(ls_engine *e, const int32_t *prompt, int n_prompt, const ls_sampling *s,
                  ls_event_cb cb, void *user, char *err, size_t errn) {
    ls_sampling defs;
    if (!s) { ls_sampling_default(&defs); s = &defs; }
    if (!cb) return eng_set_err(err, errn, LS_ERR_INVAL, "no event callback");
    if (n_prompt <= 0 || !prompt) return eng_set_err(err, errn, LS_ERR_INVAL, "the prompt is empty");
    if (n_prompt >= e->ctx)
        return eng_set_err(err, errn, LS_ERR_INVAL,
                           "the prompt has %d tokens, which does not fit the context length of %d tokens "
                           "(prompt + at least one completion token)", n_prompt, e->ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab)
            return eng_set_err(err, errn, LS_ERR_INVAL, "prompt token %d = %d is outside the vocabulary [0, %d)",
                               i, prompt[i], e->vocab);
    int rc = validate(e, s, err, errn);
    if (rc < 0) return rc;

    ereq *r = xcalloc(1, sizeof *r);
    r->cb = cb;
    r->user = user;
    r->sp = *s;
    if (s->n_stop > 0) {
        char **st = xcalloc((size_t)s->n_stop, sizeof *st);
        for (int i = 0; i < s->n_stop; i++) st[i] = xstrdup(s->stop[i]);
        r->sp.stop = (const char *const *)st;
    } else {
        r->sp.stop = NULL;
    }
    int32_t *ids = NULL;
    if (s->n_stop_ids > 0) {
        ids = xmalloc((size_t)s->n_stop_ids * sizeof *ids);
        memcpy(ids, s->stop_ids, (size_t)s->n_stop_ids * sizeof *ids);
    }
    r->sp.stop_ids = ids;
    ids = NULL;
    if (s->n_force > 0 && e->force_ok) {
        ids = xmalloc((size_t)s->n_force * sizeof *ids);
        memcpy(ids, s->force_ids, (size_t)s->n_force * sizeof *ids);
    }
    r->sp.force_ids = ids;
    r->sp.n_force = ids ? s->n_force : 0;
    r->ban = xmalloc((size_t)(e->n_eos + s->n_stop_ids + 1) * sizeof *r->ban);
    for (int i = 0; i < e->n_eos; i++) r->ban[r->n_ban++] = e->eos[i];
    for (int i = 0; i < s->n_stop_ids; i++) r->ban[r->n_ban++] = s->stop_ids[i];

    int room = e->ctx - n_prompt;
    r->max_new = s->max_tokens > 0 && s->max_tokens < room ? s->max_tokens : room;
    /* token and page arrays grow with the sequence: a queue of requests
     * allowed the whole context must not hold the whole context each */
    r->cap_tok = n_prompt + (r->max_new < 256 ? r->max_new : 256);
    r->tok = xmalloc((size_t)r->cap_tok * sizeof *r->tok);
    memcpy(r->tok, prompt, (size_t)n_prompt * sizeof *r->tok);
    r->n_prompt = r->n_tok = n_prompt;
    r->cap_pages = ceil_div(r->cap_tok, e->page_size);
    r->pages = xmalloc((size_t)r->cap_pages * sizeof *r->pages);
    r->slot = -1;
    r->snap_roll = -1;
    if (e->tok) r->ts = tok_stream_new(e->tok, s->skip_special_tokens);
    stop_init(&r->sm, r->sp.stop, r->sp.n_stop);
    r->t_submit = now_sec();
    if ((rc = eg_submit(e, r, s, err, errn)) < 0) { /* grammar and logit_bias */
        req_free(r);
        return rc;
    }

    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return eng_set_err(err, errn, LS_ERR_BUSY, "the engine is shutting down");
    }
    if (e->n_sub + e->n_waiting_pub >= e->max_queued) {
        int q = e->n_sub + e->n_waiting_pub;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return eng_set_err(err, errn, LS_ERR_BUSY, "the request queue is full (%d waiting, limit %d)", q,
                           e->max_queued);
    }
    if (!s->has_seed) { /* an unseeded request still gets its own stream */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sp.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)e->next_id * 0x9e3779b97f4a7c15ull);
    }
    smp_rng_seed(&r->rng, r->sp.seed);
    r->id = e->next_id++;
    r->state = REQ_QUEUED;
    if (e->sub_tail) e->sub_tail->next = r; else e->sub_head = r;
    e->sub_tail = r;
    e->n_sub++;
    int64_t id = r->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return id;
}

void ls_cancel(ls_engine *e, int64_t request_id) {
    if (!e || request_id <= 0) return;
    pthread_mutex_lock(&e->mu);
    if (e->n_cancel == e->cap_cancel) {
        e->cap_cancel = e->cap_cancel ? 2 * e->cap_cancel : 16;
        e->cancels = xrealloc(e->cancels, (size_t)e->cap_cancel * sizeof *e->cancels);
    }
    e->cancels[e->n_cancel++] = request_id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ==== lists (engine thread) ========================================================= */

static void wait_insert(ls_engine *e, ereq *r) {
    r->state = REQ_WAITING;
    r->next = NULL;
    if (!e->wait_head || r->id < e->wait_head->id) {
        r->next = e->wait_head;
        e->wait_head = r;
        if (!e->wait_tail) e->wait_tail = r;
    } else if (r->id > e->wait_tail->id) {
        e->wait_tail->next = r;
        e->wait_tail = r;
    } else {
        ereq *p = e->wait_head;
        while (p->next && p->next->id < r->id) p = p->next;
        r->next = p->next;
        p->next = r;
    }
    e->n_waiting++;
}

static void wait_remove(ls_engine *e, ereq *r) {
    ereq **pp = &e->wait_head, *prev = NULL;
    while (*pp && *pp != r) { prev = *pp; pp = &(*pp)->next; }
    if (!*pp) return;
    *pp = r->next;
    if (e->wait_tail == r) e->wait_tail = prev;
    r->next = NULL;
    e->n_waiting--;
}

static void run_insert(ls_engine *e, ereq *r) {
    CHECK(e->n_running < e->max_run);
    int i = e->n_running;
    while (i > 0 && e->running[i - 1]->id > r->id) { e->running[i] = e->running[i - 1]; i--; }
    e->running[i] = r;
    e->n_running++;
    r->state = REQ_RUNNING;
}

static void run_remove(ls_engine *e, ereq *r) {
    int i = 0;
    while (i < e->n_running && e->running[i] != r) i++;
    if (i == e->n_running) return;
    memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i - 1) * sizeof *e->running);
    e->n_running--;
}

static void release_cache(ls_engine *e, ereq *r) {
    pfxe_release(e, r); /* cache references dropped, its own pages back on the free list */
    if (r->slot >= 0) kvpool_put(&e->slots, r->slot);
    r->slot = -1;
    for (int i = 0; i < r->n_spare; i++) kvpool_put(&e->slots, r->spare[i]);
    r->n_spare = 0;
    r->n_draft = 0;
}

/* ==== events ===================================================================== */

static void emit(ls_engine *e, ereq *r, int32_t token, const char *text, const smp_result *sr,
                 int finished, const char *reason, const char *matched, int32_t matched_id,
                 const char *error) {
    ls_event ev = {0};
    ev.request_id = r->id;
    ev.token = token;
    ev.text = text ? text : "";
    if (sr && r->sp.logprobs) ev.logprob = sr->logprob;
    if (sr && r->sp.top_logprobs > 0) {
        ev.n_top = sr->n_top;
        ev.top_ids = sr->top_ids;
        ev.top_logprobs = sr->top_logprobs;
    }
    ev.finished = finished;
    ev.finish_reason = finished ? reason : NULL;
    ev.matched_stop = matched;
    ev.matched_stop_id = matched_id;
    ev.error = error;
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = r->n_tok - r->n_prompt;
    ev.cached_tokens = r->n_hit;
    r->cb(r->user, &ev);
}

static void publish_gauges(ls_engine *e);

/* Bookkeeping before a request's final event: off the lists, pages and slot
 * freed, counters and gauges updated, so whoever sees the final event (and
 * then reads the statistics) finds them settled. req_free follows the event. */
static void retire(ls_engine *e, ereq *r, const char *reason) {
    if (r->state == REQ_RUNNING) run_remove(e, r);
    else if (r->state == REQ_WAITING) wait_remove(e, r);
    release_cache(e, r);
    double t = now_sec();
    pthread_mutex_lock(&e->stats_mu);
    e->st.requests_total++;
    if (strcmp(reason, "error") == 0) e->st.requests_failed_total++;
    stats_observe(&e->st.e2e, t - r->t_submit);
    pthread_mutex_unlock(&e->stats_mu);
    publish_gauges(e);
}

/* End a request without a token: abort or error. Flushes no held-back text
 * (the request did not finish normally). */
static void finish_empty(ls_engine *e, ereq *r, const char *reason, const char *error) {
    retire(e, r, reason);
    emit(e, r, -1, "", NULL, 1, reason, NULL, -1, error);
    req_free(r);
}

/* ==== scheduling ====================================================================== */

static void preempt(ls_engine *e, ereq *r) {
    log_debug("engine: preempting request %lld (%d tokens cached, %d free pages)", (long long)r->id,
              r->n_cached, kvpool_avail(&e->pages));
    run_remove(e, r);
    release_cache(e, r);
    wait_insert(e, r);
    pthread_mutex_lock(&e->stats_mu);
    e->st.preemptions_total++;
    pthread_mutex_unlock(&e->stats_mu);
}

void eng_reserve_pages(ereq *r, int n) {
    if (n <= r->cap_pages) return;
    int cap = r->cap_pages * 2 > n ? r->cap_pages * 2 : n;
    r->pages = xrealloc(r->pages, (size_t)cap * sizeof *r->pages);
    r->cap_pages = cap;
}

/* Pages so that running[idx] = r covers n_cached + *n_new tokens. Preempts
 * newer requests when the pool is empty. Returns 0 (with *n_new possibly
 * reduced, 0 = skip this step) or -1 when r itself was preempted. */
static int ensure_pages(ls_engine *e, ereq *r, int *n_new) {
    int want = ceil_div(r->n_cached + *n_new, e->page_size);
    eng_reserve_pages(r, want);
    while (r->n_pages < want) {
        int32_t pg = pfxe_page_get(e); /* a free page, else an unreferenced cached one */
        if (pg >= 0) { r->pages[r->n_pages++] = pg; continue; }
        ereq *v = e->running[e->n_running - 1]; /* the newest */
        if (v != r && v->id > r->id) { preempt(e, v); continue; }
        int cover = r->n_pages * e->page_size - r->n_cached;
        if (r->n_tok - r->n_cached == 1 || cover <= 0) {
            if (r->n_tok - r->n_cached == 1) { preempt(e, r); return -1; }
            *n_new = 0;
            return 0;
        }
        *n_new = cover;
        return 0;
    }
    return 0;
}

static int schedule(ls_engine *e) {
    int nb = 0, budget = e->budget;
    for (int i = 0; i < e->n_running;) {
        ereq *r = e->running[i];
        int need = r->n_tok - r->n_cached;
        CHECK(need >= 1);
        int n_new = need == 1 ? 1 + eng_spec_plan(e, r, budget) : pfxe_chunk(e, r, need < budget ? need : budget);
        if (n_new <= 0) { i++; continue; }
        if (ensure_pages(e, r, &n_new) < 0) continue; /* r left running[i] */
        if (need == 1 && n_new < 1 + r->n_draft) r->n_draft = n_new > 0 ? n_new - 1 : 0;
        if (n_new > 0) {
            e->batch[nb] = r;
            e->batch_new[nb++] = n_new;
            budget -= n_new;
        }
        i++;
    }
    while (e->wait_head && e->n_running < e->max_run && budget > 0 && kvpool_avail(&e->slots) > 0) {
        ereq *r = e->wait_head;
        int hit = pfxe_admit(e, r); /* the cached prefix's pages, shared (0 without the cache) */
        int n_new = pfxe_chunk(e, r, r->n_tok - hit < budget ? r->n_tok - hit : budget);
        int spare = pfxe_pages_avail(e) - e->n_running; /* headroom: a page per running request */
        if (spare * e->page_size < n_new) n_new = spare * e->page_size;
        if (n_new <= 0) { pfxe_release(e, r); break; }
        wait_remove(e, r);
        r->slot = kvpool_get(&e->slots);
        pfxe_restore(e, r); /* the hit's GDN snapshot, or a zero state */
        int want = ceil_div(r->n_cached + n_new, e->page_size);
        eng_reserve_pages(r, want);
        while (r->n_pages < want) r->pages[r->n_pages++] = pfxe_page_get(e);
        run_insert(e, r);
        if (!r->prompt_counted) {
            r->prompt_counted = 1;
            r->n_hit = r->n_cached;
            pthread_mutex_lock(&e->stats_mu);
            e->st.prompt_tokens_total += (uint64_t)r->n_prompt;
            if (e->pfx_on) {
                e->st.prefix_query_tokens_total += (uint64_t)r->n_prompt;
                e->st.prefix_hit_tokens_total += (uint64_t)r->n_hit;
            }
            pthread_mutex_unlock(&e->stats_mu);
        }
        e->batch[nb] = r;
        e->batch_new[nb++] = n_new;
        budget -= n_new;
    }
    return nb;
}

/* ==== sampling and finishing ============================================================ */

static int is_stop_token(const ls_engine *e, const ereq *r, int32_t t) {
    for (int i = 0; i < e->n_eos; i++) if (e->eos[i] == t) return 1;
    for (int i = 0; i < r->sp.n_stop_ids; i++) if (r->sp.stop_ids[i] == t) return 1;
    return 0;
}

/* Phase 1 of a token (any thread): sample j->r's next token into j->res.
 * Touches only the request's RNG and the given scratch. */
void eng_sample_one(ls_engine *e, smp_ctx *c, samp_job *j) {
    ereq *r = j->r;
    int n_gen = r->n_tok - r->n_prompt;
    smp_hist h = {r->tok, r->n_prompt, r->tok + r->n_prompt, n_gen};
    int32_t forced = n_gen < r->sp.n_force ? r->sp.force_ids[n_gen] : -1;
    if (n_gen < r->sp.n_force && forced == -1) {
        /* test-only: a forced -1 poisons this row, to exercise the NaN path */
        j->row[e->vocab / 2] = NAN;
    }
    j->err.code = 0;
    smp_edit ed;
    const smp_edit *edp = eg_edit(r, &ed); /* grammar mask, logit_bias */
    int n_ban = n_gen < r->sp.min_tokens && !eg_only_end(r) ? r->n_ban : 0;
    j->rc = smp_sample_ex(c, j->row, &r->sp, &h, r->ban, n_ban, edp, &r->rng, forced, &j->res, &j->err);
}

static void sample_worker(void *ctx, int64_t w0, int64_t w1) {
    ls_engine *e = ctx;
    for (int64_t w = w0; w < w1; w++)
        for (int j = (int)w; j < e->n_jobs; j += e->n_smp_used) eng_sample_one(e, e->smps[w], &e->jobs[j]);
}

/* Sample every job, spread over the worker pool when there are several
 * (a 250k vocabulary costs about a millisecond per request). */
static void sample_all(ls_engine *e) {
    e->n_smp_used = e->n_jobs < e->n_smp ? e->n_jobs : e->n_smp;
    if (e->n_jobs < 4 || e->n_smp_used < 2) {
        for (int j = 0; j < e->n_jobs; j++) eng_sample_one(e, e->smps[0], &e->jobs[j]);
        return;
    }
    pool_for(e->n_smp_used, 1, sample_worker, e);
}

/* Phase 2 (engine thread, in batch order): append the token, emit it with
 * its text delta, finish the request if done. */
int eng_commit_token(ls_engine *e, samp_job *j) {
    ereq *r = j->r;
    int n_gen = r->n_tok - r->n_prompt;
    if (j->rc < 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "NaN/Inf logits at engine step %lld, completion token %d: %s",
                 (long long)e->n_steps, n_gen + 1, j->err.msg);
        log_error("engine: request %lld: %s", (long long)r->id, msg);
        pthread_mutex_lock(&e->stats_mu);
        e->st.nan_logits_total++;
        pthread_mutex_unlock(&e->stats_mu);
        finish_empty(e, r, "error", msg);
        j->r = NULL; /* freed */
        return 1;
    }
    const smp_result sr = j->res;
    int32_t t = sr.token;
    if (r->n_tok == r->cap_tok) {
        int cap = r->cap_tok * 2 < r->n_prompt + r->max_new ? r->cap_tok * 2 : r->n_prompt + r->max_new;
        CHECK(cap > r->n_tok);
        r->tok = xrealloc(r->tok, (size_t)cap * sizeof *r->tok);
        r->cap_tok = cap;
    }
    r->tok[r->n_tok++] = t;
    eg_commit(r, t);
    n_gen++;
    double now = now_sec();
    pthread_mutex_lock(&e->stats_mu);
    e->st.generation_tokens_total++;
    if (n_gen == 1) stats_observe(&e->st.ttft, now - r->t_submit);
    else stats_observe(&e->st.itl, now - r->t_last);
    pthread_mutex_unlock(&e->stats_mu);
    if (n_gen == 1) r->t_first = now;
    r->t_last = now;

    const char *reason = NULL, *matched = NULL;
    int32_t matched_id = -1;
    buf *out = &e->text;
    out->len = 0;
    if (out->data) out->data[0] = 0;
    if (!r->sp.ignore_eos && is_stop_token(e, r, t)) {
        reason = "stop";
        matched_id = t;
    } else if (r->ts) {
        char *d = tok_stream_push(r->ts, t);
        int k = stop_feed(&r->sm, d, strlen(d), out);
        free(d);
        if (k >= 0) { reason = "stop"; matched = r->sp.stop[k]; }
    }
    if (!reason && n_gen >= r->max_new) reason = "length";
    if (reason && !matched && r->ts) {
        /* normal end: release what the detokenizer and the stop matcher hold */
        char *d = tok_stream_finish(r->ts);
        int k = stop_feed(&r->sm, d, strlen(d), out);
        free(d);
        if (k >= 0) { reason = "stop"; matched = r->sp.stop[k]; matched_id = -1; }
        else stop_flush(&r->sm, out);
    }
    if (reason) retire(e, r, reason);
    emit(e, r, t, out->data ? out->data : "", &sr, reason != NULL, reason, matched, matched_id, NULL);
    if (reason) {
        req_free(r);
        j->r = NULL;
    }
    return reason != NULL;
}

/* ==== the engine thread =================================================================== */

static void abort_all(ls_engine *e) {
    while (e->n_running) finish_empty(e, e->running[e->n_running - 1], "abort", NULL);
    while (e->wait_head) finish_empty(e, e->wait_head, "abort", NULL);
}

static ereq *find_req(ls_engine *e, int64_t id) {
    for (int i = 0; i < e->n_running; i++) if (e->running[i]->id == id) return e->running[i];
    for (ereq *r = e->wait_head; r; r = r->next) if (r->id == id) return r;
    return NULL;
}

static void publish_gauges(ls_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->n_waiting_pub = e->n_waiting;
    int queued = e->n_sub + e->n_waiting;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->stats_mu);
    e->st.running = e->n_running;
    e->st.queued = queued;
    e->st.kv_pages_allocated = kvpool_used(&e->pages);
    e->st.kv_pages_used = e->st.kv_pages_allocated - (e->pfx_on ? e->pfx.n_unref : 0);
    e->st.prefix_cached_pages = e->pfx.n_ents;
    e->st.prefix_snapshots_used = e->pfx.n_snaps_used;
    e->st.kv_usage = e->n_pages ? (double)e->st.kv_pages_used / e->n_pages : 0;
    pthread_mutex_unlock(&e->stats_mu);
}

/* Device sampling: row i's parameters (the request's ls_sampling, its
 * completion index as the RNG counter) and its token lists appended to
 * e->stoks: bans before min_tokens, the distinct prompt + output ids for the
 * repetition penalty, (id, count) of the output ids for frequency /
 * presence, and (ed set) its grammar mask and logit_bias (eg_stage_row).
 * Returns the new list length. */
static int dev_row(ls_engine *e, ereq *r, smp_row *p, int n_toks, const smp_edit *ed) {
    const ls_sampling *sp = &r->sp;
    int n_gen = r->n_tok - r->n_prompt;
    memset(p, 0, sizeof *p);
    p->temperature = sp->temperature;
    p->top_p = sp->top_p;
    p->min_p = sp->min_p;
    p->top_k = sp->top_k;
    p->rep_pen = sp->repetition_penalty;
    p->freq_pen = sp->frequency_penalty;
    p->pres_pen = sp->presence_penalty;
    p->forced = -1;
    if (n_gen < sp->n_force) p->forced = sp->force_ids[n_gen] >= 0 ? sp->force_ids[n_gen] : SMP_ROW_POISON;
    p->want_lp = sp->logprobs;
    p->n_top = sp->top_logprobs < SMP_DEV_TOP ? sp->top_logprobs : SMP_DEV_TOP;
    p->seed = sp->seed;
    p->counter = (uint64_t)n_gen;
    int rep = sp->repetition_penalty > 0 && sp->repetition_penalty != 1.0f;
    int cnt = (sp->frequency_penalty != 0 || sp->presence_penalty != 0) && n_gen > 0;
    /* the host's rule (sample_one): no bans once the grammar allows only a terminator */
    int ban = n_gen < sp->min_tokens && !eg_only_end(r);
    int need = n_toks + (ban ? r->n_ban : 0) + (rep ? r->n_tok : 0) + (cnt ? 2 * n_gen : 0);
    if (need > e->cap_stoks) {
        e->cap_stoks = need > 2 * e->cap_stoks ? need : 2 * e->cap_stoks;
        e->stoks = xrealloc(e->stoks, (size_t)e->cap_stoks * sizeof *e->stoks);
    }
    if (ban) {
        p->ban_off = n_toks;
        p->n_ban = r->n_ban;
        memcpy(e->stoks + n_toks, r->ban, (size_t)r->n_ban * sizeof *r->ban);
        n_toks += r->n_ban;
    }
    if (rep) {
        if (++e->sstamp == 0) {
            memset(e->smark, 0, (size_t)e->vocab * sizeof *e->smark);
            e->sstamp = 1;
        }
        p->rep_off = n_toks;
        for (int i = 0; i < r->n_tok; i++) {
            int32_t id = r->tok[i];
            if (id < 0 || id >= e->vocab || e->smark[id] == e->sstamp) continue;
            e->smark[id] = e->sstamp;
            e->stoks[n_toks++] = id;
        }
        p->n_rep = n_toks - p->rep_off;
    }
    if (cnt) {
        const int32_t *out = r->tok + r->n_prompt;
        p->cnt_off = n_toks;
        for (int i = 0; i < n_gen; i++) e->scnt[out[i]]++;
        for (int i = 0; i < n_gen; i++) {
            int32_t id = out[i];
            if (!e->scnt[id]) continue;
            e->stoks[n_toks++] = id;
            e->stoks[n_toks++] = e->scnt[id];
            e->scnt[id] = 0; /* once per distinct id; leaves scnt all-zero */
        }
        p->n_cnt = (n_toks - p->cnt_off) / 2;
    }
    return ed ? eg_stage_row(e, ed, p, n_toks) : n_toks;
}

/* A device-sampled row as the host sampler's result (or its NaN/Inf error). */
void eng_dev_result(samp_job *j, const smp_out *o) {
    j->err.code = 0;
    if (o->bad_idx >= 0) {
        j->rc = errf(&j->err, ERR_RUNTIME, "logits[%d] is %g", o->bad_idx, (double)o->bad_val);
        return;
    }
    j->rc = 0;
    memset(&j->res, 0, sizeof j->res);
    j->res.token = o->token;
    j->res.logprob = o->logprob;
    j->res.n_top = o->n_top < SMP_MAX_TOP ? o->n_top : SMP_MAX_TOP;
    for (int i = 0; i < j->res.n_top; i++) {
        j->res.top_ids[i] = o->top_ids[i];
        j->res.top_logprobs[i] = o->top_lp[i];
    }
}

static void run_step(ls_engine *e, int nb) {
    int ntok = 0, n_spec = 0, n_spec_drafts = 0;
    for (int i = 0; i < nb; i++) {
        ereq *r = e->batch[i];
        fwd_seq *s = &e->seqs[i];
        if (e->spec_mtp) { /* for the MTP passes after the commits (mtp_drafts) */
            e->mtp_req[i] = r;
            e->mtp_row0[i] = ntok;
            e->mtp_past[i] = r->n_cached;
            e->mtp_job[i] = -1;
        }
        s->slot = r->slot;
        s->n_past = r->n_cached;
        s->n_new = e->batch_new[i];
        s->pages = r->pages;
        s->logits_all = 0;
        pfxe_step_plan(e, r, s); /* in-step GDN snapshots at the prompt's page boundaries (or none) */
        if (r->n_draft) { /* the last token and the drafts, a logits row each, a snapshot after each but the last */
            CHECK(s->n_new == 1 + r->n_draft && s->n_snap == 0);
            s->logits_all = 1;
            e->ids[ntok] = r->tok[r->n_cached];
            memcpy(e->ids + ntok + 1, r->draft, (size_t)r->n_draft * sizeof *e->ids);
            if (e->spec_gdn) {
                s->n_snap = r->n_draft;
                for (int k = 0; k < r->n_draft; k++) {
                    s->snap_off[k] = k + 1;
                    s->snap_slot[k] = r->spare[k];
                }
            }
            n_spec++;
            n_spec_drafts += r->n_draft;
        } else {
            memcpy(e->ids + ntok, r->tok + r->n_cached, (size_t)s->n_new * sizeof *e->ids);
        }
        ntok += s->n_new;
    }
    fwd_batch b = {.n_seq = nb, .seqs = e->seqs, .ids = e->ids, .logits = e->logits};
    /* Rows sampled this step with a grammar mask or logit_bias: on the device sampler when
     * gdev and eg_dev_ok (their masks computed now, before the forward), else the whole step
     * samples on the host from downloaded logits. */
    int dev_smp = e->dev_smp, n_con = 0;
    e->n_scon = 0;
    for (int i = 0; i < nb; i++) {
        ereq *r = e->batch[i];
        if (r->n_cached + e->batch_new[i] != r->n_tok || !eg_host_only(r)) continue;
        n_con++;
        if (!e->gdev || !eg_dev_ok(e, r)) dev_smp = 0;
        else if (dev_smp) e->scon[e->n_scon++] = i;
    }
    if (dev_smp) {
        for (int i = 0; i < nb; i++) e->sedp[i] = NULL;
        double ts = e->n_scon ? now_sec() : 0, tm = 0;
        if (e->n_scon) {
            eg_stage_masks(e);
            tm = now_sec();
        }
        int n_toks = 0, row = 0; /* a smp_row per logits row: n_new for a row with drafts, else 1 */
        for (int i = 0; i < nb; i++) {
            ereq *r = e->batch[i];
            if (r->n_draft) { /* position p sampled as if drafts 0 .. p - 1 were accepted (spec_commit) */
                const int n0 = r->n_tok, k = r->n_draft;
                if (r->cap_tok < n0 + k) {
                    r->cap_tok = n0 + k;
                    r->tok = xrealloc(r->tok, (size_t)r->cap_tok * sizeof *r->tok);
                }
                memcpy(r->tok + n0, r->draft, (size_t)k * sizeof *r->tok);
                for (int p = 0; p <= k; p++) {
                    r->n_tok = n0 + p;
                    n_toks = dev_row(e, r, &e->srows[row++], n_toks, NULL);
                }
                r->n_tok = n0;
            } else if (r->n_cached + e->batch_new[i] == r->n_tok) {
                n_toks = dev_row(e, r, &e->srows[row++], n_toks, e->sedp[i]);
            } else {
                e->srows[row++] = (smp_row){.forced = SMP_ROW_SKIP};
            }
        }
        if (e->n_scon) {
            e->n_staged += e->n_scon;
            e->t_mask += tm - ts;
            e->t_stage += now_sec() - ts;
        }
        b.smp = e->srows;
        b.smp_res = e->sres;
        b.toks = e->stoks;
        b.n_toks = n_toks;
    }
    ls_err le = {0};
    double t0 = now_sec();
    int rc = model_forward(e->m, &b, &le);
    e->n_steps++;
    if (ntok == nb) {
        e->n_dec_steps++;
        e->n_dec_rows += nb;
        e->t_dec += now_sec() - t0;
    }
    if (rc < 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "model forward failed at engine step %lld: %s", (long long)e->n_steps,
                 le.msg);
        log_error("engine: %s (failing the %d requests of the batch)", msg, nb);
        for (int i = 0; i < nb; i++) finish_empty(e, e->batch[i], "error", msg);
        return;
    }
    const double t1 = now_sec();
    if (n_con) {
        pthread_mutex_lock(&e->stats_mu);
        if (dev_smp) e->st.constrained_rows_device_total += (uint64_t)n_con;
        else e->st.constrained_rows_host_total += (uint64_t)n_con;
        pthread_mutex_unlock(&e->stats_mu);
    }
    e->n_jobs = 0;
    size_t row = 0; /* logits rows in seq order: n_new for a row with drafts, else 1 */
    for (int i = 0; i < nb; i++) {
        ereq *r = e->batch[i];
        const size_t row_i = row;
        row += r->n_draft ? (size_t)e->batch_new[i] : 1;
        r->n_cached += r->n_draft ? 1 : e->batch_new[i]; /* a row with drafts: its last token; the rest when accepted */
        pfxe_step_done(e, r); /* publish full pages, snapshot GDN state at a page boundary */
        if (r->n_cached != r->n_tok) continue;
        if (e->spec_mtp) e->mtp_job[i] = e->n_jobs;
        samp_job *j = &e->jobs[e->n_jobs++];
        *j = (samp_job){.r = r, .row = e->logits + row_i * (size_t)e->vocab};
        if (dev_smp) {
            eng_dev_result(j, &e->sres[row_i]);
            if (r->n_draft) j->dres = &e->sres[row_i];
        }
    }
    if (!dev_smp) sample_all(e);
    for (int j = 0; j < e->n_jobs; j++) {
        if (e->jobs[j].r->n_draft) eng_spec_commit(e, &e->jobs[j]);
        else eng_commit_token(e, &e->jobs[j]);
    }
    if (e->spec_mtp) eng_mtp_drafts(e, nb);
    const double t2 = now_sec();
    if (e->spec && nb <= SPEC_COST_BS && ntok - n_spec_drafts == nb) { /* decode rows only: the cost model */
        double *t = n_spec ? &e->spec_t_ver[nb] : &e->spec_t_plain[nb];
        *t = *t > 0 ? 0.8 * *t + 0.2 * (t2 - t0) : t2 - t0;
    }
    log_debug("engine: step %lld: %d seqs, %d tokens, forward %.2f ms, sampling and commit %.2f ms, %d constrained "
              "rows sampled on the %s, %d rows verifying drafts", (long long)e->n_steps, nb, ntok, (t1 - t0) * 1e3,
              (t2 - t1) * 1e3, n_con, dev_smp ? "device" : "host", n_spec);
}

void ls_engine_hold(ls_engine *e, int on) {
    pthread_mutex_lock(&e->mu);
    e->hold = on != 0;
    if (!e->hold) pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
    ls_engine *e = arg;
    int64_t *cancels = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->closing && (e->hold || (!e->sub_head && !e->n_cancel && !e->n_running && !e->wait_head)))
            pthread_cond_wait(&e->cv, &e->mu);
        ereq *sub = e->sub_head;
        e->sub_head = e->sub_tail = NULL;
        e->n_sub = 0;
        int nc = e->n_cancel;
        if (nc > cap) { cap = nc; cancels = xrealloc(cancels, (size_t)cap * sizeof *cancels); }
        if (nc) memcpy(cancels, e->cancels, (size_t)nc * sizeof *cancels);
        e->n_cancel = 0;
        int closing = e->closing;
        while (sub) { ereq *n = sub->next; wait_insert(e, sub); sub = n; }
        e->n_waiting_pub = e->n_waiting;
        pthread_mutex_unlock(&e->mu);

        if (closing) { abort_all(e); publish_gauges(e); break; }
        for (int i = 0; i < nc; i++) {
            ereq *r = find_req(e, cancels[i]);
            if (r) finish_empty(e, r, "abort", NULL);
        }
        int nb = schedule(e);
        if (nb > 0) run_step(e, nb);
        publish_gauges(e);
        if (nb == 0 && (e->n_running || e->wait_head)) {
            /* Nothing could run (cannot happen with a pool of one full context;
             * kept as a guard against spinning). */
            log_warn("engine: no request could be scheduled (%d running, %d waiting, %d free pages)",
                     e->n_running, e->n_waiting, kvpool_avail(&e->pages));
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    free(cancels);
    return NULL;
}
