/* stats.c: histogram bounds and observation (see stats.h). Stateless; the
 * engine serialises updates under its statistics lock. */
#include "engine/stats.h"

#include <string.h>

static const double TTFT_B[LS_HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8,
                                               1, 2, 4, 6, 8, 10, 20, 40};
static const double ITL_B[LS_HIST_BUCKETS] = {0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                                              0.03, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 1.0};
static const double E2E_B[LS_HIST_BUCKETS] = {0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4,
                                              6, 8, 10, 20, 40, 60, 100, 200};

void stats_hist_init(ls_hist *h, int kind) {
    memset(h, 0, sizeof *h);
    const double *b = kind == STATS_TTFT ? TTFT_B : kind == STATS_ITL ? ITL_B : E2E_B;
    memcpy(h->bounds, b, sizeof h->bounds);
}

void stats_observe(ls_hist *h, double v) {
    int i = 0;
    while (i < LS_HIST_BUCKETS && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}
