/* shapes.c: the op shapes the doctor tests, from a model's config.json, a
 * "synth:NAME" spec or a named preset (the real architectures' dimensions,
 * reference/qwen35-and-nvfp4.md section 1.2), and their JSON form that the
 * parent hands to its trial children.
 *
 * Which linears are NVFP4: in a model folder, the ones hf_quant_config does
 * not exclude (checked on the first layer of each kind: attention, GDN and
 * the shared expert); in one that declares FP8 (alone, or ModelOpt's
 * MIXED_PRECISION), what its tensors are, as the loader reads them: FP8
 * attention, GDN and dense MLP projections are gemm shapes with an FP8 weight
 * (doc_lin.fp8), an FP8 shared expert runs in BF16.
 * For a "synth:" spec, what synth writes (src/model/synth.c): the routed
 * experts NVFP4, the shared expert, attention and GDN projections BF16 (as
 * ModelOpt 0.46 excludes `*.mlp.shared_expert.*`,
 * reference/qwen35-and-nvfp4.md 4.2); all BF16 with quant=bf16 or for a preset
 * that synth writes in BF16 by default (all but the qwen3.5 ones). For a bare
 * preset (--shapes), the other layout real NVFP4 checkpoints may have: routed
 * and shared experts NVFP4, attention and GDN BF16 (which one NVIDIA's 397B
 * ships is unconfirmed; the two layouts are the two ways to name the model).
 */
#include "doctor/doctor.h"
#include "fmt/hfconfig.h"
#include "fmt/safetensors.h"
#include "model/synth.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kinds a linear's weight can have in the shapes: BF16 (gemm), NVFP4 (fp4_gemm), FP8 (gemm,
 * doc_lin.fp8). */
enum { LK_BF16 = 0, LK_NVFP4 = 1, LK_FP8 = 2 };

/* What linear module mod is: with the checkpoint's tensors at hand (st), as the loader decides
 * (NVFP4: a U8 weight with a weight_scale; FP8: an F8_E4M3 weight, kept FP8 by the loader unless
 * LASTSTAND_FP8_DEQUANT=1), where the tensor is there; else what the config's quantization block
 * says (not excluded: NVFP4, or FP8 for an FP8-only checkpoint). */
static int lin_kind(const model_config *c, const st_set *st, const char *mod) {
    const char *dq = getenv("LASTSTAND_FP8_DEQUANT");
    const int fp8 = !(dq && !strcmp(dq, "1"));
    if (st) {
        char n[300];
        snprintf(n, sizeof n, "%s.weight", mod);
        const st_tensor *t = st_find(st, n);
        if (t) {
            if (t->dtype == ST_F8_E4M3) return fp8 ? LK_FP8 : LK_BF16;
            snprintf(n, sizeof n, "%s.weight_scale", mod);
            return t->dtype == ST_U8 && st_find(st, n) != NULL ? LK_NVFP4 : LK_BF16;
        }
    }
    if (!c->nvfp4 && !c->fp8) return LK_BF16;
    if (hfcfg_excluded(c, mod)) return LK_BF16;
    return c->nvfp4 ? LK_NVFP4 : fp8 ? LK_FP8 : LK_BF16;
}

static void add_lin_kind(doc_lin *arr, int *n, int N, int K, const char *label, int fp8) {
    if (N <= 0 || K <= 0) return;
    for (int i = 0; i < *n; i++)
        if (arr[i].N == N && arr[i].K == K && arr[i].fp8 == fp8) {
            size_t l = strlen(arr[i].label);
            if (!strstr(arr[i].label, label) && l + strlen(label) + 3 < sizeof arr[i].label)
                snprintf(arr[i].label + l, sizeof arr[i].label - l, ", %s", label);
            return;
        }
    if (*n >= DOC_MAX_LIN) return;
    arr[*n].N = N;
    arr[*n].K = K;
    arr[*n].fp8 = fp8;
    snprintf(arr[*n].label, sizeof arr[*n].label, "%s", label);
    (*n)++;
}

static void add_lin(doc_lin *arr, int *n, int N, int K, const char *label) { add_lin_kind(arr, n, N, K, label, 0); }

typedef struct preset {
    const char *name;
    int hidden, E, top_k, I, Is, nh, nkv, hd, nk, nv, dk, dv, dense_inter, vocab;
} preset;

static const preset k_presets[] = {
    {"qwen3.5-397b-a17b", 4096, 512, 10, 1024, 1024, 32, 2, 256, 16, 64, 128, 128, 0, 248320},
    {"qwen3.5-122b-a10b", 3072, 256, 8, 1024, 1024, 32, 2, 256, 16, 64, 128, 128, 0, 248320},
    {"qwen3.5-35b-a3b", 2048, 256, 8, 512, 512, 16, 2, 256, 16, 32, 128, 128, 0, 248320},
    {"qwen3-next-80b-a3b", 2048, 512, 10, 512, 512, 16, 2, 256, 16, 32, 128, 128, 0, 151936},
    {"qwen3-30b-a3b", 2048, 128, 8, 768, 0, 32, 4, 128, 0, 0, 0, 0, 0, 151936},
    {"qwen3-235b-a22b", 4096, 128, 8, 1536, 0, 64, 4, 128, 0, 0, 0, 0, 0, 151936},
};

/* Fill the derived lists from the scalar fields; ka / kg / km: the kinds (LK_*) of the attention
 * and GDN projections and of a dense MLP; the routed experts go to fp4_gemm (all_bf16 moves them
 * for a BF16 model), the shared expert's kind is s->sh_nvfp4 (an FP8 one is dequantized to BF16
 * at load, as the router). */
static void add_kind(doc_shapes *s, int kind, int N, int K, const char *label) {
    if (kind == LK_NVFP4) add_lin(s->fp4, &s->n_fp4, N, K, label);
    else add_lin_kind(s->bf16, &s->n_bf16, N, K, label, kind == LK_FP8);
}

static void derive(doc_shapes *s, int ka, int kg, int km, int dense_inter) {
    const int H = s->hidden;
    s->n_fp4 = s->n_bf16 = 0;
    if (s->n_experts > 0) {
        add_kind(s, LK_NVFP4, s->moe_inter, H, "experts gate/up");
        add_kind(s, LK_NVFP4, H, s->moe_inter, "experts down");
        if (s->shared_inter > 0) {
            add_kind(s, s->sh_nvfp4 ? LK_NVFP4 : LK_BF16, s->shared_inter, H, "shared expert gate/up");
            add_kind(s, s->sh_nvfp4 ? LK_NVFP4 : LK_BF16, H, s->shared_inter, "shared expert down");
        }
        add_kind(s, LK_BF16, s->n_experts, H, "router");
    } else if (dense_inter > 0) {
        add_kind(s, km, dense_inter, H, "mlp gate/up");
        add_kind(s, km, H, dense_inter, "mlp down");
    }
    if (s->n_heads > 0) {
        add_kind(s, ka, s->n_heads * s->head_dim * (s->gated ? 2 : 1), H, "attn q_proj");
        add_kind(s, ka, s->n_kv_heads * s->head_dim, H, "attn k/v_proj");
        add_kind(s, ka, H, s->n_heads * s->head_dim, "attn o_proj");
    }
    if (s->nk > 0) {
        add_kind(s, kg, 2 * s->nk * s->dk + s->nv * s->dv, H, "gdn in_proj_qkv");
        add_kind(s, kg, s->nv * s->dv, H, "gdn in_proj_z");
        add_kind(s, kg, H, s->nv * s->dv, "gdn out_proj");
    }
    /* NVFP4 needs K % 16 == 0; anything else cannot be NVFP4 at all */
    for (int i = 0; i < s->n_fp4; i++)
        if (s->fp4[i].K % 16) {
            memmove(&s->fp4[i], &s->fp4[i + 1], sizeof s->fp4[0] * (s->n_fp4 - i - 1));
            s->n_fp4--;
            i--;
        }
}

/* A BF16 model: every linear is a gemm. */
static void all_bf16(doc_shapes *s) {
    for (int i = 0; i < s->n_fp4; i++) add_lin(s->bf16, &s->n_bf16, s->fp4[i].N, s->fp4[i].K, s->fp4[i].label);
    s->n_fp4 = 0;
    s->nvfp4 = s->sh_nvfp4 = 0;
}

int doc_shapes_from_preset(const char *name, doc_shapes *s, ls_err *e) {
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++) {
        const preset *p = &k_presets[i];
        if (strcmp(p->name, name)) continue;
        memset(s, 0, sizeof *s);
        snprintf(s->model, sizeof s->model, "%s", name);
        s->nvfp4 = 1;
        s->sh_nvfp4 = 1; /* a synth: spec turns it to BF16 below */
        s->hidden = p->hidden;
        s->vocab = p->vocab;
        s->n_experts = p->E;
        s->top_k = p->top_k;
        s->moe_inter = p->I;
        s->shared_inter = p->Is;
        s->norm_topk = 1;
        s->has_sh_gate = p->Is > 0;
        s->n_heads = p->nh;
        s->n_kv_heads = p->nkv;
        s->head_dim = p->hd;
        s->gated = p->nk > 0; /* the hybrid families gate attention output */
        s->nk = p->nk;
        s->nv = p->nv;
        s->dk = p->dk;
        s->dv = p->dv;
        s->conv_k = p->nk > 0 ? 4 : 0;
        derive(s, LK_BF16, LK_BF16, LK_NVFP4, p->dense_inter);
        return 0;
    }
    buf b;
    buf_init(&b);
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        buf_printf(&b, "%s%s", i ? ", " : "", k_presets[i].name);
    errf(e, ERR_INVAL, "--shapes: unknown preset '%s' (valid: %s)", name, b.data);
    buf_free(&b);
    return ERR_INVAL;
}

int doc_shapes_from_model(const char *path, doc_shapes *s, ls_err *e) {
    if (!strncmp(path, "synth:", 6)) {
        char name[128];
        const char *spec = path + 6;
        size_t l = strcspn(spec, ",");
        if (l == 0 || l >= sizeof name)
            return errf(e, ERR_INVAL, "--model-path: bad synth spec '%s'", path);
        memcpy(name, spec, l);
        name[l] = 0;
        int rc = doc_shapes_from_preset(name, s, e);
        if (rc) return err_prefix(e, "--model-path %s", path);
        synth_opts so;
        if ((rc = synth_parse_spec(spec, &so, e))) return err_prefix(e, "--model-path %s", path);
        snprintf(s->model, sizeof s->model, "%s", path);
        /* synth's quantization: quant=Q, else NVFP4 for the qwen3.5 presets only; its NVFP4
         * checkpoints keep the shared expert BF16; nvfp4-fp8 writes attention and GDN in FP8
         * (and the shared expert, which the loader dequantizes to BF16) */
        s->sh_nvfp4 = 0;
        const char *dq = getenv("LASTSTAND_FP8_DEQUANT");
        const int kp = so.quant && !strcmp(so.quant, "nvfp4-fp8") && !(dq && !strcmp(dq, "1")) ? LK_FP8 : LK_BF16;
        derive(s, kp, kp, LK_NVFP4, 0);
        if (!(so.quant ? strncmp(so.quant, "nvfp4", 5) == 0 : !strncmp(name, "qwen3.5-", 8))) all_bf16(s);
        return 0;
    }
    model_config c;
    memset(&c, 0, sizeof c);
    int rc = hfcfg_load_dir(path, &c, e);
    if (rc) return rc;
    memset(s, 0, sizeof *s);
    snprintf(s->model, sizeof s->model, "%s", path);
    s->nvfp4 = c.nvfp4;
    s->hidden = c.hidden;
    s->vocab = c.vocab;
    s->n_experts = c.n_experts;
    s->top_k = c.top_k;
    s->moe_inter = c.moe_inter;
    s->shared_inter = c.shared_inter;
    s->norm_topk = c.arch == ARCH_QWEN3_5_MOE ? 1 : c.norm_topk_prob;
    s->has_sh_gate = c.shared_inter > 0;
    s->n_heads = c.n_heads;
    s->n_kv_heads = c.n_kv_heads;
    s->head_dim = c.head_dim;
    s->gated = c.attn_output_gate;
    int any_lin = 0, first_full = -1, first_lin = -1;
    for (int i = 0; i < c.n_layers && i < CFG_MAX_LAYERS; i++) {
        if (c.layer_type[i] == LAYER_LINEAR_ATTN) {
            any_lin = 1;
            if (first_lin < 0) first_lin = i;
        } else if (first_full < 0) {
            first_full = i;
        }
    }
    if (any_lin) {
        s->nk = c.lin_k_heads;
        s->nv = c.lin_v_heads;
        s->dk = c.lin_k_dim;
        s->dv = c.lin_v_dim;
        s->conv_k = c.lin_conv;
        s->state_bf16 = c.state_bf16;
    }
    int qa = LK_BF16, qg = LK_BF16, qm = LK_BF16;
    const int dense = c.n_experts > 0 ? 0 : c.intermediate;
    if (c.nvfp4 || c.fp8) {
        char mod[256];
        const char *pfx = c.wrapped ? "model.language_model.layers" : "model.layers";
        /* a checkpoint that declares FP8 (alone or beside NVFP4: MIXED_PRECISION): the tensors say
         * what each linear is, as the loader reads them; the config's excludes otherwise */
        st_set *st = NULL;
        if (c.fp8 && st_open_dir(path, &st, &(ls_err){0})) st = NULL;
        if (first_full >= 0) {
            snprintf(mod, sizeof mod, "%s.%d.self_attn.q_proj", pfx, first_full);
            qa = lin_kind(&c, st, mod);
        }
        if (first_lin >= 0) {
            snprintf(mod, sizeof mod, "%s.%d.linear_attn.in_proj_qkv%s", pfx, first_lin,
                     c.arch == ARCH_QWEN3_NEXT ? "z" : "");
            qg = lin_kind(&c, st, mod);
        }
        if (dense > 0) {
            snprintf(mod, sizeof mod, "%s.0.mlp.gate_proj", pfx);
            qm = lin_kind(&c, st, mod);
        }
        if (c.shared_inter > 0 && c.n_experts > 0) {
            snprintf(mod, sizeof mod, "%s.0.mlp.shared_expert.gate_proj", pfx);
            s->sh_nvfp4 = lin_kind(&c, st, mod) == LK_NVFP4;
        }
        if (st && c.n_experts > 0) {
            snprintf(mod, sizeof mod, "%s.0.mlp.experts.0.gate_proj", pfx);
            s->nvfp4 = lin_kind(&c, st, mod) == LK_NVFP4;
        }
        st_close(st);
    }
    derive(s, qa, qg, qm, dense);
    if (!s->nvfp4) all_bf16(s);
    hfcfg_free(&c);
    return 0;
}

int doc_shapes_set_fp4(doc_shapes *s, const char *list, ls_err *e) {
    s->n_fp4 = 0;
    const char *p = list;
    while (*p) {
        int N, K, used = 0;
        if (sscanf(p, "%dx%d%n", &N, &K, &used) != 2 || N <= 0 || K <= 0 || K % 16)
            return errf(e, ERR_INVAL, "--fp4-shapes: bad entry at '%s' (want NxK with K %% 16 == 0)", p);
        char label[64];
        snprintf(label, sizeof label, "given %dx%d", N, K);
        add_lin(s->fp4, &s->n_fp4, N, K, label);
        p += used;
        if (*p == ',') p++;
        else if (*p) return errf(e, ERR_INVAL, "--fp4-shapes: expected ',' at '%s'", p);
    }
    if (!s->n_fp4) return errf(e, ERR_INVAL, "--fp4-shapes: empty list");
    return 0;
}

static json_t *lins_json(const doc_lin *a, int n) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:i,s:i,s:s,s:i}", "N", a[i].N, "K", a[i].K, "label", a[i].label, "fp8",
                                             a[i].fp8));
    return arr;
}

char *doc_shapes_json(const doc_shapes *s) {
    json_t *o = json_pack(
        "{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "model", s->model,
        "nvfp4", s->nvfp4, "hidden", s->hidden, "n_experts", s->n_experts, "top_k", s->top_k,
        "moe_inter", s->moe_inter, "shared_inter", s->shared_inter, "norm_topk", s->norm_topk,
        "has_sh_gate", s->has_sh_gate, "n_heads", s->n_heads, "n_kv_heads", s->n_kv_heads,
        "head_dim", s->head_dim, "gated", s->gated, "nk", s->nk, "nv", s->nv, "dk", s->dk, "dv",
        s->dv, "conv_k", s->conv_k);
    json_object_set_new(o, "sh_nvfp4", json_integer(s->sh_nvfp4));
    json_object_set_new(o, "vocab", json_integer(s->vocab));
    if (s->state_bf16) json_object_set_new(o, "state_bf16", json_integer(1)); /* (absent: fp32, as before) */
    json_object_set_new(o, "fp4", lins_json(s->fp4, s->n_fp4));
    json_object_set_new(o, "bf16", lins_json(s->bf16, s->n_bf16));
    char *t = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return t;
}

static int geti(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : 0;
}

static void parse_lins(json_t *arr, doc_lin *a, int *n) {
    *n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (*n >= DOC_MAX_LIN) break;
        a[*n].N = geti(v, "N");
        a[*n].K = geti(v, "K");
        a[*n].fp8 = geti(v, "fp8");
        const char *l = json_string_value(json_object_get(v, "label"));
        snprintf(a[*n].label, sizeof a[*n].label, "%s", l ? l : "");
        (*n)++;
    }
}

int doc_shapes_parse_json(const char *text, doc_shapes *s, ls_err *e) {
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return errf(e, ERR_INVAL, "doctor shapes: bad JSON: %s", je.text);
    }
    memset(s, 0, sizeof *s);
    const char *m = json_string_value(json_object_get(o, "model"));
    snprintf(s->model, sizeof s->model, "%s", m ? m : "");
    s->nvfp4 = geti(o, "nvfp4");
    s->hidden = geti(o, "hidden");
    s->n_experts = geti(o, "n_experts");
    s->top_k = geti(o, "top_k");
    s->moe_inter = geti(o, "moe_inter");
    s->shared_inter = geti(o, "shared_inter");
    s->norm_topk = geti(o, "norm_topk");
    s->has_sh_gate = geti(o, "has_sh_gate");
    s->n_heads = geti(o, "n_heads");
    s->n_kv_heads = geti(o, "n_kv_heads");
    s->head_dim = geti(o, "head_dim");
    s->gated = geti(o, "gated");
    s->nk = geti(o, "nk");
    s->nv = geti(o, "nv");
    s->dk = geti(o, "dk");
    s->dv = geti(o, "dv");
    s->conv_k = geti(o, "conv_k");
    s->sh_nvfp4 = geti(o, "sh_nvfp4");
    s->vocab = geti(o, "vocab");
    s->state_bf16 = json_object_get(o, "state_bf16") ? geti(o, "state_bf16") : 0;
    parse_lins(json_object_get(o, "fp4"), s->fp4, &s->n_fp4);
    parse_lins(json_object_get(o, "bf16"), s->bf16, &s->n_bf16);
    json_decref(o);
    return 0;
}
