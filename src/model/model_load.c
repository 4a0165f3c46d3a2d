/* model_load.c: opening a model. The checkpoint (a directory of safetensors, or `synth:` random
 * weights generated in memory), the device and its backends (open_device), then every weight bound
 * with its dtype and shape checked against the config (the binding helpers below, which the
 * architecture files call: mdl_bind_lin / mdl_bind_vec*, mdl_tensor, mdl_take_rows), in two
 * steps: the non-layer weights (bind_globals), then the streamed per-layer load (load_layers): a
 * layer at a time, generated (synth) or mapped, bound, then sliced into the tensor-parallel ranks
 * (model_tp.c) or uploaded to the device (model_weights.c), its host copies freed and its
 * checkpoint pages handed back, so that host memory holds about one layer, never the whole
 * checkpoint (the full Qwen3.5-397B over two GPUs: bench/RESULTS.md, S9). model.c holds the rest:
 * close, caches, workspace, the forward pass and CUDA graphs.
 *
 * Owns (through the model): the safetensors set, the host blocks bound (m->owned: fp32 copies of
 * 1-D parameters, rows permuted at load) and the list of tensors looked up (m->used, for the
 * unused-tensor warning). Tensor names carry the prefix `model.` or `model.language_model.`;
 * `lm_head.weight` is top level; `model.visual.*` and `mtp.*` are ignored. model_opts.max_layers
 * cuts the config's n_layers before binding (serve's smoke test), so later layers are never bound,
 * uploaded or run (model_layers_in_checkpoint: the count before). A linear is NVFP4 exactly when
 * `<p>.weight` is U8 and `<p>.weight_scale` exists.
 */
#include "model/model_impl.h"
#include "model/synth.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef LS_HAVE_CUDA
#include "ops/cuda/graph.h" /* sample_cuda */
#endif

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
    /* the MTP head's decoder layer is bound as layer n_layers: its tensors are mtp.layers.0.* */
    char lp[32];
    const int lk = snprintf(lp, sizeof lp, "layers.%d.", m->cfg.n_layers);
    if (m->n_mtp && !strncmp(out + k, lp, (size_t)lk)) {
        char rest[256];
        snprintf(rest, sizeof rest, "%s", out + k + lk);
        snprintf(out, n, "mtp.layers.0.%s", rest);
    }
}

const st_tensor *mdl_tensor(model *m, const char *name) {
    const st_tensor *t = m->st_part ? st_find(m->st_part, name) : NULL;
    if (!t) t = st_find(m->st, name);
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

void mdl_take_rows(model *m, const lin_w *w, const int *rows, int n, lin_w *out) {
    size_t rb, sb = 0; /* bytes per row of data and of scales */
    if (w->kind == W_FP8) {
        /* the codes' rows, and their scales per row (rows picked out of a block no longer share it) */
        uint8_t *d = mdl_alloc(m, (size_t)w->K * n);
        float *fs = mdl_alloc(m, sizeof(float) * (size_t)w->fs_cols * n);
        for (int i = 0; i < n; i++) {
            memcpy(d + (size_t)w->K * i, (const uint8_t *)w->data + (size_t)w->K * rows[i], (size_t)w->K);
            const size_t sr = (size_t)((rows[i] + w->fs_r0) / w->fs_br) * (size_t)w->fs_cols;
            memcpy(fs + (size_t)w->fs_cols * i, w->fscale + sr, sizeof(float) * (size_t)w->fs_cols);
        }
        *out = *w;
        out->N = n;
        out->data = d;
        out->fscale = fs;
        out->fs_br = 1;
        out->fs_r0 = 0;
        out->fs_n = (size_t)w->fs_cols * n;
        return;
    }
    switch (w->kind) {
    case W_F32: rb = (size_t)w->K * 4; break;
    case W_BF16: case W_F16: rb = (size_t)w->K * 2; break;
    default: rb = (size_t)w->K / 2; sb = (size_t)w->K / 16; break;
    }
    char *d = mdl_alloc(m, rb * n);
    uint8_t *sc = sb ? mdl_alloc(m, sb * n) : NULL;
    for (int i = 0; i < n; i++) {
        memcpy(d + rb * i, (const char *)w->data + rb * rows[i], rb);
        if (sb) memcpy(sc + sb * i, w->scale + sb * rows[i], sb);
    }
    *out = *w;
    out->N = n;
    out->data = d;
    out->scale = sc;
}

/* Tensors the text model never looked at (vision tower and MTP head aside):
 * transformers warns about unused weights; so do we, naming one. */
static void warn_unused(model *m) {
    qsort(m->used, m->n_used, sizeof *m->used, ptr_cmp);
    const size_t plen = strlen(m->prefix);
    int n = 0;
    const char *first = NULL;
    for (int i = 0; i < st_count(m->st); i++) {
        const st_tensor *t = st_get(m->st, i);
        if (!strncmp(t->name, "mtp.", 4) || strstr(t->name, "visual.")) continue;
        if (m->cfg.n_layers < m->n_layers_ckpt && !strncmp(t->name, m->prefix, plen) &&
            !strncmp(t->name + plen, "layers.", 7) && atoi(t->name + plen + 7) >= m->cfg.n_layers)
            continue; /* a layer beyond model_opts.max_layers */
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

/* ---- FP8 (E4M3) weights -----------------------------------------------------------
 * Kept as W_FP8 (1 byte a weight on the device; the gemm backends take them): the codes as in
 * the checkpoint and the scales as fp32, per tensor or per row (ModelOpt FP8: '.weight_scale',
 * one value or N) or per block of fp8_block[0] x fp8_block[1] weights (Hugging Face's
 * fine-grained FP8: '.weight_scale_inv', [ceil(N / rows), ceil(K / cols)], 128 x 128 when the
 * config gives no weight_block_size). Dequantized to BF16 (fp8 · scale in fp32, rounded once,
 * round to nearest even) where the consumer needs BF16 (mdl_bind_lin_bf16: MoE experts, router,
 * embedding, lm_head), on a GPU where the scale blocks do not cover whole 64-column groups (the
 * small-M kernel's step), and for every weight when LASTSTAND_FP8_DEQUANT=1 (the BF16 kernels then run
 * them, the behaviour before W_FP8; for before/after measurements). */
typedef struct fp8_job {
    const lin_w *w;
    uint16_t *out;
    int64_t nan_at; /* an element holding an FP8 NaN code (-1: none), any of them */
} fp8_job;

static void fp8_rows(void *ctx, int64_t r0, int64_t r1) {
    fp8_job *j = ctx;
    const int K = j->w->K;
    float *row = xmalloc(sizeof(float) * (size_t)K);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)j->w->data + r * K;
        for (int k = 0; k < K; k++)
            if ((w[k] & 0x7f) == 0x7f) __atomic_store_n(&j->nan_at, r * K + k, __ATOMIC_RELAXED);
        if (!j->out) continue;
        lin_row_f32(j->w, (int)r, row);
        uint16_t *o = j->out + r * K;
        for (int k = 0; k < K; k++) o[k] = f32_to_bf16(row[k]);
    }
    free(row);
}

/* Scan w (W_FP8) for NaN codes and, when out is set, write it there as BF16 [N, K]. */
static int fp8_pass(const lin_w *w, uint16_t *out, ls_err *e) {
    fp8_job j = {w, out, -1};
    pool_for(w->N, 64, fp8_rows, &j);
    const int64_t bad = j.nan_at;
    if (bad >= 0)
        return errf(e, ERR_INVAL, "tensor '%s': element %lld (row %lld) is an FP8 NaN (0x%02x)",
                    w->name ? w->name : "?", (long long)bad, (long long)(bad / w->K),
                    ((const uint8_t *)w->data)[bad]);
    return 0;
}

int mdl_fp8_to_bf16(model *m, lin_w *w, ls_err *e) {
    if (w->kind != W_FP8) return 0;
    uint16_t *deq = mdl_alloc(m, sizeof(uint16_t) * (size_t)w->N * w->K);
    int rc = fp8_pass(w, deq, e);
    if (rc) return rc;
    *w = (lin_w){.kind = W_BF16, .N = w->N, .K = w->K, .data = deq, .name = w->name};
    return 0;
}

/* 1 when LASTSTAND_FP8_DEQUANT=1: every FP8 weight dequantized at load. */
static int fp8_dequant_all(void) {
    const char *v = getenv("LASTSTAND_FP8_DEQUANT");
    return v && !strcmp(v, "1");
}

/* The scale tensor t (F32, BF16 or F16) as n floats in *out (the model's memory); every value
 * finite. */
static int fp8_scales(model *m, const st_tensor *t, int64_t n, float **out, ls_err *e) {
    float *v = mdl_alloc(m, sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case ST_F32: memcpy(&v[i], (const char *)t->data + 4 * i, 4); break;
        case ST_BF16: v[i] = bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        case ST_F16: v[i] = f16_to_f32(((const uint16_t *)t->data)[i]); break;
        default:
            return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected F32, BF16 or F16 (an FP8 scale)", t->name,
                        t->file, st_dtype_name(t->dtype));
        }
        if (!isfinite(v[i]))
            return errf(e, ERR_INVAL, "tensor '%s' in %s: scale %lld is %g (an FP8 scale must be a finite number)",
                        t->name, t->file, (long long)i, v[i]);
    }
    *out = v;
    return 0;
}

static int bind_fp8(model *m, const char *p, const st_tensor *w, int N, int K, lin_w *out, ls_err *e) {
    const int64_t ws[2] = {N, K};
    int rc = check_shape(w, 2, ws, e);
    if (rc) return rc;
    char sn[300], si[300];
    snprintf(sn, sizeof sn, "%s.weight_scale", p);
    snprintf(si, sizeof si, "%s.weight_scale_inv", p);
    const st_tensor *blk = mdl_tensor(m, si), *per = blk ? NULL : mdl_tensor(m, sn);
    float *sc = NULL;
    int br, bc, scols;
    int64_t ns;
    if (blk) {
        br = m->cfg.fp8_block[0] > 0 ? m->cfg.fp8_block[0] : 128;
        bc = m->cfg.fp8_block[1] > 0 ? m->cfg.fp8_block[1] : 128;
        const int64_t ss[2] = {(N + br - 1) / br, (K + bc - 1) / bc};
        if ((rc = check_shape(blk, 2, ss, e)))
            return err_prefix(e, "the block scales of FP8 tensor '%s' (weight_block_size [%d, %d])", w->name, br, bc);
        ns = ss[0] * ss[1];
        scols = (int)ss[1];
        rc = fp8_scales(m, blk, ns, &sc, e);
    } else if (per) {
        ns = st_numel(per);
        const int okrow = ns == N && (per->ndim == 1 || (per->ndim == 2 && per->shape[1] == 1));
        if (ns != 1 && !okrow) {
            char got[128];
            shape_str(per, got, sizeof got);
            return errf(e, ERR_INVAL, "tensor '%s' in %s: shape %s, expected one value or one per row ([%d] or [%d, 1]) "
                        "to scale FP8 tensor '%s'", sn, per->file, got, N, N, w->name);
        }
        br = ns == 1 ? N : 1, bc = K, scols = 1;
        rc = fp8_scales(m, per, ns, &sc, e);
    } else {
        return errf(e, ERR_INVAL, "tensor '%s' in %s is FP8 (F8_E4M3) but the checkpoint has neither '%s' nor '%s' to scale it",
                    w->name, w->file, sn, si);
    }
    if (rc) return rc;
    out->kind = W_FP8;
    out->fscale = sc;
    out->fs_br = br, out->fs_bc = bc, out->fs_cols = scols, out->fs_r0 = out->fs_c0 = 0;
    out->fs_n = (size_t)ns;
    if (fp8_dequant_all() || (mdl_uploads(m) && scols > 1 && bc % 64)) return mdl_fp8_to_bf16(m, out, e);
    return fp8_pass(out, NULL, e);
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
    case ST_F8_E4M3: return bind_fp8(m, p, w, N, K, out, e);
    default:
        return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected BF16, F16, F32, NVFP4 "
                    "(U8 with a '.weight_scale') or FP8 (F8_E4M3)", wn, w->file, st_dtype_name(w->dtype));
    }
    const int64_t ws[2] = {N, K};
    return check_shape(w, 2, ws, e);
}

int mdl_bind_lin_bf16(model *m, const char *p, int N, int K, lin_w *out, ls_err *e) {
    int rc = mdl_bind_lin(m, p, N, K, out, e);
    return rc ? rc : mdl_fp8_to_bf16(m, out, e);
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

/* ---- open ------------------------------------------------------------------- */

/* The weights outside the layers: embedding, lm_head, final norm (and the tensor-name prefix). */
static int bind_globals(model *m, ls_err *e) {
    const model_config *c = &m->cfg;
    const int H = c->hidden;
    char p[256];
    int rc;
    if (st_find(m->st, "model.language_model.embed_tokens.weight"))
        snprintf(m->prefix, sizeof m->prefix, "model.language_model.");
    else
        snprintf(m->prefix, sizeof m->prefix, "model.");
    mdl_name(m, p, sizeof p, "embed_tokens");
    if ((rc = mdl_bind_lin_bf16(m, p, c->vocab, H, &m->embed, e))) return rc;
    if (m->embed.kind == W_NVFP4)
        return errf(e, ERR_UNSUPPORTED, "tensor '%s.weight': an NVFP4 embedding is not supported", p);
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = mdl_bind_lin_bf16(m, "lm_head", c->vocab, H, &m->lm_head, e))) {
        return rc;
    }
    mdl_name(m, p, sizeof p, "norm.weight");
    if ((rc = mdl_bind_vec1(m, p, H, &m->final_norm, e))) return rc;
    m->layers = mdl_alloc(m, sizeof(layer_w) * (c->n_layers + m->n_mtp));
    for (int l = 0; l < c->n_layers; l++) { /* kinds and cache indices up front (tp_build copies the counts) */
        layer_w *L = &m->layers[l];
        L->type = c->layer_type[l];
        L->cache_idx = L->type == LAYER_FULL_ATTN ? m->n_full++ : m->n_lin++;
    }
    if (m->n_mtp) { /* the MTP head: a full-attention layer after the last, the KV layer after theirs */
        m->layers[c->n_layers].type = LAYER_FULL_ATTN;
        m->layers[c->n_layers].cache_idx = m->n_full;
    }
    return 0;
}

/* The MTP head's weights beside its decoder layer (model.h fwd_batch.mtp): mtp.fc cut into the
 * columns that take the embedding and those that take the hidden state, and the three norms. */
static int bind_mtp_glue(model *m, layer_w *L, ls_err *e) {
    const int H = m->cfg.hidden;
    lin_w fc;
    int rc;
    if ((rc = mdl_bind_lin_bf16(m, "mtp.fc", H, 2 * H, &fc, e))) return rc;
    if (fc.kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "tensor 'mtp.fc.weight': dtype %s, expected BF16 (or FP8)",
                    fc.kind == W_NVFP4 ? "NVFP4" : fc.kind == W_F16 ? "F16" : "F32");
    mtp_glue *g = mdl_alloc(m, sizeof *g);
    uint16_t *we = mdl_alloc(m, sizeof(uint16_t) * (size_t)H * H), *wh = mdl_alloc(m, sizeof(uint16_t) * (size_t)H * H);
    const uint16_t *src = fc.data;
    for (int r = 0; r < H; r++) { /* fc input = cat(embedding, hidden): columns [0, H) | [H, 2H) */
        memcpy(we + (size_t)r * H, src + (size_t)r * 2 * H, sizeof(uint16_t) * H);
        memcpy(wh + (size_t)r * H, src + (size_t)r * 2 * H + H, sizeof(uint16_t) * H);
    }
    g->fc_e = fc;
    g->fc_e.K = H;
    g->fc_e.data = we;
    g->fc_e.name = "mtp.fc[:, :H]";
    g->fc_h = g->fc_e;
    g->fc_h.data = wh;
    g->fc_h.name = "mtp.fc[:, H:]";
    if ((rc = mdl_bind_vec1(m, "mtp.pre_fc_norm_embedding.weight", H, &g->pre_e, e)) ||
        (rc = mdl_bind_vec1(m, "mtp.pre_fc_norm_hidden.weight", H, &g->pre_h, e)) ||
        (rc = mdl_bind_vec1(m, "mtp.norm.weight", H, &g->norm, e)))
        return rc;
    L->mtp = g;
    return 0;
}

static int bind_layer(model *m, int l, ls_err *e) {
    const int H = m->cfg.hidden;
    char p[256];
    int rc;
    layer_w *L = &m->layers[l];
    mdl_name(m, p, sizeof p, "layers.%d.input_layernorm.weight", l);
    if ((rc = mdl_bind_vec1(m, p, H, &L->in_norm, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.post_attention_layernorm.weight", l);
    if ((rc = mdl_bind_vec1(m, p, H, &L->post_norm, e))) return rc;
    rc = L->type == LAYER_FULL_ATTN ? qwen3_bind_attn(m, l, e) : next_bind_gdn(m, l, e);
    if (rc) return rc;
    if ((rc = qwen3_bind_mlp(m, l, e))) return rc;
    return l == m->cfg.n_layers ? bind_mtp_glue(m, L, e) : 0;
}

/* The device: "cpu", "cuda", or NULL = cuda when a GPU answers, else cpu.
 * "cuda" without a usable GPU is "no CUDA device: <why>" (the CLI exits 1):
 * ERR_RUNTIME when the CUDA runtime says why, ERR_UNSUPPORTED when this
 * build has no CUDA code at all. */
static int open_device(model *m, const model_opts *o, ls_err *e) {
    const char *dev = o && o->device ? o->device : NULL;
    if (dev && strcmp(dev, "cpu") && strcmp(dev, "cuda"))
        return errf(e, ERR_INVAL, "unknown device '%s' (valid: cpu, cuda)", dev);
    dev_info d;
    ls_stream stream = NULL;
    m->mem = &dev_mem_cpu;
    if (!dev || !strcmp(dev, "cuda")) {
        const dev_mem *cm = ops_dev_mem(DEV_CUDA);
        ls_err ce = {0};
        int rc = cm ? cm->open(0, &d, &stream, &ce)
                    : errf(&ce, ERR_UNSUPPORTED, "this build has no CUDA support (built with NO_CUDA=1)");
        if (rc == 0) {
            m->mem = cm;
        } else if (dev) {
            return errf(e, cm ? ERR_RUNTIME : ERR_UNSUPPORTED, "no CUDA device: %s", ce.msg);
        } else {
            log_debug("device: no CUDA device (%s); using the CPU", ce.msg);
        }
    }
    if (m->mem == &dev_mem_cpu) m->mem->open(0, &d, &stream, e);
    ops_names n = {0};
    if (o) {
        n.fp4_gemm = o->fp4_gemm_backend;
        n.moe = o->moe_backend;
        n.attention = o->attention_backend;
        n.gdn = o->gdn_backend;
        n.gemm = o->gemm_backend;
    }
    int rc = ops_select(&d, &n, &m->ops, e);
    if (o) m->ops.auto_fam |= o->auto_families & 31u;
    if (!rc && o) rc = mdl_lm_select(m, &d, o, e);
    m->ops.stream = stream;
    m->kv_dt = d.kind == DEV_CPU ? ACT_F32 : ACT_BF16;
#ifdef LS_HAVE_CUDA
    if (d.kind == DEV_CUDA) m->sampler = &sample_cuda;
#endif
    return rc;
}

int model_smoke_depth(const model_config *c) {
    const int n = c->n_layers;
    int total[4] = {0}, seen[4] = {0}; /* full attention, GDN, dense MLP, MoE */
    for (int l = 0; l < n && l < CFG_MAX_LAYERS; l++) {
        total[c->layer_type[l] == LAYER_FULL_ATTN ? 0 : 1]++;
        total[c->mlp_only[l] ? 2 : 3]++;
    }
    for (int d = 1; d <= n && d <= CFG_MAX_LAYERS; d++) {
        seen[c->layer_type[d - 1] == LAYER_FULL_ATTN ? 0 : 1]++;
        seen[c->mlp_only[d - 1] ? 2 : 3]++;
        int ok = d >= 2;
        for (int k = 0; k < 4 && ok; k++) ok = seen[k] >= (total[k] < 2 ? total[k] : 2);
        if (ok) return d;
    }
    return n;
}

/* The layers a model_opts.max_layers of cut leaves of c's. */
static int layers_cut(const model_config *c, int cut) {
    if (cut == MODEL_LAYERS_SMOKE) return model_smoke_depth(c);
    return cut > 0 && cut < c->n_layers ? cut : c->n_layers;
}

int model_layers_in_checkpoint(const model *m) { return m->n_layers_ckpt; }

/* This process's peak resident memory (VmHWM, bytes); 0 when /proc does not say. */
static double vm_hwm(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    fclose(f);
    return kb * 1024.0;
}

/* A tensor-parallel coordinator's layer l after its ranks took their slices: the host blocks
 * bound for it since owned_mark freed, its weights forgotten (kind, cache index and MLP kind
 * stay). */
static void drop_layer(model *m, int l, int owned_mark) {
    for (int i = owned_mark; i < m->n_owned; i++) free(m->owned[i]);
    m->n_owned = owned_mark;
    layer_w *L = &m->layers[l];
    layer_w keep = {.type = L->type, .cache_idx = L->cache_idx, .dense = L->dense};
    *L = keep;
}

/* The pages of a mapped checkpoint's tensors t[0..n) back to the kernel once their bytes are on
 * the device (or sliced): clean file pages, re-read from the page cache if ever touched again. */
static void release_pages(const st_tensor *const *t, int n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        if (!t[i]->file || !strcmp(t[i]->file, "<memory>")) continue;
        uintptr_t a = ((uintptr_t)t[i]->data + pg - 1) & ~(pg - 1), b = ((uintptr_t)t[i]->data + t[i]->nbytes) & ~(pg - 1);
        if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

/* Bind (and on a device upload) every layer, one at a time: a generated checkpoint (src) makes
 * each layer's tensors just before it is bound and frees them right after; with ranks the layer
 * is sliced into them and the coordinator's copy dropped; on a device the layer is uploaded and
 * its host copies freed; a mapped checkpoint's pages of the layer are handed back. stream = 0 (the
 * CPU, one rank): the layers stay as bound, views into the checkpoint. */
static int load_layers(model *m, synth_src *src, int stream, ls_err *e) {
    const int n = m->cfg.n_layers + m->n_mtp; /* the MTP head last */
    double t_gen = 0, t_bind = 0, t_take = 0, t_last = now_sec(), bytes = 0;
    int rc = 0;
    for (int l = 0; l < n && !rc; l++) {
        double t0 = now_sec();
        st_set *part = NULL;
        if (src) {
            if ((rc = synth_src_part(src, l, &part, e))) return err_prefix(e, "%s: generating layer %d", m->path, l);
            bytes += (double)synth_src_part_bytes(src, l);
            m->st_part = part;
        }
        double t1 = now_sec();
        const int owned_mark = m->n_owned, used_mark = m->n_used;
        rc = bind_layer(m, l, e);
        double t2 = now_sec();
        if (!rc && stream) {
            if (m->rank_m) {
                if (!(rc = tp_take_layer(m, l, e))) drop_layer(m, l, owned_mark);
            } else {
                rc = mdl_upload_part(m, l, e);
            }
            if (!part) release_pages(m->used + used_mark, m->n_used - used_mark);
        }
        if (part) { /* its tensors are gone: so are the lookups that pointed at them */
            m->st_part = NULL;
            st_close(part);
            m->n_used = used_mark;
        }
        double t3 = now_sec();
        t_gen += t1 - t0;
        t_bind += t2 - t1;
        t_take += t3 - t2;
        if (stream && (t3 - t_last > 10 || (l == n - 1 && t_gen + t_bind + t_take > 10))) {
            log_info("%s: %d of %d layers loaded (%.1f s so far)", m->path, l + 1, n, t_gen + t_bind + t_take);
            t_last = t3;
        }
    }
    if (rc) return rc;
    if (m->rank_m) tp_load_done(m);
    if ((stream || src) && t_gen + t_bind + t_take > 1)
        log_info("%s: load phases: generate %.1f s (%.1f GB), bind %.1f s, %s %.1f s", m->path, t_gen, bytes / 1e9,
                 t_bind, m->rank_m ? (m->ops.dev.kind != DEV_CPU ? "slice + upload" : "slice") : "upload", t_take);
    return 0;
}

int model_ssm_dtype(const char *v, int dflt) {
    if (!v || !*v || !strcmp(v, "auto")) return dflt;
    return !strcmp(v, "float32") ? 0 : !strcmp(v, "bfloat16") ? 1 : -1;
}

int model_open(const char *path, const model_opts *o, model **out, ls_err *e) {
    *out = NULL;
    model *m = xcalloc(1, sizeof *m);
    m->path = xstrdup(path);
    synth_src *src = NULL;
    double t_open = now_sec();
    int rc = open_device(m, o, e);
    if (rc) { model_close(m); return rc; }
    const int cut = o ? o->max_layers : 0;
    const int tp = o && o->tp > 1 ? o->tp : 1;
    /* streamed: a layer at a time, never the whole checkpoint in host memory (load_layers) */
    const int stream = mdl_uploads(m) || tp > 1;
    if (!strncmp(path, "synth:", 6)) {
        /* the same random weights `laststand synth` writes, made in memory */
        synth_opts so;
        json_t *cfg = NULL;
        if ((rc = synth_parse_spec(path + 6, &so, e))) {
            err_prefix(e, "%s", path);
            model_close(m);
            return rc;
        }
        m->n_layers_ckpt = 0;
        if (cut) { /* build only the layers that run: the full config says how many (layers=N) */
            model_config full;
            memset(&full, 0, sizeof full);
            if ((rc = synth_config(&so, &cfg, e)) || (rc = hfcfg_parse(cfg, path, &full, e))) {
                json_decref(cfg);
                err_prefix(e, "%s", path);
                model_close(m);
                return rc;
            }
            json_decref(cfg);
            cfg = NULL;
            m->n_layers_ckpt = full.n_layers;
            so.layers = layers_cut(&full, cut);
            hfcfg_free(&full);
        }
        if (stream) { /* the non-layer tensors now, each layer's when it is bound */
            if (!(rc = synth_open(&so, &src, &cfg, e))) rc = synth_src_part(src, -1, &m->st, e);
        } else {
            rc = synth_build(&so, &m->st, &cfg, e);
        }
        if (rc) {
            json_decref(cfg);
            synth_src_close(src);
            err_prefix(e, "%s", path);
            model_close(m);
            return rc;
        }
        rc = hfcfg_parse(cfg, path, &m->cfg, e);
        json_decref(cfg);
        if (rc) { synth_src_close(src); model_close(m); return rc; }
        if (!m->n_layers_ckpt) m->n_layers_ckpt = m->cfg.n_layers;
    } else {
        if ((rc = hfcfg_load_dir(path, &m->cfg, e))) { model_close(m); return rc; }
        if ((rc = st_open_dir(path, &m->st, e))) { model_close(m); return rc; }
        m->n_layers_ckpt = m->cfg.n_layers;
        /* later layers' entries of layer_type / mlp_only are simply never read */
        m->cfg.n_layers = layers_cut(&m->cfg, cut);
    }
    if (m->cfg.n_layers < m->n_layers_ckpt)
        log_info("%s: the first %d of %d layers only (model_opts.max_layers)", path, m->cfg.n_layers, m->n_layers_ckpt);
    m->norm_kind = m->cfg.arch == ARCH_QWEN3 || m->cfg.arch == ARCH_QWEN3_MOE ? RMS_PLAIN : RMS_ZC;
    const int sbf = model_ssm_dtype(o ? o->mamba_ssm_dtype : NULL, m->cfg.state_bf16);
    if (sbf < 0) {
        rc = errf(e, ERR_INVAL, "--mamba-ssm-dtype: '%s' is not float32, bfloat16 or auto", o->mamba_ssm_dtype);
        synth_src_close(src);
        model_close(m);
        return rc;
    }
    m->cfg.state_bf16 = sbf;
    if (o && o->mtp && !cut) {
        if (m->cfg.n_mtp < 1) {
            const char *key = m->cfg.arch == ARCH_QWEN3_5_MOE ? "mtp_num_hidden_layers"
                            : m->cfg.arch == ARCH_QWEN3_NEXT ? "num_nextn_predict_layers" : NULL;
            if (key)
                rc = errf(e, ERR_INVAL, "%s: MTP drafts need the checkpoint's multi-token-prediction head, and its "
                          "config has none (%s%s is 0 or absent)", path, m->cfg.wrapped ? "text_config." : "", key);
            else
                rc = errf(e, ERR_INVAL, "%s: MTP drafts need a multi-token-prediction head, which %s checkpoints do "
                          "not have (use --speculative-algorithm ngram)", path, arch_name(m->cfg.arch));
            synth_src_close(src);
            model_close(m);
            return rc;
        }
        if (m->cfg.n_mtp > 1) log_info("%s: %d MTP layers; drafting uses the first", path, m->cfg.n_mtp);
        m->n_mtp = 1;
    }
    if (m->cfg.state_bf16 && m->cfg.lin_v_heads > 0)
        log_info("%s: GDN recurrent state in BF16 (mamba_ssm_dtype)", path);
    if (m->ops.dev.kind != DEV_CPU) { /* what each GPU will hold, checked before anything loads */
        model_mem_plan pl;
        mdl_mem_plan(&m->cfg, m->cfg.n_layers, tp, 1, m->n_mtp, src ? NULL : m->st, src, &pl);
        m->plan_gpu_weights = pl.gpu_weights;
        log_info("%s: %d layers, %.1f GB of tensors: %.2f GiB of weights per GPU at --tp %d (%.2f GiB of them on "
                 "every GPU), KV %.1f KiB per token and %.1f MiB per GDN slot per GPU; host memory for the weights "
                 "while loading ~%.1f GB", path, m->cfg.n_layers, pl.total_bytes / 1e9, pl.gpu_weights / 1073741824.0,
                 tp, pl.gpu_replicated / 1073741824.0, pl.kv_token_bytes / 1024.0, pl.slot_bytes / 1048576.0,
                 pl.host_peak / 1e9);
        if (tp == 1 && (rc = mdl_check_fits(m, pl.gpu_weights, 1, e))) {
            synth_src_close(src);
            model_close(m);
            return rc;
        }
    }
    /* the non-layer weights, the ranks (each uploads its copy of them), then layer by layer */
    if ((rc = bind_globals(m, e)) || (tp > 1 && (rc = tp_build(m, tp, e))) ||
        (!m->rank_m && (rc = mdl_upload_part(m, -1, e))) || (rc = load_layers(m, src, stream, e))) {
        synth_src_close(src);
        model_close(m);
        return rc;
    }
    synth_src_close(src);
    warn_unused(m);
    for (int r = 0; m->rank_m && r < m->tp; r++) m->rank_m[r]->sampler = m->sampler;
    if ((rc = mdl_check_named_backends(m, e))) { model_close(m); return rc; }
    if (mdl_uploads(m)) {
        for (int r = 0; r < (m->rank_m ? m->tp : 1); r++) {
            model *rm = m->rank_m ? m->rank_m[r] : m;
            size_t fr = 0, tot = 0;
            mdl_dev_mem_info(rm, &fr, &tot);
            log_info("%s: %s: %.2f GiB of weights (%zu bytes), %.2f of %.2f GiB free", path, rm->ops.dev.name,
                     rm->weight_bytes / 1073741824.0, rm->weight_bytes, fr / 1073741824.0, tot / 1073741824.0);
        }
        if (m->rank_m) m->mem->bind_thread(m->rank_m[0]->ops.dev.ordinal, NULL);
    }
    const double t_all = now_sec() - t_open;
    if (t_all > 1 || getenv("LASTSTAND_LOG_LOAD"))
        log_info("%s: opened in %.1f s, host memory peak so far %.2f GB (VmHWM)", path, t_all, vm_hwm() / 1e9);
    *out = m;
    return 0;
}
