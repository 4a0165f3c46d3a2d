/* engine_int.h: the engine's private state, shared by engine.c (the engine
 * thread, scheduler, submit/cancel), engine_spec.c (speculative decoding) and
 * api.c (tokenizer, template, info, statistics). Not installed; the public
 * surface is include/laststand.h.
 */
#ifndef LS_ENGINE_INT_H
#define LS_ENGINE_INT_H

#include "laststand.h"
#include "base/base.h"
#include "model/model.h"
#include "tok/tok.h"
#include "tok/jinja.h"
#include "engine/kvpool.h"
#include "engine/prefix.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/stop.h"
#include "ops/ops.h"

#include <pthread.h>

enum { REQ_QUEUED = 0, REQ_WAITING, REQ_RUNNING };

/* One request, owned by the engine thread once it leaves the submit queue. */
typedef struct ereq ereq;
struct ereq {
    int64_t id;                /* submit order; also the preemption priority (newest goes first) */
    ereq *next;                /* submit queue / waiting list link */
    int state;
    ls_event_cb cb;
    void *user;

    ls_sampling sp;            /* deep copy: stop, stop_ids, force_ids point into owned memory */
    int32_t *ban;              /* EOS + stop ids, suppressed before min_tokens */
    int n_ban;

    int32_t *tok;              /* [cap_tok] prompt then generated ids; grows up to n_prompt + max_new */
    int n_prompt, n_tok, cap_tok;
    int max_new;               /* completion cap: min(max_tokens, context - n_prompt) */
    int n_cached;              /* tokens [0, n_cached) are in the KV pages / GDN slot */
    int32_t *pages;            /* [cap_pages] held pages, in position order */
    int n_pages, cap_pages;
    int slot;                  /* GDN slot, -1 when not running */
    /* prefix cache: pages[0 .. n_pent) are cache pages held through entries pent[] (read-only,
     * shared); pages[n_pent ..) are the request's own */
    int32_t *pent;             /* [cap_pent] */
    int n_pent, cap_pent;
    int n_hit;                 /* prompt tokens the cache gave at the first admission (cached_tokens) */
    int32_t snap_roll;         /* entry of its latest decode-time GDN snapshot, -1 */
    /* in-step GDN snapshots of the step in flight (pfxe_step_plan .. pfxe_step_done): held
     * snapshot indices and the token boundaries they hold the state at */
    int32_t snap_hold[MODEL_SNAP_MAX];
    int snap_at[MODEL_SNAP_MAX];
    int n_snap_hold;

    smp_rng rng;
    tok_stream *ts;            /* NULL without a tokenizer */
    stop_matcher sm;
    double t_submit, t_first, t_last;
    int prompt_counted;
    /* constrained decoding and logit_bias (engine_grammar.c) */
    struct gr_matcher *gm;     /* NULL: unconstrained */
    uint32_t *gmask;           /* [mask words] this step's allowed ids */
    int32_t *lb_ids;           /* [n_lb] logit_bias */
    float *lb;
    int n_lb;
    int lb_dup;                /* an id repeats in logit_bias: the host adds each (device: host-only) */
    /* speculative decoding (engine_spec.c): this step's drafts (0: a plain decode row), the spare GDN
     * slots the step snapshots the state into after each verified position (held while
     * running), the tokens its verify steps commit (a moving average, from 1 + spec_k), and the
     * steps it waits before drafting again while drafts do not pay (spec_plan) */
    int32_t draft[SPEC_DRAFT_MAX];
    int n_draft;
    int32_t spare[MODEL_SNAP_MAX];
    int n_spare;
    double spec_tpv;
    int spec_skip, spec_backoff;
    /* MTP drafts (engine_spec.c "MTP drafts"): the head's proposals for the tokens after tok[mtp_at - 1],
     * made at the end of the step that committed it; stale once n_tok moved past mtp_at */
    int32_t mtp_draft[SPEC_DRAFT_MAX];
    int n_mtp_draft, mtp_at;
};

/* One request's sampling in a step: filled in parallel, committed in order. */
typedef struct samp_job {
    ereq *r;
    float *row;                /* its logits row [vocab] */
    const smp_out *dres;       /* a row with drafts sampled on the device: its positions' results */
    smp_result res;
    int rc;
    ls_err err;
} samp_job;

struct ls_engine {
    /* ---- fixed after open ---- */
    model *m;
    const model_config *cfg;
    tokenizer *tok;            /* NULL: ids only (fixture models) */
    jinja_tmpl *tmpl;          /* NULL: no chat template */
    char *tmpl_err;            /* why the model's own template did not parse, or NULL */
    char *model_path, *tokenizer_path, *device;
    int tp;
    int32_t eos[CFG_MAX_EOS + 1];
    int n_eos;
    int vocab, ctx, page_size, max_run, budget, n_pages, max_queued;
    int force_ok;              /* LASTSTAND_TEST_FORCE_IDS=1 at open */
    int dev_smp;               /* sampling on the device (model_samples_on_device) */

    /* ---- engine thread only ---- */
    kvpool pages, slots;
    /* the prefix cache (prefix_engine.c): on, GDN snapshots needed, snapshot k is model slot
     * snap_base + k (after the max_run request slots) */
    pfx_cache pfx;
    int pfx_on, pfx_gdn, snap_base;
    int pfx_instep;            /* GDN snapshots inside the prefill step (1), or the prefill cut at them (0) */
    smp_ctx **smps;            /* [n_smp] sampler scratch, one per pool worker slot */
    int n_smp, n_smp_used;
    samp_job *jobs;            /* [max_run] requests sampling this step, in batch order */
    int n_jobs;
    float *logits;             /* [max_run, vocab] */
    fwd_seq *seqs;             /* [max_run] */
    int32_t *ids;              /* [budget + max_run] */
    ereq **batch;              /* [max_run] */
    int *batch_new;            /* [max_run] */
    ereq **running;            /* [max_run], sorted by id */
    int n_running;
    ereq *wait_head, *wait_tail; /* sorted by id */
    int n_waiting;
    buf text;                  /* event text scratch */
    int64_t n_steps;
    int64_t n_dec_steps, n_dec_rows; /* pure-decode steps (every row one token) and their rows */
    double t_dec;              /* seconds in those steps' forward + sampling */
    /* device sampling: per batch row parameters and results, the rows' token lists */
    smp_row *srows;            /* [max_run] */
    smp_out *sres;             /* [max_run] */
    int32_t *stoks;            /* [cap_stoks] */
    int cap_stoks;
    uint32_t *smark;           /* [vocab] distinct-id stamps */
    uint32_t sstamp;
    int32_t *scnt;             /* [vocab] output-id counts, all-zero between rows */
    /* constrained rows on the device sampler (engine_grammar.c eg_stage_masks): gdev 0 when
     * LASTSTAND_GRAMMAR_DEVICE=0 at open; this step's edits per batch row, the rows to stage */
    int gdev;
    smp_edit *sedit;           /* [max_run] */
    const smp_edit **sedp;     /* [max_run] NULL: none */
    int *scon, n_scon;         /* [max_run] batch rows to stage */
    int64_t n_staged;          /* constrained rows staged so far, and the host seconds their steps */
    double t_mask, t_stage;    /* spent in eg_stage_masks and in building the sampling tables */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ereq *sub_head, *sub_tail;
    int n_sub;
    int n_waiting_pub;         /* engine's n_waiting as of the last step */
    int64_t *cancels;
    int n_cancel, cap_cancel;
    int closing;
    int hold;                  /* ls_engine_hold: no admission, no step while set */
    int64_t next_id;

    /* ---- statistics, under stats_mu ---- */
    pthread_mutex_t stats_mu;
    ls_stats st;

    pthread_t thread;
    int thread_started;

    /* speculative decoding (engine_spec.c): on, drafts a row verifies at most, the n-gram windows,
     * the running requests above which no row drafts; spec_gdn: drafts hold spare GDN slots
     * (e->slots holds max_run x (1 + spec_k) of them); logits rows of e->logits */
    int spec, spec_k, spec_minw, spec_maxw, spec_max_bs, spec_gdn;
    int spec_mtp;              /* drafts from the checkpoint's MTP head (model_has_mtp), not n-grams */
    /* MTP passes (engine_spec.c "MTP drafts"): per batch row of the step, its request, first token
     * row, cached tokens before the step and sampling job (-1: none); the passes' scratch */
    ereq **mtp_req;            /* [max_run] */
    int *mtp_row0, *mtp_past, *mtp_job, *mtp_idx; /* [max_run] */
    int32_t *mtp_src;          /* [budget + max_run] */
    int64_t n_mtp_passes;
    double t_mtp;              /* seconds in MTP passes */
    int n_logit_rows;
    /* the measured cost of a step of n decode rows, plain and with drafts (moving averages of
     * seconds, 0: none yet), n = 1 .. SPEC_COST_BS; spec_adapt 0: draft whenever a match exists */
    double spec_t_plain[SPEC_COST_BS + 1], spec_t_ver[SPEC_COST_BS + 1];
    int spec_adapt;

    /* constrained decoding: the tokenizer's byte trie, built on first use, and the last compiled
     * grammars by their request text (engine_grammar.c, under its g_mu) */
    struct gr_vocab *gvocab;
    struct eg_cached { char *key; struct gr_grammar *g; uint64_t used; } gcache[64];
    uint64_t gcache_clock;
};

/* engine.c: shared with engine_spec.c */
int eng_set_err(char *err, size_t errn, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* sample j->r's next token from j->row on the host (any thread; the request's RNG and c) */
void eng_sample_one(ls_engine *e, smp_ctx *c, samp_job *j);
/* append j's token, emit it, finish the request if done: 1 when it ended (freed, j->r NULL) */
int eng_commit_token(ls_engine *e, samp_job *j);
/* a device-sampled row as the host sampler's result (or its NaN / Inf error) */
void eng_dev_result(samp_job *j, const smp_out *o);
/* room in r->pages for n pages */
void eng_reserve_pages(ereq *r, int n);

/* engine_spec.c: speculative decoding (see there) */
int eng_spec_config(ls_engine *e, const ls_engine_opts *o, int gdn, char *err, size_t errn);
int eng_spec_plan(ls_engine *e, ereq *r, int budget);
void eng_spec_commit(ls_engine *e, samp_job *j);
void eng_mtp_drafts(ls_engine *e, int nb);

/* prefix_engine.c: the prefix cache's hooks in the engine thread (see there) */
int32_t pfxe_page_get(ls_engine *e);
int pfxe_pages_avail(const ls_engine *e);
int pfxe_admit(ls_engine *e, ereq *r);
void pfxe_restore(ls_engine *e, ereq *r);
int pfxe_chunk(const ls_engine *e, const ereq *r, int n_new);
int pfxe_instep_mode(const ls_engine *e);
void pfxe_step_plan(ls_engine *e, ereq *r, fwd_seq *s);
void pfxe_step_done(ls_engine *e, ereq *r);
void pfxe_release(ls_engine *e, ereq *r);

#endif
