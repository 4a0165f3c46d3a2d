/* cu_ws.h: the per-device workspace of a CUDA op family (never included from C):
 * a lock and numbered grow-on-demand device buffers, shared by moe.cu,
 * moe_grouped.cu, gdn.cu and gdn_chunked.cu (cu_ws.cu implements it).
 *
 * A family keeps one cu_ws per device (usually inside its own per-device struct,
 * indexed by cu_ws_device) and holds its lock for the whole call: buffers are
 * handed out, kernels queued on the caller's stream, then the lock is dropped.
 *
 * Invariant (CUDA graphs): a device pointer handed out by cu_ws_get stays valid
 * until the process ends. When a slot must grow, the old buffer is retired — kept
 * allocated, never freed or reused — so a graph captured earlier that points at
 * it still runs correctly, and growing never synchronises the device (no
 * cudaDeviceSynchronize + cudaFree while queued work may still read the buffer,
 * nor while a stream is being captured). Growth is geometric (at least 1.5x the
 * old capacity), so the retired buffers of a slot add up to at most twice its
 * current capacity.
 */
#ifndef LS_CU_WS_H
#define LS_CU_WS_H

#include "ops/cuda/cu_util.h"

#include <pthread.h>
#include <stddef.h>

enum { CU_WS_MAX_DEV = 16, CU_WS_SLOTS = 16 };

typedef struct cu_ws {
    pthread_mutex_t mu;
    int init;                 /* mu initialised (under a global lock, once) */
    void *p[CU_WS_SLOTS];     /* current buffer of each slot, or NULL */
    size_t cap[CU_WS_SLOTS];  /* its bytes */
    void **retired;           /* outgrown buffers, kept until the process ends */
    int n_retired, cap_retired;
} cu_ws;

/* The current CUDA device's index, checked against CU_WS_MAX_DEV (who names the
 * family in the error). */
int cu_ws_device(const char *who, int *dev, ls_err *e);

/* Lock w, initialising it on first use (w may be a zeroed static). */
void cu_ws_lock(cu_ws *w);
void cu_ws_unlock(cu_ws *w);

/* Device buffer `slot` (0 .. CU_WS_SLOTS-1) of at least n bytes (256-byte
 * granules), caller holds w's lock. A new buffer is zeroed when zero is set
 * (with cudaMemsetAsync on stream st). NULL with e filled (naming who) when
 * the allocation fails. */
void *cu_ws_get(cu_ws *w, int slot, size_t n, int zero, cudaStream_t st, const char *who, ls_err *e);

#endif
