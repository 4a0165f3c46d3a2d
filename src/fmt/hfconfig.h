/* hfconfig.h: the model's config.json (+ hf_quant_config.json and
 * generation_config.json) parsed into one flat struct for every supported
 * architecture: qwen3, qwen3_moe, qwen3_next, qwen3_5_moe_text and the
 * qwen3_5_moe wrapper (text_config). Errors name the file and the JSON key.
 */
#ifndef LS_HFCONFIG_H
#define LS_HFCONFIG_H

#include "base/base.h"
#include <jansson.h>

typedef enum model_arch {
    ARCH_QWEN3 = 0,     /* dense */
    ARCH_QWEN3_MOE,
    ARCH_QWEN3_NEXT,
    ARCH_QWEN3_5_MOE,   /* qwen3_5_moe_text, with or without the multimodal wrapper */
} model_arch;

enum { LAYER_FULL_ATTN = 0, LAYER_LINEAR_ATTN = 1 };

#define CFG_MAX_LAYERS 512
#define CFG_MAX_EOS 8
#define CFG_MAX_EXCLUDE 256

typedef struct model_config {
    model_arch arch;
    char model_type[64];        /* as written: "qwen3_5_moe", "qwen3_5_moe_text", ... */
    int wrapped;                /* 1 when config has text_config (multimodal wrapper) */

    int hidden;                 /* hidden_size */
    int n_layers;               /* num_hidden_layers */
    int vocab;                  /* vocab_size (rows of embed / lm_head) */
    float rms_eps;
    int tie_embeddings;         /* tie_word_embeddings */
    int max_pos;                /* max_position_embeddings */

    /* full attention */
    int n_heads, n_kv_heads, head_dim;
    int rotary_dim;             /* head_dim * partial_rotary_factor */
    double rope_theta;
    int attn_output_gate;       /* q_proj emits per-head [q | gate] */

    /* dense MLP (qwen3, and MoE models' mlp_only_layers) */
    int intermediate;

    /* MoE */
    int n_experts, top_k, moe_inter;
    int shared_inter;           /* 0 = no shared expert */
    int norm_topk_prob;
    int decoder_sparse_step;
    unsigned char mlp_only[CFG_MAX_LAYERS];  /* 1: layer i uses the dense MLP */

    /* Gated DeltaNet */
    unsigned char layer_type[CFG_MAX_LAYERS]; /* LAYER_FULL_ATTN / LAYER_LINEAR_ATTN */
    int full_attn_interval;
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    int state_bf16;              /* mamba_ssm_dtype "bfloat16" (default "float32": 0) */
    /* multi-token prediction: the checkpoint's mtp.* layers (Qwen3.5 mtp_num_hidden_layers,
     * Qwen3-Next num_nextn_predict_layers; 0 for the others or when absent) */
    int n_mtp;

    /* tokens */
    int32_t eos[CFG_MAX_EOS];   /* config eos_token_id(s) + generation_config eos */
    int n_eos;
    int32_t bos;                /* -1 if none */

    /* quantization (ModelOpt NVFP4; FP8 weights, dequantized to BF16 at load) */
    int nvfp4;                  /* quant_algo NVFP4 (or MIXED_PRECISION) declared */
    int group_size;             /* 16 */
    int fp8;                    /* FP8 (E4M3) weights declared: quant_method "fp8", or ModelOpt
                                   quant_algo FP8 / FP8_PER_CHANNEL_PER_TOKEN / MIXED_PRECISION */
    int fp8_block[2];           /* "fp8"'s weight_block_size [rows, cols] of one weight_scale_inv
                                   entry; 0 when not given */
    char *exclude[CFG_MAX_EXCLUDE]; /* exclude_modules / ignore patterns (malloc'd) */
    int n_exclude;
} model_config;

/* Parse dir/config.json (+ hf_quant_config.json, generation_config.json if present). */
int hfcfg_load_dir(const char *dir, model_config *c, ls_err *e);
/* Parse a config JSON object; `file` names it in errors. */
int hfcfg_parse(json_t *root, const char *file, model_config *c, ls_err *e);
void hfcfg_free(model_config *c);
/* 1 if module prefix (e.g. "model.layers.0.self_attn.q_proj") matches an exclude pattern. */
int hfcfg_excluded(const model_config *c, const char *module);
const char *arch_name(model_arch a);

#endif
