/* stop.h: stop-string matching on streamed text.
 *
 * Text arrives in deltas (whole UTF-8 characters, from tok_stream). The
 * matcher emits only text that can no longer be part of a stop string and
 * holds back a tail that is a proper prefix of one, so a stop string split
 * across tokens is still found and never leaks to the client. On a match the
 * text before it is emitted and the stop string and everything after it are
 * dropped (SGLang's default, no_stop_trim=false). The earliest match in the
 * text wins; on equal starts, the first string in the list.
 */
#ifndef LS_ENGINE_STOP_H
#define LS_ENGINE_STOP_H

#include "base/base.h"

typedef struct stop_matcher {
    const char *const *stop;  /* borrowed; non-empty strings */
    int n;
    size_t max_len;
    buf pending;              /* held-back text, always shorter than max_len */
} stop_matcher;

void stop_init(stop_matcher *m, const char *const *stop, int n);
void stop_free(stop_matcher *m);
/* Feed a delta; appends emittable text to out. Returns the index of the
 * matched stop string, or -1. After a match the matcher must not be fed again. */
int stop_feed(stop_matcher *m, const char *text, size_t len, buf *out);
/* End of generation: append whatever is held back. */
void stop_flush(stop_matcher *m, buf *out);

#endif
