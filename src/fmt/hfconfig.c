/* hfconfig.c: a Hugging Face config.json (+ generation_config.json and
 * hf_quant_config.json) parsed into one flat model_config.
 *
 * Supported model_type values: qwen3, qwen3_moe, qwen3_next, qwen3_5_moe_text
 * and the multimodal wrapper qwen3_5_moe whose language model sits in
 * `text_config`. Defaults follow transformers' configuration classes
 * (reference/qwen35-and-nvfp4.md section 1); every value the forward pass
 * depends on is range-checked here, so model code can trust the struct.
 *
 * Errors are ERR_INVAL with "FILE: key 'PATH': what is wrong", PATH being the
 * JSON path as written in the file (e.g. 'text_config.num_experts_per_tok').
 * Owns: the malloc'd exclude patterns (hfcfg_free releases them).
 */
#include "fmt/hfconfig.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON access with error paths ---------------------------------------- */

typedef struct jctx {
    const char *file;   /* names the file in messages */
    const char *prefix; /* "" or "text_config." */
    ls_err *e;
} jctx;

static int bad(const jctx *j, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(const jctx *j, const char *key, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return errf(j->e, ERR_INVAL, "%s: key '%s%s': %s", j->file, j->prefix, key, what);
}

/* A present, non-null member, or NULL. */
static json_t *member(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

/* Integer key; def used when absent (required: def == INT64_MIN). */
#define REQUIRED INT64_MIN
static int get_int(const jctx *j, json_t *o, const char *key, int64_t def, int64_t lo, int64_t hi,
                   int *out) {
    json_t *v = member(o, key);
    int64_t x;
    if (!v) {
        if (def == REQUIRED) return bad(j, key, "missing (required)");
        x = def;
    } else if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return bad(j, key, "expected an integer");
    }
    if (x < lo || x > hi)
        return bad(j, key, "value %lld out of range [%lld, %lld]", (long long)x, (long long)lo,
                   (long long)hi);
    *out = (int)x;
    return 0;
}

static int get_num(const jctx *j, json_t *o, const char *key, double def, double lo, double hi,
                   double *out) {
    json_t *v = member(o, key);
    double x = def;
    if (v) {
        if (!json_is_number(v)) return bad(j, key, "expected a number");
        x = json_number_value(v);
    }
    if (!(x >= lo && x <= hi)) return bad(j, key, "value %g out of range [%g, %g]", x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(const jctx *j, json_t *o, const char *key, int def, int *out) {
    json_t *v = member(o, key);
    if (!v) { *out = def; return 0; }
    if (!json_is_boolean(v)) return bad(j, key, "expected true or false");
    *out = json_is_true(v);
    return 0;
}

static int add_eos(model_config *c, json_int_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 0;
    if (c->n_eos < CFG_MAX_EOS) c->eos[c->n_eos++] = (int32_t)id;
    return 0;
}

/* eos_token_id: an integer, a list of integers, or null. */
static int get_eos(const jctx *j, json_t *o, const char *key, model_config *c) {
    json_t *v = member(o, key);
    if (!v) return 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0) return bad(j, key, "negative token id");
        return add_eos(c, json_integer_value(v));
    }
    if (!json_is_array(v)) return bad(j, key, "expected an integer or a list of integers");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return bad(j, key, "element %zu is not a token id", i);
        add_eos(c, json_integer_value(x));
    }
    return 0;
}

/* ---- architecture -------------------------------------------------------- */

static const struct {
    const char *model_type;
    model_arch arch;
    const char *classes[3]; /* accepted `architectures` entries */
} k_types[] = {
    {"qwen3", ARCH_QWEN3, {"Qwen3ForCausalLM", "Qwen3Model"}},
    {"qwen3_moe", ARCH_QWEN3_MOE, {"Qwen3MoeForCausalLM", "Qwen3MoeModel"}},
    {"qwen3_next", ARCH_QWEN3_NEXT, {"Qwen3NextForCausalLM", "Qwen3NextModel"}},
    {"qwen3_5_moe_text", ARCH_QWEN3_5_MOE, {"Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextModel"}},
    {"qwen3_5_moe", ARCH_QWEN3_5_MOE,
     {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeModel"}},
};

const char *arch_name(model_arch a) {
    switch (a) {
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN3_MOE: return "qwen3_moe";
    case ARCH_QWEN3_NEXT: return "qwen3_next";
    case ARCH_QWEN3_5_MOE: return "qwen3_5_moe";
    }
    return "?";
}

/* ---- quantization -------------------------------------------------------- */

static int add_exclude(model_config *c, const jctx *j, const char *key, json_t *list) {
    if (!list) return 0;
    if (!json_is_array(list)) return bad(j, key, "expected a list of module patterns");
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) {
        if (!json_is_string(x)) return bad(j, key, "element %zu is not a string", i);
        const char *s = json_string_value(x);
        int dup = 0;
        for (int k = 0; k < c->n_exclude; k++) dup |= !strcmp(c->exclude[k], s);
        if (dup) continue;
        if (c->n_exclude >= CFG_MAX_EXCLUDE)
            return bad(j, key, "more than %d patterns", CFG_MAX_EXCLUDE);
        c->exclude[c->n_exclude++] = xstrdup(s);
    }
    return 0;
}

/* A quantization block: hf_quant_config.json's "quantization" or config.json's
 * "quantization_config". ModelOpt ("modelopt"): quant_algo NVFP4 / W4A16_NVFP4, FP8 /
 * FP8_PER_CHANNEL_PER_TOKEN (E4M3 weights with a per-tensor or per-row weight_scale), or
 * MIXED_PRECISION (some of each; each linear's own tensors say which). Hugging Face's
 * fine-grained FP8 ("fp8", the Qwen / DeepSeek FP8 checkpoints): E4M3 weights with
 * weight_scale_inv per weight_block_size block. FP8 weights are dequantized to BF16 at load
 * (model_load.c); which linears are quantized is read off their tensors, not the config. */
static int parse_quant(model_config *c, const jctx *j, json_t *q) {
    json_t *m = member(q, "quant_method");
    if (m && !json_is_string(m)) return bad(j, "quant_method", "expected a string");
    const char *qm = m ? json_string_value(m) : NULL;
    int rc;
    if (qm && !strcmp(qm, "fp8")) {
        json_t *f = member(q, "fmt");
        if (f && (!json_is_string(f) || strcmp(json_string_value(f), "e4m3")))
            return errf(j->e, ERR_UNSUPPORTED, "%s: key '%sfmt': only \"e4m3\" FP8 weights are supported",
                        j->file, j->prefix);
        json_t *b = member(q, "weight_block_size");
        if (b) {
            if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
                !json_is_integer(json_array_get(b, 1)))
                return bad(j, "weight_block_size", "expected two integers [rows, cols]");
            for (int i = 0; i < 2; i++) {
                const json_int_t v = json_integer_value(json_array_get(b, i));
                if (v < 1 || v > 1 << 20) return bad(j, "weight_block_size", "entry %d is %lld, not 1..2^20", i, (long long)v);
                c->fp8_block[i] = (int)v;
            }
        }
        c->fp8 = 1;
        if ((rc = add_exclude(c, j, "modules_to_not_convert", member(q, "modules_to_not_convert")))) return rc;
        return add_exclude(c, j, "ignored_layers", member(q, "ignored_layers"));
    }
    if (qm && strcmp(qm, "modelopt") && strcmp(qm, "modelopt_fp4") && strcmp(qm, "modelopt_fp8") &&
        strcmp(qm, "modelopt_mixed"))
        return errf(j->e, ERR_UNSUPPORTED, "%s: key '%squant_method': \"%s\" is not supported (\"modelopt\": NVFP4, "
                    "FP8 or MIXED_PRECISION; \"fp8\": block-scaled FP8)", j->file, j->prefix, qm);
    json_t *a = member(q, "quant_algo");
    if (a) {
        if (!json_is_string(a)) return bad(j, "quant_algo", "expected a string");
        const char *al = json_string_value(a);
        /* W4A16_NVFP4 stores the same tensors; only the activation handling differs */
        if (!strcmp(al, "NVFP4") || !strcmp(al, "W4A16_NVFP4"))
            c->nvfp4 = 1;
        else if (!strcmp(al, "FP8") || !strcmp(al, "FP8_PER_CHANNEL_PER_TOKEN"))
            c->fp8 = 1;
        else if (!strcmp(al, "MIXED_PRECISION"))
            c->nvfp4 = c->fp8 = 1;
        else
            return errf(j->e, ERR_UNSUPPORTED, "%s: key '%squant_algo': \"%s\" is not supported (NVFP4, "
                        "W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN and MIXED_PRECISION are)", j->file, j->prefix, al);
    }
    int gs;
    if ((rc = get_int(j, q, "group_size", 16, 1, 1 << 20, &gs))) return rc;
    if (c->nvfp4 && gs != 16) return bad(j, "group_size", "NVFP4 needs 16, got %d", gs);
    c->group_size = gs;
    if ((rc = add_exclude(c, j, "exclude_modules", member(q, "exclude_modules")))) return rc;
    return add_exclude(c, j, "ignore", member(q, "ignore"));
}

/* Pattern p against module name m: exact, fnmatch wildcard (a '*' crosses
 * dots, as Python's fnmatch does), or p naming a parent module of m. */
static int match1(const char *p, const char *m) {
    if (!strcmp(p, m) || fnmatch(p, m, 0) == 0) return 1;
    size_t n = strlen(p);
    return !strpbrk(p, "*?[") && !strncmp(p, m, n) && m[n] == '.';
}

int hfcfg_excluded(const model_config *c, const char *module) {
    /* Try the name as given, with `language_model.` stripped, and added. */
    char alt[2][512];
    const char *cand[3] = {module, NULL, NULL};
    const char *lm = strstr(module, "language_model.");
    if (lm) {
        snprintf(alt[0], sizeof alt[0], "%.*s%s", (int)(lm - module), module,
                 lm + strlen("language_model."));
        cand[1] = alt[0];
    } else if (!strncmp(module, "model.", 6)) {
        snprintf(alt[1], sizeof alt[1], "model.language_model.%s", module + 6);
        cand[2] = alt[1];
    }
    for (int i = 0; i < c->n_exclude; i++)
        for (int k = 0; k < 3; k++)
            if (cand[k] && match1(c->exclude[i], cand[k])) return 1;
    return 0;
}

/* ---- the text config ----------------------------------------------------- */

static int parse_text(model_config *c, const jctx *j, json_t *t) {
    int rc;
#define TRY(x) do { if ((rc = (x))) return rc; } while (0)
    int is_hybrid = c->arch == ARCH_QWEN3_NEXT || c->arch == ARCH_QWEN3_5_MOE;
    int is_moe = c->arch != ARCH_QWEN3;

    json_t *act = member(t, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return bad(j, "hidden_act", "only \"silu\" is supported");

    TRY(get_int(j, t, "hidden_size", REQUIRED, 1, 1 << 20, &c->hidden));
    TRY(get_int(j, t, "num_hidden_layers", REQUIRED, 1, CFG_MAX_LAYERS, &c->n_layers));
    c->n_mtp = 0;
    if (is_hybrid) { /* the MTP head's layer count: Qwen3.5's name, else Qwen3-Next's */
        if (member(t, "mtp_num_hidden_layers"))
            TRY(get_int(j, t, "mtp_num_hidden_layers", 0, 0, 8, &c->n_mtp));
        else
            TRY(get_int(j, t, "num_nextn_predict_layers", 0, 0, 8, &c->n_mtp));
    }
    TRY(get_int(j, t, "vocab_size", REQUIRED, 1, 1 << 28, &c->vocab));
    double eps = 0;
    TRY(get_num(j, t, "rms_norm_eps", 1e-6, 1e-30, 1.0, &eps));
    c->rms_eps = (float)eps;
    TRY(get_int(j, t, "max_position_embeddings", 32768, 1, 1 << 30, &c->max_pos));

    /* attention */
    TRY(get_int(j, t, "num_attention_heads", REQUIRED, 1, 1 << 12, &c->n_heads));
    TRY(get_int(j, t, "num_key_value_heads", c->n_heads, 1, c->n_heads, &c->n_kv_heads));
    if (c->n_heads % c->n_kv_heads)
        return bad(j, "num_key_value_heads", "%d does not divide num_attention_heads %d",
                   c->n_kv_heads, c->n_heads);
    /* transformers' defaults: 128 (qwen3, qwen3_moe), 256 (qwen3_next, qwen3_5_moe) */
    TRY(get_int(j, t, "head_dim", is_hybrid ? 256 : 128, 2, 1 << 12, &c->head_dim));
    if (c->head_dim % 2) return bad(j, "head_dim", "%d is odd (RoPE needs pairs)", c->head_dim);

    /* RoPE: rope_parameters (transformers 5) or the legacy top-level keys. */
    json_t *rp = member(t, "rope_parameters");
    if (!rp) rp = member(t, "rope_scaling");
    if (rp && !json_is_object(rp)) return bad(j, "rope_parameters", "expected an object");
    if (rp) {
        json_t *ty = member(rp, "rope_type");
        if (!ty) ty = member(rp, "type");
        if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "default")))
            return bad(j, "rope_parameters.rope_type", "only \"default\" RoPE is supported");
    }
    double theta_def = c->arch == ARCH_QWEN3_5_MOE ? 1e7 : 10000.0;
    jctx jr = *j;
    char rprefix[64];
    snprintf(rprefix, sizeof rprefix, "%srope_parameters.", j->prefix);
    jr.prefix = rprefix;
    if (rp && member(rp, "rope_theta"))
        TRY(get_num(&jr, rp, "rope_theta", theta_def, 1.0, 1e12, &c->rope_theta));
    else
        TRY(get_num(j, t, "rope_theta", theta_def, 1.0, 1e12, &c->rope_theta));
    double prf = is_hybrid ? 0.25 : 1.0;
    if (rp && member(rp, "partial_rotary_factor"))
        TRY(get_num(&jr, rp, "partial_rotary_factor", prf, 1e-6, 1.0, &prf));
    else
        TRY(get_num(j, t, "partial_rotary_factor", prf, 1e-6, 1.0, &prf));
    c->rotary_dim = (int)(c->head_dim * prf); /* transformers: int(head_dim * factor) */
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return bad(j, "partial_rotary_factor", "%g x head_dim %d gives rotary dim %d (needs an "
                   "even number >= 2)", prf, c->head_dim, c->rotary_dim);

    c->attn_output_gate = 0;
    if (c->arch == ARCH_QWEN3_NEXT) c->attn_output_gate = 1; /* always gated in code */
    if (c->arch == ARCH_QWEN3_5_MOE) TRY(get_bool(j, t, "attn_output_gate", 1, &c->attn_output_gate));
    json_t *ab = member(t, "attention_bias");
    if (ab && json_is_true(ab)) return bad(j, "attention_bias", "biased attention is not supported");

    /* dense MLP */
    TRY(get_int(j, t, "intermediate_size", is_moe ? 0 : REQUIRED, is_moe ? 0 : 1, 1 << 22,
                &c->intermediate));

    /* MoE */
    if (is_moe) {
        const char *ekey = member(t, "num_experts") || !member(t, "num_local_experts")
                               ? "num_experts" : "num_local_experts";
        TRY(get_int(j, t, ekey, REQUIRED, 1, 1 << 16, &c->n_experts));
        TRY(get_int(j, t, "num_experts_per_tok", REQUIRED, 1, 1 << 16, &c->top_k));
        if (c->top_k > c->n_experts)
            return bad(j, "num_experts_per_tok", "%d is more than %s %d", c->top_k, ekey,
                       c->n_experts);
        TRY(get_int(j, t, "moe_intermediate_size", REQUIRED, 1, 1 << 22, &c->moe_inter));
        if (c->arch == ARCH_QWEN3_MOE)
            c->shared_inter = 0;
        else
            TRY(get_int(j, t, "shared_expert_intermediate_size", REQUIRED, 0, 1 << 22,
                        &c->shared_inter));
        /* transformers defaults: False for qwen3_moe, True for qwen3_next;
         * Qwen3.5 always renormalises whatever the key says. */
        TRY(get_bool(j, t, "norm_topk_prob", c->arch != ARCH_QWEN3_MOE, &c->norm_topk_prob));
        if (c->arch == ARCH_QWEN3_5_MOE) c->norm_topk_prob = 1;
        TRY(get_int(j, t, "decoder_sparse_step", 1, 1, CFG_MAX_LAYERS, &c->decoder_sparse_step));
    }
    memset(c->mlp_only, !is_moe, sizeof c->mlp_only);
    if (is_moe && c->arch != ARCH_QWEN3_5_MOE) {
        /* transformers: MoE iff i not in mlp_only_layers and (i+1) % step == 0
         * (Qwen3.5-MoE has no dense layers and ignores both keys). */
        for (int i = 0; i < c->n_layers; i++)
            c->mlp_only[i] = (i + 1) % c->decoder_sparse_step != 0;
        json_t *mo = member(t, "mlp_only_layers");
        if (mo) {
            if (!json_is_array(mo)) return bad(j, "mlp_only_layers", "expected a list of layer indices");
            size_t i;
            json_t *x;
            json_array_foreach(mo, i, x) {
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) >= c->n_layers)
                    return bad(j, "mlp_only_layers", "element %zu is not a layer index in [0, %d)",
                               i, c->n_layers);
                c->mlp_only[json_integer_value(x)] = 1;
            }
        }
        for (int i = 0; i < c->n_layers; i++)
            if (c->mlp_only[i] && c->intermediate <= 0)
                return bad(j, "intermediate_size", "layer %d uses the dense MLP but the size is "
                           "missing", i);
    }

    /* Layer types: explicit list, or every full_attention_interval-th layer. */
    memset(c->layer_type, LAYER_FULL_ATTN, sizeof c->layer_type);
    c->full_attn_interval = 1;
    if (is_hybrid) TRY(get_int(j, t, "full_attention_interval", 4, 1, CFG_MAX_LAYERS,
                               &c->full_attn_interval));
    json_t *lt = member(t, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
            return bad(j, "layer_types", "expected a list of num_hidden_layers (%d) strings",
                       c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (s && !strcmp(s, "full_attention")) c->layer_type[i] = LAYER_FULL_ATTN;
            else if (s && is_hybrid && !strcmp(s, "linear_attention")) c->layer_type[i] = LAYER_LINEAR_ATTN;
            else
                return bad(j, "layer_types", "element %d: \"%s\" is not supported for %s", i,
                           s ? s : "(not a string)", c->model_type);
        }
    } else if (is_hybrid) {
        for (int i = 0; i < c->n_layers; i++)
            c->layer_type[i] = (i + 1) % c->full_attn_interval ? LAYER_LINEAR_ATTN : LAYER_FULL_ATTN;
    }
    json_t *sw = member(t, "use_sliding_window");
    if (sw && json_is_true(sw)) return bad(j, "use_sliding_window", "sliding-window attention is not supported");

    /* Gated DeltaNet */
    int n_lin = 0;
    for (int i = 0; i < c->n_layers; i++) n_lin += c->layer_type[i] == LAYER_LINEAR_ATTN;
    if (is_hybrid) {
        TRY(get_int(j, t, "linear_num_key_heads", 16, 1, 1 << 12, &c->lin_k_heads));
        TRY(get_int(j, t, "linear_num_value_heads", 32, 1, 1 << 12, &c->lin_v_heads));
        TRY(get_int(j, t, "linear_key_head_dim", 128, 1, 1 << 12, &c->lin_k_dim));
        TRY(get_int(j, t, "linear_value_head_dim", 128, 1, 1 << 12, &c->lin_v_dim));
        TRY(get_int(j, t, "linear_conv_kernel_dim", 4, 1, 64, &c->lin_conv));
        if (c->lin_v_heads % c->lin_k_heads)
            return bad(j, "linear_num_value_heads", "%d is not a multiple of linear_num_key_heads %d",
                       c->lin_v_heads, c->lin_k_heads);
        /* the recurrent state's storage (Qwen3.5: "float32"; SGLang --mamba-ssm-dtype overrides it) */
        json_t *sd = member(t, "mamba_ssm_dtype");
        if (sd) {
            const char *v = json_is_string(sd) ? json_string_value(sd) : "";
            if (!strcmp(v, "bfloat16")) c->state_bf16 = 1;
            else if (strcmp(v, "float32"))
                return bad(j, "mamba_ssm_dtype", "only \"float32\" and \"bfloat16\" are supported");
        }
        json_t *og = member(t, "output_gate_type");
        if (og && (!json_is_string(og) || (strcmp(json_string_value(og), "swish") &&
                                           strcmp(json_string_value(og), "silu"))))
            return bad(j, "output_gate_type", "only \"swish\"/\"silu\" is supported");
    }
    (void)n_lin;

    c->bos = -1;
    json_t *bos = member(t, "bos_token_id");
    if (bos) {
        if (!json_is_integer(bos) || json_integer_value(bos) < 0) return bad(j, "bos_token_id", "expected a token id");
        c->bos = (int32_t)json_integer_value(bos);
    }
    TRY(get_eos(j, t, "eos_token_id", c));
#undef TRY
    return 0;
}

int hfcfg_parse(json_t *root, const char *file, model_config *c, ls_err *e) {
    memset(c, 0, sizeof *c);
    c->bos = -1;
    jctx j = {file, "", e};
    if (!json_is_object(root)) return errf(e, ERR_INVAL, "%s: expected a JSON object", file);
    json_t *mt = member(root, "model_type");
    if (!mt || !json_is_string(mt)) return bad(&j, "model_type", "missing or not a string");
    const char *type = json_string_value(mt);
    int ti = -1;
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (!strcmp(type, k_types[i].model_type)) ti = (int)i;
    if (ti < 0)
        return bad(&j, "model_type", "unknown model type \"%s\" (supported: qwen3, qwen3_moe, "
                   "qwen3_next, qwen3_5_moe, qwen3_5_moe_text)", type);
    json_t *archs = member(root, "architectures");
    if (archs) {
        if (!json_is_array(archs) || json_array_size(archs) == 0)
            return bad(&j, "architectures", "expected a non-empty list of class names");
        size_t i;
        json_t *x;
        json_array_foreach(archs, i, x) {
            const char *s = json_string_value(x);
            int ok = 0;
            for (int k = 0; k < 3 && k_types[ti].classes[k]; k++)
                ok |= s && !strcmp(s, k_types[ti].classes[k]);
            if (!ok)
                return bad(&j, "architectures", "unknown architecture \"%s\" for model_type \"%s\"",
                           s ? s : "(not a string)", type);
        }
    }
    c->arch = k_types[ti].arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", type);

    json_t *text = root;
    json_t *tc = member(root, "text_config");
    if (!strcmp(type, "qwen3_5_moe")) {
        if (!tc || !json_is_object(tc)) return bad(&j, "text_config", "missing or not an object");
        json_t *tmt = member(tc, "model_type");
        if (tmt && (!json_is_string(tmt) || strcmp(json_string_value(tmt), "qwen3_5_moe_text")))
            return bad(&j, "text_config.model_type", "expected \"qwen3_5_moe_text\"");
        text = tc;
        c->wrapped = 1;
    }
    jctx jt = {file, c->wrapped ? "text_config." : "", e};
    int rc = parse_text(c, &jt, text);
    if (rc) return rc;
    /* The wrapper's own tie_word_embeddings wins (transformers reads it there). */
    int tie = 0;
    if ((rc = get_bool(&jt, text, "tie_word_embeddings", 0, &tie))) return rc;
    if (c->wrapped && member(root, "tie_word_embeddings") &&
        (rc = get_bool(&j, root, "tie_word_embeddings", tie, &tie)))
        return rc;
    c->tie_embeddings = tie;
    if (c->wrapped && (rc = get_eos(&j, root, "eos_token_id", c))) return rc;

    json_t *q = member(root, "quantization_config");
    if (q) {
        if (!json_is_object(q)) return bad(&j, "quantization_config", "expected an object");
        jctx jq = {file, "quantization_config.", e};
        if ((rc = parse_quant(c, &jq, q))) return rc;
    }
    return 0;
}

/* Merge an optional side file (generation_config.json, hf_quant_config.json). */
static json_t *load_optional(const char *dir, const char *name, char *path, size_t np, ls_err *e,
                             int *rc) {
    snprintf(path, np, "%s/%s", dir, name);
    *rc = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    if (!r) *rc = errf(e, ERR_INVAL, "%s: line %d: %s", path, je.line, je.text);
    return r;
}

int hfcfg_load_dir(const char *dir, model_config *c, ls_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        memset(c, 0, sizeof *c);
        FILE *f = fopen(path, "rb");
        if (!f) return errf(e, ERR_INVAL, "%s: cannot open (is --model-path a model folder?)", path);
        fclose(f);
        return errf(e, ERR_INVAL, "%s: line %d: %s", path, je.line, je.text);
    }
    int rc = hfcfg_parse(root, path, c, e);
    json_decref(root);
    if (rc) { hfcfg_free(c); return rc; }

    json_t *g = load_optional(dir, "generation_config.json", path, sizeof path, e, &rc);
    if (rc) { hfcfg_free(c); return rc; }
    if (g) {
        jctx jg = {path, "", e};
        rc = json_is_object(g) ? get_eos(&jg, g, "eos_token_id", c)
                               : errf(e, ERR_INVAL, "%s: expected a JSON object", path);
        json_decref(g);
        if (rc) { hfcfg_free(c); return rc; }
    }
    json_t *hq = load_optional(dir, "hf_quant_config.json", path, sizeof path, e, &rc);
    if (rc) { hfcfg_free(c); return rc; }
    if (hq) {
        json_t *q = json_is_object(hq) ? member(hq, "quantization") : NULL;
        jctx jq = {path, "quantization.", e};
        rc = q && json_is_object(q) ? parse_quant(c, &jq, q)
                                    : errf(e, ERR_INVAL, "%s: key 'quantization': missing or not an object", path);
        json_decref(hq);
        if (rc) { hfcfg_free(c); return rc; }
    }
    return 0;
}

void hfcfg_free(model_config *c) {
    for (int i = 0; i < c->n_exclude; i++) free(c->exclude[i]);
    c->n_exclude = 0;
}
