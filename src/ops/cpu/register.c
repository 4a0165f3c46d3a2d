/* register.c: registration of the fast CPU backends, and the two
 * deliberately broken moe backends that exist to test the doctor
 * (registered only with LASTSTAND_TEST_BROKEN_BACKENDS=1, never "auto").
 */
#include "ops/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern const moe_impl moe_cpu_grouped;
extern const gdn_impl gdn_cpu_chunked;
int moe_cpu_supported(const dev_info *d, const moe_shape *s, char *why, size_t n);

void cpu_register_all(void) {
    cpu_register_avx2();
    ops_moe_register(&moe_cpu_grouped);
    ops_gdn_register(&gdn_cpu_chunked);
}

/* Runs the reference, then overwrites the output with NaN: a backend that
 * "works" but computes garbage. */
static int broken_nan_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_cpu_ref.run(a, s, e);
    if (rc) return rc;
    float *y = a->y;
    for (size_t i = 0; i < (size_t)a->M * a->w->hidden; i++) y[i] = NAN;
    return 0;
}

/* Crashes the process, as an illegal memory access in a kernel would. */
static int broken_abort_run(const moe_args *a, ls_stream s, ls_err *e) {
    abort();
}

static const moe_impl moe_cpu_broken_nan = {"cpu_broken_nan", DEV_CPU, 1, moe_cpu_supported,
                                            broken_nan_run};
static const moe_impl moe_cpu_broken_abort = {"cpu_broken_abort", DEV_CPU, 1, moe_cpu_supported,
                                              broken_abort_run};

void cpu_register_broken(void) {
    ops_moe_register(&moe_cpu_broken_nan);
    ops_moe_register(&moe_cpu_broken_abort);
}
