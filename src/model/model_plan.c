/* model_plan.c: what loading a checkpoint places on each GPU and in host memory, from its config
 * and tensor headers alone (model_mem_plan_get: serve --dry-run; mdl_mem_plan: model_open's check
 * of every GPU's free memory before it generates, reads or uploads anything).
 *
 * Per tensor, the bytes one tensor-parallel rank uploads (model_tp.c's slicing rules, rank 0;
 * every rank holds the same amount): the embedding, lm_head, norms (q/k norms included), the MoE
 * router and the shared-expert gate whole on every rank; k_proj / v_proj split when the KV heads
 * split over the ranks, else one KV head per rank; everything else (attention q/o, GDN
 * projections, conv1d, A_log, dt_bias, experts, shared expert, dense MLP) split in tp equal parts.
 * 1-D parameters and conv1d weights are uploaded as fp32; NVFP4 global and input scales are read
 * on the host (0 bytes); each piece is 256-byte aligned on the device, as model_weights.c lays it.
 * Tensors of layers beyond model_opts.max_layers and the vision tower are left out, and mtp.*
 * unless the MTP head loads (model_opts.mtp): then it counts as one more layer (mtp.fc whole on
 * every rank) with one more KV layer.
 * Host memory while loading onto devices: the non-layer tensors, one layer's tensors, and that
 * layer's host copies (the ranks' column slices, permuted rows), the largest layer's.
 *
 * Owns nothing beyond a call.
 */
#include "model/model_impl.h"
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The layer a tensor name belongs to (-1: none), after the "layers." of its prefix. */
static int layer_of(const char *name) {
    const char *p = strstr(name, "layers.");
    if (!p || strncmp(name, "mtp.", 4) == 0) return -1; /* (the MTP head: plan_add) */
    return atoi(p + 7);
}

typedef struct plan_acc {
    const model_config *c;
    int tp, n_layers;
    int mtp;       /* the MTP head loads: layer n_layers */
    model_mem_plan *p;
    double *layer; /* [n_layers + mtp] host bytes per layer */
    double *stage; /* [n_layers + mtp] host copies made while loading the layer (see plan_add) */
    double globals;
    int device;
} plan_acc;

static void plan_add(plan_acc *a, const st_tensor *t) {
    const model_config *c = a->c;
    const int tp = a->tp;
    const char *n = t->name;
    const int is_mtp = !strncmp(n, "mtp.", 4);
    if ((is_mtp && !a->mtp) || strstr(n, "visual.")) return;
    const int l = is_mtp ? a->n_layers : layer_of(n);
    if (!is_mtp && l >= a->n_layers) return;
    if (l >= 0) a->layer[l] += (double)t->nbytes;
    else a->globals += (double)t->nbytes;
    /* host copies while a layer loads onto devices: the ranks' column slices (down_proj, o_proj,
     * out_proj: every rank's share at once), the gated q_proj's permuted rows, GDN qkv's rows */
    if (l >= 0 && a->device &&
        ((tp > 1 && (strstr(n, "down_proj") || strstr(n, "o_proj") || strstr(n, "out_proj") || strstr(n, "in_proj_qkv"))) ||
         (c->attn_output_gate && strstr(n, "q_proj"))))
        a->stage[l] += (double)t->nbytes;
    a->p->total_bytes += (double)t->nbytes;
    if (ends_with(n, ".weight_scale_2") || ends_with(n, ".input_scale")) return; /* host scalars */
    if (ends_with(n, "lm_head.weight") && c->tie_embeddings) return;
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    double bytes = (double)t->nbytes;
    const int fp32 = t->ndim <= 1 || strstr(n, "conv1d") != NULL;
    if (fp32) bytes = 4.0 * (double)numel;
    if (t->dtype == ST_F8_E4M3 && t->ndim == 2 && ends_with(n, ".weight")) {
        /* FP8 linears the loader dequantizes to BF16 (model_load.c: experts, router, embedding,
         * lm_head; all of them under LASTSTAND_FP8_DEQUANT=1) take 2 bytes a weight */
        const char *dq = getenv("LASTSTAND_FP8_DEQUANT");
        if ((dq && !strcmp(dq, "1")) || strstr(n, ".experts.") || strstr(n, "shared_expert") ||
            ends_with(n, ".mlp.gate.weight") || strstr(n, "embed_tokens") || ends_with(n, "lm_head.weight"))
            bytes = 2.0 * (double)numel;
    }
    int whole = strstr(n, "embed_tokens") || ends_with(n, "lm_head.weight") || strstr(n, "norm.weight") ||
                !strcmp(n, "mtp.fc.weight") ||
                ends_with(n, ".mlp.gate.weight") || strstr(n, "shared_expert_gate") ||
                (t->ndim <= 1 && !strstr(n, "A_log") && !strstr(n, "dt_bias"));
    double mine;
    if (whole || tp <= 1) mine = bytes;
    else if ((strstr(n, "k_proj") || strstr(n, "v_proj")) && c->n_kv_heads % tp)
        mine = bytes / (c->n_kv_heads > 0 ? c->n_kv_heads : 1); /* one KV head per rank */
    else mine = bytes / tp;
    mine = (double)align256((size_t)mine);
    a->p->gpu_weights += mine;
    if (whole && tp > 1) a->p->gpu_replicated += mine;
}

int mdl_mem_plan(const model_config *c, int n_layers, int tp, int device, int mtp, const st_set *st,
                 const synth_src *src, model_mem_plan *out) {
    memset(out, 0, sizeof *out);
    out->tp = tp > 1 ? tp : 1;
    out->n_layers = n_layers;
    mtp = mtp ? 1 : 0;
    plan_acc a = {.c = c, .tp = out->tp, .n_layers = n_layers, .mtp = mtp, .p = out, .device = device};
    a.layer = xcalloc((size_t)(n_layers + mtp > 0 ? n_layers + mtp : 1), sizeof(double));
    a.stage = xcalloc((size_t)(n_layers + mtp > 0 ? n_layers + mtp : 1), sizeof(double));
    if (src) {
        for (int i = 0; i < synth_src_count(src); i++) {
            st_tensor t;
            synth_src_info(src, i, &t);
            plan_add(&a, &t);
        }
    } else {
        for (int i = 0; i < st_count(st); i++) plan_add(&a, st_get(st, i));
    }
    double stage = 0;
    for (int l = 0; l < n_layers + mtp; l++) {
        if (a.layer[l] > out->largest_layer) out->largest_layer = a.layer[l];
        if (a.stage[l] > stage) stage = a.stage[l];
    }
    out->host_globals = a.globals;
    free(a.layer);
    free(a.stage);
    /* caches per GPU: the rank's heads (model_tp.c), BF16 KV on a device, fp32 on the CPU */
    int n_full = 0, n_lin = 0;
    for (int l = 0; l < n_layers && l < CFG_MAX_LAYERS; l++) {
        if (c->layer_type[l] == LAYER_FULL_ATTN) n_full++;
        else n_lin++;
    }
    const int T = out->tp;
    const int nkv = c->n_kv_heads % T == 0 ? c->n_kv_heads / T : 1;
    out->kv_token_bytes = (double)(n_full + mtp) * 2 * nkv * c->head_dim * (device ? 2 : 4);
    const double nk = c->lin_k_heads / T, nv = c->lin_v_heads / T;
    out->slot_bytes = (double)n_lin * (4.0 * (2 * nk * c->lin_k_dim + nv * c->lin_v_dim) * (c->lin_conv - 1) +
                                       (c->state_bf16 ? 2.0 : 4.0) * nv * c->lin_k_dim * c->lin_v_dim);
    /* host memory while loading: streamed (a device, or CPU ranks), the non-layer tensors and one
     * layer beyond what stays (a CPU rank keeps its slices: the layers); else everything */
    const double layers = out->total_bytes - out->host_globals;
    if (device) out->host_peak = out->host_globals + out->largest_layer + stage;
    else if (T > 1) out->host_peak = out->host_globals + layers + out->largest_layer;
    else out->host_peak = out->total_bytes;
    return 0;
}

int model_mem_plan_get(const char *path, const model_opts *o, model_mem_plan *out, ls_err *e) {
    memset(out, 0, sizeof *out);
    model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    st_set *st = NULL;
    synth_src *src = NULL;
    int rc;
    const int tp = o && o->tp > 1 ? o->tp : 1;
    const int device = !(o && o->device && !strcmp(o->device, "cpu"));
    if (!strncmp(path, "synth:", 6)) {
        synth_opts so;
        json_t *j = NULL;
        if ((rc = synth_parse_spec(path + 6, &so, e)) || (rc = synth_open(&so, &src, &j, e)) ||
            (rc = hfcfg_parse(j, path, &cfg, e))) {
            json_decref(j);
            synth_src_close(src);
            hfcfg_free(&cfg);
            return err_prefix(e, "%s", path);
        }
        json_decref(j);
    } else if ((rc = hfcfg_load_dir(path, &cfg, e)) || (rc = st_open_dir(path, &st, e))) {
        hfcfg_free(&cfg);
        return rc;
    }
    int n_layers = cfg.n_layers;
    const int sbf = model_ssm_dtype(o ? o->mamba_ssm_dtype : NULL, cfg.state_bf16);
    if (sbf >= 0) cfg.state_bf16 = sbf; /* (a bad value: model_open names it) */
    if (o && o->max_layers) {
        int cut = o->max_layers == MODEL_LAYERS_SMOKE ? model_smoke_depth(&cfg) : o->max_layers;
        if (cut > 0 && cut < n_layers) n_layers = cut;
    }
    const int mtp = o && o->mtp && !o->max_layers && cfg.n_mtp > 0; /* (without a head: model_open refuses) */
    rc = mdl_mem_plan(&cfg, n_layers, tp, device, mtp, st, src, out);
    out->n_layers_ckpt = cfg.n_layers;
    synth_src_close(src);
    if (st) st_close(st);
    hfcfg_free(&cfg);
    return rc;
}

int model_auto_max_running(double cache_bytes, double slot_bytes) {
    if (!(slot_bytes > 0)) return MODEL_AUTO_RUN_MAX;
    const double n = floor(0.25 * cache_bytes / slot_bytes);
    return n < 1 ? 1 : n > MODEL_AUTO_RUN_MAX ? MODEL_AUTO_RUN_MAX : (int)n;
}
