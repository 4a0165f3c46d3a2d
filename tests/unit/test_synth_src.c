/* test_synth_src.c: the on-demand synth checkpoint (synth_open / synth_src_part, synth.h) that
 * model_open streams layer by layer. Oracle: synth_build (whose bytes test_synth.c pins against
 * the written checkpoint). Pins: every part's tensors are synth_build's, byte for byte, whatever
 * the order the parts are made in and however often (a layer's buffer is reused); the parts
 * partition the checkpoint (each tensor in exactly one: the non-layer ones in part -1, layer l's
 * in part l, the hybrids' MTP head mtp.* in part L = synth_src_layers); synth_src_info lists every tensor with synth_build's dtype, shape and bytes;
 * synth_src_part_bytes sums a part; the config equals synth_build's; a part that does not exist
 * is ERR_INVAL naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* part of a tensor name: -1 outside the layers, L for the MTP head, else its layer */
static int part_of(const char *name, int L) {
    if (!strncmp(name, "mtp.", 4)) return L;
    const char *p = strstr(name, "layers.");
    return p ? atoi(p + 7) : -1;
}

static void check_preset(const char *spec, const int *order, int n_order) {
    synth_opts o;
    ls_err e = {0};
    assert_int_equal(synth_parse_spec(spec, &o, &e), 0);
    st_set *all;
    json_t *cfg_all, *cfg_src;
    assert_int_equal(synth_build(&o, &all, &cfg_all, &e), 0);
    synth_src *s;
    assert_int_equal(synth_open(&o, &s, &cfg_src, &e), 0);
    assert_true(json_equal(cfg_all, cfg_src));
    const int L = synth_src_layers(s);
    /* the listing: every tensor of synth_build, same dtype / shape / bytes */
    assert_int_equal(synth_src_count(s), st_count(all));
    for (int i = 0; i < synth_src_count(s); i++) {
        st_tensor t;
        synth_src_info(s, i, &t);
        const st_tensor *b = st_find(all, t.name);
        assert_non_null(b);
        assert_int_equal(t.dtype, b->dtype);
        assert_int_equal(t.ndim, b->ndim);
        for (int k = 0; k < t.ndim; k++) assert_int_equal(t.shape[k], b->shape[k]);
        assert_int_equal(t.nbytes, b->nbytes);
    }
    /* the parts, in the given order (repeats included) */
    int *seen = calloc((size_t)st_count(all), sizeof(int));
    for (int k = 0; k < n_order; k++) {
        const int part = order[k];
        st_set *ps;
        assert_int_equal(synth_src_part(s, part, &ps, &e), 0);
        size_t bytes = 0;
        for (int i = 0; i < st_count(ps); i++) {
            const st_tensor *t = st_get(ps, i), *b = st_find(all, t->name);
            assert_non_null(b);
            assert_int_equal(part_of(t->name, L), part);
            assert_int_equal(t->nbytes, b->nbytes);
            assert_memory_equal(t->data, b->data, t->nbytes);
            bytes += t->nbytes;
            for (int j = 0; j < st_count(all); j++)
                if (st_get(all, j) == b) seen[j] = 1;
        }
        assert_int_equal(bytes, synth_src_part_bytes(s, part));
        st_close(ps);
    }
    /* every tensor is in a part (when the order visited every part) */
    int visited_all = 1;
    for (int p = -1; p <= L; p++) { /* L: the demo (Qwen3.5 layout) has an MTP head */
        int v = 0;
        for (int k = 0; k < n_order; k++) v |= order[k] == p;
        visited_all &= v;
    }
    if (visited_all)
        for (int j = 0; j < st_count(all); j++) assert_int_equal(seen[j], 1);
    free(seen);
    /* a part that does not exist */
    st_set *bad;
    assert_true(synth_src_part_bytes(s, L) > 0); /* the MTP head */
    assert_int_equal(synth_src_part(s, L + 1, &bad, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "no layer"));
    assert_int_equal(synth_src_part_bytes(s, L + 1), 0);
    synth_src_close(s);
    st_close(all);
    json_decref(cfg_all);
    json_decref(cfg_src);
}

static void test_demo_parts_equal_synth_build_in_any_order(void **st) {
    const int order[] = {3, -1, 0, 7, 8, 3, 1, 2, 4, 5, 6, 0, 8};
    check_preset("demo,seed=5", order, (int)(sizeof order / sizeof order[0]));
}

static void test_demo_bf16_fused_experts_parts(void **st) {
    /* the BF16 layout (fused 3-D experts) in reverse; the real presets' layers (0.5-3.9 GB) are
     * too big for a unit test: tests/test_flagship_load.py loads the 35B's through model_open */
    const int order[] = {8, 7, 6, 5, 4, 3, 2, 1, 0, -1};
    check_preset("demo,quant=bf16,layers=8", order, (int)(sizeof order / sizeof order[0]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_parts_equal_synth_build_in_any_order),
        cmocka_unit_test(test_demo_bf16_fused_experts_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
