/* test_safetensors.c: the safetensors reader's validation and the writer's
 * round trip (single file and sharded with index.json). Corrupt files are
 * written byte by byte here, so each test pins one rule of the format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fmt/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void **st) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_st_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **st) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) != 0;
}

static char *tpath(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

/* Write a raw safetensors file: header JSON (length as given or its real one)
 * followed by ndata bytes of a counting pattern. */
static void write_raw(const char *path, const char *header, int64_t hlen_override, size_t ndata) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(header);
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(hl >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_open_error(const char *header, int64_t hlen, size_t ndata, const char *needle1,
                              const char *needle2) {
    char *p = tpath("x.safetensors");
    write_raw(p, header, hlen, ndata);
    st_set *s = (st_set *)1;
    ls_err e = {0};
    int rc = st_open_file(p, &s, &e);
    if (rc != ERR_INVAL || !strstr(e.msg, needle1) || (needle2 && !strstr(e.msg, needle2)) ||
        !strstr(e.msg, "x.safetensors"))
        print_error("rc=%d msg=%s\n", rc, e.msg);
    assert_int_equal(rc, ERR_INVAL);
    assert_null(s);
    assert_non_null(strstr(e.msg, "x.safetensors"));
    assert_non_null(strstr(e.msg, needle1));
    if (needle2) assert_non_null(strstr(e.msg, needle2));
}

static void test_valid_file_reads_views_into_mapping(void **st) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                    "\"empty\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[12,12]},"
                    "\"s\":{\"dtype\":\"F8_E4M3\",\"shape\":[],\"data_offsets\":[12,13]}}";
    char *p = tpath("ok.safetensors");
    write_raw(p, h, -1, 13);
    st_set *s;
    ls_err e = {0};
    assert_int_equal(st_open_file(p, &s, &e), 0);
    assert_int_equal(st_count(s), 4);
    const st_tensor *a = st_find(s, "a"), *b = st_find(s, "b"), *sc = st_find(s, "s");
    assert_non_null(a);
    assert_int_equal(a->dtype, ST_BF16);
    assert_int_equal(a->nbytes, 4);
    assert_int_equal(((const unsigned char *)a->data)[1], 1);
    assert_int_equal(b->ndim, 1);
    assert_int_equal(b->shape[0], 2);
    assert_int_equal(((const unsigned char *)b->data)[0], 4);
    assert_int_equal(sc->ndim, 0);
    assert_int_equal(st_numel(sc), 1);
    assert_int_equal(st_numel(st_find(s, "empty")), 0);
    assert_null(st_find(s, "nope"));
    assert_string_equal(a->file, p);
    st_close(s);
}

static void test_truncated_file_is_rejected(void **st) {
    char *p = tpath("x.safetensors");
    FILE *f = fopen(p, "wb");
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    st_set *s;
    ls_err e = {0};
    assert_int_equal(st_open_file(p, &s, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "too short"));
    /* header length claims more than the file holds */
    expect_open_error("{}", 1000, 0, "header length 1000", "truncated");
}

static void test_offsets_past_end_name_the_tensor(void **st) {
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8,
                      "tensor 'w'", "run past the end of the file");
}

static void test_byte_size_must_match_shape_and_dtype(void **st) {
    expect_open_error("{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 16,
                      "tensor 'w'", "needs 8 bytes");
}

static void test_overlapping_tensors_rejected(void **st) {
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      -1, 12, "overlap", "tensor 'a'");
}

static void test_bad_header_fields_rejected(void **st) {
    expect_open_error("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "tensor 'w'",
                      "unknown dtype 'F33'");
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", -1, 4, "tensor 'w'",
                      "shape dim 0");
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", -1, 4, "tensor 'w'",
                      "end before");
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", -1, 4, "tensor 'w'", "data_offsets");
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", -1, 4, "not valid JSON", NULL);
    expect_open_error("[1,2]", -1, 0, "not a JSON object", NULL);
    expect_open_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "not valid JSON", "duplicate");
    expect_open_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", -1, 4,
                      "tensor 'w'", "overflows");
}

/* Build an in-memory set of n tensors with recognisable contents. */
static st_set *make_set(void) {
    st_set *s = st_new();
    ls_err e = {0};
    const char *names[] = {"model.norm.weight", "model.embed_tokens.weight", "lm_head.weight", "z.scale"};
    st_dtype dts[] = {ST_BF16, ST_BF16, ST_BF16, ST_F32};
    for (int i = 0; i < 4; i++) {
        int64_t shape[2] = {3, 5 + i};
        size_t nb = 15 + 3 * i;
        nb *= st_dtype_size(dts[i]);
        unsigned char *d = malloc(nb);
        for (size_t k = 0; k < nb; k++) d[k] = (unsigned char)(k * 7 + i);
        assert_int_equal(st_add_owned(s, names[i], dts[i], 2, shape, d, nb, &e), 0);
    }
    return s;
}

static void test_in_memory_set_rejects_duplicates_and_size_mismatch(void **st) {
    st_set *s = make_set();
    ls_err e = {0};
    int64_t shape[1] = {4};
    assert_int_equal(st_add_owned(s, "lm_head.weight", ST_F32, 1, shape, malloc(16), 16, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "duplicate tensor 'lm_head.weight'"));
    assert_int_equal(st_add_owned(s, "q", ST_F32, 1, shape, malloc(15), 15, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "tensor 'q'"));
    assert_int_equal(st_count(s), 4);
    st_close(s);
}

static void check_same(const st_set *a, const st_set *b) {
    assert_int_equal(st_count(a), st_count(b));
    for (int i = 0; i < st_count(a); i++) {
        const st_tensor *x = st_get(a, i), *y = st_find(b, x->name);
        assert_non_null(y);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_memory_equal(x->data, y->data, x->nbytes);
        assert_int_equal((uintptr_t)y->data % st_dtype_size(y->dtype), 0);
    }
}

static void test_write_then_read_single_file(void **st) {
    st_set *s = make_set(), *r;
    ls_err e = {0};
    char *d = tpath("single");
    assert_int_equal(st_write_dir(s, d, 0, &e), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char l8[8];
    assert_int_equal(fread(l8, 1, 8, f), 8);
    assert_int_equal(l8[0] % 8, 0); /* header padded to 8 bytes */
    fclose(f);
    assert_int_equal(st_open_dir(d, &r, &e), 0);
    check_same(s, r);
    st_close(r);
    st_close(s);
}

static void test_write_sharded_with_index_then_read(void **st) {
    st_set *s = make_set(), *r;
    ls_err e = {0};
    char *d = tpath("sharded");
    assert_int_equal(st_write_dir(s, d, 40, &e), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00004.safetensors", d);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(st_open_dir(d, &r, &e), 0);
    check_same(s, r);
    st_close(r);
    st_close(s);
}

static void test_rewrite_replaces_stale_shards(void **st) {
    st_set *s = make_set(), *r;
    ls_err e = {0};
    char *d = tpath("rewrite");
    assert_int_equal(st_write_dir(s, d, 40, &e), 0);
    assert_int_equal(st_write_dir(s, d, 0, &e), 0); /* now one file: the index and shards must go */
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00004.safetensors", d);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_equal(st_open_dir(d, &r, &e), 0);
    check_same(s, r);
    st_close(r);
    st_close(s);
}

static void test_index_errors_name_file_and_tensor(void **st) {
    st_set *s = make_set(), *r;
    ls_err e = {0};
    char *d = tpath("idx");
    assert_int_equal(st_write_dir(s, d, 40, &e), 0);
    st_close(s);
    char p[600], cmd[1400];
    /* an index entry for a tensor the shard does not have */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json;p='%s';j=json.load(open(p));j['weight_map']['ghost.weight']="
             "'model-00001-of-00004.safetensors';json.dump(j,open(p,'w'))\"", p);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(st_open_dir(d, &r, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "tensor 'ghost.weight'"));
    assert_non_null(strstr(e.msg, "model-00001-of-00004.safetensors"));
    /* an index entry pointing to a shard that is gone */
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json;p='%s';j=json.load(open(p));j['weight_map']['ghost.weight']="
             "'model-00009-of-00009.safetensors';json.dump(j,open(p,'w'))\"", p);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(st_open_dir(d, &r, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "does not exist"));
    assert_non_null(strstr(e.msg, "model-00009-of-00009.safetensors"));
}

static void test_duplicate_names_across_shards_rejected(void **st) {
    char d[600];
    snprintf(d, sizeof d, "%s/dups", tmpdir);
    mkdir(d, 0755);
    char p[700];
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    snprintf(p, sizeof p, "%s/a.safetensors", d);
    write_raw(p, h, -1, 4);
    snprintf(p, sizeof p, "%s/b.safetensors", d);
    write_raw(p, h, -1, 4);
    st_set *r;
    ls_err e = {0};
    assert_int_equal(st_open_dir(d, &r, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "tensor 'w': duplicate name"));
    assert_non_null(strstr(e.msg, "b.safetensors"));
    assert_non_null(strstr(e.msg, "a.safetensors"));
}

static void test_empty_dir_is_an_error(void **st) {
    char d[600];
    snprintf(d, sizeof d, "%s/empty", tmpdir);
    mkdir(d, 0755);
    st_set *r;
    ls_err e = {0};
    assert_int_equal(st_open_dir(d, &r, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "no model.safetensors"));
}

static void test_dtype_names_round_trip(void **st) {
    for (int t = 0; t < ST_NDTYPES; t++) assert_int_equal(st_dtype_parse(st_dtype_name((st_dtype)t)), t);
    assert_int_equal(st_dtype_parse("F4"), -1);
    assert_int_equal(st_dtype_size(ST_F8_E5M2), 1);
    assert_int_equal(st_dtype_size(ST_I64), 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_reads_views_into_mapping),
        cmocka_unit_test(test_truncated_file_is_rejected),
        cmocka_unit_test(test_offsets_past_end_name_the_tensor),
        cmocka_unit_test(test_byte_size_must_match_shape_and_dtype),
        cmocka_unit_test(test_overlapping_tensors_rejected),
        cmocka_unit_test(test_bad_header_fields_rejected),
        cmocka_unit_test(test_in_memory_set_rejects_duplicates_and_size_mismatch),
        cmocka_unit_test(test_write_then_read_single_file),
        cmocka_unit_test(test_write_sharded_with_index_then_read),
        cmocka_unit_test(test_rewrite_replaces_stale_shards),
        cmocka_unit_test(test_index_errors_name_file_and_tensor),
        cmocka_unit_test(test_duplicate_names_across_shards_rejected),
        cmocka_unit_test(test_empty_dir_is_an_error),
        cmocka_unit_test(test_dtype_names_round_trip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
