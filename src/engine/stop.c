/* stop.c: stop-string matching across token boundaries (see stop.h).
 *
 * Owns: the held-back tail (pending). Invariant between calls: no stop string
 * occurs in pending, and pending is a proper prefix of some stop string (or
 * empty). Every emitted byte was checked against both conditions, so a match
 * can only start inside pending. Stop strings are valid UTF-8 and cannot start
 * with a continuation byte, so every cut falls on a character boundary.
 */
#include "engine/stop.h"

#include <string.h>

void stop_init(stop_matcher *m, const char *const *stop, int n) {
    memset(m, 0, sizeof *m);
    m->stop = stop;
    m->n = n;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stop[i]);
        if (l > m->max_len) m->max_len = l;
    }
    buf_init(&m->pending);
}

void stop_free(stop_matcher *m) { buf_free(&m->pending); }

int stop_feed(stop_matcher *m, const char *text, size_t len, buf *out) {
    if (m->n == 0) {
        buf_append(out, text, len);
        return -1;
    }
    buf_append(&m->pending, text, len);
    const char *p = m->pending.data;
    size_t pl = m->pending.len;

    /* 1. The earliest complete match. */
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < m->n; i++) {
        size_t sl = strlen(m->stop[i]);
        if (sl == 0 || sl > pl) continue;
        const char *hit = memmem(p, pl, m->stop[i], sl);
        if (hit && (size_t)(hit - p) < best) { best = (size_t)(hit - p); which = i; }
    }
    if (which >= 0) {
        buf_append(out, p, best);
        m->pending.len = 0;
        m->pending.data[0] = 0;
        return which;
    }

    /* 2. Hold back the longest tail that is a proper prefix of a stop string. */
    size_t cut = pl;
    size_t from = pl + 1 > m->max_len ? pl + 1 - m->max_len : 0;
    for (size_t i = from; i < pl && cut == pl; i++) {
        size_t tl = pl - i;
        for (int k = 0; k < m->n; k++) {
            size_t sl = strlen(m->stop[k]);
            if (tl < sl && memcmp(p + i, m->stop[k], tl) == 0) { cut = i; break; }
        }
    }
    buf_append(out, p, cut);
    memmove(m->pending.data, p + cut, pl - cut);
    m->pending.len = pl - cut;
    m->pending.data[m->pending.len] = 0;
    return -1;
}

void stop_flush(stop_matcher *m, buf *out) {
    buf_append(out, m->pending.data ? m->pending.data : "", m->pending.len);
    m->pending.len = 0;
    if (m->pending.data) m->pending.data[0] = 0;
}
