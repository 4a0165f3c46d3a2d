/* test_synth.c: the synth: spec parser and the contract that the same
 * (preset, layers, seed, quant) gives the same weights in memory and on disk. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_spec_parses_every_key(void **st) {
    synth_opts o;
    ls_err e = {0};
    assert_int_equal(synth_parse_spec("qwen3.5-35b-a3b,layers=2,seed=9,quant=bf16", &o, &e), 0);
    assert_string_equal(o.preset, "qwen3.5-35b-a3b");
    assert_int_equal(o.layers, 2);
    assert_int_equal(o.seed, 9);
    assert_string_equal(o.quant, "bf16");
    assert_int_equal(synth_parse_spec("demo", &o, &e), 0);
    assert_int_equal(o.layers, 0);
    assert_null(o.quant);
}

static void test_spec_errors_name_the_key(void **st) {
    synth_opts o;
    ls_err e = {0};
    struct { const char *spec, *needle; } bad[] = {
        {"", "empty"}, {"llama", "unknown preset 'llama'"}, {"demo,layers=0", "layers=0"},
        {"demo,layers=513", "layers=513"}, {"demo,layers=x", "layers=x"}, {"demo,seed=-3", "seed=-3"},
        {"demo,quant=int8", "quant=int8"}, {"demo,depth=3", "unknown key 'depth'"}, {"demo,layers", "key=value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(synth_parse_spec(bad[i].spec, &o, &e), ERR_INVAL);
        if (!strstr(e.msg, bad[i].needle)) print_error("%s -> %s\n", bad[i].spec, e.msg);
        assert_non_null(strstr(e.msg, bad[i].needle));
    }
}

static void test_memory_and_disk_hold_the_same_bytes(void **st) {
    char dir[] = "/tmp/test_synth_XXXXXX";
    assert_non_null(mkdtemp(dir));
    synth_opts o;
    ls_err e = {0};
    assert_int_equal(synth_parse_spec("demo,layers=4,seed=3", &o, &e), 0);
    st_set *mem, *disk;
    json_t *cfg;
    assert_int_equal(synth_build(&o, &mem, &cfg, &e), 0);
    assert_int_equal(synth_write(&o, dir, &e), 0);
    assert_int_equal(st_open_dir(dir, &disk, &e), 0);
    assert_int_equal(st_count(mem), st_count(disk));
    for (int i = 0; i < st_count(mem); i++) {
        const st_tensor *a = st_get(mem, i), *b = st_find(disk, a->name);
        assert_non_null(b);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    /* the config written is the config built */
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *w = json_load_file(p, 0, NULL);
    assert_non_null(w);
    assert_true(json_equal(w, cfg));
    json_t *tc = json_object_get(cfg, "text_config");
    assert_int_equal(json_integer_value(json_object_get(tc, "num_hidden_layers")), 4);
    assert_non_null(json_object_get(cfg, "quantization_config"));
    json_decref(w);
    json_decref(cfg);
    st_close(mem);
    st_close(disk);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_seed_changes_weights_but_not_layout(void **st) {
    synth_opts a, b;
    ls_err e = {0};
    assert_int_equal(synth_parse_spec("demo,layers=1", &a, &e), 0);
    assert_int_equal(synth_parse_spec("demo,layers=1,seed=1", &b, &e), 0);
    st_set *x, *y;
    json_t *cx, *cy;
    assert_int_equal(synth_build(&a, &x, &cx, &e), 0);
    assert_int_equal(synth_build(&b, &y, &cy, &e), 0);
    assert_true(json_equal(cx, cy));
    const st_tensor *t1 = st_find(x, "model.language_model.embed_tokens.weight"),
                    *t2 = st_find(y, "model.language_model.embed_tokens.weight");
    assert_non_null(t1);
    assert_non_null(t2);
    assert_int_equal(t1->nbytes, t2->nbytes);
    assert_true(memcmp(t1->data, t2->data, t1->nbytes) != 0);
    json_decref(cx);
    json_decref(cy);
    st_close(x);
    st_close(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_parses_every_key),
        cmocka_unit_test(test_spec_errors_name_the_key),
        cmocka_unit_test(test_memory_and_disk_hold_the_same_bytes),
        cmocka_unit_test(test_seed_changes_weights_but_not_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
