/* resp_store.c: the stored responses of the Responses API (store: true).
 *
 * Each entry keeps three JSON texts under the response id: the response
 * object (GET /v1/responses/{id}), the items of its whole conversation
 * (previous_response_id chains continue from them: the previous entries'
 * items, this request's input items, then its output items) and this
 * request's own input items (GET /v1/responses/{id}/input_items). Texts, not
 * json_t, so that no JSON value is shared between connection threads.
 *
 * Bounded by bytes (--responses-store-mb): an insertion evicts the oldest
 * entries until the texts fit; an entry larger than the whole budget is not
 * kept. A hash table on the id finds entries, a list in insertion order
 * evicts them. One mutex; lookups copy the texts out.
 */
#include "server/server.h"

#include <stdlib.h>
#include <string.h>

#define NBUCKET 4096

typedef struct rs_entry {
    char *id;
    char *texts[RSTORE_NTEXT];
    size_t bytes;
    struct rs_entry *hnext;          /* bucket chain */
    struct rs_entry *older, *newer;  /* insertion order */
} rs_entry;

struct resp_store {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    size_t n;
    rs_entry *bucket[NBUCKET];
    rs_entry *oldest, *newest;
};

static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h % NBUCKET;
}

resp_store *rstore_new(size_t max_bytes) {
    resp_store *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->max_bytes = max_bytes;
    return s;
}

static void entry_free(rs_entry *e) {
    free(e->id);
    for (int i = 0; i < RSTORE_NTEXT; i++) free(e->texts[i]);
    free(e);
}

/* Unlink from the table and the list (lock held). */
static void unlink_entry(resp_store *s, rs_entry *e) {
    rs_entry **pp = &s->bucket[hash(e->id)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older) e->older->newer = e->newer;
    else s->oldest = e->newer;
    if (e->newer) e->newer->older = e->older;
    else s->newest = e->older;
    s->bytes -= e->bytes;
    s->n--;
}

static rs_entry *find(resp_store *s, const char *id) {
    for (rs_entry *e = s->bucket[hash(id)]; e; e = e->hnext)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

int rstore_put(resp_store *s, const char *id, char *texts[RSTORE_NTEXT]) {
    rs_entry *e = xcalloc(1, sizeof *e);
    e->id = xstrdup(id);
    e->bytes = sizeof *e + strlen(id) + 1;
    for (int i = 0; i < RSTORE_NTEXT; i++) {
        e->texts[i] = texts[i];
        texts[i] = NULL;
        e->bytes += e->texts[i] ? strlen(e->texts[i]) + 1 : 0;
    }
    pthread_mutex_lock(&s->mu);
    if (e->bytes > s->max_bytes) {
        pthread_mutex_unlock(&s->mu);
        entry_free(e);
        return -1;
    }
    rs_entry *old = find(s, id);
    if (old) { unlink_entry(s, old); entry_free(old); }
    while (s->bytes + e->bytes > s->max_bytes && s->oldest) {
        rs_entry *v = s->oldest;
        unlink_entry(s, v);
        entry_free(v);
    }
    unsigned h = hash(id);
    e->hnext = s->bucket[h];
    s->bucket[h] = e;
    e->older = s->newest;
    if (s->newest) s->newest->newer = e;
    else s->oldest = e;
    s->newest = e;
    s->bytes += e->bytes;
    s->n++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int rstore_get(resp_store *s, const char *id, int which, char **text) {
    *text = NULL;
    pthread_mutex_lock(&s->mu);
    rs_entry *e = find(s, id);
    if (e && e->texts[which]) *text = xstrdup(e->texts[which]);
    pthread_mutex_unlock(&s->mu);
    return e ? 0 : -1;
}

int rstore_delete(resp_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    rs_entry *e = find(s, id);
    if (e) unlink_entry(s, e);
    pthread_mutex_unlock(&s->mu);
    if (!e) return -1;
    entry_free(e);
    return 0;
}

void rstore_stats(resp_store *s, size_t *n, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    *n = s->n;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}

void rstore_free(resp_store *s) {
    if (!s) return;
    for (rs_entry *e = s->oldest; e;) {
        rs_entry *n = e->newer;
        entry_free(e);
        e = n;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}
