/* model.c: a model once open (model_load.c opens it: the checkpoint, the device, every weight
 * bound and loaded a layer at a time): close, the caches (paged KV pool, GDN state slots), the
 * workspace, and the forward pass skeleton shared by the architectures:
 *
 *   h = embed(ids)
 *   per layer:  h += attn_or_gdn(norm_in(h));  h += mlp_or_moe(norm_post(h))
 *   logits = lm_head(norm_final(h))            for the rows that want logits
 *
 * Devices: the same code runs on the CPU (fp32 activations, views into the
 * safetensors mapping) and on CUDA (BF16 activations; every weight copied
 * once at open into one device allocation (model_weights.c), BF16 stays BF16, NVFP4 stays
 * packed with its E4M3 scales, 1-D parameters fp32). All memory the forward
 * pass touches is on the model's device: the weights, the caches (KV pool in
 * kv_dt, GDN state fp32) and the workspace (mws: activations and the step's
 * token/sequence/page tables, uploaded with one copy per step); the host
 * gets back only the logits rows, or with device sampling only the chosen
 * tokens (and logprobs) of each row (fwd_batch.smp; ops.h smp_row).
 *
 * CUDA graphs ("CUDA graphs" below): a pure-decode step (every sequence
 * n_new = 1, device sampling) is padded to a batch-size bucket and
 * replayed from the bucket's graph (model_graphs_capture at start-up, or
 * on the bucket's first use, and again whenever it went stale). What a graph
 * bakes in (workspace, step-table and sampling buffers, caches) lives at
 * fixed addresses; per step only the tables' contents are copied in before
 * the launch. Any change of those addresses bumps graph_gen and the stale
 * graphs are re-captured. Padding rows run on a reserved GDN slot and KV page
 * beyond the engine's, and their results are dropped. With tensor
 * parallelism every rank holds its own graphs (its slice, its all-reduces)
 * and captures, replays or runs eagerly in step with the others: the
 * coordinator makes their staleness common before each step
 * (mdl_graphs_sync) and every decision on the capture path is agreed across
 * the ranks (tp_all); the start-up check runs through all ranks.
 *
 * Owns: the safetensors set (weights are views into its mapping), fp32
 * copies of the 1-D parameters, rows permuted at load (gated q_proj,
 * Qwen3-Next's fused projections), the device weights, caches, workspace; model_close frees
 * them all (what model_load.c bound included).
 */
#include "model/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
#include "ops/cuda/graph.h"
#endif

/* ---- forward helpers ----------------------------------------------------- */

int mdl_op_err(int rc, const char *op, int layer, ls_err *e) {
    if (!rc) return 0;
    if (layer < 0) return errf(e, rc, "forward: %s failed (code %d)", op, rc);
    return errf(e, rc, "layer %d: %s failed (code %d)", layer, op, rc);
}

/* ---- close ----------------------------------------------------------------- */

static void cache_free(const model *m, mcache *c) {
    m->mem->free(c->kv);
    m->mem->free(c->conv);
    m->mem->free(c->rec);
    m->mem->free(c->rec16);
    memset(c, 0, sizeof *c);
}

static void graphs_drop(model *m);

static void ws_free(model *m) {
    mws *w = &m->ws;
    graphs_drop(m);
    if (m->mem) {
        m->mem->free(w->act);
        if (w->meta != w->meta_host) m->mem->free(w->meta);
        m->mem->free(w->srow);
        m->mem->free(w->sout);
        m->mem->free(w->swork);
        m->mem->free(w->stoks);
        m->mem->free(m->attn_scratch);
    }
    m->attn_scratch = NULL;
    free(m->gpad);
    free(m->gpad_ids);
    free(m->gpad_smp);
    m->gpad = NULL;
    m->gpad_ids = NULL;
    m->gpad_smp = NULL;
    free(w->meta_host);
    free(w->aseq_host);
    free(w->lg_host);
    memset(w, 0, sizeof *w);
}

void model_close(model *m) {
    if (!m) return;
    tp_free(m);
    if (m->mem) {
        if (m->graph_stream) m->mem->sync(m->graph_stream, NULL);
        cache_free(m, &m->cache);
        ws_free(m);
        for (int i = 0; m->dev_part && i <= m->cfg.n_layers + m->n_mtp; i++) m->mem->free(m->dev_part[i]);
        free(m->dev_part);
#ifdef LS_HAVE_CUDA
        if (m->graph_stream) cug_stream_free(m->graph_stream);
#endif
        if (!m->graph_stream && (!m->is_rank || m->owns_stream)) m->mem->close_stream(m->ops.stream);
    }
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->used);
    if (m->st) st_close(m->st);
    if (!m->is_rank) hfcfg_free(&m->cfg);
    free(m->path);
    free(m);
}

const model_config *model_cfg(const model *m) { return &m->cfg; }
const char *model_path(const model *m) { return m->path; }
const char *model_device(const model *m) { return m->ops.dev.kind == DEV_CPU ? "cpu" : "cuda"; }
int model_samples_on_device(const model *m) {
    return (m->rank_m ? m->rank_m[0]->sampler : m->sampler) != NULL;
}
void model_graph_stats_get(const model *m, model_graph_stats *out) {
    const model *r = m->rank_m ? m->rank_m[0] : m;
    *out = (model_graph_stats){.replayed = r->n_replayed, .eager = r->n_eager, .captured = r->n_captured};
}
size_t model_device_mem(const model *m) { return m->ops.dev.kind == DEV_CPU ? 0 : m->ops.dev.mem_bytes; }

/* ---- caches ---------------------------------------------------------------- */

static size_t conv_floats(const model_config *c) {
    return (size_t)(2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim) * (c->lin_conv - 1);
}
static size_t rec_floats(const model_config *c) {
    return (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}
/* bytes of one element of the recurrent state (mcache.rec or rec16) */
static size_t rec_esize(const model_config *c) { return c->state_bf16 ? 2 : 4; }

size_t model_kv_page_bytes(const model *m, int page_size) {
    if (m->rank_m) {
        size_t n = 0;
        for (int r = 0; r < m->tp; r++) n += model_kv_page_bytes(m->rank_m[r], page_size);
        return n;
    }
    /* every full-attention layer's K and V, and the MTP head's when it is loaded */
    return (size_t)(m->n_full + m->n_mtp) * 2 * page_size * m->cfg.n_kv_heads * m->cfg.head_dim * act_size(m->kv_dt);
}

size_t model_slot_bytes(const model *m) {
    if (m->rank_m) {
        size_t n = 0;
        for (int r = 0; r < m->tp; r++) n += model_slot_bytes(m->rank_m[r]);
        return n;
    }
    return (size_t)m->n_lin * (conv_floats(&m->cfg) * sizeof(float) + rec_floats(&m->cfg) * rec_esize(&m->cfg));
}

static int cache_alloc(const model *m, const model_cache_opts *o, mcache *c, ls_err *e) {
    if (o->page_size < 1 || o->n_pages < 1 || o->n_slots < 1)
        return errf(e, ERR_INVAL, "cache: page_size %d, n_pages %d, n_slots %d must all be >= 1",
                    o->page_size, o->n_pages, o->n_slots);
    memset(c, 0, sizeof *c);
    c->page_size = o->page_size;
    c->n_pages = o->n_pages;
    c->n_slots = o->n_slots;
    size_t kv = model_kv_page_bytes(m, o->page_size) * o->n_pages;
    size_t nc = (size_t)m->n_lin * o->n_slots * conv_floats(&m->cfg) * sizeof(float);
    size_t nr = (size_t)m->n_lin * o->n_slots * rec_floats(&m->cfg) * rec_esize(&m->cfg);
    ls_err ae = {0};
    void *rb = NULL;
    int bad = (kv && !(c->kv = m->mem->alloc(kv, &ae))) ||
              (nc && !(c->conv = m->mem->alloc(nc, &ae))) ||
              (nr && !(rb = m->mem->alloc(nr, &ae)));
    if (m->cfg.state_bf16) c->rec16 = rb;
    else c->rec = rb;
    int rc = bad ? ERR_NOMEM : 0;
    /* KV pages are always written before they are read; GDN state starts at zero (also in BF16) */
    if (!rc && nc) rc = m->mem->memset0(c->conv, nc, m->ops.stream, &ae);
    if (!rc && nr) rc = m->mem->memset0(rb, nr, m->ops.stream, &ae);
    if (rc) {
        cache_free(m, c);
        return errf(e, ERR_NOMEM, "cache: cannot allocate %zu bytes of KV and %zu of GDN state on %s: %s",
                    kv, nc + nr, m->ops.dev.name, ae.msg);
    }
    return 0;
}

/* ---- workspace ---------------------------------------------------------------- */

/* Lay the activation buffers out in one block for T tokens; returns its bytes
 * (base NULL: sizes only). */
static size_t ws_layout(const model *m, int T, char *base, mws *w) {
    const model_config *c = &m->cfg;
    const size_t t = (size_t)T;
    size_t off = 0, es = sizeof(float);
#define TAKE(field, cols)                                              \
    do {                                                               \
        w->field = base ? base + off : NULL;                           \
        off += align256(t * (size_t)(cols) * es);                      \
    } while (0)
    TAKE(h, c->hidden); /* the residual stream: fp32 on every device */
    es = act_size(m->ops.act);
    TAKE(u, c->hidden);
    TAKE(o, c->hidden);
    TAKE(hl, c->hidden);
    TAKE(hm, m->n_mtp ? c->hidden : 0);
    TAKE(hs, m->n_mtp ? c->hidden : 0);
    TAKE(red, m->grp ? c->hidden : 0);
    if (m->n_full + m->n_mtp) { /* the MTP head attends too */
        const int nq = c->n_heads * c->head_dim, nk = c->n_kv_heads * c->head_dim;
        TAKE(q, nq);
        TAKE(gate, c->attn_output_gate ? nq : 0);
        TAKE(k, nk);
        TAKE(v, nk);
        TAKE(ao, nq);
    }
    if (m->n_lin) {
        const int vd = c->lin_v_heads * c->lin_v_dim;
        TAKE(qkv, 2 * c->lin_k_heads * c->lin_k_dim + vd);
        TAKE(z, vd);
        TAKE(b, c->lin_v_heads);
        TAKE(a, c->lin_v_heads);
        TAKE(core, vd);
    }
    int I = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (m->layers[l].dense && m->layers[l].mlp.gate.N > I) I = m->layers[l].mlp.gate.N;
    TAKE(g, I);
    TAKE(up, I);
    TAKE(logits, m->ops.dev.kind == DEV_CPU ? 0 : c->vocab);
#undef TAKE
    return off;
}

static size_t meta_bytes(int T, int S, int P) {
    return 3 * align256((size_t)T * sizeof(int32_t)) + align256((size_t)S * sizeof(attn_seq)) +
           align256((size_t)S * sizeof(gdn_seq)) + align256((size_t)P * sizeof(int32_t)) +
           align256((size_t)MODEL_GDN_CALLS_MAX * S * sizeof(gdn_seq)) + /* the GDN op's calls (next_snap_tables) */
           align256((size_t)T * sizeof(int32_t));                        /* an MTP pass's hidden-state rows */
}

/* Make the workspace hold a step of T tokens, S sequences and P page-table
 * entries (capacities only grow). */
static int ws_reserve(model *m, int T, int S, int P, ls_err *e) {
    mws *w = &m->ws;
    const int on_cpu = m->ops.dev.kind == DEV_CPU;
    if (T > w->cap_tok) {
        if (w->act) log_debug("%s: forward workspace grows to %d tokens", m->path, T);
        m->mem->free(w->act);
        w->act = NULL;
        w->cap_tok = 0;
        mws lay = *w;
        size_t n = ws_layout(m, T, NULL, &lay);
        char *blk = m->mem->alloc(n, e);
        if (!blk) return err_prefix(e, "forward workspace for %d tokens", T);
        ws_layout(m, T, blk, w);
        w->act = blk;
        w->cap_tok = T;
        m->graph_gen++;
        free(w->lg_host);
        w->lg_host = on_cpu ? NULL : xmalloc((size_t)T * m->cfg.vocab * act_size(m->ops.act));
    }
    if (T > w->cap_seq || S > w->cap_seq || P > w->cap_pages || !w->meta_host) {
        int nt = T > w->cap_seq ? T : w->cap_seq, np = P > w->cap_pages ? P : w->cap_pages;
        if (S > nt) nt = S;
        size_t n = meta_bytes(nt, nt, np);
        if (w->meta != w->meta_host) m->mem->free(w->meta);
        free(w->meta_host);
        free(w->aseq_host);
        w->meta = w->meta_host = NULL;
        w->aseq_host = NULL;
        w->cap_seq = w->cap_pages = 0;
        w->meta_host = xmalloc(n);
        w->aseq_host = xmalloc(sizeof(attn_seq) * (size_t)nt);
        if (on_cpu) {
            w->meta = w->meta_host;
        } else if (!(w->meta = m->mem->alloc(n, e))) {
            return err_prefix(e, "forward step tables (%d tokens, %d pages)", nt, np);
        }
        w->cap_seq = nt;
        w->cap_pages = np;
        m->graph_gen++;
    }
    return 0;
}

/* Device sampling buffers for `rows` rows and `n_toks` list entries (grown
 * only, after the stream drained: a captured graph may still read them). */
static int smp_reserve(model *m, int rows, int n_toks, ls_err *e) {
    mws *w = &m->ws;
    if (rows > w->cap_srows) {
        if (w->srow) m->mem->sync(m->ops.stream, NULL);
        m->mem->free(w->srow);
        m->mem->free(w->sout);
        m->mem->free(w->swork);
        w->srow = NULL;
        w->sout = NULL;
        w->swork = NULL;
        w->cap_srows = 0;
        if (!(w->srow = m->mem->alloc(sizeof(smp_row) * (size_t)rows, e)) ||
            !(w->sout = m->mem->alloc(sizeof(smp_out) * (size_t)rows, e)) ||
            !(w->swork = m->mem->alloc(sizeof(float) * (size_t)rows * m->cfg.vocab, e)))
            return err_prefix(e, "sampling buffers for %d rows", rows);
        w->cap_srows = rows;
        m->graph_gen++;
    }
    if (n_toks > w->cap_stoks) {
        int cap = n_toks > 2 * w->cap_stoks ? n_toks : 2 * w->cap_stoks;
        if (cap < 4096) cap = 4096;
        if (w->stoks) m->mem->sync(m->ops.stream, NULL);
        m->mem->free(w->stoks);
        w->cap_stoks = 0;
        if (!(w->stoks = m->mem->alloc(sizeof(int32_t) * (size_t)cap, e)))
            return err_prefix(e, "sampling token lists (%d ids)", cap);
        w->cap_stoks = cap;
        m->graph_gen++;
    }
    return 0;
}

/* The rows' sampling parameters and token lists to the device. */
static int smp_upload(model *m, const smp_row *rows, int n_rows, const int32_t *toks, int n_toks, ls_err *e) {
    mws *w = &m->ws;
    int rc = m->mem->h2d(w->srow, rows, sizeof(smp_row) * (size_t)n_rows, m->ops.stream, e);
    if (!rc && n_toks > 0)
        rc = m->mem->h2d(w->stoks, toks, sizeof(int32_t) * (size_t)n_toks, m->ops.stream, e);
    return rc ? err_prefix(e, "sampling tables to %s", m->ops.dev.name) : 0;
}

/* ---- CUDA graphs: buckets ----------------------------------------------------------- */

/* Bucket sizes: every power of two to 8 (where one padded row costs the most
 * relative to the batch), then steps of at most 1.5x so a padded batch wastes
 * under a third of its rows; the engine's largest batch closes the list. */
static const int k_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512};

static void graphs_drop(model *m) {
    for (int i = 0; i < m->n_graphs; i++) {
#ifdef LS_HAVE_CUDA
        cug_destroy(m->graphs[i].exec);
#endif
        m->graphs[i].exec = NULL;
        m->graphs[i].state = 0;
    }
}

static void graphs_setup(model *m, int max_bs) {
    graphs_drop(m);
    m->n_graphs = 0;
    for (size_t i = 0; i < sizeof k_buckets / sizeof *k_buckets && k_buckets[i] <= max_bs; i++)
        m->graphs[m->n_graphs++] = (mgraph){.bs = k_buckets[i]};
    if (m->n_graphs < MG_MAX && (!m->n_graphs || m->graphs[m->n_graphs - 1].bs < max_bs))
        m->graphs[m->n_graphs++] = (mgraph){.bs = max_bs};
}



int model_cache_init(model *m, const model_cache_opts *o, ls_err *e) {
    model_cache_opts ro = *o;
    if (m->rank_m && o->graph_max_bs > 0 && m->ops.dev.kind != DEV_CPU) {
        char why[256];
        if (!tp_graphs_supported(m, why, sizeof why)) {
            log_info("%s: CUDA graphs off with --tp %d: %s (tensor-parallel steps run eagerly)", m->path, m->tp,
                     why);
            ro.graph_max_bs = 0;
        }
    }
    for (int r = 0; m->rank_m && r < m->tp; r++) {
        model *rm = m->rank_m[r];
        int rc = rm->mem->bind_thread(rm->ops.dev.ordinal, e);
        if (!rc) rc = model_cache_init(rm, &ro, e);
        if (rc) return rc;
    }
    cache_free(m, &m->cache);
    if (m->rank_m) { /* the coordinator keeps only the geometry, for check_batch */
        m->cache = m->rank_m[0]->cache;
        m->cache.kv = NULL;
        m->cache.conv = m->cache.rec = NULL;
        m->cache.rec16 = NULL;
        return 0;
    }
    /* graphs: a device (the only model, or a TP rank whose coordinator let them through), with a
     * GDN slot and a KV page for the padding rows */
    int graphs = o->graph_max_bs > 0 && m->ops.dev.kind != DEV_CPU && m->sampler;
    model_cache_opts co = *o;
    if (graphs) {
        co.n_pages++;
        co.n_slots++;
    }
    graphs_drop(m);
    m->graph_gen++;
    int rc = cache_alloc(m, &co, &m->cache, e);
    if (rc) return rc;
    /* the workspace: sized for the engine's largest step up front, so decode never allocates */
    int T = o->max_tokens > 0 ? o->max_tokens : 256;
    int S = (o->max_seqs > 0 && o->max_seqs < o->n_slots ? o->max_seqs : o->n_slots) + (graphs ? 1 : 0);
    if (T < S) T = S;
    if ((rc = ws_reserve(m, T, S, co.n_pages + S, e))) return rc;
    /* token lists: 1M ids (4 MiB) up front, so penalty lists rarely grow them (which re-captures) */
    if (m->sampler && (rc = smp_reserve(m, o->max_sample_rows > S ? o->max_sample_rows : S, 1 << 20, e))) return rc;
    m->graph_max_bs = 0;
    m->n_graphs = 0;
    if (!graphs) return 0;
    m->scratch_page = o->n_pages;
    m->scratch_slot = o->n_slots;
#ifdef LS_HAVE_CUDA
    if (!m->graph_stream) { /* the legacy default stream the model runs on cannot be captured */
        if ((rc = m->mem->sync(m->ops.stream, e)) || (rc = cug_stream_new(&m->graph_stream, e)))
            return err_prefix(e, "CUDA graphs: the model's stream");
        m->ops.stream = m->graph_stream;
    }
#endif
    m->ctx_cap = o->ctx_cap > 0 ? o->ctx_cap : o->n_pages * o->page_size;
    graphs_setup(m, o->graph_max_bs < S - 1 ? o->graph_max_bs : S - 1);
    m->graph_max_bs = m->graphs[m->n_graphs - 1].bs;
#ifdef LS_HAVE_CUDA
    size_t ab = 0;
    if (m->n_full + m->n_mtp)
        for (int i = 0; i < m->n_graphs; i++) {
            size_t b = attn_cuda_scratch_bytes(m->graphs[i].bs, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim,
                                               m->ctx_cap);
            if (b > ab) ab = b;
        }
    m->mem->free(m->attn_scratch);
    m->attn_scratch = NULL;
    m->attn_scratch_bytes = 0;
    if (ab && !(m->attn_scratch = m->mem->alloc(ab, e)))
        return err_prefix(e, "attention scratch for CUDA graphs (%.1f MiB)", ab / 1048576.0);
    m->attn_scratch_bytes = ab;
#endif
    free(m->gpad);
    free(m->gpad_ids);
    free(m->gpad_smp);
    m->gpad = xcalloc((size_t)m->graph_max_bs, sizeof *m->gpad);
    m->gpad_ids = xcalloc((size_t)m->graph_max_bs, sizeof *m->gpad_ids);
    m->gpad_smp = xcalloc((size_t)m->graph_max_bs, sizeof *m->gpad_smp);
    char list[256];
    int k = 0;
    for (int i = 0; i < m->n_graphs && k < (int)sizeof list - 8; i++)
        k += snprintf(list + k, sizeof list - k, "%s%d", i ? "," : "", m->graphs[i].bs);
    if (m->rank == 0)
        log_info("%s: CUDA graphs for decode steps%s, batch buckets %s, context cap %d, "
                 "attention scratch %.1f MiB%s", m->path, m->grp ? " on every tensor-parallel rank" : "", list,
                 m->ctx_cap, m->attn_scratch_bytes / 1048576.0, m->grp ? " per rank" : "");
    return 0;
}

static void slot_reset(const model *m, mcache *c, int slot) {
    if (slot < 0 || slot >= c->n_slots) return;
    const size_t nc = conv_floats(&m->cfg), nr = rec_floats(&m->cfg), es = rec_esize(&m->cfg);
    char *rec = c->rec16 ? (char *)c->rec16 : (char *)c->rec;
    for (int l = 0; l < m->n_lin; l++) {
        m->mem->memset0(c->conv + ((size_t)l * c->n_slots + slot) * nc, sizeof(float) * nc,
                        m->ops.stream, NULL);
        m->mem->memset0(rec + ((size_t)l * c->n_slots + slot) * nr * es, es * nr, m->ops.stream, NULL);
    }
}

void model_slot_reset(model *m, int slot) {
    for (int r = 0; m->rank_m && r < m->tp; r++) {
        model *rm = m->rank_m[r];
        rm->mem->bind_thread(rm->ops.dev.ordinal, NULL);
        model_slot_reset(rm, slot);
    }
    if (!m->rank_m) slot_reset(m, &m->cache, slot);
}

static int slot_copy(const model *m, mcache *c, int dst, int src, ls_err *e) {
    if (dst < 0 || dst >= c->n_slots || src < 0 || src >= c->n_slots)
        return errf(e, ERR_INVAL, "slot copy %d -> %d: slots are 0 .. %d", src, dst, c->n_slots - 1);
    if (dst == src) return 0;
    const size_t nc = conv_floats(&m->cfg), nr = rec_floats(&m->cfg) * rec_esize(&m->cfg); /* nr in bytes */
    char *rec = c->rec16 ? (char *)c->rec16 : (char *)c->rec;
    for (int l = 0; l < m->n_lin; l++) {
        float *cb = c->conv + (size_t)l * c->n_slots * nc;
        char *rb = rec + (size_t)l * c->n_slots * nr;
        int rc = m->mem->d2d(cb + (size_t)dst * nc, cb + (size_t)src * nc, sizeof(float) * nc, m->ops.stream, e);
        if (!rc) rc = m->mem->d2d(rb + (size_t)dst * nr, rb + (size_t)src * nr, nr, m->ops.stream, e);
        if (rc) return err_prefix(e, "GDN state copy, slot %d -> %d", src, dst);
    }
    return 0;
}

int model_slot_copy(model *m, int dst, int src, ls_err *e) {
    for (int r = 0; m->rank_m && r < m->tp; r++) {
        model *rm = m->rank_m[r];
        int rc = rm->mem->bind_thread(rm->ops.dev.ordinal, e);
        if (!rc) rc = model_slot_copy(rm, dst, src, e);
        if (rc) return rc;
    }
    return m->rank_m ? 0 : slot_copy(m, &m->cache, dst, src, e);
}

/* ---- forward ----------------------------------------------------------------- */

static int check_batch(const model *m, const mcache *c, const fwd_batch *b, ls_err *e) {
    if (!c->page_size) return errf(e, ERR_INVAL, "forward: the cache is not initialised (model_cache_init)");
    if (b->n_seq < 1) return errf(e, ERR_INVAL, "forward: empty batch");
    int row = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const fwd_seq *q = &b->seqs[s];
        if (q->n_new < 1 || q->n_past < 0)
            return errf(e, ERR_INVAL, "forward: sequence %d has n_past %d, n_new %d", s, q->n_past, q->n_new);
        if (m->n_lin && (q->slot < 0 || q->slot >= c->n_slots))
            return errf(e, ERR_INVAL, "forward: sequence %d uses GDN slot %d outside [0, %d)", s, q->slot,
                        c->n_slots);
        for (int r = 0; m->n_lin && r < s; r++)
            if (b->seqs[r].slot == q->slot)
                return errf(e, ERR_INVAL, "forward: sequences %d and %d share GDN slot %d", r, s, q->slot);
        if (m->n_full + m->n_mtp) {
            int np = (q->n_past + q->n_new + c->page_size - 1) / c->page_size;
            for (int i = 0; i < np; i++)
                if (!q->pages || q->pages[i] < 0 || q->pages[i] >= c->n_pages)
                    return errf(e, ERR_INVAL, "forward: sequence %d page %d is outside the pool of %d", s,
                                q->pages ? q->pages[i] : -1, c->n_pages);
        }
        if (q->n_snap < 0 || q->n_snap > MODEL_SNAP_MAX)
            return errf(e, ERR_INVAL, "forward: sequence %d asks for %d GDN snapshots (0 .. %d)", s, q->n_snap,
                        MODEL_SNAP_MAX);
        for (int i = 0; m->n_lin && i < q->n_snap; i++) {
            int lo = i ? q->snap_off[i - 1] : 0, slot = q->snap_slot[i];
            if (q->snap_off[i] <= lo || q->snap_off[i] >= q->n_new)
                return errf(e, ERR_INVAL, "forward: sequence %d snapshot %d at new token %d, outside (%d, %d)", s, i,
                            q->snap_off[i], lo, q->n_new);
            if (slot < 0 || slot >= c->n_slots)
                return errf(e, ERR_INVAL, "forward: sequence %d snapshot %d into GDN slot %d outside [0, %d)", s, i,
                            slot, c->n_slots);
            for (int r = 0; r < b->n_seq; r++) {
                if (b->seqs[r].slot == slot)
                    return errf(e, ERR_INVAL, "forward: sequence %d snapshot %d into GDN slot %d, sequence %d's", s,
                                i, slot, r);
                for (int k = 0; k < b->seqs[r].n_snap && (r < s || (r == s && k < i)); k++)
                    if (b->seqs[r].snap_slot[k] == slot)
                        return errf(e, ERR_INVAL, "forward: two snapshots of the step into GDN slot %d", slot);
            }
        }
        for (int i = 0; i < q->n_new; i++, row++)
            if (b->ids[row] < 0 || b->ids[row] >= m->cfg.vocab)
                return errf(e, ERR_INVAL, "forward: token id %d outside the vocabulary [0, %d)",
                            b->ids[row], m->cfg.vocab);
    }
    if (b->mtp) {
        if (!m->n_mtp) return errf(e, ERR_INVAL, "forward: an MTP pass, but the MTP head is not loaded (model_opts.mtp)");
        const int have = b->mtp_self ? m->mtp_rows_self : m->mtp_rows_main;
        for (int i = 0; i < row; i++)
            if (!b->mtp_src || b->mtp_src[i] < 0 || b->mtp_src[i] >= have)
                return errf(e, ERR_INVAL, "forward: MTP row %d takes hidden row %d of the last %s pass's %d", i,
                            b->mtp_src ? b->mtp_src[i] : -1, b->mtp_self ? "MTP" : "model", have);
    }
    return 0;
}

/* The step's tables (ids, positions, logits rows, per-sequence attention
 * and GDN views, page tables) built on the host and copied to the device in
 * one transfer. Returns the number of logits rows. */
static int upload_tables(model *m, const mcache *c, const fwd_batch *b, int T, fwd_ctx *f,
                         const int32_t **d_ids, const int32_t **d_rows, ls_err *e) {
    mws *w = &m->ws;
    const int S = b->n_seq;
    char *h = w->meta_host, *d = w->meta;
    const size_t o_pos = align256((size_t)T * 4), o_rows = 2 * o_pos;
    const size_t o_aseq = 3 * o_pos;
    const size_t o_gseq = o_aseq + align256((size_t)S * sizeof(attn_seq));
    const size_t o_pages = o_gseq + align256((size_t)S * sizeof(gdn_seq));
    int32_t *ids = (int32_t *)h, *pos = (int32_t *)(h + o_pos), *rows = (int32_t *)(h + o_rows);
    attn_seq *as = (attn_seq *)(h + o_aseq);
    gdn_seq *gs = (gdn_seq *)(h + o_gseq);
    int32_t *pg = (int32_t *)(h + o_pages);
    memcpy(ids, b->ids, sizeof(int32_t) * T);
    int n_rows = 0, np = 0;
    for (int s = 0, row = 0; s < S; s++) {
        const fwd_seq *q = &b->seqs[s];
        int n_pg = m->n_full + m->n_mtp ? (q->n_past + q->n_new + c->page_size - 1) / c->page_size : 0;
        memcpy(pg + np, q->pages, sizeof(int32_t) * n_pg);
        as[s] = (attn_seq){.n_past = q->n_past, .n_new = q->n_new, .row0 = row,
                           .pages = (const int32_t *)(d + o_pages) + np};
        w->aseq_host[s] = as[s];
        w->aseq_host[s].pages = pg + np;
        gs[s] = (gdn_seq){.slot = q->slot, .n_new = q->n_new, .row0 = row};
        np += n_pg;
        for (int i = 0; i < q->n_new; i++) pos[row + i] = q->n_past + i;
        for (int i = q->logits_all ? 0 : q->n_new - 1; i < q->n_new; i++) rows[n_rows++] = row + i;
        row += q->n_new;
    }
    /* the GDN op's calls (in-step snapshots, decode rows apart from chunks), after the page tables */
    const size_t o_piece = o_pages + align256(sizeof(int32_t) * np);
    f->seqs = b->seqs;
    f->n_piece = m->n_lin ? next_snap_tables(f, b->seqs, S, gs, (gdn_seq *)(h + o_piece)) : 0;
    for (int p = 0; p < f->n_piece; p++) {
        f->gpiece[p] = (const gdn_seq *)(d + o_piece) + (size_t)p * S;
        f->gpiece_host[p] = (const gdn_seq *)(h + o_piece) + (size_t)p * S;
    }
    if (d != h) {
        size_t n = f->n_piece ? o_piece + sizeof(gdn_seq) * (size_t)f->n_piece * S : o_pages + sizeof(int32_t) * np;
        int rc = m->mem->h2d(d, h, n, m->ops.stream, e);
        if (rc) return err_prefix(e, "forward: step tables to %s", m->ops.dev.name);
    }
    *d_ids = (const int32_t *)d;
    f->pos = (const int32_t *)(d + o_pos);
    *d_rows = (const int32_t *)(d + o_rows);
    f->aseq = (const attn_seq *)(d + o_aseq);
    f->gseq = (const gdn_seq *)(d + o_gseq);
    f->aseq_host = w->aseq_host;
    f->gseq_host = gs;
    return n_rows;
}

/* Rank 0's end of a pass: the lm_head over the n_rows rows x [n_rows, H] with its own gemm plan
 * (mdl_lm_ops; M = the rows that want logits) into the caller's fp32 logits (the CPU) or the
 * device's activation-dtype logits, then, with do_sample, the device sampler over them. */
static int logits_tail(model *m, const void *x, int n_rows, float *cpu_logits, int do_sample, ls_err *e) {
    mws *w = &m->ws;
    ops_sel lm_tmp;
    const ops_sel *lo = mdl_lm_ops(m, &lm_tmp);
    if (m->ops.dev.kind == DEV_CPU) return ops_linear(lo, n_rows, x, &m->lm_head, cpu_logits, 0, e);
    int rc = ops_linear(lo, n_rows, x, &m->lm_head, w->logits, 0, e);
    if (rc || !do_sample) return rc;
    sample_args sa = {.rows = n_rows, .vocab = m->cfg.vocab, .logits = w->logits, .dt = m->ops.act, .p = w->srow,
                      .toks = w->stoks, .work = w->swork, .out = w->sout};
    return m->sampler->run(&sa, m->ops.stream, e);
}

/* The MTP head's pass (fwd_batch.mtp): x = fc(cat(pre_e · embed(ids), pre_h · h_src)) as two
 * GEMMs whose outputs the residual stream sums in fp32, the head's decoder layer, and (every
 * rank: the next mtp_self pass gathers from it) its mtp.norm output of the logits rows into
 * ws.hs; then, as a model pass, rank 0's lm_head and sampler over those rows. */
static int mtp_body(model *m, fwd_ctx *f, const int32_t *d_ids, const int32_t *d_src, int self,
                    const int32_t *d_rows, int n_rows, float *cpu_logits, int do_sample, ls_err *e) {
    const model_config *cfg = &m->cfg;
    const small_ops *so = m->ops.small;
    const act_dtype dt = m->ops.act;
    const ls_stream st = m->ops.stream;
    const int H = cfg->hidden, T = f->n_tok, l = cfg->n_layers;
    const layer_w *L = &m->layers[l];
    const mtp_glue *g = L->mtp;
    mws *w = f->ws;
    const size_t TH = (size_t)T * H;
    int rc = mdl_op_err(so->embed(T, d_ids, &m->embed, w->o, dt, st), "MTP embedding lookup", l, e);
    if (!rc) rc = mdl_op_err(so->rmsnorm(T, H, w->o, g->pre_e, m->norm_kind, cfg->rms_eps, w->u, dt, st),
                             "MTP pre_fc_norm_embedding", l, e);
    if (!rc) rc = mdl_op_err(so->gather_rows(T, H, d_src, self ? w->hs : w->hm, w->hl, dt, st),
                             "MTP hidden-state gather", l, e);
    if (!rc) rc = mdl_op_err(so->rmsnorm(T, H, w->hl, g->pre_h, m->norm_kind, cfg->rms_eps, w->hl, dt, st),
                             "MTP pre_fc_norm_hidden", l, e);
    if (!rc) rc = ops_linear(&m->ops, T, w->u, &g->fc_e, w->o, 0, e);
    if (!rc) rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, 1, L->in_norm, m->norm_kind, cfg->rms_eps, w->u, dt,
                                             st), "MTP fc (embedding half)", l, e);
    if (!rc) rc = ops_linear(&m->ops, T, w->hl, &g->fc_h, w->o, 0, e);
    if (!rc) rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, 0, L->in_norm, m->norm_kind, cfg->rms_eps, w->u, dt,
                                             st), "MTP fc + input norm", l, e);
    /* with TP, a rank that failed keeps meeting the others at the all-reduces */
    if (!rc) rc = qwen3_attn_forward(f, l, w->u, w->o, e);
    if (m->grp) tp_allreduce(m, w->o, TH);
    if (!rc)
        rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, 0, L->post_norm, m->norm_kind, cfg->rms_eps, w->u, dt, st),
                        "MTP residual add + post-attention norm", l, e);
    if (!rc) rc = qwen3_mlp_forward(f, l, w->u, w->o, e);
    if (m->grp) tp_allreduce(m, w->o, TH);
    if (!rc && m->grp) rc = tp_status(m, e);
    if (rc || !n_rows) return rc;
    if ((rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, 0, g->norm, m->norm_kind, cfg->rms_eps, w->u, dt, st),
                         "MTP residual add + mtp.norm", l, e)) ||
        (rc = mdl_op_err(so->gather_rows(n_rows, H, d_rows, w->u, w->hs, dt, st), "MTP output rows", l, e)) ||
        m->rank > 0)
        return rc;
    return logits_tail(m, w->hs, n_rows, cpu_logits, do_sample, e);
}

/* The pass itself over uploaded tables: embedding, the layers, and on rank 0
 * the logits rows (gather, final norm, lm_head) and, with do_sample, the
 * sampler over them. Only stream-ordered device work (and, with TP, the
 * all-reduces), so it can run eagerly or under graph capture. */
static int forward_body(model *m, fwd_ctx *f, const int32_t *d_ids, const int32_t *d_rows, int n_rows,
                        float *cpu_logits, int do_sample, ls_err *e) {
    const model_config *cfg = &m->cfg;
    const small_ops *so = m->ops.small;
    const act_dtype dt = m->ops.act;
    const ls_stream st = m->ops.stream;
    const int H = cfg->hidden, T = f->n_tok;
    mws *w = f->ws;
    /* The residual stream h is fp32 on every device (BF16 rounding of the running sum is what
     * the hybrid models amplify most, bench/gpu_forward_results.md): each block's output o
     * (activation dtype) is added to it by the norm that follows, which writes the next
     * block's input u. The embedding goes through o into the first add (init). */
    int rc = mdl_op_err(so->embed(T, d_ids, &m->embed, w->o, dt, st), "embedding lookup", -1, e);
    /* with TP, a rank that failed keeps meeting the others at the all-reduces */
    const size_t TH = (size_t)T * H;
    for (int l = 0; l < cfg->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        if (!rc)
            rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, l == 0, L->in_norm, m->norm_kind, cfg->rms_eps,
                                            w->u, dt, st), "residual add + input norm", l, e);
        if (!rc)
            rc = L->type == LAYER_FULL_ATTN ? qwen3_attn_forward(f, l, w->u, w->o, e)
                                            : next_gdn_forward(f, l, w->u, w->o, e);
        if (m->grp) tp_allreduce(m, w->o, TH);
        if (!rc)
            rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, 0, L->post_norm, m->norm_kind, cfg->rms_eps,
                                            w->u, dt, st), "residual add + post-attention norm", l, e);
        if (!rc) rc = qwen3_mlp_forward(f, l, w->u, w->o, e);
        if (m->grp) tp_allreduce(m, w->o, TH);
    }
    if (!rc && m->grp) rc = tp_status(m, e);
    /* rank 0 alone computes the logits; with the MTP head every rank keeps the final-normed rows
     * (ws.hm: the head's next pass takes them, on every rank) */
    if (rc || (m->rank > 0 && !m->n_mtp)) return rc;
    /* the last add with the final norm (every row: as cheap as a gather), then the rows that
     * want logits: all new tokens (logits_all) or the last one */
    void *hn = m->n_mtp ? w->hm : w->u;
    if ((rc = mdl_op_err(so->add_rmsnorm(T, H, w->h, w->o, cfg->n_layers == 0, m->final_norm, m->norm_kind,
                                         cfg->rms_eps, hn, dt, st), "residual add + final norm", -1, e)) ||
        m->rank > 0 ||
        (rc = mdl_op_err(so->gather_rows(n_rows, H, d_rows, hn, w->hl, dt, st), "logits row gather",
                         -1, e)))
        return rc;
    return logits_tail(m, w->hl, n_rows, cpu_logits, do_sample, e);
}

/* After the pass (rank 0, devices): the sampled rows, or the logits rows
 * widened to fp32, back to the caller. n_rows: the caller's rows. */
static int forward_results(model *m, const fwd_batch *b, int n_rows, ls_err *e) {
    mws *w = &m->ws;
    const ls_stream st = m->ops.stream;
    int rc;
    if (b->smp) {
        if ((rc = m->mem->d2h(b->smp_res, w->sout, sizeof(smp_out) * (size_t)n_rows, st, e)))
            return err_prefix(e, "forward on %s", m->ops.dev.name);
        return 0;
    }
    const size_t n = (size_t)n_rows * m->cfg.vocab;
    if ((rc = m->mem->d2h(w->lg_host, w->logits, n * act_size(m->ops.act), st, e)))
        return err_prefix(e, "forward on %s", m->ops.dev.name);
    if (m->ops.act == ACT_BF16)
        for (size_t i = 0; i < n; i++) b->logits[i] = bf16_to_f32(w->lg_host[i]);
    else
        memcpy(b->logits, (const void *)w->lg_host, n * sizeof(float));
    return 0;
}

/* Pages, tokens and longest context of a batch. */
static void batch_dims(const model *m, const mcache *c, const fwd_batch *b, int *T, int *P, int *max_ctx) {
    *T = *P = *max_ctx = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const fwd_seq *q = &b->seqs[s];
        *T += q->n_new;
        if (q->n_past + q->n_new > *max_ctx) *max_ctx = q->n_past + q->n_new;
        if (m->n_full + m->n_mtp) *P += (q->n_past + q->n_new + c->page_size - 1) / c->page_size;
    }
}

/* One eager pass over b on the workspace: tables, body; results left on the device. */
static int forward_eager(model *m, mcache *c, const fwd_batch *b, int *n_rows, ls_err *e) {
    int T, P, max_ctx;
    batch_dims(m, c, b, &T, &P, &max_ctx);
    int rc;
    if ((rc = ws_reserve(m, T, b->n_seq, P, e))) return rc;
    mws *w = &m->ws;
    fwd_ctx f = {.m = m, .c = c, .ws = w, .n_tok = T, .n_seq = b->n_seq, .max_ctx = max_ctx};
    const int32_t *d_ids = NULL, *d_rows = NULL;
    int nr = upload_tables(m, c, b, T, &f, &d_ids, &d_rows, e);
    if (nr < 0) return nr;
    *n_rows = nr;
    if (b->mtp && b->mtp_nologits) *n_rows = nr = 0;
    int do_sample = b->smp && m->rank == 0 && nr > 0;
    if (do_sample) {
        if ((rc = smp_reserve(m, nr, b->n_toks, e)) || (rc = smp_upload(m, b->smp, nr, b->toks, b->n_toks, e)))
            return rc;
    }
    if (b->mtp) { /* the rows' hidden sources after the step tables (the same meta block) */
        const size_t o_src = meta_bytes(T, b->n_seq, P) - align256((size_t)T * sizeof(int32_t));
        int32_t *src = (int32_t *)(w->meta_host + o_src);
        memcpy(src, b->mtp_src, sizeof(int32_t) * (size_t)T);
        const int32_t *d_src = (const int32_t *)((char *)w->meta + o_src);
        if (w->meta != w->meta_host && (rc = m->mem->h2d((void *)d_src, src, sizeof(int32_t) * (size_t)T,
                                                         m->ops.stream, e)))
            return err_prefix(e, "forward: MTP rows to %s", m->ops.dev.name);
        return mtp_body(m, &f, d_ids, d_src, b->mtp_self, d_rows, nr, b->logits, do_sample, e);
    }
    return forward_body(m, &f, d_ids, d_rows, nr, b->logits, do_sample, e);
}

/* ---- CUDA graphs: capture and replay -------------------------------------------------- */

#ifdef LS_HAVE_CUDA
static mgraph *graph_for(model *m, int n) {
    for (int i = 0; i < m->n_graphs; i++)
        if (m->graphs[i].bs >= n) return &m->graphs[i];
    return NULL;
}

/* n single-token sequences on the scratch slot and page, run eagerly and
 * thrown away: grows every backend's workspace to its size for n tokens and
 * makes the backends' lazily uploaded tables resident, so that a capture
 * afterwards records kernels only. rehearse: with the backends a capture
 * picks (ops_sel.capturing = 2). */
static int graph_warmup(model *m, mcache *c, int n, int rehearse, ls_err *e) {
    fwd_seq *s = xmalloc(sizeof *s * (size_t)n);
    int32_t *ids = xcalloc((size_t)n, sizeof *ids);
    for (int i = 0; i < n; i++)
        s[i] = (fwd_seq){.slot = m->scratch_slot, .n_past = 0, .n_new = 1, .pages = &m->scratch_page};
    fwd_batch wb = {.n_seq = n, .seqs = s, .ids = ids};
    m->ops.capturing = rehearse ? 2 : 0; /* the backends the capture will choose */
    int nr, rc = forward_eager(m, c, &wb, &nr, e);
    m->ops.capturing = 0;
    if (!rc) rc = m->mem->sync(m->ops.stream, e);
    free(s);
    free(ids);
    return rc ? err_prefix(e, "CUDA graph warm-up over %d tokens", n) : 0;
}
#endif

#ifdef LS_HAVE_CUDA
/* Log a rank's capture-path event: every rank's own failure, and rank 0's verdict. */
static const char *rank_tag(const model *m, char *s, size_t n) {
    if (m->grp) snprintf(s, n, " (rank %d)", m->rank);
    else s[0] = 0;
    return s;
}

/* The capture path's verdict across the ranks (tp_all; alone: ok). When this rank was fine but
 * another was not, why says so. */
static int agree(model *m, int ok, ls_err *why) {
    int all = tp_all(m, ok);
    if (ok && !all) errf(why, ERR_RUNTIME, "another tensor-parallel rank failed this step");
    return all;
}

/* Bucket g for batch b (NULL: capture only, every row padding): the padded
 * tables uploaded, the graph (re)captured when it is missing or stale, then
 * (b set) replayed and the results fetched. *done = 0 when the bucket runs
 * eagerly (a backend is not capture-safe; b is then run by the caller).
 * With TP every rank runs this for the same bucket at once (tp_forward or
 * model_graphs_capture); the capture path's decisions are agreed (agree), so
 * all ranks capture or none, and replay or run eagerly alike. */
static int graph_run(model *m, mcache *c, mgraph *g, const fwd_batch *b, int P, int *done, ls_err *e) {
    *done = 0;
    const int B = g->bs, n = b ? b->n_seq : 0, n_toks = b ? b->n_toks : 0;
    int rc;
    char tag[32];
    rank_tag(m, tag, sizeof tag);
    rc = ws_reserve(m, B, B, P + (B - n), e);
    if (!rc) rc = smp_reserve(m, B, n_toks, e);
    if (g->state > 0 && g->gen != m->graph_gen) { /* something it holds moved */
        cug_destroy(g->exec);
        g->exec = NULL;
        g->state = 0;
    }
    double t0 = now_sec();
    /* the same on every rank: all start at 0, staleness is made common by mdl_graphs_sync, and
     * every later change is agreed (a rank whose reservation fails in a replayed step leaves the
     * others waiting in their all-reduces, as in an eager step) */
    const int capture = g->state == 0;
    if (capture && !agree(m, rc == 0, e)) return rc ? rc : ERR_RUNTIME;
    if (rc) return rc;
    if (capture) {
        ls_err we = {0};
        if (!tp_all(m, m->warm_gen == m->graph_gen)) { /* due on one rank: due on all (its passes meet) */
            /* every backend at its largest step's workspace, so no later eager step moves one */
            int ok = !graph_warmup(m, c, m->ws.cap_tok, 0, &we);
            if (!agree(m, ok, &we)) {
                if (!ok || m->rank == 0) log_warn("%s: CUDA graphs off%s: %s", m->path, tag, we.msg);
                for (int i = 0; i < m->n_graphs; i++) m->graphs[i].state = -1;
                return 0;
            }
            m->warm_gen = m->graph_gen;
        }
        /* the rehearsal: a backend the capture would take may still refuse the model at run time */
        int ok = !graph_warmup(m, c, B, 1, &we);
        if (!agree(m, ok, &we)) {
            if (!ok || m->rank == 0) log_info("%s: decode batches of %d run eagerly%s: %s", m->path, B, tag, we.msg);
            g->state = -1;
            return 0;
        }
        rc = ws_reserve(m, B, B, P + (B - n), e);
        if (!agree(m, rc == 0, e)) return rc ? rc : ERR_RUNTIME;
    }
    /* the padded batch: rows n..B-1 on the scratch slot and page, not sampled */
    for (int i = 0; i < B; i++) {
        if (i < n) {
            m->gpad[i] = b->seqs[i];
            m->gpad_ids[i] = b->ids[i];
            m->gpad_smp[i] = b->smp[i];
        } else {
            m->gpad[i] = (fwd_seq){.slot = m->scratch_slot, .n_past = 0, .n_new = 1, .pages = &m->scratch_page};
            m->gpad_ids[i] = 0;
            m->gpad_smp[i] = (smp_row){.forced = SMP_ROW_SKIP};
        }
    }
    fwd_batch pb = {.n_seq = B, .seqs = m->gpad, .ids = m->gpad_ids};
    mws *w = &m->ws;
    fwd_ctx f = {.m = m, .c = c, .ws = w, .n_tok = B, .n_seq = B, .max_ctx = m->ctx_cap, .ctx_cap = m->ctx_cap,
                 .attn_scratch = m->attn_scratch, .attn_scratch_bytes = m->attn_scratch_bytes};
    const int32_t *d_ids = NULL, *d_rows = NULL;
    int nr = upload_tables(m, c, &pb, B, &f, &d_ids, &d_rows, e);
    rc = nr < 0 ? nr : 0;
    /* rank 0 alone samples (the graphs of the other ranks end with their last all-reduce) */
    if (!rc && m->rank == 0) rc = smp_upload(m, m->gpad_smp, B, b ? b->toks : NULL, n_toks, e);
    if (capture && !agree(m, rc == 0, e)) return rc ? rc : ERR_RUNTIME;
    if (rc) return rc;
    if (capture) {
        const ls_stream st = m->ops.stream;
        void *exec = NULL;
        ls_err ce = {0};
        m->tp_cap_rc = 0;
        m->ops.capturing = 1;
        rc = cug_begin(st, &ce);
        /* with TP, the body only where every rank is capturing: an uncaptured all-reduce would wait
         * for peers that only record theirs */
        if (!agree(m, rc == 0, &ce)) {
            if (!rc) {
                ls_err ee = {0};
                cug_end(st, 0, &exec, &ee);
                rc = ERR_RUNTIME;
            }
        } else {
            int brc = forward_body(m, &f, d_ids, d_rows, B, NULL, 1, &ce);
            ls_err ee = {0};
            rc = cug_end(st, brc == 0, &exec, &ee);
            if (brc) rc = brc;
            else if (rc) ce = ee;
        }
        m->ops.capturing = 0;
        m->tp_cap_rc = 0;
        int ok = !rc && exec;
        if (!ok && !ce.msg[0]) errf(&ce, ERR_RUNTIME, "capture failed");
        if (!agree(m, ok, &ce)) {
            cug_destroy(exec);
            if (!ok || m->rank == 0) log_info("%s: decode batches of %d run eagerly%s: %s", m->path, B, tag, ce.msg);
            g->state = -1;
            return 0; /* the tables are re-uploaded by the eager pass */
        }
        g->exec = exec;
        g->gen = m->graph_gen;
        g->state = 1;
        m->n_captured++;
        if (m->rank == 0)
            log_info("%s: captured the CUDA graph of decode batch size %d%s (%.1f ms with warm-up)", m->path, B,
                     m->grp ? " on every tensor-parallel rank" : "", (now_sec() - t0) * 1e3);
    }
    if (!b) return 0;
    if ((rc = cug_launch(g->exec, m->ops.stream, e))) return rc;
    m->n_replayed++;
    *done = 1;
    if (m->rank > 0) return 0; /* rank 0 fetches the step's results */
    return forward_results(m, b, n, e);
}
#endif

/* A pure-decode step through its bucket's graph. */
static int graph_step(model *m, mcache *c, const fwd_batch *b, int P, int *done, ls_err *e) {
    *done = 0;
#ifdef LS_HAVE_CUDA
    mgraph *g = graph_for(m, b->n_seq);
    if (!g || g->state < 0) return 0;
    return graph_run(m, c, g, b, P, done, e);
#else
    (void)m; (void)c; (void)b; (void)P; (void)e;
    return 0;
#endif
}

#ifdef LS_HAVE_CUDA
static int graphs_capture_rank(model *m, void *arg, ls_err *e) {
    (void)arg;
    return model_graphs_capture(m, e);
}
#endif

int model_graphs_capture(model *m, ls_err *e) {
#ifdef LS_HAVE_CUDA
    /* TP: every rank captures at once on its own thread (their all-reduces are recorded in the
     * same order, and their warm-up passes meet) */
    if (m->rank_m) return m->rank_m[0]->n_graphs ? tp_each(m, graphs_capture_rank, NULL, e) : 0;
    for (int i = 0; i < m->n_graphs; i++) {
        int done, rc = graph_run(m, &m->cache, &m->graphs[i], NULL, 0, &done, e);
        if (rc) return err_prefix(e, "capturing the CUDA graph of decode batch size %d", m->graphs[i].bs);
    }
    if (m->n_graphs) m->mem->sync(m->ops.stream, NULL);
#else
    (void)m; (void)e;
#endif
    return 0;
}

/* The model that runs the graphs: the only one, or TP rank 0 (its ranks agree). */
static model *graph_model(model *m) { return m->rank_m ? m->rank_m[0] : m; }

/* Every rank's n_graphs set to on ? saved : 0 (0 sends every step down the eager path). */
static void graphs_enable(model *m, int on, int *saved) {
    const int N = m->rank_m ? m->tp : 1;
    for (int r = 0; r < N; r++) {
        model *rm = m->rank_m ? m->rank_m[r] : m;
        if (!on) saved[r] = rm->n_graphs;
        rm->n_graphs = on ? saved[r] : 0;
    }
}

/* One greedy run on the scratch slot and page for the self-check: an eager
 * prefill of ids, then `steps` decode steps (through the bucket-1 graph unless
 * eager), through model_forward (with TP: every rank, rank 0 sampling).
 * tok / lp / top: [steps] tokens, their logprobs, top-5 logprobs. */
static int check_run(model *m, const int32_t *ids, int n, int steps, int eager, int32_t *tok, float *lp,
                     float (*top)[5], ls_err *e) {
    model *gm = graph_model(m);
    model_slot_reset(m, gm->scratch_slot);
    int saved[TP_MAX];
    fwd_seq s = {.slot = gm->scratch_slot, .n_past = 0, .n_new = n, .pages = &gm->scratch_page};
    smp_row row = {.temperature = 0, .top_p = 1, .top_k = -1, .rep_pen = 1, .forced = -1, .want_lp = 1, .n_top = 5};
    smp_out o;
    int32_t id;
    int rc = 0;
    for (int k = -1; k < steps && !rc; k++) {
        fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = k < 0 ? ids : &id, .smp = &row, .smp_res = &o};
        if (eager) graphs_enable(m, 0, saved);
        rc = model_forward(m, &b, e);
        if (eager) graphs_enable(m, 1, saved);
        if (!rc && o.bad_idx >= 0) rc = errf(e, ERR_RUNTIME, "NaN/Inf logits (index %d)", o.bad_idx);
        if (rc) break;
        s.n_past += s.n_new;
        s.n_new = 1;
        id = o.token;
        if (k >= 0) {
            tok[k] = o.token;
            lp[k] = o.logprob;
            for (int i = 0; i < 5; i++) top[k][i] = i < o.n_top ? o.top_lp[i] : -INFINITY;
        }
    }
    model_slot_reset(m, gm->scratch_slot);
    return rc;
}

int model_graphs_check(model *m, char *why, size_t n) {
    const model *gm = graph_model(m);
    const mgraph *g1 = gm->n_graphs ? &gm->graphs[0] : NULL;
    const int P = 8, S = 6; /* prompt and decode steps: one KV page holds them */
    if (!g1 || g1->bs != 1 || g1->state != 1 || gm->cache.page_size < P + S + 1) return 0;
    int32_t ids[8];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < P; i++) {
        x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
        ids[i] = (int32_t)((x * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)m->cfg.vocab);
    }
    int32_t te[6], tg[6];
    float le[6], lg[6], pe[6][5], pg[6][5];
    ls_err e = {0};
    const int64_t replayed = gm->n_replayed;
    if (check_run(m, ids, P, S, 1, te, le, pe, &e) || check_run(m, ids, P, S, 0, tg, lg, pg, &e)) {
        snprintf(why, n, "%s", e.msg);
        return 1;
    }
    /* the graph run really replayed its decode steps (a bucket that fell back would compare eager
     * with eager) */
    if (gm->n_replayed - replayed != S) {
        snprintf(why, n, "%lld of %d decode steps replayed the batch-1 graph",
                 (long long)(gm->n_replayed - replayed), S);
        return 1;
    }
    /* equal tokens; or, at the first difference, a near tie: the same top logprob and the
     * replay's token among the eager step's top 5 within 0.05 of its best */
    for (int k = 0; k < S; k++) {
        float d = fabsf(pe[k][0] - pg[k][0]);
        if (!(d <= 0.05f)) {
            snprintf(why, n, "decode step %d: top logprob %.4f replayed vs %.4f eager", k + 1, pg[k][0], pe[k][0]);
            return 1;
        }
        if (te[k] != tg[k]) {
            if (!(fabsf(lg[k] - le[k]) <= 0.05f && pe[k][0] - lg[k] <= 0.05f)) {
                snprintf(why, n, "decode step %d: token %d (logprob %.4f) replayed vs %d (%.4f) eager", k + 1, tg[k],
                         lg[k], te[k], le[k]);
                return 1;
            }
            break; /* the contexts differ from here on */
        }
    }
    return 0;
}

void model_graphs_off(model *m) {
    for (int r = 0; m->rank_m && r < m->tp; r++) {
        model *rm = m->rank_m[r];
        rm->mem->bind_thread(rm->ops.dev.ordinal, NULL);
        model_graphs_off(rm);
    }
    for (int i = 0; i < m->n_graphs; i++) {
#ifdef LS_HAVE_CUDA
        cug_destroy(m->graphs[i].exec);
#endif
        m->graphs[i].exec = NULL;
        m->graphs[i].state = -1;
    }
}

void mdl_graphs_sync(model *m) {
    if (!m->rank_m || !m->rank_m[0]->n_graphs) return;
    int warm = 0;
    for (int r = 0; r < m->tp; r++) warm |= m->rank_m[r]->warm_gen != m->rank_m[r]->graph_gen;
    for (int r = 0; warm && r < m->tp; r++) m->rank_m[r]->warm_gen = -1; /* graph_gen is never negative */
    for (int i = 0; i < m->rank_m[0]->n_graphs; i++) {
        int stale = 0;
        for (int r = 0; r < m->tp; r++) {
            const model *rm = m->rank_m[r];
            stale |= i < rm->n_graphs && rm->graphs[i].state > 0 && rm->graphs[i].gen != rm->graph_gen;
        }
        for (int r = 0; stale && r < m->tp; r++)
            if (i < m->rank_m[r]->n_graphs) m->rank_m[r]->graphs[i].gen = -1; /* re-captured by graph_run */
    }
}

int mdl_forward_rank(model *m, mcache *c, const fwd_batch *b, ls_err *e) {
    int rc = check_batch(m, c, b, e);
    if (rc) return rc; /* every rank sees the same batch and geometry: all return here, or none */
    if (b->smp && m->rank == 0 && !m->sampler)
        return errf(e, ERR_UNSUPPORTED, "forward: device sampling on %s, which has no sampler", m->ops.dev.name);
    int T, P, max_ctx;
    batch_dims(m, c, b, &T, &P, &max_ctx);
    if (m->n_graphs && b->smp && !b->mtp && T == b->n_seq && max_ctx <= m->ctx_cap && b->n_seq <= m->graph_max_bs) {
        int done = 0;
        for (int s = 0; s < b->n_seq; s++) done |= b->seqs[s].logits_all;
        if (!done) {
            rc = graph_step(m, c, b, P, &done, e);
            if (!rc && done) m->mtp_rows_main = T;
            if (rc || done) return rc;
        }
    }
    int n_rows;
    if ((rc = forward_eager(m, c, b, &n_rows, e))) return rc;
    if (b->mtp) m->mtp_rows_self = n_rows;
    else m->mtp_rows_main = T;
    if (m->n_graphs && !b->mtp) m->n_eager++;
    if (m->rank > 0 || m->ops.dev.kind == DEV_CPU) return 0;
    return forward_results(m, b, n_rows, e);
}

int model_forward(model *m, const fwd_batch *b, ls_err *e) {
    if (!m->rank_m) return mdl_forward_rank(m, &m->cache, b, e);
    mcache *caches[TP_MAX];
    for (int r = 0; r < m->tp; r++) caches[r] = &m->rank_m[r]->cache;
    return tp_forward(m, caches, b, e);
}

int model_has_mtp(const model *m) { return m->n_mtp > 0; }

/* The logits of every position of ids on a fresh cache of its own (per rank with TP); with mtp,
 * then the MTP head's over rows 0 .. n - 2 (model_mtp_logits_all). */
static int logits_all(model *m, const int32_t *ids, int n, int mtp, float **logits, ls_err *e) {
    *logits = NULL;
    if (n < 1 + mtp) return errf(e, ERR_INVAL, "logits: %s", mtp ? "the MTP head needs at least 2 token ids" : "no token ids");
    if (mtp && !m->n_mtp) return errf(e, ERR_INVAL, "logits: the MTP head is not loaded (model_opts.mtp)");
    const int page = 16, n_pages = (n + page - 1) / page;
    model_cache_opts co = {.page_size = page, .n_pages = n_pages, .n_slots = 1};
    /* a fresh cache of its own, per rank with TP */
    const int N = m->rank_m ? m->tp : 1;
    model *rm[TP_MAX];
    mcache cs[TP_MAX], *cp[TP_MAX];
    int rc = 0, n_alloc = 0;
    for (int r = 0; r < N; r++) {
        rm[r] = m->rank_m ? m->rank_m[r] : m;
        cp[r] = &cs[r];
        if (!rc && m->rank_m) rc = rm[r]->mem->bind_thread(rm[r]->ops.dev.ordinal, e);
        if (!rc && !(rc = cache_alloc(rm[r], &co, &cs[r], e))) {
            n_alloc++;
            rc = ws_reserve(rm[r], n, 1, n_pages, e);
        }
    }
    int32_t *pages = xmalloc(sizeof(int32_t) * n_pages);
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    fwd_seq s = {.slot = 0, .n_past = 0, .n_new = n, .pages = pages, .logits_all = 1};
    float *out = rc ? NULL : malloc(sizeof(float) * (size_t)n * m->cfg.vocab);
    int32_t *src = xmalloc(sizeof(int32_t) * (size_t)n);
    if (!rc && !out) {
        rc = errf(e, ERR_NOMEM, "logits: cannot allocate %d x %d floats", n, m->cfg.vocab);
    } else if (!rc) {
        fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = ids, .logits = out};
        rc = m->rank_m ? tp_forward(m, cp, &b, e) : mdl_forward_rank(m, &cs[0], &b, e);
        if (!rc && mtp) { /* row i: the token after position i and the hidden state at i */
            for (int i = 0; i < n - 1; i++) src[i] = i;
            s.n_new = n - 1;
            b = (fwd_batch){.n_seq = 1, .seqs = &s, .ids = ids + 1, .logits = out, .mtp = 1, .mtp_src = src};
            rc = m->rank_m ? tp_forward(m, cp, &b, e) : mdl_forward_rank(m, &cs[0], &b, e);
        }
    }
    free(src);
    if (rc) { free(out); out = NULL; }
    *logits = out;
    free(pages);
    for (int r = 0; r < n_alloc; r++) {
        if (m->rank_m) rm[r]->mem->bind_thread(rm[r]->ops.dev.ordinal, NULL);
        cache_free(rm[r], &cs[r]);
    }
    return rc;
}

int model_logits_all(model *m, const int32_t *ids, int n, float **logits, ls_err *e) {
    return logits_all(m, ids, n, 0, logits, e);
}

int model_mtp_logits_all(model *m, const int32_t *ids, int n, float **logits, ls_err *e) {
    return logits_all(m, ids, n, 1, logits, e);
}
