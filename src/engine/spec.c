/* spec.c: the NGRAM draft source (spec.h).
 *
 * A backward scan: the suffix's last token is compared first, so most
 * positions cost one comparison; SPEC_NGRAM_SCAN bounds the work per row and
 * step (65536 positions, ~50 us) on very long contexts. The proposal is always
 * k tokens: a match d tokens back that runs into the end continues with period
 * d (a repeating pattern proposes its own continuation), which is what makes
 * loops and repeated lines cheap to verify.
 */
#include "engine/spec.h"

int spec_ngram_propose(const int32_t *tok, int n, int min_w, int max_w, int k, int32_t *out) {
    if (k > SPEC_DRAFT_MAX) k = SPEC_DRAFT_MAX;
    if (!tok || k <= 0 || min_w < 1 || max_w < min_w) return 0;
    if (max_w > n - 1) max_w = n - 1;
    for (int w = max_w; w >= min_w; w--) {
        const int32_t *suf = tok + n - w;
        int lo = n - w - SPEC_NGRAM_SCAN;
        if (lo < 0) lo = 0;
        /* p + w < n: the latest candidate starts at n - w - 1 */
        for (int p = n - w - 1; p >= lo; p--) {
            if (tok[p + w - 1] != suf[w - 1]) continue;
            int i = 0;
            while (i < w - 1 && tok[p + i] == suf[i]) i++;
            if (i < w - 1) continue;
            /* the match is the suffix shifted back by d: continue with period d past the end */
            const int d = n - w - p;
            for (int j = 0; j < k; j++) out[j] = p + w + j < n ? tok[p + w + j] : out[j - d];
            return k;
        }
    }
    return 0;
}
