/* kvpool.h: a fixed set of indices handed out from a free list: KV pages and
 * GDN state slots. The memory behind them belongs to the model; this only
 * says who holds which index.
 */
#ifndef LS_ENGINE_KVPOOL_H
#define LS_ENGINE_KVPOOL_H

#include <stdint.h>

typedef struct kvpool {
    int n;             /* indices 0 .. n-1 */
    int n_free;
    int32_t *free;     /* stack; the next kvpool_get returns free[n_free-1] */
    uint8_t *used;     /* [n] 1 while held (catches double frees) */
} kvpool;

void kvpool_init(kvpool *p, int n);
void kvpool_free(kvpool *p);
int32_t kvpool_get(kvpool *p);          /* -1 when empty */
void kvpool_put(kvpool *p, int32_t i);  /* CHECKs that i is held */
int kvpool_avail(const kvpool *p);
int kvpool_used(const kvpool *p);

#endif
