/* stats.h: latency histograms behind ls_engine_stats.
 *
 * Bucket bounds (seconds) follow SGLang's defaults for
 * time_to_first_token_seconds, inter_token_latency_seconds and
 * e2e_request_latency_seconds, thinned to LS_HIST_BUCKETS. counts[i] holds
 * the observations in (bounds[i-1], bounds[i]] and counts[LS_HIST_BUCKETS]
 * those above the last bound: per bucket, not cumulative; a Prometheus
 * exporter sums them into le="..." buckets.
 */
#ifndef LS_ENGINE_STATS_H
#define LS_ENGINE_STATS_H

#include "laststand.h"

enum { STATS_TTFT, STATS_ITL, STATS_E2E };
void stats_hist_init(ls_hist *h, int kind);
void stats_observe(ls_hist *h, double v);

#endif
