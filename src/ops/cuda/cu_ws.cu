/* cu_ws.cu: the per-device workspace helper of cu_ws.h (lock + keep-on-grow
 * device buffers). Owns nothing global but the mutex that serialises the
 * first-use initialisation of every cu_ws.
 */
#include "ops/cuda/cu_ws.h"

#include <stdlib.h>

static pthread_mutex_t g_cu_ws_init_mu = PTHREAD_MUTEX_INITIALIZER;

int cu_ws_device(const char *who, int *dev, ls_err *e) {
    int d = 0;
    CU_TRY(e, cudaGetDevice(&d), "cudaGetDevice");
    if (d < 0 || d >= CU_WS_MAX_DEV)
        return errf(e, ERR_UNSUPPORTED, "%s: device %d out of range (at most %d devices)", who, d, CU_WS_MAX_DEV);
    *dev = d;
    return 0;
}

void cu_ws_lock(cu_ws *w) {
    pthread_mutex_lock(&g_cu_ws_init_mu);
    if (!w->init) {
        pthread_mutex_init(&w->mu, NULL);
        w->init = 1;
    }
    pthread_mutex_unlock(&g_cu_ws_init_mu);
    pthread_mutex_lock(&w->mu);
}

void cu_ws_unlock(cu_ws *w) { pthread_mutex_unlock(&w->mu); }

void *cu_ws_get(cu_ws *w, int slot, size_t n, int zero, cudaStream_t st, const char *who, ls_err *e) {
    if (slot < 0 || slot >= CU_WS_SLOTS) {
        errf(e, ERR_INVAL, "%s workspace: slot %d out of range", who, slot);
        return NULL;
    }
    if (n == 0) n = 16;
    n = (n + 255) & ~(size_t)255;
    if (w->cap[slot] >= n) return w->p[slot];
    if (w->n_retired == w->cap_retired) { /* room first: a failure below leaves w unchanged */
        int nc = w->cap_retired ? 2 * w->cap_retired : 16;
        w->retired = (void **)xrealloc(w->retired, sizeof(void *) * nc);
        w->cap_retired = nc;
    }
    /* geometric growth bounds the retired bytes; the exact size if that much is not free */
    size_t want = w->cap[slot] + w->cap[slot] / 2;
    want = want > n ? (want + 255) & ~(size_t)255 : n;
    void *p = NULL;
    cudaError_t c = cudaMalloc(&p, want);
    if (c != cudaSuccess && want > n) {
        (void)cudaGetLastError();
        want = n;
        c = cudaMalloc(&p, want);
    }
    if (c != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "%s workspace (%zu bytes)", who, want);
        cu_fail(e, c, what);
        return NULL;
    }
    if (zero && (c = cudaMemsetAsync(p, 0, want, st)) != cudaSuccess) {
        cudaFree(p); /* never handed out: nothing can use it */
        cu_fail(e, c, who);
        return NULL;
    }
    /* the old buffer may still be read by queued work or a captured graph: keep it */
    if (w->p[slot]) w->retired[w->n_retired++] = w->p[slot];
    w->p[slot] = p;
    w->cap[slot] = want;
    return p;
}
