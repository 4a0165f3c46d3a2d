/* engine_spec.c: speculative decoding in the engine thread (engine.c runs the steps; this file
 * decides the drafts, commits a verified row and rolls it back, and makes the MTP head's drafts):
 * the options (eng_spec_config), a decode row's drafts (eng_spec_plan: n-gram lookup, spec.c, or
 * the MTP head's chain from the last step), the commit of a row with drafts and the cost model
 * (eng_spec_commit, spec_settle), and the MTP head's passes after each step (eng_mtp_drafts).
 * Engine-thread only, as engine.c's scheduler; shares engine_int.h's state and helpers.
 */
#include "engine/engine_int.h"
#include "engine/engine_grammar.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ==== speculative decoding ================================================================
 *
 * A decode row with drafts (r->n_draft > 0) feeds its last token and the drafts in one
 * step, n_new = 1 + n_draft, with a logits row per position (logits_all). Position p's row
 * is sampled exactly as a plain decode step would sample it (penalties, grammar, bans and
 * the RNG see the tokens committed so far), the token committed, and the next position
 * looked at only if that token equals draft p: the drafts are point proposals, so "sample
 * the target and accept while it agrees" is speculative sampling's exact rule, and the
 * tokens are distributed (greedy: equal) as without drafts. A row commits 1 + accepted
 * tokens a step. Rollback: the KV of the rejected positions is simply not counted
 * (n_cached), and is overwritten later; the GDN state, which has absorbed every fed
 * token, is taken from the in-step snapshot after the last valid position (fwd_seq
 * snapshots into the row's spare slots: the request's slot and that spare swap, no copy).
 * With the prefix cache on a GDN model, a row's step never passes a page boundary before
 * its last position, so every snapshot the cache takes at a boundary (pfxe_step_done) is
 * of a state that holds exactly the cached tokens. With a device sampler every position
 * is sampled on the device, its smp_row built as if the drafts before it were accepted
 * (run_step); a step with drafts runs eagerly (the CUDA graphs are pure decode steps'),
 * which costs little (S27: an eager one-token step 2.47 ms, replayed 2.41 on the 35B).
 * Drafts are for small batches (spec_max_bs), and spec_settle stops a request drafting
 * where its verify steps do not pay for their cost. */

/* 1 when --speculative-algorithm names the checkpoint's MTP head as the draft model: mtp, or
 * SGLang's names for it on these models, EAGLE (without a draft model) and NEXTN. */
int ls_spec_algo_is_mtp(const char *a) {
    return a && (!strcasecmp(a, "mtp") || !strcasecmp(a, "eagle") || !strcasecmp(a, "nextn"));
}

/* The speculative decoding options (ls_engine_opts) into e->spec*: validated, defaults filled. */
int eng_spec_config(ls_engine *e, const ls_engine_opts *o, int gdn, char *err, size_t errn) {
    const char *a = o->speculative_algorithm;
    const int n = o->speculative_num_draft_tokens, w0 = o->speculative_ngram_min_window,
              w1 = o->speculative_ngram_max_window, mb = o->speculative_max_batch;
    if (n < 0 || w0 < 0 || w1 < 0 || mb < 0)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--speculative-*: negative value (num-draft-tokens %d, ngram windows "
                           "%d..%d, max-batch %d)", n, w0, w1, mb);
    if (!a || !*a || !strcasecmp(a, "none")) {
        if (n || w0 || w1 || mb)
            log_warn("engine: --speculative-* options without --speculative-algorithm: speculative decoding is off");
        return 0;
    }
    const int mtp = ls_spec_algo_is_mtp(a);
    if (strcasecmp(a, "ngram") && !mtp)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--speculative-algorithm '%s': expected ngram, mtp (also EAGLE or "
                           "NEXTN: the checkpoint's own MTP head) or none", a);
    if (mtp && (w0 || w1))
        log_warn("engine: --speculative-ngram-* options with --speculative-algorithm %s: the MTP head drafts, they "
                 "do nothing", a);
    const int kmax = gdn ? MODEL_SNAP_MAX : SPEC_DRAFT_MAX;
    const int k = n ? n - 1 : 3;
    if (k < 1 || k > kmax)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--speculative-num-draft-tokens %d: expected 2..%d (the last accepted "
                           "token and up to %d drafts%s)", n, kmax + 1, kmax,
                           gdn ? "; each draft of a model with GDN layers holds a spare state slot" : "");
    const int minw = w0 ? w0 : 2, maxw = w1 ? w1 : (minw > 12 ? minw : 12);
    if (minw > maxw || maxw > 1024)
        return eng_set_err(err, errn, LS_ERR_INVAL, "--speculative-ngram-min/max-match-window-size %d..%d: expected "
                           "1 <= min <= max <= 1024", minw, maxw);
    e->spec = 1;
    e->spec_mtp = mtp;
    e->spec_k = k;
    e->spec_minw = minw;
    e->spec_maxw = maxw;
    e->spec_max_bs = mb ? mb : 16;
    e->spec_gdn = gdn;
    const char *ad = getenv("LASTSTAND_SPEC_ADAPT");
    e->spec_adapt = !(ad && !strcmp(ad, "0"));
    return 0;
}

/* Drafts for the decode row r (need = 1) within the step's token budget; sets r->n_draft and
 * returns it (0: a plain decode row). */
int eng_spec_plan(ls_engine *e, ereq *r, int budget) {
    r->n_draft = 0;
    if (!e->spec || e->n_running > e->spec_max_bs) return 0;
    /* a grammar mask or logit_bias on the device sampler is staged for the row's state before
     * the step, not per position: such rows verify drafts only where the host samples */
    if (e->dev_smp && eg_host_only(r)) return 0;
    if (r->spec_skip > 0) { r->spec_skip--; return 0; }
    if (!r->spec_tpv) r->spec_tpv = 1 + e->spec_k; /* optimistic until its first verify step */
    const int ps = e->page_size;
    int k = e->spec_k;
    int left = r->max_new - (r->n_tok - r->n_prompt) - 1; /* tokens the request may emit after this step's first */
    if (k > left) k = left;
    if (k > budget - 1) k = budget - 1;
    if (e->pfx_on && e->pfx_gdn) { /* the step ends at the next page boundary at the latest */
        int to = (r->n_cached / ps + 1) * ps - r->n_cached - 1;
        if (k > to) k = to;
    }
    /* pages: those held, and free ones beyond a page of headroom per running request (never
     * preempt anyone for a draft) */
    int spare_pages = pfxe_pages_avail(e) - e->n_running;
    int room = (r->n_pages + (spare_pages > 0 ? spare_pages : 0)) * ps - r->n_cached - 1;
    if (k > room) k = room;
    if (k <= 0) return 0;
    int32_t d[SPEC_DRAFT_MAX];
    int m;
    if (e->spec_mtp) { /* the head's chain from the end of the last step (mtp_drafts), if it is current */
        m = r->mtp_at == r->n_tok ? r->n_mtp_draft : 0;
        if (m > k) m = k;
        if (m > 0) memcpy(d, r->mtp_draft, (size_t)m * sizeof *d);
    } else {
        m = spec_ngram_propose(r->tok, r->n_tok, e->spec_minw, e->spec_maxw, k, d);
    }
    if (m <= 0) return 0;
    if (e->spec_gdn) {
        while (r->n_spare < m) {
            int32_t sl = kvpool_get(&e->slots);
            if (sl < 0) break;
            r->spare[r->n_spare++] = sl;
        }
        if (m > r->n_spare) m = r->n_spare;
    }
    memcpy(r->draft, d, (size_t)m * sizeof *d);
    r->n_draft = m;
    return m;
}

/* After a verify step that accepted a drafts: does drafting pay for r? Its verify steps commit
 * spec_tpv tokens on average; a step with drafts costs spec_t_ver[n] against spec_t_plain[n] for
 * one token a row (n: the decode rows running, both measured; unknown: assume it pays). When it
 * does not (or nothing was accepted), r skips 1, 2, 4 .. 16 steps before drafting again, each
 * retry refreshing its average; when it does, the back-off resets. */
static void spec_settle(ls_engine *e, ereq *r, int a) {
    r->spec_tpv = 0.7 * r->spec_tpv + 0.3 * (1 + a);
    int n = e->n_running < 1 ? 1 : e->n_running > SPEC_COST_BS ? SPEC_COST_BS : e->n_running;
    const double tp = e->spec_t_plain[n], tv = e->spec_t_ver[n];
    int pays = a > 0 && (!e->spec_adapt || !(tp > 0 && tv > 0) || r->spec_tpv * tp >= tv);
    if (pays) {
        r->spec_backoff = 0;
        return;
    }
    r->spec_skip = r->spec_backoff ? r->spec_backoff : 1;
    r->spec_backoff = r->spec_backoff ? (r->spec_backoff < 16 ? 2 * r->spec_backoff : 16) : 2;
}

/* A row with drafts after its step (see "Speculative decoding"): j holds position 0's sample.
 * Commits position by position while the committed token equals the draft there, then rolls
 * the GDN state back to the last valid position. */
void eng_spec_commit(ls_engine *e, samp_job *j) {
    ereq *r = j->r;
    const int k = r->n_draft;
    int a = 0; /* drafts accepted */
    for (;;) {
        const int32_t t = j->rc == 0 ? j->res.token : -1;
        if (eng_commit_token(e, j)) break; /* the request ended (and is freed) */
        if (a == k || t != r->draft[a]) {
            if (e->spec_gdn && a < k) { /* the state after position a is in spare a */
                int32_t sl = r->slot;
                r->slot = r->spare[a];
                r->spare[a] = sl;
            }
            r->n_draft = 0;
            spec_settle(e, r, a);
            break;
        }
        a++; /* draft a - 1 is the token committed: its position's KV and state are valid */
        r->n_cached++;
        pfxe_step_done(e, r);
        if (j->dres) {
            eng_dev_result(j, &j->dres[a]);
        } else {
            j->row += e->vocab;
            eng_sample_one(e, e->smps[0], j);
        }
    }
    pthread_mutex_lock(&e->stats_mu);
    e->st.spec_verify_rows_total++;
    e->st.spec_draft_tokens_total += (uint64_t)k;
    e->st.spec_accepted_tokens_total += (uint64_t)a;
    pthread_mutex_unlock(&e->stats_mu);
}

/* ==== MTP drafts =========================================================================
 *
 * With --speculative-algorithm mtp (EAGLE, NEXTN) the checkpoint's multi-token-prediction head
 * drafts (model.h fwd_batch.mtp). Its row at position p takes the model's final-normed hidden
 * state at p and the token at p + 1, and predicts the token at p + 2; its attention keeps its
 * own KV in the request's pages. After every step that ran a request (mtp_drafts):
 *   pass 1: the head over the request's rows of the step whose next token is now known (a
 *     prefill chunk: all of them; a decode row: its one; a verify row: its last token and the
 *     accepted drafts), from the step's hidden states: this writes the head's KV for those
 *     positions and, at the last row, the first draft (the token after the one just committed);
 *   passes 2 .. k: one row each, the previous draft at the next position, from the head's own
 *     output (EAGLE's chain), for the next draft.
 * Drafts are greedy (the head's argmax), verified by the next step as any others (spec_commit:
 * the output is the one without drafts). A position the chain wrote with a draft is rewritten
 * by pass 1 once the model has run it, so the head's KV holds the true inputs wherever it is
 * read later. Requests that do not draft next step (finished, over the batch limit, backing
 * off, a device-masked grammar) still get pass 1 (their KV), without logits when none drafts. */

/* The token with the largest logit (the first of equals). */
static int32_t row_argmax(const float *row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* r drafts after this step: it sampled a token (decodes next) and spec_plan would let it. The
 * chain length: the tokens it may still emit after the next step's first. */
static int mtp_want(const ls_engine *e, const ereq *r) {
    if (r->n_cached != r->n_tok - 1 || e->n_running > e->spec_max_bs || r->spec_skip > 0) return 0;
    if (e->dev_smp && eg_host_only(r)) return 0;
    int k = r->max_new - (r->n_tok - r->n_prompt) - 1;
    return k < e->spec_k ? (k > 0 ? k : 0) : e->spec_k;
}

/* One MTP pass over e->seqs[0 .. n) (ids e->ids, hidden rows e->mtp_src); with logits, the
 * greedy token of each sequence's last row into tok[]. 0, or -1 after logging why. */
static int mtp_pass(ls_engine *e, int n, int self, int logits, int32_t *tok) {
    fwd_batch b = {.n_seq = n, .seqs = e->seqs, .ids = e->ids, .logits = e->logits, .mtp = 1, .mtp_self = self,
                   .mtp_nologits = !logits, .mtp_src = e->mtp_src};
    if (logits && e->dev_smp) {
        for (int i = 0; i < n; i++) e->srows[i] = (smp_row){.forced = -1, .rep_pen = 1.0f};
        b.smp = e->srows;
        b.smp_res = e->sres;
        b.toks = e->stoks;
        b.n_toks = 0;
    }
    ls_err le = {0};
    const double t0 = now_sec();
    int rc = model_forward(e->m, &b, &le);
    e->n_mtp_passes++;
    e->t_mtp += now_sec() - t0;
    if (rc) {
        log_warn("engine: MTP pass at step %lld failed (no drafts this step): %s", (long long)e->n_steps, le.msg);
        return -1;
    }
    for (int i = 0; logits && i < n; i++)
        tok[i] = e->dev_smp ? e->sres[i].token : row_argmax(e->logits + (size_t)i * e->vocab, e->vocab);
    return 0;
}

/* After the commits of a step of nb rows (e->mtp_* filled by run_step): pass 1 and the chain. */
void eng_mtp_drafts(ls_engine *e, int nb) {
    int n = 0, ntok = 0, any = 0;
    for (int i = 0; i < nb; i++) {
        ereq *r = e->mtp_req[i];
        if (e->mtp_job[i] >= 0 && !e->jobs[e->mtp_job[i]].r) continue; /* it ended this step */
        const int past = e->mtp_past[i];
        int m = r->n_tok - past - 1; /* rows whose next token is known */
        if (m > e->batch_new[i]) m = e->batch_new[i];
        if (m <= 0) continue;
        r->n_mtp_draft = 0;
        fwd_seq *s = &e->seqs[n];
        *s = (fwd_seq){.slot = r->slot, .n_past = past, .n_new = m, .pages = r->pages};
        for (int t = 0; t < m; t++) {
            e->ids[ntok + t] = r->tok[past + 1 + t];
            e->mtp_src[ntok + t] = e->mtp_row0[i] + t;
        }
        ntok += m;
        e->batch[n] = r; /* the step's batch is done with: the passes' order */
        e->mtp_idx[n] = mtp_want(e, r);
        any |= e->mtp_idx[n] > 0;
        n++;
    }
    if (!n) return;
    int32_t tok[n];
    if (mtp_pass(e, n, 0, any, tok) || !any) return;
    /* e->batch[0 .. cnt): the sequences still drafting, in the order of the last pass's output
     * rows; mtp_idx: each one's chain length */
    int cnt = 0;
    for (int i = 0; i < n; i++) {
        ereq *r = e->batch[i];
        if (e->mtp_idx[i] <= 0) continue;
        r->mtp_draft[0] = tok[i];
        r->n_mtp_draft = 1;
        r->mtp_at = r->n_tok;
        e->mtp_row0[cnt] = i; /* its row in pass 1's output */
        e->batch[cnt] = r;
        e->mtp_idx[cnt++] = e->mtp_idx[i];
    }
    for (int j = 1; cnt > 0; j++) { /* pass j + 1: draft j from draft j - 1 at the next position */
        int n2 = 0;
        for (int i = 0; i < cnt; i++) {
            ereq *r = e->batch[i];
            if (e->mtp_idx[i] <= j) continue;
            const int pos = r->n_tok - 1 + (j - 1); /* draft j - 1's position */
            const int want = pos / e->page_size + 1;
            if (r->n_pages < want) { /* a free page for the head's KV, never at anyone's expense */
                eng_reserve_pages(r, want);
                int32_t pg = pfxe_pages_avail(e) > e->n_running ? pfxe_page_get(e) : -1;
                if (pg < 0) continue;
                r->pages[r->n_pages++] = pg;
            }
            e->seqs[n2] = (fwd_seq){.slot = r->slot, .n_past = pos, .n_new = 1, .pages = r->pages};
            e->ids[n2] = r->mtp_draft[j - 1];
            e->mtp_src[n2] = e->mtp_row0[i]; /* its output row of the last pass */
            e->batch[n2] = r;                /* (n2 <= i: entries not yet read are not overwritten) */
            e->mtp_idx[n2] = e->mtp_idx[i];
            n2++;
        }
        if (!n2 || mtp_pass(e, n2, 1, 1, tok)) break;
        for (int q = 0; q < n2; q++) {
            ereq *r = e->batch[q];
            r->mtp_draft[j] = tok[q];
            r->n_mtp_draft = j + 1;
            e->mtp_row0[q] = q;
        }
        cnt = n2;
    }
}
