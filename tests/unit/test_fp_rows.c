/* test_fp_rows.c: cuda_flash_prefill's row plan (src/ops/cuda/fp_rows.h), the host arithmetic that
 * decides how a decode row's keys are cut into split-K chunks, checked exhaustively on the CPU.
 * Oracle: the plan's own contract, recomputed by brute force here (not by the header's formulas):
 * - the chunks of a context cover its key tiles exactly (ct >= 1, nc·ct >= n, (nc - 1)·ct < n) and
 *   never exceed FP_MAX_SPLIT;
 * - device planning's split count (a CUDA-graph step, fp_rows_nsplit_cap) is at least the chunk count
 *   of every context up to the cap, so the grid never binds: the chunk with the grid's count as
 *   `most` equals the chunk without it, i.e. a row's rounding depends on its own context only (a
 *   replayed decode step is bitwise the eager one) — the brute-force maximum over all contexts is
 *   the oracle; a bound that missed the short contexts' extra chunks fails here;
 * - the scratch reserves at least that many split slots (fp_rows_scratch_splits);
 * - ss = 0 is the plan before S14 (chunks of c0 tiles, longer past FP_MAX_SPLIT chunks), and a
 *   short context (n <= ss tiles) is cut into one tile a chunk.
 * Ranges: c0 (the chunk in key tiles) 1..8, ss 0..64, contexts of 1..3000 key tiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/cuda/fp_rows.h"

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

static const int C0S[] = {1, 2, 4, 8};
static const int SSS[] = {0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 63, 64};
enum { MAXT = 3000 };

static void test_chunks_cover_every_key_tile_once(void **st) {
    (void)st;
    for (size_t a = 0; a < sizeof C0S / sizeof *C0S; a++)
        for (size_t b = 0; b < sizeof SSS / sizeof *SSS; b++)
            for (int n = 1; n <= MAXT; n++) {
                const int ct = fp_rows_chunk(n, C0S[a], SSS[b], 0), nc = ceil_div(n, ct);
                assert_true(ct >= 1);
                assert_true((long)nc * ct >= n && (long)(nc - 1) * ct < n);
                assert_true(nc <= FP_MAX_SPLIT);
            }
}

static void test_graph_split_count_never_binds(void **st) {
    (void)st;
    for (size_t a = 0; a < sizeof C0S / sizeof *C0S; a++)
        for (size_t b = 0; b < sizeof SSS / sizeof *SSS; b++) {
            const int c0 = C0S[a], ss = SSS[b];
            int most = 0; /* brute force: the most chunks of any context up to cap */
            for (int cap = 1; cap <= MAXT; cap++) {
                const int nc = ceil_div(cap, fp_rows_chunk(cap, c0, ss, 0));
                if (nc > most) most = nc;
                const int ns = fp_rows_nsplit_cap(cap, c0, ss);
                if (ns < most)
                    fail_msg("c0 %d ss %d cap %d: split count %d under the %d chunks of a shorter context", c0, ss,
                             cap, ns, most);
                assert_true(ns <= FP_MAX_SPLIT);
                assert_true(fp_rows_scratch_splits(cap) >= ns);
            }
            /* with the grid's count as `most`, every context's chunk is its own */
            for (int cap = 1; cap <= MAXT; cap += 97) {
                const int ns = fp_rows_nsplit_cap(cap, c0, ss);
                for (int n = 1; n <= cap; n++)
                    assert_int_equal(fp_rows_chunk(n, c0, ss, ns), fp_rows_chunk(n, c0, ss, 0));
            }
        }
}

static void test_short_contexts_and_the_old_plan(void **st) {
    (void)st;
    for (size_t a = 0; a < sizeof C0S / sizeof *C0S; a++) {
        const int c0 = C0S[a];
        for (int n = 1; n <= MAXT; n++) {
            /* ss = 0: c0 tiles a chunk, longer only past FP_MAX_SPLIT chunks */
            const int old = ceil_div(n, FP_MAX_SPLIT) > c0 ? ceil_div(n, FP_MAX_SPLIT) : c0;
            assert_int_equal(fp_rows_chunk(n, c0, 0, 0), old);
            /* the default: never longer than the old chunk; one tile a chunk up to FP_SHORT_SPLIT tiles;
             * at least as many chunks as the old plan, at most FP_SHORT_SPLIT where it made fewer */
            const int ct = fp_rows_chunk(n, c0, FP_SHORT_SPLIT, 0);
            assert_true(ct <= old);
            if (n <= FP_SHORT_SPLIT) assert_int_equal(ct, 1);
            const int nc = ceil_div(n, ct), nc_old = ceil_div(n, old);
            assert_true(nc >= nc_old);
            if (nc > nc_old) assert_true(nc <= FP_SHORT_SPLIT);
        }
        /* the 35B at head_dim 256 (32-key tiles, 128-key chunks): a 300-key row, 10 tiles, was 3
         * chunks and is 10 now; 600 keys (19 tiles) 5 -> 10; 4096 keys unchanged */
        if (c0 == 4) {
            assert_int_equal(ceil_div(10, fp_rows_chunk(10, 4, FP_SHORT_SPLIT, 0)), 10);
            assert_int_equal(ceil_div(10, fp_rows_chunk(10, 4, 0, 0)), 3);
            assert_int_equal(ceil_div(19, fp_rows_chunk(19, 4, FP_SHORT_SPLIT, 0)), 10);
            assert_int_equal(fp_rows_chunk(128, 4, FP_SHORT_SPLIT, 0), fp_rows_chunk(128, 4, 0, 0));
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_cover_every_key_tile_once),
        cmocka_unit_test(test_graph_split_count_never_binds),
        cmocka_unit_test(test_short_contexts_and_the_old_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
