/* sampler.c: penalties, temperature, top_k / top_p / min_p, the draw, and
 * logprobs for one row of logits (the semantics are in sampler.h).
 *
 * Owns: per-thread scratch sized to the vocabulary (smp_ctx), so nothing is
 * allocated per token. Work is O(vocab) per token plus O(c log c) to sort the
 * c candidates when top_k / top_p need an order; top_p finds its candidates
 * with a shrinking probability threshold so a 250k vocabulary is never sorted.
 * Invariants: the input logits are never modified; ties are broken towards
 * the lower token id everywhere (like torch.argmax), so results do not depend
 * on memory layout or thread count.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct smp_ctx {
    int vocab;
    float *work;      /* [vocab] penalised, scaled logits */
    double *ex;       /* [vocab] exp(s - max) */
    int32_t *cand;    /* [vocab] candidate ids */
    int32_t *cnt;     /* [vocab] output-token counts, kept all-zero between calls */
    uint32_t *mark;   /* [vocab] stamp per distinct-token pass */
    uint32_t stamp;
    uint64_t *rkey, *rkey2; /* [vocab] radix-sort scratch, allocated on first large sort */
    int32_t *rtmp;
};

/* ---- request defaults (SGLang's) ---------------------------------------------- */

void ls_sampling_default(ls_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->top_k = -1;
    s->min_p = 0.0f;
    s->repetition_penalty = 1.0f;
    s->max_tokens = 0;
    s->skip_special_tokens = 1;
}

/* ---- RNG: xoshiro256** seeded by splitmix64 --------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void smp_rng_seed(smp_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(smp_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}

double smp_rng_uniform(smp_rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- scratch ------------------------------------------------------------------ */

smp_ctx *smp_new(int vocab) {
    smp_ctx *c = xcalloc(1, sizeof *c);
    c->vocab = vocab;
    c->work = xmalloc((size_t)vocab * sizeof *c->work);
    c->ex = xmalloc((size_t)vocab * sizeof *c->ex);
    c->cand = xmalloc((size_t)vocab * sizeof *c->cand);
    c->cnt = xcalloc((size_t)vocab, sizeof *c->cnt);
    c->mark = xcalloc((size_t)vocab, sizeof *c->mark);
    return c;
}

void smp_free(smp_ctx *c) {
    if (!c) return;
    free(c->work); free(c->ex); free(c->cand); free(c->cnt); free(c->mark);
    free(c->rkey); free(c->rkey2); free(c->rtmp);
    free(c);
}

static uint32_t next_stamp(smp_ctx *c) {
    if (++c->stamp == 0) { /* wrapped: clear old marks */
        memset(c->mark, 0, (size_t)c->vocab * sizeof *c->mark);
        c->stamp = 1;
    }
    return c->stamp;
}

/* ---- penalties ------------------------------------------------------------------ */

void smp_apply_penalties(smp_ctx *c, float *x, const ls_sampling *p, const smp_hist *h) {
    int V = c->vocab;
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f) {
        float rp = p->repetition_penalty;
        uint32_t st = next_stamp(c);
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *t = pass ? h->out : h->prompt;
            int n = pass ? h->n_out : h->n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t id = t[i];
                if (id < 0 || id >= V || c->mark[id] == st) continue;
                c->mark[id] = st;
                x[id] = x[id] > 0 ? x[id] / rp : x[id] * rp;
            }
        }
    }
    if (p->frequency_penalty != 0 || p->presence_penalty != 0) {
        for (int i = 0; i < h->n_out; i++) {
            int32_t id = h->out[i];
            if (id >= 0 && id < V) c->cnt[id]++;
        }
        for (int i = 0; i < h->n_out; i++) {
            int32_t id = h->out[i];
            if (id < 0 || id >= V || c->cnt[id] == 0) continue;
            x[id] -= p->frequency_penalty * (float)c->cnt[id] + p->presence_penalty;
            c->cnt[id] = 0; /* once per distinct token; leaves cnt all-zero */
        }
    }
}

/* ---- ordering helpers -------------------------------------------------------------- */

/* a ranks before b: higher value, then lower id. */
static inline int ranks_before(double va, int32_t a, double vb, int32_t b) {
    return va > vb || (va == vb && a < b);
}

/* Keep the k best (by v) of ids in a min-heap whose root is the worst kept. */
static void heap_sift_down(int32_t *hp, int n, int i, const double *v) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(v[hp[w]], hp[w], v[hp[l]], hp[l])) w = l;
        if (r < n && ranks_before(v[hp[w]], hp[w], v[hp[r]], hp[r])) w = r;
        if (w == i) return;
        int32_t t = hp[i]; hp[i] = hp[w]; hp[w] = t;
        i = w;
    }
}

/* qsort has no context argument: the sort keys travel in a thread-local. */
static _Thread_local const double *t_sort_v;
static int cmp_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const double *v = t_sort_v;
    if (ranks_before(v[x], x, v[y], y)) return -1;
    if (ranks_before(v[y], y, v[x], x)) return 1;
    return 0;
}

/* Descending v, ascending id on ties, for ids given in ascending order:
 * a stable LSD radix sort on the bits of v (non-negative doubles order like
 * their bit patterns), 8 bits per pass, passes where all keys agree skipped.
 * O(n), where qsort through a comparator costs ~15 ms for 100k candidates. */
static void radix_sort_desc(smp_ctx *c, int32_t *ids, int n, const double *v) {
    if (!c->rkey) {
        c->rkey = xmalloc((size_t)c->vocab * sizeof *c->rkey);
        c->rkey2 = xmalloc((size_t)c->vocab * sizeof *c->rkey2);
        c->rtmp = xmalloc((size_t)c->vocab * sizeof *c->rtmp);
    }
    uint64_t *k = c->rkey, *k2 = c->rkey2;
    int32_t *a = ids, *b = c->rtmp;
    for (int i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &v[ids[i]], sizeof u);
        k[i] = ~u; /* ascending ~bits = descending value */
    }
    for (int shift = 0; shift < 64; shift += 8) {
        size_t cnt[256] = {0};
        for (int i = 0; i < n; i++) cnt[(k[i] >> shift) & 255]++;
        if (cnt[(k[0] >> shift) & 255] == (size_t)n) continue;
        size_t pos = 0;
        for (int d = 0; d < 256; d++) { size_t t = cnt[d]; cnt[d] = pos; pos += t; }
        for (int i = 0; i < n; i++) {
            size_t p = cnt[(k[i] >> shift) & 255]++;
            b[p] = a[i];
            k2[p] = k[i];
        }
        int32_t *ta = a; a = b; b = ta;
        uint64_t *tk = k; k = k2; k2 = tk;
    }
    if (a != ids) memcpy(ids, a, (size_t)n * sizeof *ids);
}

static void sort_by_rank(smp_ctx *c, int32_t *ids, int n, const double *v, int ids_ascending) {
    if (n > 1024 && ids_ascending) {
        radix_sort_desc(c, ids, n, v);
        return;
    }
    t_sort_v = v;
    qsort(ids, (size_t)n, sizeof *ids, cmp_rank);
}

/* The k best of [0, V) by v into out (sorted, best first). Returns k. */
static int top_k_ids(smp_ctx *c, int V, const double *v, int k, int32_t *out) {
    if (k > V) k = V;
    int n = 0;
    for (int32_t i = 0; i < V; i++) {
        if (n < k) {
            out[n++] = i;
            if (n == k)
                for (int j = k / 2 - 1; j >= 0; j--) heap_sift_down(out, k, j, v);
        } else if (ranks_before(v[i], i, v[out[0]], out[0])) {
            out[0] = i;
            heap_sift_down(out, k, 0, v);
        }
    }
    sort_by_rank(c, out, n, v, 0);
    return n;
}

/* ---- distribution ---------------------------------------------------------------- */

/* The largest of x[0 .. n) (no NaN: smp_sample_ex checked), in eight lanes the compiler keeps in
 * vector registers; -inf when every entry is. */
static float max_of(const float *x, int n) {
    float l[8];
    for (int j = 0; j < 8; j++) l[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] = x[i + j] > l[j] ? x[i + j] : l[j];
    float m = -INFINITY;
    for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The lowest id holding the largest logit (torch.argmax's tie rule): the maximum by lanes, then
 * the first id equal to it; 0 when every logit is -inf. */
static int32_t argmax_first(const float *x, int n) {
    const float m = max_of(x, n);
    for (int32_t i = 0; i < n; i++) if (x[i] == m) return i;
    return 0;
}

/* From scaled logits s = c->work: c->ex = exp(s - max), returns Z, *mx = max. */
static double softmax_terms(smp_ctx *c, double *mx) {
    int V = c->vocab;
    const float m = max_of(c->work, V);
    double z = 0;
    for (int i = 0; i < V; i++) {
        /* masked / banned ids (-inf) skip the exp: a constrained row is mostly such ids */
        double t = c->work[i] == -INFINITY ? 0.0 : exp((double)c->work[i] - (double)m);
        c->ex[i] = t;
        z += t;
    }
    *mx = m;
    return z;
}

/* Candidates after top_k / top_p / min_p into c->cand; returns the count and
 * their unnormalised mass in *mass. Sorted by rank when top_k or top_p cut. */
static int filter(smp_ctx *c, const ls_sampling *p, double z, double *mass) {
    int V = c->vocab, n;
    const double *ex = c->ex;
    int32_t *cand = c->cand;
    double base = z;
    int use_k = p->top_k > 0 && p->top_k < V;
    int use_p = p->top_p > 0 && p->top_p < 1;
    if (use_k) {
        n = top_k_ids(c, V, ex, p->top_k, cand);
        base = 0;
        for (int i = 0; i < n; i++) base += ex[cand[i]];
    } else if (use_p) {
        /* Everything above the threshold outranks everything below it, so if
         * the tokens above hold top_p of the mass, the nucleus is inside them. */
        for (double t = 1e-4;; t *= 1e-4) {
            double s = 0;
            n = 0;
            int all = t < 1e-300;
            for (int32_t i = 0; i < V; i++)
                if (all || ex[i] >= t) { cand[n++] = i; s += ex[i]; }
            if (all || s >= (double)p->top_p * z) break;
        }
        sort_by_rank(c, cand, n, ex, 1);
    } else {
        n = V;
        for (int32_t i = 0; i < V; i++) cand[i] = i;
    }
    if (use_p) {
        double lim = (double)p->top_p * base, cum = 0;
        int keep = 0;
        while (keep < n && cum < lim) cum += ex[cand[keep++]];
        if (keep == 0) keep = 1;
        n = keep;
    }
    if (p->min_p > 0) {
        /* ex of the most likely token is 1 (shifted by the max). */
        double thr = (double)p->min_p;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (ex[cand[i]] >= thr) cand[k++] = cand[i];
        n = k; /* the argmax has ex == 1 >= min_p <= 1, so n >= 1 */
    }
    double s = 0;
    for (int i = 0; i < n; i++) s += ex[cand[i]];
    *mass = s;
    return n;
}

static void prepare(smp_ctx *c, const float *logits, const ls_sampling *p, float temp) {
    (void)p;
    int V = c->vocab;
    if (temp != 1.0f) {
        float inv = 1.0f / temp;
        for (int i = 0; i < V; i++) c->work[i] = logits[i] * inv;
    } else if (logits != c->work) {
        memcpy(c->work, logits, (size_t)V * sizeof *c->work);
    }
}

int smp_filtered_dist(smp_ctx *c, const float *logits, const ls_sampling *p, int32_t *ids,
                      double *probs) {
    float temp = p->temperature > 0 ? p->temperature : 1.0f;
    prepare(c, logits, p, temp);
    double mx, mass, z = softmax_terms(c, &mx);
    int n = filter(c, p, z, &mass);
    for (int i = 0; i < n; i++) {
        ids[i] = c->cand[i];
        probs[i] = c->ex[c->cand[i]] / mass;
    }
    return n;
}

/* ---- the sampler -------------------------------------------------------------------- */

int smp_sample(smp_ctx *c, const float *logits, const ls_sampling *p, const smp_hist *h,
               const int32_t *ban, int n_ban, smp_rng *rng, int32_t forced, smp_result *res,
               ls_err *e) {
    return smp_sample_ex(c, logits, p, h, ban, n_ban, NULL, rng, forced, res, e);
}

int smp_sample_ex(smp_ctx *c, const float *logits, const ls_sampling *p, const smp_hist *h,
                  const int32_t *ban, int n_ban, const smp_edit *ed, smp_rng *rng, int32_t forced,
                  smp_result *res, ls_err *e) {
    int V = c->vocab;
    /* NaN/Inf scan on the exponent bits: an OR reduction the compiler vectorises */
    const uint32_t *bits = (const uint32_t *)(const void *)logits;
    uint32_t bad = 0;
    for (int i = 0; i < V; i++) bad |= (uint32_t)((bits[i] & 0x7f800000u) == 0x7f800000u);
    if (bad)
        for (int i = 0; i < V; i++)
            if (!isfinite(logits[i]))
                return errf(e, ERR_RUNTIME, "logits[%d] is %g", i, (double)logits[i]);

    /* Work on a copy only when something edits the logits. */
    int penalised = (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f && h->n_prompt + h->n_out) ||
                    ((p->frequency_penalty != 0 || p->presence_penalty != 0) && h->n_out);
    const float *x = logits;
    int edited = ed && (ed->allow || ed->n_bias > 0);
    if (n_ban > 0 || penalised || edited) {
        float *w = c->work;
        memcpy(w, logits, (size_t)V * sizeof *w);
        if (edited) {
            for (int i = 0; i < ed->n_bias; i++)
                if (ed->bias_ids[i] >= 0 && ed->bias_ids[i] < V) w[ed->bias_ids[i]] += ed->bias[i];
            if (ed->allow) /* a word at a time: masks are mostly all-allowed or all-refused runs */
                for (int b = 0; b < V; b += 32) {
                    uint32_t a = ed->allow[b >> 5];
                    int n = V - b < 32 ? V - b : 32;
                    if (a == 0xffffffffu && n == 32) continue;
                    for (int i = 0; i < n; i++)
                        if (!((a >> i) & 1)) w[b + i] = -INFINITY;
                }
        }
        for (int i = 0; i < n_ban; i++)
            if (ban[i] >= 0 && ban[i] < V) w[ban[i]] = -INFINITY;
        smp_apply_penalties(c, w, p, h);
        x = w;
    }

    int greedy = !(p->temperature > 0) || p->top_k == 1;
    int want_lp = p->logprobs || p->top_logprobs > 0;
    float temp = p->temperature > 0 ? p->temperature : 1.0f;
    if (greedy && p->top_k == 1 && p->temperature > 0) temp = p->temperature;
    memset(res, 0, sizeof *res);

    if (greedy) res->token = forced >= 0 ? forced : argmax_first(x, V);
    double mx = 0, z = 1;
    if (!greedy || want_lp) {
        prepare(c, x, p, temp); /* work = x / temp (in place when x is work) */
        z = softmax_terms(c, &mx);
    }
    if (!greedy) {
        if (forced >= 0) {
            res->token = forced;
        } else {
            double mass;
            int n = filter(c, p, z, &mass);
            double u = smp_rng_uniform(rng) * mass, acc = 0;
            int32_t pick = c->cand[n - 1];
            for (int i = 0; i < n; i++) {
                acc += c->ex[c->cand[i]];
                if (acc > u) { pick = c->cand[i]; break; }
            }
            res->token = pick;
        }
    }
    if (want_lp) {
        double lz = log(z) + mx;
        res->logprob = (float)((double)c->work[res->token] - lz);
        int k = p->top_logprobs;
        if (k > SMP_MAX_TOP) k = SMP_MAX_TOP;
        if (k > 0) {
            /* rank by ex (monotone in the logit); reuse cand as heap space */
            int n = top_k_ids(c, V, c->ex, k, c->cand);
            while (n > 0 && !(c->ex[c->cand[n - 1]] > 0) && isinf(c->work[c->cand[n - 1]])) n--; /* masked */
            res->n_top = n;
            for (int i = 0; i < n; i++) {
                res->top_ids[i] = c->cand[i];
                res->top_logprobs[i] = (float)((double)c->work[c->cand[i]] - lz);
            }
        }
    }
    return 0;
}
