/* model.c: opening a model (config + safetensors), binding every weight with
 * its dtype and shape checked against the config, the caches (paged KV pool,
 * GDN state slots) and the forward pass skeleton shared by the architectures:
 *
 *   h = embed(ids)
 *   per layer:  h += attn_or_gdn(norm_in(h));  h += mlp_or_moe(norm_post(h))
 *   logits = lm_head(norm_final(h))            for the rows that want logits
 *
 * Owns: the safetensors set (weights are views into its mapping), fp32
 * copies of the 1-D parameters, the cache memory. Tensor names carry the
 * prefix `model.` or `model.language_model.`; `lm_head.weight` is top level;
 * `model.visual.*` and `mtp.*` are ignored. A linear is NVFP4 exactly when
 * `<p>.weight` is U8 and `<p>.weight_scale` exists.
 */
#include "model/model_impl.h"
#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding helpers ------------------------------------------------------ */

void *mdl_alloc(model *m, size_t bytes) {
    void *p = xcalloc(1, bytes ? bytes : 1);
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = xrealloc(m->owned, sizeof(void *) * m->cap_owned);
    }
    m->owned[m->n_owned++] = p;
    return p;
}

void mdl_name(const model *m, char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(out, n, "%s", m->prefix);
    vsnprintf(out + k, n - k, fmt, ap);
    va_end(ap);
}

const st_tensor *mdl_tensor(model *m, const char *name) {
    const st_tensor *t = st_find(m->st, name);
    if (t) {
        if (m->n_used == m->cap_used) {
            m->cap_used = m->cap_used ? 2 * m->cap_used : 256;
            m->used = xrealloc(m->used, sizeof(*m->used) * m->cap_used);
        }
        m->used[m->n_used++] = t;
    }
    return t;
}

static int ptr_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Tensors the text model never looked at (vision tower and MTP head aside):
 * transformers warns about unused weights; so do we, naming one. */
static void warn_unused(model *m) {
    qsort(m->used, m->n_used, sizeof *m->used, ptr_cmp);
    int n = 0;
    const char *first = NULL;
    for (int i = 0; i < st_count(m->st); i++) {
        const st_tensor *t = st_get(m->st, i);
        if (!strncmp(t->name, "mtp.", 4) || strstr(t->name, "visual.")) continue;
        if (bsearch(&t, m->used, m->n_used, sizeof *m->used, ptr_cmp)) continue;
        if (!first) first = t->name;
        n++;
    }
    if (n) log_warn("%s: %d tensor%s not used by the %s text model (first: '%s')", m->path, n,
                    n > 1 ? "s are" : " is", arch_name(m->cfg.arch), first);
}

static void shape_str(const st_tensor *t, char *s, size_t n) {
    int k = snprintf(s, n, "[");
    for (int i = 0; i < t->ndim && k < (int)n; i++)
        k += snprintf(s + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < (int)n) snprintf(s + k, n - k, "]");
}

static int check_shape(const st_tensor *t, int nd, const int64_t *want, ls_err *e) {
    int ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
    if (ok) return 0;
    char got[128], exp[128];
    shape_str(t, got, sizeof got);
    int k = snprintf(exp, sizeof exp, "[");
    for (int i = 0; i < nd; i++) k += snprintf(exp + k, sizeof exp - k, "%s%lld", i ? ", " : "", (long long)want[i]);
    snprintf(exp + k, sizeof exp - k, "]");
    return errf(e, ERR_INVAL, "tensor '%s' in %s: shape %s, expected %s", t->name, t->file, got, exp);
}

static int missing(const model *m, const char *name, ls_err *e) {
    return errf(e, ERR_INVAL, "missing tensor '%s' in %s", name, m->path);
}

int mdl_bind_lin(model *m, const char *p, int N, int K, lin_w *out, ls_err *e) {
    char wn[300], sn[300], s2n[300];
    snprintf(wn, sizeof wn, "%s.weight", p);
    snprintf(sn, sizeof sn, "%s.weight_scale", p);
    snprintf(s2n, sizeof s2n, "%s.weight_scale_2", p);
    const st_tensor *w = mdl_tensor(m, wn);
    char in[300];
    snprintf(in, sizeof in, "%s.input_scale", p);
    mdl_tensor(m, in); /* the W4A4 activation scale: read by nobody on W4A16 paths */
    if (!w) return missing(m, wn, e);
    const st_tensor *sc = mdl_tensor(m, sn);
    memset(out, 0, sizeof *out);
    out->N = N;
    out->K = K;
    out->name = w->name;
    out->data = w->data;
    int rc;
    if (w->dtype == ST_U8 && sc) {
        if (K % 16)
            return errf(e, ERR_INVAL, "tensor '%s' in %s: NVFP4 needs K (%d) to be a multiple of 16",
                        wn, w->file, K);
        const int64_t ws[2] = {N, K / 2}, ss[2] = {N, K / 16};
        if ((rc = check_shape(w, 2, ws, e)) || (rc = check_shape(sc, 2, ss, e))) return rc;
        if (sc->dtype != ST_F8_E4M3)
            return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected F8_E4M3", sn, sc->file,
                        st_dtype_name(sc->dtype));
        const st_tensor *s2 = mdl_tensor(m, s2n);
        if (!s2) return missing(m, s2n, e);
        if (s2->dtype != ST_F32 || st_numel(s2) != 1)
            return errf(e, ERR_INVAL, "tensor '%s' in %s: expected one F32 value, got %s with %lld "
                        "elements", s2n, s2->file, st_dtype_name(s2->dtype), (long long)st_numel(s2));
        out->kind = W_NVFP4;
        out->scale = sc->data;
        memcpy(&out->scale2, s2->data, 4);
        if (!(out->scale2 > 0) || out->scale2 > 1e30f)
            return errf(e, ERR_INVAL, "tensor '%s' in %s: global scale %g is not a positive number",
                        s2n, s2->file, out->scale2);
        return 0;
    }
    switch (w->dtype) {
    case ST_BF16: out->kind = W_BF16; break;
    case ST_F16: out->kind = W_F16; break;
    case ST_F32: out->kind = W_F32; break;
    default:
        return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected BF16, F16, F32 or NVFP4 "
                    "(U8 with a '.weight_scale')", wn, w->file, st_dtype_name(w->dtype));
    }
    const int64_t ws[2] = {N, K};
    return check_shape(w, 2, ws, e);
}

int mdl_bind_vec(model *m, const char *name, int nd, const int64_t *shape, float **out, ls_err *e) {
    const st_tensor *t = mdl_tensor(m, name);
    if (!t) return missing(m, name, e);
    int rc = check_shape(t, nd, shape, e);
    if (rc) return rc;
    int64_t n = st_numel(t);
    float *v = mdl_alloc(m, sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case ST_BF16: v[i] = bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        case ST_F16: v[i] = f16_to_f32(((const uint16_t *)t->data)[i]); break;
        case ST_F32: memcpy(&v[i], (const char *)t->data + 4 * i, 4); break;
        default:
            return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected BF16, F16 or F32", name,
                        t->file, st_dtype_name(t->dtype));
        }
    }
    *out = v;
    return 0;
}

int mdl_bind_vec1(model *m, const char *name, int n, float **out, ls_err *e) {
    const int64_t s[1] = {n};
    return mdl_bind_vec(m, name, 1, s, out, e);
}

/* ---- open / close ---------------------------------------------------------- */

static int bind_all(model *m, ls_err *e) {
    const model_config *c = &m->cfg;
    const int H = c->hidden;
    char p[256];
    int rc;
    if (st_find(m->st, "model.language_model.embed_tokens.weight"))
        snprintf(m->prefix, sizeof m->prefix, "model.language_model.");
    else
        snprintf(m->prefix, sizeof m->prefix, "model.");
    mdl_name(m, p, sizeof p, "embed_tokens");
    if ((rc = mdl_bind_lin(m, p, c->vocab, H, &m->embed, e))) return rc;
    if (m->embed.kind == W_NVFP4)
        return errf(e, ERR_UNSUPPORTED, "tensor '%s.weight': an NVFP4 embedding is not supported", p);
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = mdl_bind_lin(m, "lm_head", c->vocab, H, &m->lm_head, e))) {
        return rc;
    }
    mdl_name(m, p, sizeof p, "norm.weight");
    if ((rc = mdl_bind_vec1(m, p, H, &m->final_norm, e))) return rc;

    m->layers = mdl_alloc(m, sizeof(layer_w) * c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
        L->type = c->layer_type[l];
        L->cache_idx = L->type == LAYER_FULL_ATTN ? m->n_full++ : m->n_lin++;
        mdl_name(m, p, sizeof p, "layers.%d.input_layernorm.weight", l);
        if ((rc = mdl_bind_vec1(m, p, H, &L->in_norm, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.post_attention_layernorm.weight", l);
        if ((rc = mdl_bind_vec1(m, p, H, &L->post_norm, e))) return rc;
        rc = L->type == LAYER_FULL_ATTN ? qwen3_bind_attn(m, l, e) : next_bind_gdn(m, l, e);
        if (rc) return rc;
        if ((rc = qwen3_bind_mlp(m, l, e))) return rc;
    }
    return 0;
}

static int open_device(model *m, const model_opts *o, ls_err *e) {
    const char *dev = o && o->device ? o->device : "cpu";
    if (!strcmp(dev, "cuda"))
        return errf(e, ERR_UNSUPPORTED, "this build/device has no CUDA backend");
    if (strcmp(dev, "cpu"))
        return errf(e, ERR_INVAL, "unknown device '%s' (valid: cpu, cuda)", dev);
    if (o && o->tp > 1)
        return errf(e, ERR_UNSUPPORTED, "tensor parallelism (tp=%d) is not supported by the CPU forward yet", o->tp);
    dev_info d;
    ops_cpu_dev(&d);
    ops_names n = {0};
    if (o) {
        n.fp4_gemm = o->fp4_gemm_backend;
        n.moe = o->moe_backend;
        n.attention = o->attention_backend;
        n.gdn = o->gdn_backend;
    }
    return ops_select(&d, &n, &m->ops, e);
}

int model_open(const char *path, const model_opts *o, model **out, ls_err *e) {
    *out = NULL;
    model *m = xcalloc(1, sizeof *m);
    m->path = xstrdup(path);
    int rc = open_device(m, o, e);
    if (rc) { model_close(m); return rc; }
    if (!strncmp(path, "synth:", 6)) {
        /* the same random weights `laststand synth` writes, built in memory */
        synth_opts so;
        json_t *cfg = NULL;
        if ((rc = synth_parse_spec(path + 6, &so, e)) || (rc = synth_build(&so, &m->st, &cfg, e))) {
            err_prefix(e, "%s", path);
            model_close(m);
            return rc;
        }
        rc = hfcfg_parse(cfg, path, &m->cfg, e);
        json_decref(cfg);
        if (rc) { model_close(m); return rc; }
    } else {
        if ((rc = hfcfg_load_dir(path, &m->cfg, e))) { model_close(m); return rc; }
        if ((rc = st_open_dir(path, &m->st, e))) { model_close(m); return rc; }
    }
    m->norm_kind = m->cfg.arch == ARCH_QWEN3 || m->cfg.arch == ARCH_QWEN3_MOE ? RMS_PLAIN : RMS_ZC;
    if ((rc = bind_all(m, e))) { model_close(m); return rc; }
    warn_unused(m);
    *out = m;
    return 0;
}

static void cache_free(mcache *c) {
    free(c->kv);
    free(c->conv);
    free(c->rec);
    memset(c, 0, sizeof *c);
}

void model_close(model *m) {
    if (!m) return;
    cache_free(&m->cache);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->used);
    if (m->st) st_close(m->st);
    hfcfg_free(&m->cfg);
    free(m->path);
    free(m);
}

const model_config *model_cfg(const model *m) { return &m->cfg; }
const char *model_path(const model *m) { return m->path; }

/* ---- caches ---------------------------------------------------------------- */

static size_t conv_floats(const model_config *c) {
    return (size_t)(2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim) * (c->lin_conv - 1);
}
static size_t rec_floats(const model_config *c) {
    return (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}

size_t model_kv_page_bytes(const model *m, int page_size) {
    return (size_t)m->n_full * 2 * page_size * m->cfg.n_kv_heads * m->cfg.head_dim * sizeof(float);
}

size_t model_slot_bytes(const model *m) {
    return (size_t)m->n_lin * (conv_floats(&m->cfg) + rec_floats(&m->cfg)) * sizeof(float);
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
    size_t nc = (size_t)m->n_lin * o->n_slots * conv_floats(&m->cfg);
    size_t nr = (size_t)m->n_lin * o->n_slots * rec_floats(&m->cfg);
    c->kv = kv ? calloc(1, kv) : NULL;
    c->conv = nc ? calloc(nc, sizeof(float)) : NULL;
    c->rec = nr ? calloc(nr, sizeof(float)) : NULL;
    if ((kv && !c->kv) || (nc && !c->conv) || (nr && !c->rec)) {
        cache_free(c);
        return errf(e, ERR_NOMEM, "cache: cannot allocate %zu bytes of KV and %zu of GDN state", kv,
                    (nc + nr) * sizeof(float));
    }
    return 0;
}

int model_cache_init(model *m, const model_cache_opts *o, ls_err *e) {
    cache_free(&m->cache);
    return cache_alloc(m, o, &m->cache, e);
}

static void slot_reset(const model *m, mcache *c, int slot) {
    if (slot < 0 || slot >= c->n_slots) return;
    const size_t nc = conv_floats(&m->cfg), nr = rec_floats(&m->cfg);
    for (int l = 0; l < m->n_lin; l++) {
        memset(c->conv + ((size_t)l * c->n_slots + slot) * nc, 0, sizeof(float) * nc);
        memset(c->rec + ((size_t)l * c->n_slots + slot) * nr, 0, sizeof(float) * nr);
    }
}

void model_slot_reset(model *m, int slot) { slot_reset(m, &m->cache, slot); }

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
        if (m->n_full) {
            int np = (q->n_past + q->n_new + c->page_size - 1) / c->page_size;
            for (int i = 0; i < np; i++)
                if (!q->pages || q->pages[i] < 0 || q->pages[i] >= c->n_pages)
                    return errf(e, ERR_INVAL, "forward: sequence %d page %d is outside the pool of %d", s,
                                q->pages ? q->pages[i] : -1, c->n_pages);
        }
        for (int i = 0; i < q->n_new; i++, row++)
            if (b->ids[row] < 0 || b->ids[row] >= m->cfg.vocab)
                return errf(e, ERR_INVAL, "forward: token id %d outside the vocabulary [0, %d)",
                            b->ids[row], m->cfg.vocab);
    }
    return 0;
}

static int forward(model *m, mcache *c, const fwd_batch *b, ls_err *e) {
    int rc = check_batch(m, c, b, e);
    if (rc) return rc;
    const model_config *cfg = &m->cfg;
    const small_ops *so = m->ops.small;
    const int H = cfg->hidden;
    fwd_ctx f = {.m = m, .c = c, .n_seq = b->n_seq, .seqs = b->seqs};
    for (int s = 0; s < b->n_seq; s++) f.n_tok += b->seqs[s].n_new;
    const int T = f.n_tok;
    f.aseq = xmalloc(sizeof(attn_seq) * b->n_seq);
    f.gseq = xmalloc(sizeof(gdn_seq) * b->n_seq);
    f.pos = xmalloc(sizeof(int32_t) * T);
    int n_rows = 0;
    for (int s = 0, row = 0; s < b->n_seq; s++) {
        const fwd_seq *q = &b->seqs[s];
        f.aseq[s] = (attn_seq){.n_past = q->n_past, .n_new = q->n_new, .row0 = row, .pages = q->pages};
        f.gseq[s] = (gdn_seq){.slot = q->slot, .n_new = q->n_new, .row0 = row};
        for (int i = 0; i < q->n_new; i++) f.pos[row + i] = q->n_past + i;
        row += q->n_new;
        n_rows += q->logits_all ? q->n_new : 1;
    }
    float *h = xmalloc(sizeof(float) * (size_t)T * H);
    float *u = xmalloc(sizeof(float) * (size_t)T * H);
    float *o = xmalloc(sizeof(float) * (size_t)T * H);
    float *hl = NULL;
    if ((rc = so->embed(T, b->ids, &m->embed, h, m->ops.act, NULL))) {
        errf(e, rc, "forward: embedding lookup failed");
        goto done;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        so->rmsnorm(T, H, h, L->in_norm, m->norm_kind, cfg->rms_eps, u, m->ops.act, NULL);
        rc = L->type == LAYER_FULL_ATTN ? qwen3_attn_forward(&f, l, u, o, e)
                                        : next_gdn_forward(&f, l, u, o, e);
        if (rc) goto done;
        so->add((int64_t)T * H, o, h, m->ops.act, NULL);
        so->rmsnorm(T, H, h, L->post_norm, m->norm_kind, cfg->rms_eps, u, m->ops.act, NULL);
        if ((rc = qwen3_mlp_forward(&f, l, u, o, e))) goto done;
        so->add((int64_t)T * H, o, h, m->ops.act, NULL);
    }
    /* rows that want logits: all new tokens (logits_all) or the last one */
    hl = xmalloc(sizeof(float) * (size_t)n_rows * H);
    for (int s = 0, row = 0, r = 0; s < b->n_seq; s++) {
        const fwd_seq *q = &b->seqs[s];
        int first = q->logits_all ? 0 : q->n_new - 1;
        for (int i = first; i < q->n_new; i++, r++)
            memcpy(hl + (size_t)r * H, h + (size_t)(row + i) * H, sizeof(float) * H);
        row += q->n_new;
    }
    so->rmsnorm(n_rows, H, hl, m->final_norm, m->norm_kind, cfg->rms_eps, hl, m->ops.act, NULL);
    rc = ops_linear(&m->ops, n_rows, hl, &m->lm_head, b->logits, 0, e);
done:
    free(h); free(u); free(o); free(hl);
    free(f.aseq); free(f.gseq); free(f.pos);
    return rc;
}

int model_forward(model *m, const fwd_batch *b, ls_err *e) { return forward(m, &m->cache, b, e); }

int model_logits_all(model *m, const int32_t *ids, int n, float **logits, ls_err *e) {
    *logits = NULL;
    if (n < 1) return errf(e, ERR_INVAL, "logits: no token ids");
    const int page = 16, n_pages = (n + page - 1) / page;
    model_cache_opts co = {.page_size = page, .n_pages = n_pages, .n_slots = 1};
    mcache c;
    int rc = cache_alloc(m, &co, &c, e);
    if (rc) return rc;
    int32_t *pages = xmalloc(sizeof(int32_t) * n_pages);
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    fwd_seq s = {.slot = 0, .n_past = 0, .n_new = n, .pages = pages, .logits_all = 1};
    float *out = malloc(sizeof(float) * (size_t)n * m->cfg.vocab);
    if (!out) {
        rc = errf(e, ERR_NOMEM, "logits: cannot allocate %d x %d floats", n, m->cfg.vocab);
    } else {
        fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = ids, .logits = out};
        rc = forward(m, &c, &b, e);
    }
    if (rc) { free(out); out = NULL; }
    *logits = out;
    free(pages);
    cache_free(&c);
    return rc;
}
