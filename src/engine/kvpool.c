/* kvpool.c: free-list allocator of page / slot indices (see kvpool.h).
 *
 * Invariants: every index is either on the free stack or marked used, never
 * both; indices come out lowest first on a fresh pool, and freed ones are
 * reused first (LIFO keeps recently touched cache memory warm).
 */
#include "engine/kvpool.h"
#include "base/base.h"

#include <stdlib.h>

void kvpool_init(kvpool *p, int n) {
    p->n = n;
    p->n_free = n;
    p->free = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *p->free);
    p->used = xcalloc((size_t)(n > 0 ? n : 1), 1);
    for (int i = 0; i < n; i++) p->free[i] = n - 1 - i;
}

void kvpool_free(kvpool *p) {
    free(p->free);
    free(p->used);
    p->free = NULL;
    p->used = NULL;
    p->n = p->n_free = 0;
}

int32_t kvpool_get(kvpool *p) {
    if (p->n_free == 0) return -1;
    int32_t i = p->free[--p->n_free];
    CHECK(!p->used[i]);
    p->used[i] = 1;
    return i;
}

void kvpool_put(kvpool *p, int32_t i) {
    CHECK(i >= 0 && i < p->n);
    CHECK(p->used[i]);
    p->used[i] = 0;
    p->free[p->n_free++] = i;
}

int kvpool_avail(const kvpool *p) { return p->n_free; }
int kvpool_used(const kvpool *p) { return p->n - p->n_free; }
