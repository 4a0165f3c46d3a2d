/* pool.c: the process-wide worker pool behind pool_for.
 *
 * Owns: N-1 worker threads (the caller is the N-th) created on first use.
 * Invariants: one pool_for runs at a time (a mutex serialises callers from
 * different threads); a pool_for issued from inside a worker runs inline.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t g_call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_nthreads = 0;
static __thread int t_in_worker = 0;

/* current job */
static pool_fn g_fn;
static void *g_ctx;
static int64_t g_n, g_chunk, g_next;
static int g_pending; /* workers still inside the job */
static uint64_t g_gen;

static void run_chunks(pool_fn fn, void *ctx) {
    for (;;) {
        pthread_mutex_lock(&g_mu);
        int64_t i0 = g_next;
        if (i0 >= g_n) { pthread_mutex_unlock(&g_mu); return; }
        int64_t i1 = i0 + g_chunk < g_n ? i0 + g_chunk : g_n;
        g_next = i1;
        pthread_mutex_unlock(&g_mu);
        fn(ctx, i0, i1);
    }
}

static void *worker(void *arg) {
    (void)arg;
    t_in_worker = 1;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        while (g_gen == seen) pthread_cond_wait(&g_work_cv, &g_mu);
        seen = g_gen;
        pool_fn fn = g_fn;
        void *ctx = g_ctx;
        pthread_mutex_unlock(&g_mu);
        run_chunks(fn, ctx);
        pthread_mutex_lock(&g_mu);
        if (--g_pending == 0) pthread_cond_signal(&g_done_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

static void pool_start(void) {
    if (g_nthreads <= 0) {
        const char *s = getenv("LS_THREADS");
        g_nthreads = s ? atoi(s) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (g_nthreads < 1) g_nthreads = 1;
        if (g_nthreads > 256) g_nthreads = 256;
    }
    for (int i = 1; i < g_nthreads; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker, NULL) == 0);
        pthread_detach(t);
    }
}

void pool_set_threads(int n) { if (n > 0) g_nthreads = n; }

int pool_threads(void) {
    pthread_once(&g_once, pool_start);
    return g_nthreads;
}

void pool_for(int64_t n, int64_t min_chunk, pool_fn fn, void *ctx) {
    if (n <= 0) return;
    pthread_once(&g_once, pool_start);
    if (min_chunk < 1) min_chunk = 1;
    if (t_in_worker || g_nthreads == 1 || n <= min_chunk) { fn(ctx, 0, n); return; }
    pthread_mutex_lock(&g_call_mu);
    int prev = t_in_worker;
    t_in_worker = 1;
    int64_t chunk = (n + (int64_t)g_nthreads * 4 - 1) / ((int64_t)g_nthreads * 4);
    if (chunk < min_chunk) chunk = min_chunk;
    pthread_mutex_lock(&g_mu);
    g_fn = fn; g_ctx = ctx; g_n = n; g_chunk = chunk; g_next = 0;
    g_pending = g_nthreads - 1;
    g_gen++;
    pthread_cond_broadcast(&g_work_cv);
    pthread_mutex_unlock(&g_mu);
    run_chunks(fn, ctx);
    pthread_mutex_lock(&g_mu);
    while (g_pending > 0) pthread_cond_wait(&g_done_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    t_in_worker = prev;
    pthread_mutex_unlock(&g_call_mu);
}
