/* gen.c: one HTTP request's engine submissions and its event queue.
 *
 * A gen owns n engine requests (the choices: n per prompt, prompts in
 * order). The engine thread calls on_event, which copies the event into the
 * gen's queue and returns at once; the connection thread pops events with
 * gen_next. Lifetime: the gen is freed by whichever side lets go last: the
 * HTTP side (gen_release) or the engine delivering the final event of the
 * last live choice. Releasing with choices still running cancels them, so a
 * client that goes away frees its pages at the engine's next step.
 */
#include "server/server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gen_sub { gen *g; int choice; int64_t id; int live; } gen_sub;

struct gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ls_engine *eng;
    int n;
    gen_sub *subs;
    int n_live;          /* submitted, final event not yet delivered */
    int released;
    gen_event *q;        /* FIFO ring */
    size_t qh, qn, qcap;
};

void gen_event_free(gen_event *ev) {
    free(ev->text); free(ev->top_ids); free(ev->top_lps); free(ev->matched_stop); free(ev->error);
    memset(ev, 0, sizeof *ev);
}

static void gen_destroy(gen *g) {
    while (g->qn) {
        gen_event_free(&g->q[g->qh]);
        g->qh = (g->qh + 1) % g->qcap;
        g->qn--;
    }
    free(g->q);
    free(g->subs);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

static void push(gen *g, gen_event *ev) {
    if (g->qn == g->qcap) {
        size_t cap = g->qcap ? g->qcap * 2 : 64;
        gen_event *q = xmalloc(cap * sizeof *q);
        for (size_t i = 0; i < g->qn; i++) q[i] = g->q[(g->qh + i) % g->qcap];
        free(g->q);
        g->q = q;
        g->qh = 0;
        g->qcap = cap;
    }
    g->q[(g->qh + g->qn) % g->qcap] = *ev;
    g->qn++;
}

/* Engine thread: copy and queue; never blocks beyond the queue lock. */
static void on_event(void *user, const ls_event *ev) {
    gen_sub *s = user;
    gen *g = s->g;
    gen_event e = {0};
    e.choice = s->choice;
    e.token = ev->token;
    e.text = xstrdup(ev->text ? ev->text : "");
    e.logprob = ev->logprob;
    if (ev->n_top > 0 && ev->top_ids && ev->top_logprobs) {
        e.n_top = ev->n_top;
        e.top_ids = xmalloc(ev->n_top * sizeof(int32_t));
        e.top_lps = xmalloc(ev->n_top * sizeof(float));
        memcpy(e.top_ids, ev->top_ids, ev->n_top * sizeof(int32_t));
        memcpy(e.top_lps, ev->top_logprobs, ev->n_top * sizeof(float));
    }
    e.finished = ev->finished;
    if (ev->finish_reason) snprintf(e.finish_reason, sizeof e.finish_reason, "%s", ev->finish_reason);
    if (ev->matched_stop) e.matched_stop = xstrdup(ev->matched_stop);
    if (ev->error) e.error = xstrdup(ev->error);
    e.matched_stop_id = ev->finished ? ev->matched_stop_id : -1;
    e.prompt_tokens = ev->prompt_tokens;
    e.completion_tokens = ev->completion_tokens;
    e.cached_tokens = ev->cached_tokens;

    pthread_mutex_lock(&g->mu);
    if (g->released) gen_event_free(&e);
    else push(g, &e);
    if (ev->finished && s->live) {
        s->live = 0;
        g->n_live--;
    }
    int destroy = g->released && g->n_live == 0;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (destroy) gen_destroy(g);
}

int gen_start(srv *sv, const srv_req *r, gen **out, char *err, size_t errn) {
    gen *g = xcalloc(1, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    g->eng = sv->eng;
    g->n = r->n_prompts * r->n;
    g->subs = xcalloc(g->n, sizeof *g->subs);
    for (int c = 0; c < g->n; c++) {
        const srv_prompt *p = &r->prompts[c / r->n];
        ls_sampling s = r->s;
        if (s.has_seed) s.seed += (uint64_t)(c % r->n);
        gen_sub *sub = &g->subs[c];
        sub->g = g;
        sub->choice = c;
        pthread_mutex_lock(&g->mu);
        sub->live = 1;
        g->n_live++;
        pthread_mutex_unlock(&g->mu);
        int64_t id = ls_submit(sv->eng, p->ids, p->n, &s, on_event, sub, err, errn);
        pthread_mutex_lock(&g->mu);
        if (id < 0) {
            if (sub->live) { sub->live = 0; g->n_live--; }
            pthread_mutex_unlock(&g->mu);
            gen_release(g);
            return (int)id;
        }
        sub->id = id;
        pthread_mutex_unlock(&g->mu);
    }
    *out = g;
    return 0;
}

int gen_choices(const gen *g) { return g->n; }

int gen_next(gen *g, gen_event *ev, double timeout_s) {
    pthread_mutex_lock(&g->mu);
    if (!g->qn && g->n_live > 0 && timeout_s > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long ns = ts.tv_nsec + (long long)(timeout_s * 1e9);
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        while (!g->qn && g->n_live > 0)
            if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT) break;
    }
    int rc;
    if (g->qn) {
        *ev = g->q[g->qh];
        g->qh = (g->qh + 1) % g->qcap;
        g->qn--;
        rc = 1;
    } else {
        rc = g->n_live > 0 ? 0 : -1;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* Ids of the choices still running (caller frees). */
static int live_ids(gen *g, int64_t **ids) {
    *ids = xmalloc((g->n + 1) * sizeof(int64_t));
    int k = 0;
    for (int c = 0; c < g->n; c++)
        if (g->subs[c].live && g->subs[c].id > 0) (*ids)[k++] = g->subs[c].id;
    return k;
}

void gen_cancel(gen *g) {
    int64_t *ids;
    pthread_mutex_lock(&g->mu);
    int k = live_ids(g, &ids);
    ls_engine *eng = g->eng;
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < k; i++) ls_cancel(eng, ids[i]);
    free(ids);
}

void gen_release(gen *g) {
    int64_t *ids;
    pthread_mutex_lock(&g->mu);
    g->released = 1;
    int k = live_ids(g, &ids);
    ls_engine *eng = g->eng;
    int destroy = g->n_live == 0;
    pthread_mutex_unlock(&g->mu);
    /* g may be freed by the engine thread from here on unless destroy */
    for (int i = 0; i < k; i++) ls_cancel(eng, ids[i]);
    free(ids);
    if (destroy) gen_destroy(g);
}
