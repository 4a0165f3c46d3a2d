/* test_hfconfig.c: config.json parsing for the four Qwen families (values as
 * transformers' configuration classes define them), the side files
 * (generation_config.json eos, hf_quant_config.json excludes), exclude
 * pattern matching, and the error messages naming file and key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fmt/hfconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse(const char *text, model_config *c, ls_err *e) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) fail_msg("bad test JSON: %s", je.text);
    int rc = hfcfg_parse(j, "config.json", c, e);
    json_decref(j);
    return rc;
}

#define QWEN3 "\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":128," \
              "\"num_hidden_layers\":4,\"vocab_size\":1024,\"num_attention_heads\":4," \
              "\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":96"

#define TEXT35 "\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":128,\"num_hidden_layers\":8," \
               "\"vocab_size\":1536,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32," \
               "\"num_experts\":16,\"num_experts_per_tok\":4,\"moe_intermediate_size\":48," \
               "\"shared_expert_intermediate_size\":64,\"linear_num_key_heads\":2," \
               "\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,\"linear_value_head_dim\":32"

static void test_qwen3_dense_values_and_defaults(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" QWEN3 ",\"rope_theta\":1000000,\"tie_word_embeddings\":true,"
                           "\"eos_token_id\":151645}", &c, &e), 0);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_int_equal(c.hidden, 128);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.rotary_dim, 32); /* full RoPE */
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(c.attn_output_gate, 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos[0], 151645);
    assert_true(c.rms_eps == 1e-6f);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(c.layer_type[i], LAYER_FULL_ATTN);
        assert_int_equal(c.mlp_only[i], 1);
    }
    hfcfg_free(&c);
}

static void test_rope_parameters_win_over_legacy_keys(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" QWEN3 ",\"rope_theta\":5,\"rope_parameters\":{\"rope_type\":\"default\","
                           "\"rope_theta\":10000.0}}", &c, &e), 0);
    assert_true(c.rope_theta == 10000.0);
    hfcfg_free(&c);
    assert_int_equal(parse("{" QWEN3 ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", &c, &e),
                     ERR_INVAL);
    assert_non_null(strstr(e.msg, "rope_type"));
    hfcfg_free(&c);
}

static void test_qwen35_wrapper_reads_text_config(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{\"model_type\":\"qwen3_5_moe\",\"architectures\":"
                           "[\"Qwen3_5MoeForConditionalGeneration\"],\"tie_word_embeddings\":false,"
                           "\"text_config\":{" TEXT35 ",\"full_attention_interval\":4,"
                           "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,"
                           "\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10],"
                           "\"mrope_interleaved\":true},\"eos_token_id\":248044,"
                           "\"norm_topk_prob\":false}}", &c, &e), 0);
    assert_int_equal(c.arch, ARCH_QWEN3_5_MOE);
    assert_int_equal(c.wrapped, 1);
    assert_int_equal(c.rotary_dim, 8);           /* 32 x 0.25 */
    assert_true(c.rope_theta == 1e7);
    assert_int_equal(c.attn_output_gate, 1);     /* default true */
    assert_int_equal(c.norm_topk_prob, 1);       /* Qwen3.5 always renormalises */
    assert_int_equal(c.n_experts, 16);
    assert_int_equal(c.top_k, 4);
    assert_int_equal(c.shared_inter, 64);
    assert_int_equal(c.lin_conv, 4);             /* default */
    /* default layer_types: full attention every 4th layer */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(c.layer_type[i], (i + 1) % 4 ? LAYER_LINEAR_ATTN : LAYER_FULL_ATTN);
        assert_int_equal(c.mlp_only[i], 0);
    }
    assert_int_equal(c.eos[0], 248044);
    hfcfg_free(&c);
}

static void test_partial_rotary_factor_top_level(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" TEXT35 ",\"partial_rotary_factor\":0.5,\"rope_theta\":100}", &c, &e), 0);
    assert_int_equal(c.rotary_dim, 16);
    assert_true(c.rope_theta == 100);
    hfcfg_free(&c);
}

static void test_moe_sparse_step_and_mlp_only_layers(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"num_hidden_layers\":6,"
                           "\"vocab_size\":100,\"num_attention_heads\":2,\"head_dim\":32,"
                           "\"intermediate_size\":96,\"num_local_experts\":8,\"num_experts_per_tok\":2,"
                           "\"moe_intermediate_size\":16,\"decoder_sparse_step\":2,"
                           "\"mlp_only_layers\":[3]}", &c, &e), 0);
    assert_int_equal(c.n_experts, 8); /* transformers 5 writes num_local_experts */
    assert_int_equal(c.n_kv_heads, 2); /* defaults to the query heads */
    assert_int_equal(c.norm_topk_prob, 0); /* qwen3_moe default */
    assert_int_equal(c.shared_inter, 0);
    const int want[6] = {1, 0, 1, 1, 1, 0}; /* MoE iff (i+1) % 2 == 0 and not in [3] */
    for (int i = 0; i < 6; i++) assert_int_equal(c.mlp_only[i], want[i]);
    hfcfg_free(&c);
}

static void test_eos_list_and_generation_config_merge(void **st) {
    char dir[] = "/tmp/test_hfcfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{" QWEN3 ",\"eos_token_id\":[7,8]}");
    fclose(f);
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    f = fopen(p, "w");
    fprintf(f, "{\"eos_token_id\":[8,9]}");
    fclose(f);
    model_config c;
    ls_err e = {0};
    assert_int_equal(hfcfg_load_dir(dir, &c, &e), 0);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos[0], 7);
    assert_int_equal(c.eos[1], 8);
    assert_int_equal(c.eos[2], 9);
    hfcfg_free(&c);
    /* a broken side file is named in the error */
    f = fopen(p, "w");
    fprintf(f, "{\"eos_token_id\":\"x\"}");
    fclose(f);
    assert_int_equal(hfcfg_load_dir(dir, &c, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "generation_config.json"));
    assert_non_null(strstr(e.msg, "eos_token_id"));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_hf_quant_config_excludes_with_wildcards(void **st) {
    char dir[] = "/tmp/test_hfcfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" TEXT35 "},"
               "\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\","
               "\"group_size\":16,\"ignore\":[\"lm_head\"]}}");
    fclose(f);
    snprintf(p, sizeof p, "%s/hf_quant_config.json", dir);
    f = fopen(p, "w");
    fprintf(f, "{\"producer\":{\"name\":\"modelopt\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
               "\"group_size\":16,\"exclude_modules\":[\"model.visual*\",\"mtp*\",\"*linear_attn*\","
               "\"model.language_model.layers.0.mlp.gate\"]}}");
    fclose(f);
    model_config c;
    ls_err e = {0};
    assert_int_equal(hfcfg_load_dir(dir, &c, &e), 0);
    assert_int_equal(c.nvfp4, 1);
    assert_int_equal(c.group_size, 16);
    assert_int_equal(c.n_exclude, 5);
    assert_true(hfcfg_excluded(&c, "lm_head"));
    assert_true(hfcfg_excluded(&c, "model.visual.blocks.0.attn.qkv"));
    assert_true(hfcfg_excluded(&c, "mtp.fc"));
    assert_true(hfcfg_excluded(&c, "model.language_model.layers.2.linear_attn.in_proj_qkv"));
    assert_true(hfcfg_excluded(&c, "model.language_model.layers.0.mlp.gate"));
    /* the same module named without the multimodal prefix */
    assert_true(hfcfg_excluded(&c, "model.layers.0.mlp.gate"));
    assert_false(hfcfg_excluded(&c, "model.language_model.layers.0.mlp.gate_proj"));
    assert_false(hfcfg_excluded(&c, "model.language_model.layers.1.mlp.gate"));
    assert_false(hfcfg_excluded(&c, "model.language_model.layers.3.mlp.experts.0.up_proj"));
    hfcfg_free(&c);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_exclude_adds_language_model_prefix(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" TEXT35 ",\"quantization_config\":{\"quant_method\":\"modelopt\","
                           "\"quant_algo\":\"NVFP4\",\"exclude_modules\":"
                           "[\"model.language_model.layers.*.self_attn*\"]}}", &c, &e), 0);
    assert_true(hfcfg_excluded(&c, "model.layers.3.self_attn.q_proj"));
    assert_false(hfcfg_excluded(&c, "model.layers.3.mlp.experts.1.down_proj"));
    hfcfg_free(&c);
}

/* Each bad value: rc ERR_INVAL and the message names file and key path. */
static void expect_error(const char *json, const char *key) {
    model_config c;
    ls_err e = {0};
    int rc = parse(json, &c, &e);
    hfcfg_free(&c);
    if (rc != ERR_INVAL) fail_msg("expected ERR_INVAL for %s, got %d (%s)", key, rc, e.msg);
    if (!strstr(e.msg, "config.json") || !strstr(e.msg, key))
        fail_msg("message '%s' does not name config.json and '%s'", e.msg, key);
}

static void test_errors_name_file_and_key(void **st) {
    expect_error("{\"model_type\":\"llama\"}", "key 'model_type'");
    expect_error("{" QWEN3 ",\"architectures\":[\"LlamaForCausalLM\"]}", "key 'architectures'");
    expect_error("{\"model_type\":\"qwen3\",\"num_hidden_layers\":4}", "key 'hidden_size'");
    char big[1024];
    snprintf(big, sizeof big, "{" QWEN3 ",\"hidden_size\":0}");
    expect_error(big, "key 'hidden_size'");
    expect_error("{" QWEN3 ",\"num_key_value_heads\":3}", "key 'num_key_value_heads'");
    expect_error("{" QWEN3 ",\"num_hidden_layers\":513}", "key 'num_hidden_layers'");
    expect_error("{" QWEN3 ",\"head_dim\":33}", "key 'head_dim'");
    expect_error("{" QWEN3 ",\"rms_norm_eps\":\"small\"}", "key 'rms_norm_eps'");
    expect_error("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" TEXT35
                 ",\"num_experts_per_tok\":17}}", "key 'text_config.num_experts_per_tok'");
    expect_error("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" TEXT35
                 ",\"layer_types\":[\"linear_attention\"]}}", "key 'text_config.layer_types'");
    expect_error("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" TEXT35
                 ",\"linear_num_value_heads\":3}}", "key 'text_config.linear_num_value_heads'");
    expect_error("{\"model_type\":\"qwen3_5_moe\"}", "key 'text_config'");
    expect_error("{" QWEN3 ",\"eos_token_id\":[1,\"x\"]}", "key 'eos_token_id'");
    expect_error("{" QWEN3 ",\"hidden_act\":\"gelu\"}", "key 'hidden_act'");
}

static void test_missing_config_file_is_named(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(hfcfg_load_dir("/nonexistent/model", &c, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "/nonexistent/model/config.json"));
}

static void test_unsupported_quant_algo(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"modelopt\","
                           "\"quant_algo\":\"INT4_AWQ\"}}", &c, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "quantization_config.quant_algo"));
    assert_non_null(strstr(e.msg, "INT4_AWQ"));
    hfcfg_free(&c);
    e = (ls_err){0};
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"gptq\"}}", &c, &e),
                     ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "quantization_config.quant_method"));
    hfcfg_free(&c);
}

/* FP8 checkpoints: ModelOpt FP8 / MIXED_PRECISION and Hugging Face's block-scaled "fp8". */
static void test_fp8_quant_configs(void **st) {
    model_config c;
    ls_err e = {0};
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"modelopt\","
                           "\"quant_algo\":\"FP8\"}}", &c, &e), 0);
    assert_true(c.fp8 && !c.nvfp4);
    hfcfg_free(&c);
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"modelopt\","
                           "\"quant_algo\":\"MIXED_PRECISION\",\"group_size\":16}}", &c, &e), 0);
    assert_true(c.fp8 && c.nvfp4);
    hfcfg_free(&c);
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
                           "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,64]}}", &c, &e), 0);
    assert_true(c.fp8 && !c.nvfp4);
    assert_int_equal(c.fp8_block[0], 128);
    assert_int_equal(c.fp8_block[1], 64);
    hfcfg_free(&c);
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"fp8\","
                           "\"weight_block_size\":[128]}}", &c, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "quantization_config.weight_block_size"));
    hfcfg_free(&c);
    e = (ls_err){0};
    assert_int_equal(parse("{" QWEN3 ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}}",
                           &c, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "quantization_config.fmt"));
    hfcfg_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_dense_values_and_defaults),
        cmocka_unit_test(test_rope_parameters_win_over_legacy_keys),
        cmocka_unit_test(test_qwen35_wrapper_reads_text_config),
        cmocka_unit_test(test_partial_rotary_factor_top_level),
        cmocka_unit_test(test_moe_sparse_step_and_mlp_only_layers),
        cmocka_unit_test(test_eos_list_and_generation_config_merge),
        cmocka_unit_test(test_hf_quant_config_excludes_with_wildcards),
        cmocka_unit_test(test_exclude_adds_language_model_prefix),
        cmocka_unit_test(test_errors_name_file_and_key),
        cmocka_unit_test(test_missing_config_file_is_named),
        cmocka_unit_test(test_unsupported_quant_algo),
        cmocka_unit_test(test_fp8_quant_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
