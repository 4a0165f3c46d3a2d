/* test_doctor.c: the doctor's pure parts: the op shapes of the real
 * architectures (reference/qwen35-and-nvfp4.md 1.2-1.3 and 4.3), their JSON
 * round trip to the trial children, --fp4-shapes parsing, and the bucket
 * lookup serve uses on a cached report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "doctor/doctor.h"
#include "doctor/trial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const doc_lin *find(const doc_lin *a, int n, int N, int K) {
    for (int i = 0; i < n; i++)
        if (a[i].N == N && a[i].K == K) return &a[i];
    return NULL;
}

static void test_preset_397b_shapes(void **st) {
    doc_shapes s;
    ls_err e = {0};
    assert_int_equal(doc_shapes_from_preset("qwen3.5-397b-a17b", &s, &e), 0);
    assert_int_equal(s.hidden, 4096);
    assert_int_equal(s.n_experts, 512);
    assert_int_equal(s.top_k, 10);
    /* experts: gate/up [1024, 4096] (U8 [1024, 2048] on disk), down [4096, 1024]; shared expert the same */
    const doc_lin *gu = find(s.fp4, s.n_fp4, 1024, 4096);
    assert_non_null(gu);
    assert_non_null(strstr(gu->label, "experts gate/up"));
    assert_non_null(strstr(gu->label, "shared expert gate/up"));
    assert_non_null(find(s.fp4, s.n_fp4, 4096, 1024));
    assert_int_equal(s.n_fp4, 2);
    /* BF16: router [512, 4096], q_proj with the output gate 32*256*2, o_proj [4096, 8192],
     * GDN in_proj_qkv conv_dim 12288, in_proj_z 8192 (section 1.3) */
    assert_non_null(find(s.bf16, s.n_bf16, 512, 4096));
    assert_non_null(find(s.bf16, s.n_bf16, 16384, 4096));
    assert_non_null(find(s.bf16, s.n_bf16, 4096, 8192));
    assert_non_null(find(s.bf16, s.n_bf16, 12288, 4096));
    assert_non_null(find(s.bf16, s.n_bf16, 8192, 4096));
    assert_int_equal(s.nv, 64);
    assert_int_equal(s.nk, 16);
}

static void test_synth_spec_and_unknown_preset(void **st) {
    doc_shapes s;
    ls_err e = {0};
    assert_int_equal(doc_shapes_from_model("synth:qwen3.5-35b-a3b,layers=4,seed=3", &s, &e), 0);
    assert_int_equal(s.hidden, 2048);
    assert_non_null(find(s.fp4, s.n_fp4, 512, 2048));
    assert_string_equal(s.model, "synth:qwen3.5-35b-a3b,layers=4,seed=3");
    assert_int_equal(doc_shapes_from_preset("qwen9", &s, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "qwen9"));
    assert_non_null(strstr(e.msg, "qwen3.5-122b-a10b")); /* lists the valid ones */
}

/* What synth writes (src/model/synth.c excludes `*mlp.shared_expert*`): NVFP4
 * routed experts, a BF16 shared expert; quant=bf16 and the non-qwen3.5 presets
 * are all BF16. The preset (--shapes) keeps the NVFP4 shared expert. The kind
 * survives the JSON round trip to the trial children. */
static void test_synth_shared_expert_kind(void **st) {
    doc_shapes s, b;
    ls_err e = {0};
    assert_int_equal(doc_shapes_from_model("synth:qwen3.5-397b-a17b,layers=1", &s, &e), 0);
    assert_int_equal(s.nvfp4, 1);
    assert_int_equal(s.sh_nvfp4, 0);
    const doc_lin *gu = find(s.fp4, s.n_fp4, 1024, 4096);
    assert_non_null(gu);
    assert_null(strstr(gu->label, "shared expert"));
    const doc_lin *sgu = find(s.bf16, s.n_bf16, 1024, 4096), *sd = find(s.bf16, s.n_bf16, 4096, 1024);
    assert_non_null(sgu);
    assert_non_null(strstr(sgu->label, "shared expert gate/up"));
    assert_non_null(sd);
    assert_non_null(strstr(sd->label, "shared expert down"));
    char *t = doc_shapes_json(&s);
    assert_int_equal(doc_shapes_parse_json(t, &b, &e), 0);
    free(t);
    assert_int_equal(b.sh_nvfp4, 0);
    assert_int_equal(b.nvfp4, 1);

    assert_int_equal(doc_shapes_from_preset("qwen3.5-397b-a17b", &s, &e), 0);
    assert_int_equal(s.sh_nvfp4, 1);
    t = doc_shapes_json(&s);
    assert_int_equal(doc_shapes_parse_json(t, &b, &e), 0);
    free(t);
    assert_int_equal(b.sh_nvfp4, 1);

    assert_int_equal(doc_shapes_from_model("synth:qwen3.5-35b-a3b,quant=bf16", &s, &e), 0);
    assert_int_equal(s.nvfp4, 0);
    assert_int_equal(s.n_fp4, 0);
    assert_non_null(find(s.bf16, s.n_bf16, 512, 2048));
    assert_int_equal(doc_shapes_from_model("synth:qwen3-30b-a3b", &s, &e), 0);
    assert_int_equal(s.nvfp4, 0);
    assert_int_equal(s.n_fp4, 0);
    assert_int_equal(doc_shapes_from_model("synth:qwen3.5-35b-a3b,colour=red", &s, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "colour"));
}

static void test_json_round_trip(void **st) {
    doc_shapes a, b;
    ls_err e = {0};
    assert_int_equal(doc_shapes_from_preset("qwen3-next-80b-a3b", &a, &e), 0);
    char *t = doc_shapes_json(&a);
    assert_int_equal(doc_shapes_parse_json(t, &b, &e), 0);
    free(t);
    assert_int_equal(b.n_fp4, a.n_fp4);
    assert_int_equal(b.n_bf16, a.n_bf16);
    for (int i = 0; i < a.n_fp4; i++) {
        assert_int_equal(b.fp4[i].N, a.fp4[i].N);
        assert_int_equal(b.fp4[i].K, a.fp4[i].K);
        assert_string_equal(b.fp4[i].label, a.fp4[i].label);
    }
    assert_int_equal(b.nv, a.nv);
    assert_int_equal(b.top_k, a.top_k);
    assert_int_equal(doc_shapes_parse_json("[1,2]", &b, &e), ERR_INVAL);
}

static void test_fp4_shapes_flag(void **st) {
    doc_shapes s;
    ls_err e = {0};
    assert_int_equal(doc_shapes_from_preset("qwen3.5-35b-a3b", &s, &e), 0);
    assert_int_equal(doc_shapes_set_fp4(&s, "4096x4096,16384x4096", &e), 0);
    assert_int_equal(s.n_fp4, 2);
    assert_int_equal(s.fp4[1].N, 16384);
    assert_int_equal(doc_shapes_set_fp4(&s, "4096x4095", &e), ERR_INVAL); /* K % 16 */
    assert_int_equal(doc_shapes_set_fp4(&s, "4096*4096", &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "--fp4-shapes"));
}

static void test_pick_bucket(void **st) {
    json_t *r = json_loads("{\"choice\":{\"fp4_gemm\":{\"1\":\"a\",\"8\":\"b\",\"64\":null,\"512\":\"c\"}}}", 0, NULL);
    assert_non_null(r);
    assert_string_equal(doctor_pick(r, "fp4_gemm", 1), "a");
    assert_string_equal(doctor_pick(r, "fp4_gemm", 2), "b");  /* the next bucket up */
    assert_string_equal(doctor_pick(r, "fp4_gemm", 8), "b");
    assert_null(doctor_pick(r, "fp4_gemm", 9));               /* nothing correct at 64 */
    assert_string_equal(doctor_pick(r, "fp4_gemm", 100), "c");
    assert_string_equal(doctor_pick(r, "fp4_gemm", 9000), "c"); /* above the largest */
    assert_null(doctor_pick(r, "moe", 1));
    json_decref(r);
}

/* The run's shared CPU references: a stored one loads back exactly, and only under its own
 * family, job, key and size; a truncated or absent file, or no cache prefix, loads nothing. */
static void test_shared_reference(void **st) {
    (void)st;
    char prefix[] = "/tmp/laststand-test-ref-XXXXXX";
    int fd = mkstemp(prefix);
    assert_true(fd >= 0);
    close(fd);
    td_job_ctx c = {.ref_cache = prefix};
    float buf[100], got[100];
    for (int i = 0; i < 100; i++) buf[i] = (float)i * 0.25f - 3.f;
    assert_int_equal(td_ref_load(&c, "moe", 3, 7, got, sizeof got), 0); /* nothing stored yet */
    td_ref_store(&c, "moe", 3, 7, buf, sizeof buf);
    memset(got, 0, sizeof got);
    assert_int_equal(td_ref_load(&c, "moe", 3, 7, got, sizeof got), 1);
    assert_memory_equal(got, buf, sizeof buf);
    assert_int_equal(td_ref_load(&c, "moe", 3, 8, got, sizeof got), 0);     /* another key */
    assert_int_equal(td_ref_load(&c, "moe", 4, 7, got, sizeof got), 0);     /* another job */
    assert_int_equal(td_ref_load(&c, "gdn", 3, 7, got, sizeof got), 0);     /* another family */
    assert_int_equal(td_ref_load(&c, "moe", 3, 7, got, sizeof got - 4), 0); /* another size */
    char path[512];
    doctor_ref_path(prefix, "moe", 3, path, sizeof path);
    assert_int_equal(truncate(path, 40), 0); /* a partial file */
    assert_int_equal(td_ref_load(&c, "moe", 3, 7, got, sizeof got), 0);
    td_job_ctx none = {0};
    td_ref_store(&none, "moe", 5, 7, buf, sizeof buf);
    assert_int_equal(td_ref_load(&none, "moe", 5, 7, got, sizeof got), 0);
    unlink(path);
    unlink(prefix);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_397b_shapes),
        cmocka_unit_test(test_synth_spec_and_unknown_preset),
        cmocka_unit_test(test_synth_shared_expert_kind),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_fp4_shapes_flag),
        cmocka_unit_test(test_pick_bucket),
        cmocka_unit_test(test_shared_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
