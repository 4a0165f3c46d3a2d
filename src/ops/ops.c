/* ops.c: the op-family registries, backend selection, and helpers shared by
 * every backend (weight-row dequantisation, the router's top-k).
 *
 * Selection: one backend per family, or a per-M plan (ops.h "per-M plans":
 * parsed here, dispatched by the run helpers on the call's M), plus the
 * banned backends that per-shape fallbacks and capture substitutes skip.
 *
 * Owns: one registry array per family, filled once (pthread_once) in
 * preference order: CUDA backends (if linked), fast CPU backends, the
 * test-only broken ones (LASTSTAND_TEST_BROKEN_BACKENDS=1), then the CPU
 * reference, which stays last: later registrations are inserted before it.
 */
#include "ops/ops.h"
#include "ops/cpu/cpu.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------- */

size_t act_size(act_dtype dt) { return dt == ACT_BF16 ? 2 : 4; }
const char *act_name(act_dtype dt) { return dt == ACT_BF16 ? "bf16" : "f32"; }

const char *w_kind_name(w_kind k) {
    switch (k) {
    case W_F32: return "F32";
    case W_BF16: return "BF16";
    case W_F16: return "F16";
    case W_NVFP4: return "NVFP4";
    case W_FP8: return "FP8";
    }
    return "?";
}

/* fp8 e4m3 -> fp32 for all 256 codes (built once; block scales hit it per 16 weights). */
static float g_fp8[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;
static void fp8_init(void) {
    for (int i = 0; i < 256; i++) g_fp8[i] = fp8_e4m3_to_f32((uint8_t)i);
}
const float *ops_fp8_e4m3_table(void) {
    pthread_once(&g_fp8_once, fp8_init);
    return g_fp8;
}

void lin_row_f32(const lin_w *w, int n, float *out) {
    const int K = w->K;
    switch (w->kind) {
    case W_F32:
        memcpy(out, (const float *)w->data + (size_t)n * K, sizeof(float) * K);
        break;
    case W_BF16: {
        const uint16_t *r = (const uint16_t *)w->data + (size_t)n * K;
        for (int k = 0; k < K; k++) out[k] = bf16_to_f32(r[k]);
        break;
    }
    case W_F16: {
        const uint16_t *r = (const uint16_t *)w->data + (size_t)n * K;
        for (int k = 0; k < K; k++) out[k] = f16_to_f32(r[k]);
        break;
    }
    case W_NVFP4: {
        /* W[n,k] = E2M1(code) · fp8(scale[n, k/16]) · scale2; byte holds 2i low, 2i+1 high. */
        const uint8_t *codes = (const uint8_t *)w->data + (size_t)n * (K / 2);
        const uint8_t *sc = w->scale + (size_t)n * (K / 16);
        const float *fp8 = ops_fp8_e4m3_table();
        for (int b = 0; b < K / 16; b++) {
            float s = fp8[sc[b]] * w->scale2;
            for (int i = 0; i < 8; i++) {
                uint8_t byte = codes[b * 8 + i];
                out[b * 16 + 2 * i] = E2M1_LUT[byte & 0xF] * s;
                out[b * 16 + 2 * i + 1] = E2M1_LUT[byte >> 4] * s;
            }
        }
        break;
    }
    case W_FP8: {
        /* W[n,k] = e4m3(code) · scale of its block (lin_fp8_scale), in fp32 */
        const uint8_t *r = (const uint8_t *)w->data + (size_t)n * K;
        const float *fp8 = ops_fp8_e4m3_table();
        const int bc = w->fs_bc;
        for (int k = 0; k < K;) {
            const float s = lin_fp8_scale(w, n, k);
            int end = k + bc - (k + w->fs_c0) % bc; /* the end of this scale block's columns */
            if (end > K) end = K;
            for (; k < end; k++) out[k] = fp8[r[k]] * s;
        }
        break;
    }
    }
}

size_t lin_bytes(const lin_w *w) {
    size_t nk = (size_t)w->N * w->K;
    switch (w->kind) {
    case W_F32: return nk * 4;
    case W_BF16: case W_F16: return nk * 2;
    case W_NVFP4: return nk / 2 + nk / 16;
    case W_FP8: return nk + sizeof(float) * w->fs_n;
    }
    return 0;
}

void moe_route(const float *logits, int E, int k, int norm, int32_t *idx, float *w) {
    /* softmax over all E in fp32 (max-subtracted), then the k largest. */
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) sum += exp((double)logits[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        idx[j] = best;
        w[j] = (float)(exp((double)logits[best] - mx) / sum);
    }
    if (norm) {
        double s = 0;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] = (float)(w[j] / s);
    }
}

void ops_cpu_dev(dev_info *d) {
    memset(d, 0, sizeof *d);
    d->kind = DEV_CPU;
    snprintf(d->name, sizeof d->name, "cpu");
    d->n_threads = pool_threads();
}

/* ---- registries ---------------------------------------------------------- */

#define REG_MAX 32
/* Every impl struct starts with `const char *name`, then `dev_kind dev`, then `int test_only`. */
typedef struct impl_head {
    const char *name;
    dev_kind dev;
    int test_only;
} impl_head;

typedef struct registry {
    const void *v[REG_MAX];
    int n;
    int has_ref; /* v[n-1] is the CPU reference */
} registry;

static registry g_reg[6];
enum { F_GEMM, F_FP4, F_MOE, F_ATTN, F_GDN, F_SMALL };
static const char *const k_fam_name[6] = {"gemm", "fp4_gemm", "moe", "attention", "gdn", "small"};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int g_initialising; /* set while reg_init runs on this thread */

static const impl_head *head(const void *p) { return (const impl_head *)p; }

static int reg_add(registry *r, const void *impl, int is_ref) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(head(r->v[i])->name, head(impl)->name)) return ERR_INVAL;
    if (r->n >= REG_MAX) return ERR_INVAL;
    if (is_ref) {
        r->v[r->n++] = impl;
        r->has_ref = 1;
    } else if (r->has_ref) {
        r->v[r->n] = r->v[r->n - 1];
        r->v[r->n - 1] = impl;
        r->n++;
    } else {
        r->v[r->n++] = impl;
    }
    return 0;
}

__attribute__((weak)) void ops_cuda_register_all(void);
#ifdef LS_HAVE_CUDA
/* a strong reference: it pulls src/ops/cuda/fwd_dev.o out of the static library */
#define HAVE_FWD_HOOK 1
#else
__attribute__((weak)) void ops_cuda_register_fwd(void);
#define HAVE_FWD_HOOK (ops_cuda_register_fwd != NULL)
#endif

static void reg_init(void) {
    g_initialising = 1;
    if (ops_cuda_register_all) ops_cuda_register_all();
    if (HAVE_FWD_HOOK) ops_cuda_register_fwd();
    cpu_register_all();
    const char *b = getenv("LASTSTAND_TEST_BROKEN_BACKENDS");
    if (b && !strcmp(b, "1")) cpu_register_broken();
    reg_add(&g_reg[F_GEMM], &gemm_cpu_ref, 1);
    reg_add(&g_reg[F_FP4], &fp4_gemm_cpu_ref, 1);
    reg_add(&g_reg[F_MOE], &moe_cpu_ref, 1);
    reg_add(&g_reg[F_ATTN], &attn_cpu_ref, 1);
    reg_add(&g_reg[F_GDN], &gdn_cpu_ref, 1);
    reg_add(&g_reg[F_SMALL], &small_cpu_ref, 1);
    g_initialising = 0;
}

static registry *reg(int f) {
    if (!g_initialising) pthread_once(&g_once, reg_init);
    return &g_reg[f];
}

static int reg_register(int f, const void *impl) {
    registry *r = reg(f);
    pthread_mutex_lock(&g_mu);
    int rc = reg_add(r, impl, 0);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static const void *reg_find(int f, const char *name) {
    registry *r = reg(f);
    for (int i = 0; i < r->n; i++)
        if (!strcmp(head(r->v[i])->name, name)) return r->v[i];
    return NULL;
}

#define OPS_DEFINE_FAMILY(fam, T, F)                                                   \
    int ops_##fam##_register(const T *impl) { return reg_register(F, impl); }          \
    int ops_##fam##_count(void) { return reg(F)->n; }                                  \
    const T *ops_##fam##_at(int i) {                                                   \
        registry *r = reg(F);                                                          \
        return i >= 0 && i < r->n ? (const T *)r->v[i] : NULL;                         \
    }                                                                                  \
    const T *ops_##fam##_find(const char *name) { return (const T *)reg_find(F, name); }
OPS_DEFINE_FAMILY(gemm, gemm_impl, F_GEMM)
OPS_DEFINE_FAMILY(fp4_gemm, fp4_gemm_impl, F_FP4)
OPS_DEFINE_FAMILY(moe, moe_impl, F_MOE)
OPS_DEFINE_FAMILY(attn, attn_impl, F_ATTN)
OPS_DEFINE_FAMILY(gdn, gdn_impl, F_GDN)
OPS_DEFINE_FAMILY(small, small_ops, F_SMALL)

/* ---- selection ----------------------------------------------------------- */

/* "valid: auto, a, b" for family f on device d (NULL: every device) into b. */
static void valid_names(int f, const dev_info *d, buf *b) {
    registry *r = reg(f);
    for (int i = 0; i < r->n; i++)
        if (!d || head(r->v[i])->dev == d->kind) buf_printf(b, "%s%s", b->len ? ", " : "", head(r->v[i])->name);
}

static int pick(int f, const dev_info *d, const char *name, const void **out, ops_plan *plan, ls_err *e) {
    registry *r = reg(f);
    if (plan) plan->n = 0;
    if (name && name[strcspn(name, ",:")]) { /* a plan */
        ops_plan p;
        int rc = ops_plan_parse(f, d, name, &p, e);
        if (rc) return rc;
        *out = p.impl[0];
        if (plan && p.n > 1) *plan = p;
        return 0;
    }
    if (!name || !*name || !strcmp(name, "auto")) {
        for (int i = 0; i < r->n; i++) {
            const impl_head *h = head(r->v[i]);
            if (h->dev == d->kind && !h->test_only) { *out = r->v[i]; return 0; }
        }
        return errf(e, ERR_UNSUPPORTED, "no %s backend for device %s", k_fam_name[f], d->name);
    }
    for (int i = 0; i < r->n; i++) {
        const impl_head *h = head(r->v[i]);
        if (!strcmp(h->name, name) && h->dev == d->kind) { *out = r->v[i]; return 0; }
    }
    buf b;
    buf_init(&b);
    valid_names(f, d, &b);
    errf(e, ERR_INVAL, "unknown %s backend '%s' for device %s (valid: auto, %s)", k_fam_name[f],
         name, d->name, b.data ? b.data : "");
    buf_free(&b);
    return ERR_INVAL;
}

/* ---- plans --------------------------------------------------------------- */

const char *ops_family_name(int fam) { return fam >= 0 && fam < OPS_N_FAM ? k_fam_name[fam] : "?"; }

int ops_family_index(const char *name) {
    for (int f = 0; f < OPS_N_FAM && name; f++)
        if (!strcmp(name, k_fam_name[f])) return f;
    return -1;
}

int ops_plan_parse(int fam, const dev_info *d, const char *text, ops_plan *out, ls_err *e) {
    memset(out, 0, sizeof *out);
    if (fam < 0 || fam >= OPS_N_FAM) return errf(e, ERR_INVAL, "no op family %d", fam);
    const char *fn = k_fam_name[fam];
    if (!text || !*text) return errf(e, ERR_INVAL, "%s backend: empty (a name, or a plan NAME:MAXM,...,NAME)", fn);
    registry *r = reg(fam);
    int k = 1; /* empty entries first, wherever they are ("a:8,b," is a stray comma, not a bound fault) */
    for (const char *q = text;; k++) {
        size_t len = strcspn(q, ","), sp = strspn(q, " \t");
        if (sp >= len)
            return errf(e, ERR_INVAL, "%s backend plan '%s': entry %d is empty (write NAME:MAXM,...,NAME)", fn, text, k);
        if (!q[len]) break;
        q += len + 1;
    }
    const char *p = text;
    for (int idx = 0;; idx++) {
        size_t len = strcspn(p, ",");
        const int last = p[len] == 0;
        while (len && (*p == ' ' || *p == '\t')) p++, len--; /* spaces around an entry are not part of it */
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        char ent[160];
        if (len == 0)
            return errf(e, ERR_INVAL, "%s backend plan '%s': entry %d is empty (write NAME:MAXM,...,NAME)", fn, text,
                        idx + 1);
        if (len >= sizeof ent)
            return errf(e, ERR_INVAL, "%s backend plan '%s': entry %d is too long", fn, text, idx + 1);
        memcpy(ent, p, len);
        ent[len] = 0;
        char *colon = strchr(ent, ':');
        long bound = 0;
        if (colon) {
            *colon = 0;
            const char *bs = colon + 1;
            char *end;
            errno = 0;
            bound = strtol(bs, &end, 10);
            if (!*bs || *end || errno || bound < 1 || bound > (1L << 30) || !(*bs >= '0' && *bs <= '9'))
                return errf(e, ERR_INVAL, "%s backend plan '%s': entry '%s:%s': the bound '%s' is not an integer in "
                            "1..%ld (NAME:MAXM takes calls of up to MAXM tokens)", fn, text, ent, bs, bs, 1L << 30);
        }
        if (!ent[0])
            return errf(e, ERR_INVAL, "%s backend plan '%s': entry %d has no backend name", fn, text, idx + 1);
        if (!strcmp(ent, "auto"))
            return errf(e, ERR_INVAL, "%s backend plan '%s': 'auto' cannot be an entry of a plan (name a backend)",
                        fn, text);
        if (idx >= OPS_PLAN_MAX)
            return errf(e, ERR_INVAL, "%s backend plan '%s': more than %d entries", fn, text, OPS_PLAN_MAX);
        const void *impl = NULL;
        for (int i = 0; i < r->n && !impl; i++)
            if (!strcmp(head(r->v[i])->name, ent) && (!d || head(r->v[i])->dev == d->kind)) impl = r->v[i];
        if (!impl) {
            buf b;
            buf_init(&b);
            valid_names(fam, d, &b);
            if (last && idx == 0)
                errf(e, ERR_INVAL, "unknown %s backend '%s'%s%s (valid: auto, %s)", fn, ent, d ? " for device " : "",
                     d ? d->name : "", b.data ? b.data : "");
            else
                errf(e, ERR_INVAL, "%s backend plan '%s': unknown %s backend '%s'%s%s (valid: %s)", fn, text, fn, ent,
                     d ? " for device " : "", d ? d->name : "", b.data ? b.data : "");
            buf_free(&b);
            return ERR_INVAL;
        }
        if (last && colon)
            return errf(e, ERR_INVAL, "%s backend plan '%s': the last entry '%s:%ld' must have no bound (it takes every "
                        "M above the previous entry's)", fn, text, ent, bound);
        if (!last && !colon)
            return errf(e, ERR_INVAL, "%s backend plan '%s': entry '%s' needs a bound (NAME:MAXM); only the last entry "
                        "has none", fn, text, ent);
        if (colon && idx > 0 && bound <= out->max_m[idx - 1])
            return errf(e, ERR_INVAL, "%s backend plan '%s': bounds must increase, but '%s:%ld' follows a bound of %d",
                        fn, text, ent, bound, out->max_m[idx - 1]);
        out->impl[idx] = impl;
        out->max_m[idx] = last ? INT_MAX : (int)bound;
        out->n = idx + 1;
        if (last) return 0;
        p += strcspn(p, ",") + 1;
    }
}

void ops_plan_format(const ops_plan *p, char *out, size_t n) {
    if (n) out[0] = 0;
    size_t o = 0;
    for (int i = 0; i < p->n && o < n; i++) {
        int w = i + 1 < p->n ? snprintf(out + o, n - o, "%s%s:%d", i ? "," : "", head(p->impl[i])->name, p->max_m[i])
                             : snprintf(out + o, n - o, "%s%s", i ? "," : "", head(p->impl[i])->name);
        if (w < 0) break;
        o += (size_t)w;
    }
}

const void *ops_plan_at(const ops_plan *p, int M) {
    for (int i = 0; i < p->n; i++)
        if (M <= p->max_m[i]) return p->impl[i];
    return p->n ? p->impl[p->n - 1] : NULL;
}

const void *ops_sel_for_m(const ops_sel *s, int fam, int M) {
    if (fam < 0 || fam >= OPS_N_FAM) return NULL;
    if (s->plan[fam].n) return ops_plan_at(&s->plan[fam], M);
    switch (fam) {
    case OPS_FAM_GEMM: return s->gemm;
    case OPS_FAM_FP4_GEMM: return s->fp4_gemm;
    case OPS_FAM_MOE: return s->moe;
    case OPS_FAM_ATTN: return s->attn;
    default: return s->gdn;
    }
}

int ops_sel_is_banned(const ops_sel *s, int fam, const void *impl) {
    if (fam < 0 || fam >= OPS_N_FAM) return 0;
    for (int i = 0; i < s->n_ban[fam]; i++)
        if (s->ban[fam][i] == impl) return 1;
    return 0;
}

int ops_sel_ban(ops_sel *s, const char *list, ls_err *e) {
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        char item[160];
        if (len == 0 || len >= sizeof item)
            return errf(e, ERR_INVAL, "banned backends '%s': %s item", list, len ? "a too long" : "an empty");
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strchr(item, ':');
        if (colon) *colon = 0;
        int f = ops_family_index(item);
        if (!colon || f < 0)
            return errf(e, ERR_INVAL, "banned backends '%s': '%s%s%s' is not FAMILY:NAME (families: gemm, fp4_gemm, "
                        "moe, attention, gdn)", list, item, colon ? ":" : "", colon ? colon + 1 : "");
        const void *impl = reg_find(f, colon + 1);
        if (!impl) return errf(e, ERR_INVAL, "banned backends '%s': no %s backend '%s'", list, item, colon + 1);
        if (!ops_sel_is_banned(s, f, impl)) {
            if (s->n_ban[f] >= OPS_BAN_MAX)
                return errf(e, ERR_INVAL, "banned backends '%s': more than %d in %s", list, OPS_BAN_MAX, item);
            s->ban[f][s->n_ban[f]++] = impl;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

int ops_select(const dev_info *d, const ops_names *n, ops_sel *out, ls_err *e) {
    static const ops_names none;
    if (!n) n = &none;
    memset(out, 0, sizeof *out);
    out->dev = *d;
    out->act = d->kind == DEV_CPU ? ACT_F32 : ACT_BF16;
    int rc;
    if ((rc = pick(F_GEMM, d, n->gemm, (const void **)&out->gemm, &out->plan[F_GEMM], e))) return rc;
    if ((rc = pick(F_FP4, d, n->fp4_gemm, (const void **)&out->fp4_gemm, &out->plan[F_FP4], e))) return rc;
    if ((rc = pick(F_MOE, d, n->moe, (const void **)&out->moe, &out->plan[F_MOE], e))) return rc;
    if ((rc = pick(F_ATTN, d, n->attention, (const void **)&out->attn, &out->plan[F_ATTN], e))) return rc;
    if ((rc = pick(F_GDN, d, n->gdn, (const void **)&out->gdn, &out->plan[F_GDN], e))) return rc;
    const char *names[5] = {n->gemm, n->fp4_gemm, n->moe, n->attention, n->gdn};
    for (int f = 0; f < 5; f++)
        if (!names[f] || !*names[f] || !strcmp(names[f], "auto")) out->auto_fam |= 1u << f;
    return pick(F_SMALL, d, NULL, (const void **)&out->small, NULL, e);
}

/* The backend for one call: sel (the plan's entry for the call's M, or the
 * single selection) if it takes the shape; for a family chosen by "auto",
 * else another entry of the plan that does, else the first backend of the
 * device that does and is neither test_only nor banned. sup(impl, shape,
 * why, n) wraps the family's supported. */
typedef int (*sup_fn)(const void *impl, const dev_info *d, const void *shape, char *why, size_t n);

static const void *for_shape(const ops_sel *s, int f, const void *sel, sup_fn sup, const void *shape,
                             ls_err *e) {
    char why[256] = "";
    if (sup(sel, &s->dev, shape, why, sizeof why)) return sel;
    if (s->auto_fam & (1u << f)) {
        char w2[256];
        const ops_plan *p = &s->plan[f];
        for (int i = 0; i < p->n; i++)
            if (p->impl[i] != sel && !ops_sel_is_banned(s, f, p->impl[i]) && sup(p->impl[i], &s->dev, shape, w2, sizeof w2))
                return p->impl[i];
        registry *r = reg(f);
        for (int i = 0; i < r->n; i++) {
            const impl_head *h = head(r->v[i]);
            if (h->dev == s->dev.kind && !h->test_only && r->v[i] != sel && !ops_sel_is_banned(s, f, r->v[i]) &&
                sup(r->v[i], &s->dev, shape, w2, sizeof w2))
                return r->v[i];
        }
    }
    errf(e, ERR_UNSUPPORTED, "%s backend '%s' does not take this shape: %s", k_fam_name[f],
         head(sel)->name, why);
    return NULL;
}

/* During CUDA graph capture only graph_safe backends may run (ops.h). A
 * family chosen by "auto" first trades a backend that is not capture-safe
 * for the first capture-safe one of the device that takes the shape. */
static int refuse_uncapturable(const ops_sel *s, int f, const char *name, int safe, ls_err *e) {
    if (s->capturing != 1 || safe) return 0;
    return errf(e, ERR_UNSUPPORTED, "%s backend '%s' is not capture-safe (graph_safe = 0)", k_fam_name[f],
                name);
}

typedef int (*safe_fn)(const void *impl);
static int safe_gemm(const void *p) { return ((const gemm_impl *)p)->graph_safe; }
static int safe_moe(const void *p) { return ((const moe_impl *)p)->graph_safe; }
static int safe_attn(const void *p) { return ((const attn_impl *)p)->graph_safe; }
static int safe_gdn(const void *p) { return ((const gdn_impl *)p)->graph_safe; }

static const void *capture_alt(const ops_sel *s, int f, const void *g, sup_fn sup, safe_fn safe,
                               const void *shape) {
    if (!g || !s->capturing || safe(g) || !(s->auto_fam & (1u << f))) return g;
    char why[256];
    const ops_plan *p = &s->plan[f]; /* the plan's own capture-safe entries first */
    for (int i = 0; i < p->n; i++)
        if (safe(p->impl[i]) && !ops_sel_is_banned(s, f, p->impl[i]) && sup(p->impl[i], &s->dev, shape, why, sizeof why))
            return p->impl[i];
    registry *r = reg(f);
    for (int i = 0; i < r->n; i++) {
        const impl_head *h = head(r->v[i]);
        if (h->dev == s->dev.kind && !h->test_only && safe(r->v[i]) && !ops_sel_is_banned(s, f, r->v[i]) &&
            sup(r->v[i], &s->dev, shape, why, sizeof why))
            return r->v[i];
    }
    return g;
}

static int sup_gemm(const void *impl, const dev_info *d, const void *shape, char *why, size_t n) {
    const gemm_impl *g = impl;
    return !g->supported || g->supported(d, shape, why, n);
}
static int sup_moe(const void *impl, const dev_info *d, const void *shape, char *why, size_t n) {
    const moe_impl *g = impl;
    return !g->supported || g->supported(d, shape, why, n);
}
static int sup_attn(const void *impl, const dev_info *d, const void *shape, char *why, size_t n) {
    const attn_impl *g = impl;
    return !g->supported || g->supported(d, shape, why, n);
}
static int sup_gdn(const void *impl, const dev_info *d, const void *shape, char *why, size_t n) {
    const gdn_impl *g = impl;
    return !g->supported || g->supported(d, shape, why, n);
}

/* ---- load-time check of named backends -------------------------------------
 * A family whose backend or plan was named (auto bit clear) never falls back, so an
 * entry that does not take one of the model's shapes would fail a request at run
 * time (the first decode step, say). The model checks its shapes once at open:
 * every entry at the first and the last M of its range (the last entry: its first M
 * and OPS_CHECK_MAX_M, the doctor's largest bucket); support depends on M only
 * through bounds (cuda_fused_decode: M <= 8), so the two ends decide. */
typedef void (*set_m_fn)(void *shape, int M);

static int check_named(const ops_sel *s, int f, sup_fn sup, set_m_fn set_m, void *shape, const char *what,
                       ls_err *e) {
    if (s->auto_fam & (1u << f)) return 0;
    const ops_plan *p = &s->plan[f];
    const void *single = f == F_GEMM ? (const void *)s->gemm : f == F_FP4 ? (const void *)s->fp4_gemm
                       : f == F_MOE ? (const void *)s->moe : f == F_ATTN ? (const void *)s->attn : (const void *)s->gdn;
    const int n = p->n ? p->n : 1;
    for (int i = 0; i < n; i++) {
        const void *impl = p->n ? p->impl[i] : single;
        if (!impl) continue;
        const int lo = i ? p->max_m[i - 1] + 1 : 1;
        const int hi = p->n && i < p->n - 1 ? p->max_m[i] : (lo > OPS_CHECK_MAX_M ? lo : OPS_CHECK_MAX_M);
        const int ms[2] = {lo, hi};
        for (int j = 0; j < 2; j++) {
            char why[256] = "";
            set_m(shape, ms[j]);
            if (sup(impl, &s->dev, shape, why, sizeof why)) continue;
            char range[48];
            if (p->n > 1 && i < p->n - 1) snprintf(range, sizeof range, " (its entry for M %d..%d)", lo, hi);
            else if (p->n > 1) snprintf(range, sizeof range, " (its entry for M >= %d)", lo);
            else range[0] = 0;
            return errf(e, ERR_UNSUPPORTED, "%s backend '%s'%s does not take this model's %s at M = %d: %s",
                        k_fam_name[f], head(impl)->name, range, what, ms[j], why);
        }
    }
    return 0;
}

static void set_m_gemm(void *p, int M) { ((gemm_shape *)p)->M = M; }
static void set_m_moe(void *p, int M) { ((moe_shape *)p)->M = M; }
static void set_m_attn(void *p, int M) {
    attn_shape *a = p;
    a->n_tok = M;
    a->n_seq = 1;
    if (a->max_ctx < M) a->max_ctx = M;
}
static void set_m_gdn(void *p, int M) {
    gdn_shape *g = p;
    g->n_tok = M;
    g->n_seq = 1;
}

int ops_sel_check_linear(const ops_sel *s, const lin_w *w, ls_err *e) {
    gemm_shape sh = {.M = 1, .N = w->N, .K = w->K, .wk = w->kind, .dt = s->act};
    char what[160];
    snprintf(what, sizeof what, "linear '%s' [%d x %d]", w->name ? w->name : "?", w->N, w->K);
    return check_named(s, w->kind == W_NVFP4 ? F_FP4 : F_GEMM, sup_gemm, set_m_gemm, &sh, what, e);
}

int ops_sel_check_moe(const ops_sel *s, const moe_w *w, ls_err *e) {
    moe_shape sh = {.M = 1, .H = w->hidden, .E = w->n_experts, .top_k = w->top_k, .I = w->inter,
                    .Is = w->shared_inter, .wk = w->gate[0].kind, .dt = s->act,
                    .sk = w->shared_inter > 0 ? w->sh_gate.kind : w->gate[0].kind};
    char what[160];
    snprintf(what, sizeof what, "moe shape (hidden %d, %d experts, top-%d, expert size %d, shared %d)", w->hidden,
             w->n_experts, w->top_k, w->inter, w->shared_inter);
    return check_named(s, F_MOE, sup_moe, set_m_moe, &sh, what, e);
}

int ops_sel_check_attn(const ops_sel *s, const attn_shape *shape, ls_err *e) {
    attn_shape sh = *shape;
    char what[160];
    snprintf(what, sizeof what, "attention shape (%d heads, %d kv heads, head dim %d%s)", sh.n_heads,
             sh.n_kv_heads, sh.head_dim, sh.gated ? ", gated" : "");
    return check_named(s, F_ATTN, sup_attn, set_m_attn, &sh, what, e);
}

int ops_sel_check_gdn(const ops_sel *s, const gdn_shape *shape, ls_err *e) {
    gdn_shape sh = *shape;
    char what[160];
    snprintf(what, sizeof what, "gdn shape (%d key heads, %d value heads, dk %d, dv %d, conv %d)", sh.nk, sh.nv,
             sh.dk, sh.dv, sh.conv_k);
    return check_named(s, F_GDN, sup_gdn, set_m_gdn, &sh, what, e);
}

/* The backend ops_linear takes for (M, w), or NULL with e set. */
static const gemm_impl *linear_impl(const ops_sel *s, int M, const lin_w *w, ls_err *e) {
    const int fp4 = w->kind == W_NVFP4;
    const gemm_impl *g = ops_sel_for_m(s, fp4 ? F_FP4 : F_GEMM, M);
    if (s->dev.kind != DEV_CPU) {
        gemm_shape sh = {.M = M, .N = w->N, .K = w->K, .wk = w->kind, .dt = s->act};
        if (!(g = for_shape(s, fp4 ? F_FP4 : F_GEMM, g, sup_gemm, &sh, e))) {
            err_prefix(e, "%s", w->name ? w->name : "linear");
            return NULL;
        }
        g = capture_alt(s, fp4 ? F_FP4 : F_GEMM, g, sup_gemm, safe_gemm, &sh);
    }
    if (refuse_uncapturable(s, fp4 ? F_FP4 : F_GEMM, g->name, g->graph_safe, e)) return NULL;
    return g;
}

int ops_linear(const ops_sel *s, int M, const void *x, const lin_w *w, void *y, int accumulate,
               ls_err *e) {
    const gemm_impl *g = linear_impl(s, M, w, e);
    if (!g) return e->code;
    gemm_args a = {.M = M, .x = x, .w = w, .y = y, .accumulate = accumulate, .dt = s->act};
    return g->run(&a, s->stream, e);
}

int ops_linear_multi(const ops_sel *s, int M, const void *x, int n, const lin_w *const *w, void *const *y,
                     ls_err *e) {
    if (n < 1 || n > OPS_LINEAR_MULTI_MAX)
        return errf(e, ERR_INVAL, "ops_linear_multi: %d weights (1..%d)", n, OPS_LINEAR_MULTI_MAX);
    const gemm_impl *g = n > 1 ? linear_impl(s, M, w[0], e) : NULL;
    if (n > 1 && !g) return e->code;
    int same = g && g->run_multi;
    for (int i = 1; i < n && same; i++) {
        ls_err e2 = {0};
        same = w[i]->kind == w[0]->kind && w[i]->K == w[0]->K && linear_impl(s, M, w[i], &e2) == g;
    }
    if (!same) {
        for (int i = 0; i < n; i++) {
            int rc = ops_linear(s, M, x, w[i], y[i], 0, e);
            if (rc) return rc;
        }
        return 0;
    }
    gemm_args a[OPS_LINEAR_MULTI_MAX];
    for (int i = 0; i < n; i++) a[i] = (gemm_args){.M = M, .x = x, .w = w[i], .y = y[i], .accumulate = 0, .dt = s->act};
    return g->run_multi(n, a, s->stream, e);
}

int ops_moe_run(const ops_sel *s, const moe_args *a, ls_err *e) {
    const moe_w *w = a->w;
    moe_shape sh = {.M = a->M, .H = w->hidden, .E = w->n_experts, .top_k = w->top_k, .I = w->inter,
                    .Is = w->shared_inter, .wk = w->gate[0].kind, .dt = a->dt,
                    .sk = w->shared_inter > 0 ? w->sh_gate.kind : w->gate[0].kind};
    const moe_impl *g = capture_alt(s, F_MOE, for_shape(s, F_MOE, ops_sel_for_m(s, F_MOE, a->M), sup_moe, &sh, e), sup_moe, safe_moe, &sh);
    if (g && refuse_uncapturable(s, F_MOE, g->name, g->graph_safe, e)) return e->code;
    return g ? g->run(a, s->stream, e) : e->code;
}

int ops_attn_run(const ops_sel *s, const attn_args *a, int max_ctx, ls_err *e) {
    attn_shape sh = {.n_tok = a->n_tok, .n_seq = a->n_seq, .max_ctx = max_ctx, .n_heads = a->n_heads,
                     .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim, .gated = a->gate != NULL,
                     .dt = a->dt};
    const attn_impl *g = capture_alt(s, F_ATTN, for_shape(s, F_ATTN, ops_sel_for_m(s, F_ATTN, a->n_tok), sup_attn, &sh, e), sup_attn,
                                     safe_attn, &sh);
    if (g && refuse_uncapturable(s, F_ATTN, g->name, g->graph_safe, e)) return e->code;
    return g ? g->run(a, s->stream, e) : e->code;
}

int ops_gdn_run(const ops_sel *s, const gdn_args *a, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh = {.n_tok = a->n_tok, .n_seq = a->n_seq, .nk = w->nk, .nv = w->nv, .dk = w->dk,
                    .dv = w->dv, .conv_k = w->conv_k, .dt = a->dt, .state_bf16 = a->st && a->st->rec16};
    const gdn_impl *g = capture_alt(s, F_GDN, for_shape(s, F_GDN, ops_sel_for_m(s, F_GDN, a->n_tok), sup_gdn, &sh, e), sup_gdn, safe_gdn, &sh);
    if (g && refuse_uncapturable(s, F_GDN, g->name, g->graph_safe, e)) return e->code;
    return g ? g->run(a, s->stream, e) : e->code;
}

/* ---- device memory ------------------------------------------------------- */

static int cpu_open(int ordinal, dev_info *d, ls_stream *s, ls_err *e) {
    ops_cpu_dev(d);
    *s = NULL;
    return 0;
}
static void cpu_close_stream(ls_stream s) {}
static void *cpu_alloc(size_t n, ls_err *e) {
    void *p = malloc(n ? n : 1);
    if (!p) errf(e, ERR_NOMEM, "cannot allocate %zu bytes", n);
    return p;
}
static void cpu_free(void *p) { free(p); }
static int cpu_copy(void *dst, const void *src, size_t n, ls_stream s, ls_err *e) {
    if (n) memmove(dst, src, n);
    return 0;
}
static int cpu_memset0(void *dst, size_t n, ls_stream s, ls_err *e) {
    if (n) memset(dst, 0, n);
    return 0;
}
static int cpu_sync(ls_stream s, ls_err *e) { return 0; }
static int cpu_bind_thread(int ordinal, ls_err *e) { return 0; }
static int cpu_count(void) { return 1; }

const dev_mem dev_mem_cpu = {DEV_CPU,  cpu_open,    cpu_close_stream, cpu_alloc,       cpu_free, cpu_copy,
                             cpu_copy, cpu_memset0, cpu_sync,         cpu_bind_thread, cpu_count,
                             cpu_copy};

static const dev_mem *g_dev_mem_cuda;

void ops_dev_mem_register(const dev_mem *m) {
    if (m->dev == DEV_CUDA) g_dev_mem_cuda = m;
}

const dev_mem *ops_dev_mem(dev_kind k) {
    reg(F_SMALL); /* the CUDA hook registers its table during the registry init */
    return k == DEV_CPU ? &dev_mem_cpu : g_dev_mem_cuda;
}
