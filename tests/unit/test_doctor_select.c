/* test_doctor_select.c: serve's reading of a doctor report (src/doctor/select.c):
 * per-backend verdicts over the buckets serve uses, across every shape of a
 * family; a failure anywhere at those buckets fails the backend, with the
 * buckets and the first reason; buckets not in the report fail ("missing");
 * buckets outside the requested ones are ignored; test-only flags carried. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "doctor/select.h"

#include <string.h>

/* fp4_gemm with two shapes; backends ref, fast, flaky (wrong at M=16 on the
 * second shape only), broken (test-only, crash everywhere); M=64 bad for fast. */
static const char *REPORT =
    "{\"tables\": ["
    " {\"family\": \"fp4_gemm\", \"backends\": [\"ref\", \"fast\", \"flaky\", \"broken\"], \"test_only\": [\"broken\"],"
    "  \"cells\": {"
    "   \"ref\":    {\"1\": {\"status\": \"ok\", \"ms\": 1.0}, \"16\": {\"status\": \"ok\", \"ms\": 2.0}},"
    "   \"fast\":   {\"1\": {\"status\": \"ok\", \"ms\": 0.25}, \"16\": {\"status\": \"ok\", \"ms\": 0.5},"
    "                \"64\": {\"status\": \"wrong\", \"detail\": \"rel err 1\"}},"
    "   \"flaky\":  {\"1\": {\"status\": \"ok\", \"ms\": 0.1}, \"16\": {\"status\": \"ok\", \"ms\": 0.1}},"
    "   \"broken\": {\"1\": {\"status\": \"crash\", \"detail\": \"killed by SIGABRT (6)\"},"
    "                \"16\": {\"status\": \"crash\", \"detail\": \"killed by SIGABRT (6)\"}}}},"
    " {\"family\": \"fp4_gemm\", \"backends\": [\"ref\", \"fast\", \"flaky\", \"broken\"], \"test_only\": [\"broken\"],"
    "  \"cells\": {"
    "   \"ref\":    {\"1\": {\"status\": \"ok\", \"ms\": 1.0}, \"16\": {\"status\": \"ok\", \"ms\": 2.0}},"
    "   \"fast\":   {\"1\": {\"status\": \"ok\", \"ms\": 0.25}, \"16\": {\"status\": \"ok\", \"ms\": 0.5}},"
    "   \"flaky\":  {\"1\": {\"status\": \"ok\", \"ms\": 0.1}, \"16\": {\"status\": \"wrong\", \"detail\": \"M=16: 3 of 9 NaN\"}},"
    "   \"broken\": {\"1\": {\"status\": \"crash\", \"detail\": \"killed by SIGABRT (6)\"}}}},"
    " {\"family\": \"moe\", \"backends\": [\"ref\"], \"test_only\": [],"
    "  \"cells\": {\"ref\": {\"1\": {\"status\": \"ok\", \"ms\": 3.0}}}}"
    "]}";

static const doc_verdict *by_name(const doc_verdict *v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name)) return &v[i];
    return NULL;
}

static void test_verdicts_over_every_shape_at_the_requested_buckets(void **st) {
    json_t *r = json_loads(REPORT, 0, NULL);
    assert_non_null(r);
    doc_verdict v[8];
    const int ms[] = {1, 16};
    int n = doctor_verdicts(r, "fp4_gemm", ms, 2, v, 8);
    assert_int_equal(n, 4);
    assert_string_equal(v[0].name, "ref"); /* the report's order */
    const doc_verdict *ref = by_name(v, n, "ref"), *fast = by_name(v, n, "fast"), *flaky = by_name(v, n, "flaky"),
                      *broken = by_name(v, n, "broken");
    assert_true(ref->ok && !ref->test_only);
    assert_float_equal(ref->ms, 6.0, 1e-12);   /* 1 + 2 on each of the two shapes */
    assert_true(fast->ok);                      /* its M=64 failure is outside the buckets asked */
    assert_float_equal(fast->ms, 1.5, 1e-12);
    assert_false(flaky->ok);                    /* right on one shape, wrong on the other */
    assert_string_equal(flaky->status, "wrong");
    assert_string_equal(flaky->detail, "at M=16: M=16: 3 of 9 NaN");
    assert_false(broken->ok);
    assert_true(broken->test_only);
    assert_string_equal(broken->status, "crash");
    /* M=1 and 16 crash on shape 1; shape 2 has no M=16 cell: still "crash" first, both buckets listed */
    assert_string_equal(broken->detail, "at M=1,16: killed by SIGABRT (6)");
    json_decref(r);
}

static void test_a_bucket_the_report_lacks_fails_the_backend(void **st) {
    json_t *r = json_loads(REPORT, 0, NULL);
    doc_verdict v[8];
    const int ms[] = {1, 64};
    int n = doctor_verdicts(r, "fp4_gemm", ms, 2, v, 8);
    const doc_verdict *ref = by_name(v, n, "ref"), *fast = by_name(v, n, "fast");
    assert_false(ref->ok);
    assert_string_equal(ref->status, "missing");
    assert_false(fast->ok);
    assert_string_equal(fast->status, "wrong"); /* the first failure found wins */
    json_decref(r);
}

static void test_families_present(void **st) {
    json_t *r = json_loads(REPORT, 0, NULL);
    assert_true(doctor_has_family(r, "fp4_gemm"));
    assert_true(doctor_has_family(r, "moe"));
    assert_false(doctor_has_family(r, "gdn"));
    doc_verdict v[2];
    const int ms[] = {1};
    assert_int_equal(doctor_verdicts(r, "gdn", ms, 1, v, 2), 0);
    assert_int_equal(doctor_verdicts(r, "fp4_gemm", ms, 1, v, 2), 2); /* capped at max */
    json_decref(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdicts_over_every_shape_at_the_requested_buckets),
        cmocka_unit_test(test_a_bucket_the_report_lacks_fails_the_backend),
        cmocka_unit_test(test_families_present),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
