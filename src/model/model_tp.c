/* model_tp.c: tensor parallelism on the CPU device (DESIGN.md sections 5 and
 * 10): N ranks, each a `model` holding its slice of every layer, run as N
 * threads over the same batch, with a shared-memory all-reduce (sum in rank
 * order, so every rank holds bit-identical activations) after the attention
 * or GDN output projection and after the MLP / MoE.
 *
 * Slicing (rank r of N; model_open binds the checkpoint a layer at a time and hands each
 * bound layer to tp_take_layer, which slices it into every rank; the coordinator's copy of the
 * layer is dropped before the next one is bound, so host memory holds one layer beyond what the
 * ranks keep. A CPU rank takes owned copies of its rows / columns and of the replicated
 * weights; a CUDA rank uploads its slice to its GPU at once, contiguous row ranges and
 * replicated weights straight from the coordinator's (views, no host copy), column slices
 * through a host copy freed after the upload):
 *   attention  query heads [r·nh/N, ...): q (and gate) rows, o_proj columns;
 *              KV heads split the same way when N divides nkv, else (N a
 *              multiple of nkv) each rank keeps the one KV head its query heads
 *              read (replicated KV); q_norm / k_norm per head dim, shared
 *   GDN        key heads and value heads split: the q, k, v rows of in_proj_qkv
 *              and of conv1d, z/b/a rows, A_log / dt_bias entries, out_proj columns
 *   MLP / MoE  intermediate dims split: gate/up rows and down columns of every
 *              expert, the shared expert and the dense MLP; router and shared
 *              gate replicated (every rank routes identically)
 *   embedding, norms, lm_head replicated; rank 0 alone computes the logits.
 * NVFP4 columns go in whole 16-element scale blocks: a slice width that is not
 * a multiple of 16 is refused (ERR_INVAL naming the tensor and --tp).
 *
 * Each rank's config copy carries its local head counts and intermediate
 * sizes, so the layer code, the workspace and the caches need no TP case.
 *
 * Devices: on the CPU the ranks are threads and the all-reduce sums through
 * shared memory. On CUDA rank r owns GPU r (its slice uploaded there, its
 * caches and workspace there), runs on its own thread bound to that GPU, and
 * the all-reduce is NCCL's (BF16 sum, in place, on the rank's stream), with
 * NCCL loaded by dlopen("libnccl.so.2") so the binary has no link-time
 * dependency on it; communicators from ncclCommInitAll (one process, N GPUs).
 * NVLink multicast (NVLS) is turned off (NCCL_NVLS_ENABLE=0) unless the
 * environment says otherwise.
 *
 * Threads: ranks 1..N-1 each have a worker thread for the model's life
 * (started by tp_build, stopped by tp_free); a step (tp_forward) or a job on
 * every rank (tp_each) is handed to them, rank 0 runs on the caller's thread,
 * and the call returns when all ranks are done. One job at a time.
 *
 * CUDA graphs under TP (model.c captures them): every rank captures its own
 * decode step, NCCL all-reduces included (NCCL >= 2.9 records them into the
 * graph; ncclGetVersion is asked at run time), with all ranks capturing
 * concurrently on their threads so the collectives are recorded in the same
 * order everywhere. Every decision on the capture path (warm-up, rehearsal,
 * capture) is agreed across the ranks through tp_all, so all ranks replay a
 * bucket or all run it eagerly; an all-reduce that fails while capturing is
 * the capture's failure (tp_cap_rc), not the group's sticky error.
 */
#include "model/model_impl.h"

#ifdef LS_HAVE_CUDA
#include "ops/cuda/tp_p2p.h"
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The slice of nccl.h used here (ABI-stable since NCCL 2.0; bfloat16 since 2.10). */
typedef void *nccl_comm;
enum { NCCL_OK = 0, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };
static struct {
    void *h;
    int (*init_all)(nccl_comm *comms, int ndev, const int *devlist);
    int (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op, nccl_comm comm,
                      void *stream);
    int (*destroy)(nccl_comm comm);
    const char *(*err_string)(int rc);
    int (*get_version)(int *version); /* optional: NULL when the library lacks it */
} g_nccl;
static pthread_mutex_t g_nccl_mu = PTHREAD_MUTEX_INITIALIZER;

static int nccl_load(ls_err *e) {
    pthread_mutex_lock(&g_nccl_mu);
    int rc = 0;
    if (!g_nccl.h) {
        void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            rc = errf(e, ERR_UNSUPPORTED, "tensor parallelism on CUDA needs NCCL: dlopen(libnccl.so.2): %s "
                      "(put NCCL's lib folder on LD_LIBRARY_PATH)", dlerror());
        } else {
            *(void **)&g_nccl.init_all = dlsym(h, "ncclCommInitAll");
            *(void **)&g_nccl.all_reduce = dlsym(h, "ncclAllReduce");
            *(void **)&g_nccl.destroy = dlsym(h, "ncclCommDestroy");
            *(void **)&g_nccl.err_string = dlsym(h, "ncclGetErrorString");
            *(void **)&g_nccl.get_version = dlsym(h, "ncclGetVersion");
            if (!g_nccl.init_all || !g_nccl.all_reduce || !g_nccl.destroy || !g_nccl.err_string) {
                rc = errf(e, ERR_UNSUPPORTED, "libnccl.so.2 lacks ncclCommInitAll/ncclAllReduce/"
                          "ncclCommDestroy/ncclGetErrorString");
                dlclose(h);
            } else {
                g_nccl.h = h;
            }
        }
    }
    pthread_mutex_unlock(&g_nccl_mu);
    return rc;
}

/* A rank's loading state: host staging for the column slices of its layer, reused layer after
 * layer (each slice is uploaded before the next is cut), and the row copies that fill them, run in
 * parallel (copies_run). */
typedef struct rank_load {
    char **stage;
    size_t *stage_cap;
    int n_stage, stage_cur;
    size_t stage_used;
    struct row_copy { char *dst; const char *src; int rows; size_t nb, stride; } *copies;
    int n_copies, cap_copies;
    double t_slice, t_upload; /* seconds spent slicing and uploading, over the load */
} rank_load;

struct tp_group {
    int n;
    pthread_barrier_t bar;
    const float *part[TP_MAX];
    nccl_comm comm[TP_MAX]; /* CUDA */
    int has_comm;
    int nccl_version;       /* ncclGetVersion's code (e.g. 22105 for 2.21.5), 0 when unknown */
    volatile int nccl_rc;   /* the last failed all-reduce's NCCL code */
    void *p2p;              /* lsc_p2p (LASTSTAND_TP_P2P=1): the small all-reduces through peer memory */
    size_t p2p_max;         /* its largest all-reduce (elements); larger ones go to NCCL */
    volatile int p2p_rc;    /* a failed peer all-reduce launch (ERR_*) */
    int vote[TP_MAX];       /* tp_all's ballots */
    /* the ranks' worker threads (ranks 1..n-1; rank 0 runs on the caller's thread), one job at
     * a time: tp_run posts fn/arg under wmu and bumps job_gen, each worker runs it once on its
     * rank and counts itself done */
    model **ranks;
    pthread_t th[TP_MAX];
    int n_started;          /* workers running (1..n_started) */
    pthread_mutex_t run_mu; /* one tp_run at a time */
    pthread_mutex_t wmu;
    pthread_cond_t wcv, dcv;
    unsigned job_gen;
    int n_done, quit;
    int (*job)(model *rm, void *arg, int r, ls_err *e);
    void *job_arg;
    int rc[TP_MAX];
    ls_err err[TP_MAX];
    rank_load ld[TP_MAX];   /* while loading: each rank's (tp_take_layer slices the ranks at once) */
};

#define STAGE_CHUNK ((size_t)64 << 20)

/* n bytes of the rank's staging (256-byte aligned), valid until stage_reset. */
static void *stage_take(rank_load *g, size_t n) {
    n = align256(n ? n : 1);
    while (g->stage_cur < g->n_stage && g->stage_used + n > g->stage_cap[g->stage_cur]) {
        g->stage_cur++;
        g->stage_used = 0;
    }
    if (g->stage_cur == g->n_stage) {
        g->stage = xrealloc(g->stage, sizeof(*g->stage) * (g->n_stage + 1));
        g->stage_cap = xrealloc(g->stage_cap, sizeof(*g->stage_cap) * (g->n_stage + 1));
        g->stage_cap[g->n_stage] = n > STAGE_CHUNK ? n : STAGE_CHUNK;
        g->stage[g->n_stage] = xmalloc(g->stage_cap[g->n_stage]);
        g->n_stage++;
        g->stage_used = 0;
    }
    void *p = g->stage[g->stage_cur] + g->stage_used;
    g->stage_used += n;
    return p;
}

static void stage_reset(rank_load *g) {
    g->stage_cur = 0;
    g->stage_used = 0;
}

static void stage_free(rank_load *g) {
    for (int i = 0; i < g->n_stage; i++) free(g->stage[i]);
    free(g->stage);
    free(g->stage_cap);
    g->stage = NULL;
    g->stage_cap = NULL;
    g->n_stage = g->stage_cur = 0;
    g->stage_used = 0;
}

/* rows rows of nb bytes from src (stride bytes apart) to dst (packed), queued on g. */
static void copy_rows(rank_load *g, void *dst, const void *src, int rows, size_t nb, size_t stride) {
    if (g->n_copies == g->cap_copies) {
        g->cap_copies = g->cap_copies ? 2 * g->cap_copies : 1024;
        g->copies = xrealloc(g->copies, sizeof(*g->copies) * g->cap_copies);
    }
    g->copies[g->n_copies++] = (struct row_copy){dst, src, rows, nb, stride};
}

static void copies_range(void *ctx, int64_t i0, int64_t i1) {
    rank_load *g = ctx;
    for (int64_t i = i0; i < i1; i++) {
        const struct row_copy *c = &g->copies[i];
        for (int r = 0; r < c->rows; r++) memcpy(c->dst + (size_t)r * c->nb, c->src + (size_t)r * c->stride, c->nb);
    }
}

/* Every queued row copy, spread over the thread pool. */
static void copies_run(rank_load *g) {
    pool_for(g->n_copies, 1, copies_range, g);
    g->n_copies = 0;
}

static void load_free(rank_load *g) {
    stage_free(g);
    free(g->copies);
    g->copies = NULL;
    g->n_copies = g->cap_copies = 0;
}

void tp_load_done(model *m) {
    if (!m->grp || m->is_rank) return;
    double ts = 0, tu = 0;
    for (int r = 0; r < m->grp->n; r++) {
        if (m->grp->ld[r].t_slice > ts) ts = m->grp->ld[r].t_slice;
        if (m->grp->ld[r].t_upload > tu) tu = m->grp->ld[r].t_upload;
        load_free(&m->grp->ld[r]);
    }
    if (ts + tu > 1)
        log_info("%s: the ranks' layers: slicing %.1f s, uploading %.1f s (the slowest rank; %d ranks at once)", m->path,
                 ts, tu, m->tp);
}

int tp_status(model *m, ls_err *e) {
    if (m->grp->p2p_rc)
        return errf(e, ERR_RUNTIME, "rank %d: the peer all-reduce (LASTSTAND_TP_P2P=1) failed to launch", m->rank);
    int rc = m->ops.capturing == 1 && m->tp_cap_rc ? m->tp_cap_rc : m->grp->nccl_rc;
    if (!rc) return 0;
    return errf(e, ERR_RUNTIME, "rank %d: ncclAllReduce%s: %s", m->rank,
                m->ops.capturing == 1 && m->tp_cap_rc ? " (while capturing a CUDA graph)" : "",
                g_nccl.err_string(rc));
}

/* NCCL's version code as major.minor.patch (codes before 2.9 were X·1000 + Y·100 + Z). */
static void nccl_version_str(int v, char *s, size_t n) {
    if (v >= 10000) snprintf(s, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(s, n, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

int tp_graphs_supported(const model *m, char *why, size_t n) {
    const tp_group *g = m->grp;
    if (!g || !g->has_comm) {
        snprintf(why, n, "the ranks have no NCCL communicators");
        return 0;
    }
    const char *env = getenv("LASTSTAND_TP_GRAPHS");
    if (env && !strcmp(env, "0")) {
        snprintf(why, n, "turned off by LASTSTAND_TP_GRAPHS=0");
        return 0;
    }
    if (!g->nccl_version) {
        snprintf(why, n, "libnccl.so.2 does not report its version (ncclGetVersion); capturing "
                 "all-reduces needs NCCL >= 2.9");
        return 0;
    }
    if (g->nccl_version < 20900) {
        char v[32];
        nccl_version_str(g->nccl_version, v, sizeof v);
        snprintf(why, n, "NCCL %s cannot capture all-reduces into a CUDA graph (needs >= 2.9)", v);
        return 0;
    }
    return 1;
}

int tp_all(model *m, int ok) {
    tp_group *g = m->grp;
    if (!g || g->n < 2) return ok != 0;
    g->vote[m->rank] = ok != 0;
    pthread_barrier_wait(&g->bar);
    int all = 1;
    for (int r = 0; r < g->n; r++) all &= g->vote[r];
    pthread_barrier_wait(&g->bar); /* every rank has counted before the next vote overwrites */
    return all;
}

/* ---- all-reduce ----------------------------------------------------------- */

void tp_allreduce(model *m, void *x, size_t n) {
    tp_group *g = m->grp;
#ifdef LS_HAVE_CUDA
    if (g->p2p && n <= g->p2p_max && m->ops.act == ACT_BF16) { /* the same choice on every rank (same n) */
        ls_err pe = {0};
        if (lsc_p2p_allreduce(g->p2p, m->rank, x, n, m->ops.stream, &pe)) {
            if (!g->p2p_rc) log_error("rank %d: %s", m->rank, pe.msg);
            g->p2p_rc = ERR_RUNTIME;
        }
        return;
    }
#endif
    if (g->has_comm) {
        int rc = g_nccl.all_reduce(x, x, n, m->ops.act == ACT_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT32, NCCL_SUM,
                                   g->comm[m->rank], m->ops.stream);
        /* reported by tp_status at the end of the step; under capture, the capture's own failure */
        if (rc != NCCL_OK) {
            if (m->ops.capturing == 1) m->tp_cap_rc = rc;
            else g->nccl_rc = rc;
        }
        return;
    }
    float *tmp = m->ws.red;
    g->part[m->rank] = x;
    pthread_barrier_wait(&g->bar);
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int r = 0; r < g->n; r++) s += g->part[r][i];
        tmp[i] = s;
    }
    pthread_barrier_wait(&g->bar); /* every rank has read every part */
    memcpy(x, tmp, n * sizeof(float));
}

/* ---- slicing -------------------------------------------------------------- */

/* 1 when rank m's slices may be views into the coordinator's weights: a device rank uploads
 * them (tp_take_layer) before the coordinator's layer goes; a CPU rank keeps owned copies. */
static int views_ok(const model *m) { return mdl_uploads(m); }

/* out = columns [c0, c0 + nc) of w: an owned copy (CPU), or a copy in the group's staging
 * (device ranks: uploaded before the staging is reused). The rows are copied later, with the
 * rest of the layer's, by copies_run (tp_take_layer), in parallel. */
static int take_cols(model *m, const lin_w *w, int c0, int nc, lin_w *out, ls_err *e) {
    size_t es = w->kind == W_F32 ? 4 : 2;
    *out = *w;
    out->K = nc;
    if (w->kind == W_NVFP4) {
        if (c0 % 16 || nc % 16)
            return errf(e, ERR_INVAL, "tensor '%s': an NVFP4 column slice [%d, %d) is not in whole "
                        "16-element blocks; choose a --tp that splits it so", w->name ? w->name : "?",
                        c0, c0 + nc);
        const size_t db = (size_t)w->N * nc / 2, sb = (size_t)w->N * nc / 16;
        uint8_t *d = views_ok(m) ? stage_take(&m->grp->ld[m->rank], db) : mdl_alloc(m, db);
        uint8_t *s = views_ok(m) ? stage_take(&m->grp->ld[m->rank], sb) : mdl_alloc(m, sb);
        copy_rows(&m->grp->ld[m->rank], d, (const uint8_t *)w->data + c0 / 2, w->N, nc / 2, (size_t)w->K / 2);
        copy_rows(&m->grp->ld[m->rank], s, w->scale + c0 / 16, w->N, nc / 16, (size_t)w->K / 16);
        out->data = d;
        out->scale = s;
        return 0;
    }
    if (w->kind == W_FP8 && views_ok(m) && w->fs_cols > 1 && (w->fs_c0 + c0) % 64) {
        /* on a GPU, scale blocks that do not start on a 64-column group (the small-M kernel's
         * step): the slice runs in BF16 (fp8 · scale in fp32, rounded once, as mdl_fp8_to_bf16) */
        const float *lut = ops_fp8_e4m3_table();
        uint16_t *d = mdl_alloc(m, sizeof(uint16_t) * (size_t)w->N * nc);
        for (int n = 0; n < w->N; n++)
            for (int k = 0; k < nc; k++)
                d[(size_t)n * nc + k] =
                    f32_to_bf16(lut[((const uint8_t *)w->data)[(size_t)n * w->K + c0 + k]] * lin_fp8_scale(w, n, c0 + k));
        *out = (lin_w){.kind = W_BF16, .N = w->N, .K = nc, .data = d, .name = w->name};
        return 0;
    }
    if (w->kind == W_FP8) {
        /* the codes' columns; the scales stay the whole tensor's, found through fs_c0 (a CPU
         * rank owns a copy) */
        const size_t db = (size_t)w->N * nc;
        uint8_t *d = views_ok(m) ? stage_take(&m->grp->ld[m->rank], db) : mdl_alloc(m, db);
        copy_rows(&m->grp->ld[m->rank], d, (const uint8_t *)w->data + c0, w->N, (size_t)nc, (size_t)w->K);
        out->data = d;
        out->fs_c0 = w->fs_c0 + c0;
        if (!views_ok(m)) {
            float *fs = mdl_alloc(m, sizeof(float) * w->fs_n);
            memcpy(fs, w->fscale, sizeof(float) * w->fs_n);
            out->fscale = fs;
        }
        return 0;
    }
    const size_t db = (size_t)w->N * nc * es;
    char *d = views_ok(m) ? stage_take(&m->grp->ld[m->rank], db) : mdl_alloc(m, db);
    copy_rows(&m->grp->ld[m->rank], d, (const char *)w->data + (size_t)c0 * es, w->N, nc * es, (size_t)w->K * es);
    out->data = d;
    return 0;
}

/* out = rows [r0, r0 + n) of w: a view (views_ok: contiguous rows need no copy) or an owned copy. */
static void take_range(model *m, const lin_w *w, int r0, int n, lin_w *out) {
    if (views_ok(m) && w->kind != W_F32) {
        const size_t rb = w->kind == W_NVFP4 ? (size_t)w->K / 2 : w->kind == W_FP8 ? (size_t)w->K : (size_t)w->K * 2;
        *out = *w;
        out->N = n;
        out->data = (const char *)w->data + rb * r0;
        if (w->kind == W_NVFP4) out->scale = w->scale + (size_t)w->K / 16 * r0;
        if (w->kind == W_FP8) out->fs_r0 = w->fs_r0 + r0; /* the scales are shared, as the rows */
        return;
    }
    int *rows = xmalloc(sizeof(int) * (n ? n : 1));
    for (int i = 0; i < n; i++) rows[i] = r0 + i;
    mdl_take_rows(m, w, rows, n, out);
    free(rows);
}

/* A weight every rank holds whole (norms, router, shared-expert gate): the coordinator's as is
 * on a device rank (uploaded before the coordinator's copy goes), an owned copy on the CPU. */
static float *keep_vec(model *m, const float *v, size_t n) {
    if (!v || views_ok(m)) return (float *)v;
    float *d = mdl_alloc(m, sizeof(float) * n);
    memcpy(d, v, sizeof(float) * n);
    return d;
}

static void keep_lin(model *m, const lin_w *w, lin_w *out) {
    if (!w->data) {
        *out = *w;
        return;
    }
    take_range(m, w, 0, w->N, out);
}

static int slice_attn(model *rm, const model *m, int r, int N, const attn_layer_w *a, attn_layer_w *o,
                      ls_err *e) {
    const model_config *c = &m->cfg;
    const int hd = c->head_dim, nh = c->n_heads / N, nkv = rm->cfg.n_kv_heads;
    const int kv0 = c->n_kv_heads % N == 0 ? r * nkv : (r * nh) / (c->n_heads / c->n_kv_heads);
    *o = *a;
    take_range(rm, &a->q, r * nh * hd, nh * hd, &o->q);
    if (a->gate.data) take_range(rm, &a->gate, r * nh * hd, nh * hd, &o->gate);
    take_range(rm, &a->k, kv0 * hd, nkv * hd, &o->k);
    take_range(rm, &a->v, kv0 * hd, nkv * hd, &o->v);
    o->q_norm = keep_vec(rm, a->q_norm, hd);
    o->k_norm = keep_vec(rm, a->k_norm, hd);
    return take_cols(rm, &a->o, r * nh * hd, nh * hd, &o->o, e);
}

static int slice_gdn(model *rm, const model *m, int r, int N, const gdn_layer_w *g, gdn_layer_w *o,
                     ls_err *e) {
    const model_config *c = &m->cfg;
    const int dk = c->lin_k_dim, dv = c->lin_v_dim, K = c->lin_conv;
    const int key = c->lin_k_heads * dk, nk = c->lin_k_heads / N, nv = c->lin_v_heads / N;
    const int cd = 2 * nk * dk + nv * dv;
    *o = *g;
    int *rows = xmalloc(sizeof(int) * cd);
    for (int i = 0; i < nk * dk; i++) {
        rows[i] = r * nk * dk + i;                    /* q of the rank's key heads */
        rows[nk * dk + i] = key + r * nk * dk + i;    /* k */
    }
    for (int i = 0; i < nv * dv; i++) rows[2 * nk * dk + i] = 2 * key + r * nv * dv + i; /* v */
    mdl_take_rows(rm, &g->qkv, rows, cd, &o->qkv);
    float *cw = mdl_alloc(rm, sizeof(float) * cd * K);
    for (int i = 0; i < cd; i++) memcpy(cw + (size_t)i * K, g->g.conv_w + (size_t)rows[i] * K, sizeof(float) * K);
    free(rows);
    take_range(rm, &g->z, r * nv * dv, nv * dv, &o->z);
    take_range(rm, &g->b, r * nv, nv, &o->b);
    take_range(rm, &g->a, r * nv, nv, &o->a);
    o->g.nk = nk;
    o->g.nv = nv;
    o->g.conv_w = cw;
    o->g.A_log = keep_vec(rm, g->g.A_log + r * nv, nv);
    o->g.dt_bias = keep_vec(rm, g->g.dt_bias + r * nv, nv);
    o->norm = keep_vec(rm, g->norm, dv);
    return take_cols(rm, &g->out, r * nv * dv, nv * dv, &o->out, e);
}

/* gate/up rows and down columns [r·I/N, ...) of one gated MLP. */
static int slice_mlp3(model *rm, int r, int N, const lin_w *gate, const lin_w *up, const lin_w *down,
                      lin_w *og, lin_w *ou, lin_w *od, ls_err *e) {
    const int I = gate->N / N;
    take_range(rm, gate, r * I, I, og);
    take_range(rm, up, r * I, I, ou);
    return take_cols(rm, down, r * I, I, od, e);
}

static int slice_layer(model *rm, const model *m, int r, int N, int l, ls_err *e) {
    const layer_w *L = &m->layers[l];
    layer_w *O = &rm->layers[l];
    int rc;
    *O = *L;
    O->in_norm = keep_vec(rm, L->in_norm, m->cfg.hidden);
    O->post_norm = keep_vec(rm, L->post_norm, m->cfg.hidden);
    if (L->mtp) { /* the MTP head's fc and norms: whole on every rank (its input is replicated) */
        const int H = m->cfg.hidden;
        O->mtp = mdl_alloc(rm, sizeof *O->mtp);
        keep_lin(rm, &L->mtp->fc_e, &O->mtp->fc_e);
        keep_lin(rm, &L->mtp->fc_h, &O->mtp->fc_h);
        O->mtp->pre_e = keep_vec(rm, L->mtp->pre_e, H);
        O->mtp->pre_h = keep_vec(rm, L->mtp->pre_h, H);
        O->mtp->norm = keep_vec(rm, L->mtp->norm, H);
    }
    if (L->type == LAYER_FULL_ATTN) rc = slice_attn(rm, m, r, N, &L->attn, &O->attn, e);
    else rc = slice_gdn(rm, m, r, N, &L->gdn, &O->gdn, e);
    if (rc) return rc;
    if (L->dense)
        return slice_mlp3(rm, r, N, &L->mlp.gate, &L->mlp.up, &L->mlp.down, &O->mlp.gate, &O->mlp.up,
                          &O->mlp.down, e);
    const moe_w *w = &L->moe;
    const int E = w->n_experts;
    O->experts = mdl_alloc(rm, sizeof(lin_w) * 3 * E);
    for (int x = 0; x < E; x++)
        if ((rc = slice_mlp3(rm, r, N, &w->gate[x], &w->up[x], &w->down[x], &O->experts[x],
                             &O->experts[E + x], &O->experts[2 * E + x], e)))
            return rc;
    O->moe.gate = O->experts;
    O->moe.up = O->experts + E;
    O->moe.down = O->experts + 2 * E;
    O->moe.inter = w->inter / N;
    keep_lin(rm, &w->router, &O->moe.router);
    keep_lin(rm, &w->sh_gate_w, &O->moe.sh_gate_w);
    if (w->shared_inter > 0) {
        O->moe.shared_inter = w->shared_inter / N;
        if ((rc = slice_mlp3(rm, r, N, &w->sh_gate, &w->sh_up, &w->sh_down, &O->moe.sh_gate,
                             &O->moe.sh_up, &O->moe.sh_down, e)))
            return rc;
    }
    return 0;
}

static int check_split(const model_config *c, int N, ls_err *e) {
    struct { const char *what; int n; } need[] = {
        {"num_attention_heads", c->n_heads}, {"intermediate_size", c->intermediate},
        {"moe_intermediate_size", c->moe_inter}, {"shared_expert_intermediate_size", c->shared_inter},
        {"linear_num_key_heads", c->lin_k_heads}, {"linear_num_value_heads", c->lin_v_heads}};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].n > 0 && need[i].n % N)
            return errf(e, ERR_INVAL, "--tp %d: %s = %d does not split into %d equal parts", N,
                        need[i].what, need[i].n, N);
    if (c->n_kv_heads % N && N % c->n_kv_heads)
        return errf(e, ERR_INVAL, "--tp %d: num_key_value_heads = %d neither splits over nor "
                    "divides the ranks", N, c->n_kv_heads);
    return 0;
}

/* CUDA: N GPUs, NCCL loaded, one communicator per rank. */
static int tp_cuda_init(model *m, tp_group *g, int N, ls_err *e) {
    int have = m->mem->count();
    if (have < N) return errf(e, ERR_UNSUPPORTED, "--tp %d: only %d CUDA device%s", N, have, have == 1 ? "" : "s");
    int rc = nccl_load(e);
    if (rc) return rc;
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int devs[TP_MAX];
    for (int r = 0; r < N; r++) devs[r] = r;
    if ((rc = g_nccl.init_all(g->comm, N, devs)) != NCCL_OK)
        return errf(e, ERR_RUNTIME, "ncclCommInitAll over %d GPUs: %s", N, g_nccl.err_string(rc));
    g->has_comm = 1;
    if (g_nccl.get_version && g_nccl.get_version(&g->nccl_version) != NCCL_OK) g->nccl_version = 0;
    char v[32] = "unknown";
    if (g->nccl_version) nccl_version_str(g->nccl_version, v, sizeof v);
    log_info("%s: tensor parallel over %d GPUs, NCCL %s (NCCL_NVLS_ENABLE=%s)", m->path, N, v,
             getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "");
#ifdef LS_HAVE_CUDA
    const char *pe = getenv("LASTSTAND_TP_P2P");
    if (pe && !strcmp(pe, "1") && m->ops.act == ACT_BF16) { /* opt-in: the small all-reduces through peer memory */
        ls_err e2 = {0};
        lsc_p2p *p = NULL;
        if (lsc_p2p_open(N, devs, (size_t)1 << 19, &p, &e2)) {
            log_warn("%s: LASTSTAND_TP_P2P=1: %s; every all-reduce goes through NCCL", m->path, e2.msg);
        } else {
            g->p2p = p;
            g->p2p_max = lsc_p2p_max_elems(p);
            log_info("%s: all-reduces of up to %zu BF16 elements (%zu KiB) through peer memory (LASTSTAND_TP_P2P=1), "
                     "larger ones through NCCL", m->path, g->p2p_max, g->p2p_max * 2 / 1024);
        }
    }
#endif
    return 0;
}

/* ---- the ranks' worker threads ---------------------------------------------- */

/* Rank r's part of the posted job, on the calling thread (bound to the rank's device first; a
 * rank whose device cannot be bound still runs the job, so the collectives inside stay matched). */
static void run_rank(tp_group *g, int r, int (*fn)(model *, void *, int, ls_err *), void *arg) {
    model *rm = g->ranks[r];
    g->err[r] = (ls_err){0};
    int rc = rm->mem->bind_thread(rm->ops.dev.ordinal, &g->err[r]);
    int frc = fn(rm, arg, r, &g->err[r]);
    g->rc[r] = rc ? rc : frc;
}

static void *worker_main(void *p) {
    tp_group *g = ((void **)p)[0];
    const int r = (int)(intptr_t)((void **)p)[1];
    free(p);
    unsigned seen = 0;
    pthread_mutex_lock(&g->wmu);
    for (;;) {
        while (g->job_gen == seen && !g->quit) pthread_cond_wait(&g->wcv, &g->wmu);
        if (g->quit) break;
        seen = g->job_gen;
        int (*fn)(model *, void *, int, ls_err *) = g->job;
        void *arg = g->job_arg;
        pthread_mutex_unlock(&g->wmu);
        run_rank(g, r, fn, arg);
        pthread_mutex_lock(&g->wmu);
        if (++g->n_done == g->n - 1) pthread_cond_signal(&g->dcv);
    }
    pthread_mutex_unlock(&g->wmu);
    return NULL;
}

static int workers_start(tp_group *g, ls_err *e) {
    for (int r = 1; r < g->n; r++) {
        void **p = xmalloc(2 * sizeof(void *));
        p[0] = g;
        p[1] = (void *)(intptr_t)r;
        int rc = pthread_create(&g->th[r], NULL, worker_main, p);
        if (rc) {
            free(p);
            return errf(e, ERR_RUNTIME, "--tp %d: cannot start the thread of rank %d: %s", g->n, r, strerror(rc));
        }
        g->n_started = r;
    }
    return 0;
}

static void workers_stop(tp_group *g) {
    pthread_mutex_lock(&g->wmu);
    g->quit = 1;
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
    for (int r = 1; r <= g->n_started; r++) pthread_join(g->th[r], NULL);
    g->n_started = 0;
}

/* fn on every rank at once: ranks 1.. on their workers, rank 0 on this thread; returns when all
 * are done, with the lowest failing rank's status (and its error in e, "rank R: " first when
 * name_rank). */
static int tp_run(model *m, int (*fn)(model *rm, void *arg, int r, ls_err *e), void *arg, int name_rank,
                  ls_err *e) {
    tp_group *g = m->grp;
    const int N = g->n;
    pthread_mutex_lock(&g->run_mu);
    pthread_mutex_lock(&g->wmu);
    g->job = fn;
    g->job_arg = arg;
    g->n_done = 0;
    g->job_gen++;
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
    run_rank(g, 0, fn, arg);
    pthread_mutex_lock(&g->wmu);
    while (g->n_done < N - 1) pthread_cond_wait(&g->dcv, &g->wmu);
    pthread_mutex_unlock(&g->wmu);
    int rc = 0;
    for (int r = 0; r < N && !rc; r++)
        if (g->rc[r]) {
            rc = g->rc[r];
            if (e) {
                *e = g->err[r];
                if (name_rank) err_prefix(e, "rank %d", r);
            }
        }
    pthread_mutex_unlock(&g->run_mu);
    return rc;
}

int tp_build(model *m, int N, ls_err *e) {
    const model_config *c = &m->cfg;
    if (N > TP_MAX) return errf(e, ERR_INVAL, "--tp %d: at most %d ranks", N, TP_MAX);
    int rc = check_split(c, N, e);
    if (rc) return rc;
    const int cuda = m->ops.dev.kind != DEV_CPU;
    tp_group *g = xcalloc(1, sizeof *g);
    g->n = N;
    pthread_barrier_init(&g->bar, NULL, N);
    pthread_mutex_init(&g->run_mu, NULL);
    pthread_mutex_init(&g->wmu, NULL);
    pthread_cond_init(&g->wcv, NULL);
    pthread_cond_init(&g->dcv, NULL);
    m->grp = g;
    m->tp = N;
    if (cuda && (rc = tp_cuda_init(m, g, N, e))) return rc;
    m->rank_m = xcalloc(N, sizeof(model *));
    for (int r = 0; r < N; r++) {
        model *rm = xcalloc(1, sizeof *rm);
        m->rank_m[r] = rm;
        rm->cfg = *c; /* shallow: the coordinator owns the config's allocations */
        rm->cfg.n_heads = c->n_heads / N;
        rm->cfg.n_kv_heads = c->n_kv_heads % N == 0 ? c->n_kv_heads / N : 1;
        rm->cfg.intermediate = c->intermediate / N;
        rm->cfg.moe_inter = c->moe_inter / N;
        rm->cfg.shared_inter = c->shared_inter / N;
        rm->cfg.lin_k_heads = c->lin_k_heads / N;
        rm->cfg.lin_v_heads = c->lin_v_heads / N;
        rm->is_rank = 1;
        rm->rank = r;
        rm->tp = N;
        rm->grp = g;
        rm->path = xstrdup(m->path);
        rm->ops = m->ops;
        rm->mem = m->mem;
        rm->kv_dt = m->kv_dt;
        rm->norm_kind = m->norm_kind;
        memcpy(rm->prefix, m->prefix, sizeof rm->prefix);
        rm->embed = m->embed;
        rm->lm_head = m->lm_head;
        rm->lm_plan = m->lm_plan; /* rank 0 computes the logits with the lm_head's own plan */
        rm->lm_auto = m->lm_auto;
        memcpy(rm->lm_ban, m->lm_ban, sizeof rm->lm_ban);
        rm->n_lm_ban = m->n_lm_ban;
        rm->final_norm = m->final_norm;
        rm->n_full = m->n_full;
        rm->n_lin = m->n_lin;
        rm->n_mtp = m->n_mtp;
        rm->layers = mdl_alloc(rm, sizeof(layer_w) * (c->n_layers + m->n_mtp));
        if (cuda) { /* GPU r: its own device, stream and copy of the replicated weights */
            if ((rc = rm->mem->open(r, &rm->ops.dev, &rm->ops.stream, e)) ||
                (rc = mdl_check_fits(rm, m->plan_gpu_weights, N, e)) || (rc = mdl_upload_part(rm, -1, e)))
                return err_prefix(e, "rank %d (GPU %d)", r, r);
            rm->owns_stream = 1;
        } else if (mdl_uploads(rm) && (rc = mdl_upload_part(rm, -1, e))) { /* LASTSTAND_TEST_CPU_UPLOAD */
            return err_prefix(e, "rank %d", r);
        }
    }
    g->ranks = m->rank_m;
    if (cuda) m->mem->bind_thread(m->rank_m[0]->ops.dev.ordinal, NULL);
    return workers_start(g, e);
}

typedef struct take_job {
    const model *m; /* the coordinator, layer l bound */
    int l;
} take_job;

/* Rank r's slice of layer l, on its own thread (bound to its GPU): cut, copied, uploaded. */
static int take_rank(model *rm, void *arg, int r, ls_err *e) {
    const take_job *j = arg;
    rank_load *ld = &rm->grp->ld[r];
    double t0 = now_sec();
    stage_reset(ld);
    int rc = slice_layer(rm, j->m, r, rm->tp, j->l, e);
    if (rc) {
        ld->n_copies = 0; /* never run: the slices they fill are dropped with the model */
        return rc;
    }
    copies_run(ld);
    double t1 = now_sec();
    ld->t_slice += t1 - t0;
    if (mdl_uploads(rm) && (rc = mdl_upload_part(rm, j->l, e)))
        return err_prefix(e, "GPU %d", rm->ops.dev.ordinal);
    ld->t_upload += now_sec() - t1;
    return 0;
}

int tp_take_layer(model *m, int l, ls_err *e) {
    take_job j = {.m = m, .l = l};
    return tp_run(m, take_rank, &j, 1, e);
}

void tp_free(model *m) {
    if (!m->grp || m->is_rank) return;
    workers_stop(m->grp);
    for (int r = 0; m->rank_m && r < m->tp; r++) {
        if (!m->rank_m[r]) continue;
        m->rank_m[r]->mem->bind_thread(m->rank_m[r]->ops.dev.ordinal, NULL);
        model_close(m->rank_m[r]);
    }
    free(m->rank_m);
    m->rank_m = NULL;
    for (int r = 0; m->grp->has_comm && r < m->tp; r++) g_nccl.destroy(m->grp->comm[r]);
#ifdef LS_HAVE_CUDA
    lsc_p2p_close(m->grp->p2p);
#endif
    pthread_barrier_destroy(&m->grp->bar);
    pthread_mutex_destroy(&m->grp->run_mu);
    pthread_mutex_destroy(&m->grp->wmu);
    pthread_cond_destroy(&m->grp->wcv);
    pthread_cond_destroy(&m->grp->dcv);
    for (int r = 0; r < m->grp->n; r++) load_free(&m->grp->ld[r]);
    free(m->grp);
    m->grp = NULL;
}

/* ---- forward over the ranks ------------------------------------------------ */

typedef struct fwd_job {
    mcache *const *caches;
    const fwd_batch *b;
} fwd_job;

static int fwd_rank(model *rm, void *arg, int r, ls_err *e) {
    const fwd_job *j = arg;
    return mdl_forward_rank(rm, j->caches[r], j->b, e);
}

int tp_forward(model *m, mcache *const *caches, const fwd_batch *b, ls_err *e) {
    mdl_graphs_sync(m); /* every rank takes the same path through its graphs */
    fwd_job j = {.caches = caches, .b = b};
    return tp_run(m, fwd_rank, &j, 0, e);
}

/* ---- a function on every rank ------------------------------------------------ */

typedef struct each_job {
    int (*fn)(model *rm, void *arg, ls_err *e);
    void *arg;
} each_job;

static int each_rank(model *rm, void *arg, int r, ls_err *e) {
    (void)r;
    const each_job *j = arg;
    return j->fn(rm, j->arg, e);
}

int tp_each(model *m, int (*fn)(model *rm, void *arg, ls_err *e), void *arg, ls_err *e) {
    each_job j = {.fn = fn, .arg = arg};
    return tp_run(m, each_rank, &j, 1, e);
}
