/* test_smoke_depth.c: model_smoke_depth (model.h), the depth serve's smoke test cuts the
 * model to: the smallest prefix holding 2 layers of every layer kind the model has (full
 * attention / GDN, dense MLP / MoE; a kind with one layer: that layer), at least 2 layers,
 * and never more than the model has. Configs are built by hand in the layouts hfconfig.c
 * derives from config.json (layer_type by full_attention_interval, mlp_only by
 * mlp_only_layers / decoder_sparse_step). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model.h"

#include <string.h>

/* n layers; every interval-th a full-attention layer (interval 0: all full attention);
 * moe: 1 for MoE MLPs (decoder_sparse_step step: MoE iff (i + 1) % step == 0), 0 dense */
static model_config cfg(int n, int interval, int moe, int step) {
    model_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = n;
    for (int i = 0; i < n; i++) {
        c.layer_type[i] = interval && (i + 1) % interval ? LAYER_LINEAR_ATTN : LAYER_FULL_ATTN;
        c.mlp_only[i] = !moe || (step > 1 && (i + 1) % step != 0);
    }
    return c;
}

static void test_qwen35_and_next_hybrid_is_8(void **st) {
    (void)st;
    model_config c = cfg(40, 4, 1, 1); /* qwen3.5-35b-a3b */
    assert_int_equal(model_smoke_depth(&c), 8);
    c = cfg(60, 4, 1, 1); /* 397b */
    assert_int_equal(model_smoke_depth(&c), 8);
    c = cfg(10, 4, 1, 1);
    assert_int_equal(model_smoke_depth(&c), 8);
    c = cfg(8, 4, 1, 1); /* no deeper: all of it */
    assert_int_equal(model_smoke_depth(&c), 8);
}

static void test_a_kind_with_one_layer_counts_once(void **st) {
    (void)st;
    model_config c = cfg(4, 4, 1, 1); /* 3 GDN + 1 attention (the test fixtures) */
    assert_int_equal(model_smoke_depth(&c), 4);
    c = cfg(6, 4, 1, 1); /* attention at 3 only */
    assert_int_equal(model_smoke_depth(&c), 4);
    c = cfg(48, 0, 1, 1); /* qwen3-moe with mlp_only_layers [20]: that dense layer must run */
    c.mlp_only[20] = 1;
    assert_int_equal(model_smoke_depth(&c), 21);
}

static void test_dense_and_moe_only_models_are_2(void **st) {
    (void)st;
    model_config c = cfg(36, 0, 0, 1); /* dense qwen3 */
    assert_int_equal(model_smoke_depth(&c), 2);
    c = cfg(48, 0, 1, 1); /* qwen3-30b-a3b */
    assert_int_equal(model_smoke_depth(&c), 2);
}

static void test_mixed_dense_and_moe_layers_need_2_of_each(void **st) {
    (void)st;
    model_config c = cfg(48, 0, 1, 2); /* decoder_sparse_step 2: dense, MoE, dense, MoE, ... */
    assert_int_equal(model_smoke_depth(&c), 4);
    c = cfg(48, 0, 1, 1); /* mlp_only_layers [0, 1]: 2 dense then MoE */
    c.mlp_only[0] = c.mlp_only[1] = 1;
    assert_int_equal(model_smoke_depth(&c), 4);
    c = cfg(40, 4, 1, 1); /* hybrid with mlp_only_layers [9, 13] */
    c.mlp_only[9] = c.mlp_only[13] = 1;
    assert_int_equal(model_smoke_depth(&c), 14);
}

static void test_tiny_models_run_whole(void **st) {
    (void)st;
    model_config c = cfg(1, 0, 0, 1);
    assert_int_equal(model_smoke_depth(&c), 1);
    c = cfg(2, 4, 1, 1); /* two GDN layers */
    assert_int_equal(model_smoke_depth(&c), 2);
    c = cfg(0, 0, 0, 1);
    assert_int_equal(model_smoke_depth(&c), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen35_and_next_hybrid_is_8),
        cmocka_unit_test(test_a_kind_with_one_layer_counts_once),
        cmocka_unit_test(test_dense_and_moe_only_models_are_2),
        cmocka_unit_test(test_mixed_dense_and_moe_layers_need_2_of_each),
        cmocka_unit_test(test_tiny_models_run_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
