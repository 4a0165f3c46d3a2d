/* model_qwen3_next.c: the Gated DeltaNet layers of Qwen3-Next and Qwen3.5
 * (reference sections 2.4 and 2.7). Their gated full-attention and MoE parts
 * live in model_qwen3.c.
 *
 *   qkv, z, b, a = projections of x
 *     Qwen3.5:    in_proj_qkv [q | k | v] contiguous, in_proj_z, in_proj_b, in_proj_a
 *     Qwen3-Next: in_proj_qkvz grouped per key head g: [q_g | k_g | v_g (r·dv) | z_g (r·dv)],
 *                 in_proj_ba per key head: [b_g (r) | a_g (r)], r = nv / nk
 *   core = gdn(conv1d + SiLU, l2norm, g/β, delta rule)     (the gdn op family)
 *   y    = (w · rmsnorm(core_j)) · silu(z_j) per value head j  (inside gdn where the backend fuses it)
 *   out  = y·W_outᵀ
 *
 * In-step snapshots (fwd_seq.n_snap, the prefix cache's): when a sequence asks
 * for the GDN state after its first k new tokens, the gdn op runs in pieces
 * (next_snap_tables): piece 0 = every sequence, those with snapshots cut at
 * their first offset; after it, that layer's conv + recurrent state of each
 * such slot is copied (device to device, on the model's stream) into the
 * snapshot slot; piece 1 continues those sequences to their second offset (or
 * their end), and so on. A piece's op sees the span of the step's rows its
 * sequences occupy (the operand pointers offset to its first row, row0 counted
 * from there), so its outputs land in place, the op's per-M plan picks the
 * backend a step of that size would get, and the projections, the gated norm
 * and out_proj still run once over the whole step. The pieces are exactly what
 * separate steps ending at the offsets would run through the gdn op, so every
 * backend serves them unchanged; the gated norm is never fused into a piece (it
 * runs once after).
 *
 * Decode rows apart: a step with both decode rows (one new token) and longer
 * chunks runs each piece as two calls, the decode rows' and the chunks', each
 * with the backend its own M gets (LASTSTAND_GDN_SPLIT=0: one call). A server
 * at concurrency N mixes one prompt's chunk with N - 1 decode rows in most
 * prefill steps; in one call the chunk makes it a chunked kernel's, which runs
 * the decode rows at a third of the recurrent kernel's speed (bench/RESULTS.md
 * S17). The rows of one sequence stay in one call per piece, so the order of
 * its state updates is unchanged; a row may get another backend than before.
 */
#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

int next_bind_gdn(model *m, int l, ls_err *e) {
    const model_config *c = &m->cfg;
    gdn_layer_w *g = &m->layers[l].gdn;
    const int H = c->hidden, nk = c->lin_k_heads, nv = c->lin_v_heads, dk = c->lin_k_dim,
              dv = c->lin_v_dim, K = c->lin_conv;
    const int key_dim = nk * dk, val_dim = nv * dv, conv_dim = 2 * key_dim + val_dim;
    char p[256];
    int rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkvz.weight", l);
    g->fused = mdl_tensor(m, p) != NULL;
    if (g->fused) {
        /* per key head g: qkvz rows [q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)], ba rows
         * [b_g (r) | a_g (r)]: permuted once into contiguous q | k | v, z, b, a */
        const int r = nv / nk, grp = 2 * dk + 2 * r * dv;
        lin_w qkvz, ba;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkvz", l);
        if ((rc = mdl_bind_lin(m, p, 2 * key_dim + 2 * val_dim, H, &qkvz, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_ba", l);
        if ((rc = mdl_bind_lin(m, p, 2 * nv, H, &ba, e))) return rc;
        int *rows = xmalloc(sizeof(int) * (conv_dim + val_dim + 2 * nv));
        int *zr = rows + conv_dim, *br = zr + val_dim, *ar = br + nv;
        for (int h = 0; h < nk; h++) {
            for (int i = 0; i < dk; i++) {
                rows[h * dk + i] = h * grp + i;                          /* q */
                rows[key_dim + h * dk + i] = h * grp + dk + i;           /* k */
            }
            for (int i = 0; i < r * dv; i++) {
                rows[2 * key_dim + h * r * dv + i] = h * grp + 2 * dk + i;   /* v */
                zr[h * r * dv + i] = h * grp + 2 * dk + r * dv + i;          /* z */
            }
            for (int i = 0; i < r; i++) {
                br[h * r + i] = h * 2 * r + i;
                ar[h * r + i] = h * 2 * r + r + i;
            }
        }
        mdl_take_rows(m, &qkvz, rows, conv_dim, &g->qkv);
        mdl_take_rows(m, &qkvz, zr, val_dim, &g->z);
        mdl_take_rows(m, &ba, br, nv, &g->b);
        mdl_take_rows(m, &ba, ar, nv, &g->a);
        free(rows);
    } else {
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkv", l);
        if ((rc = mdl_bind_lin(m, p, conv_dim, H, &g->qkv, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_z", l);
        if ((rc = mdl_bind_lin(m, p, val_dim, H, &g->z, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_b", l);
        if ((rc = mdl_bind_lin(m, p, nv, H, &g->b, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_a", l);
        if ((rc = mdl_bind_lin(m, p, nv, H, &g->a, e))) return rc;
    }
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.out_proj", l);
    if ((rc = mdl_bind_lin(m, p, H, val_dim, &g->out, e))) return rc;
    float *conv_w, *A_log, *dt_bias;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.conv1d.weight", l);
    const int64_t cs[3] = {conv_dim, 1, K};
    if ((rc = mdl_bind_vec(m, p, 3, cs, &conv_w, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.A_log", l);
    if ((rc = mdl_bind_vec1(m, p, nv, &A_log, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.dt_bias", l);
    if ((rc = mdl_bind_vec1(m, p, nv, &dt_bias, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.norm.weight", l);
    if ((rc = mdl_bind_vec1(m, p, dv, &g->norm, e))) return rc;
    g->g = (gdn_w){.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = K,
                   .conv_w = conv_w, .A_log = A_log, .dt_bias = dt_bias};
    return 0;
}

/* An env switch that is on unless set to "0", read once (every rank writes the same value). */
static int env_on(const char *name, int *cache) {
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = !(v && !strcmp(v, "0"));
    }
    return *cache;
}

int next_snap_tables(fwd_ctx *f, const fwd_seq *seqs, int n_seq, const gdn_seq *gs, gdn_seq *out) {
    static int split_on = -1, span_on = -1;
    int n_snap_piece = 1, n_dec = 0;
    for (int s = 0; s < n_seq; s++) {
        if (seqs[s].n_snap + 1 > n_snap_piece) n_snap_piece = seqs[s].n_snap + 1;
        n_dec += seqs[s].n_new == 1;
    }
    const int split = n_dec > 0 && n_dec < n_seq && env_on("LASTSTAND_GDN_SPLIT", &split_on);
    if (n_snap_piece <= 1 && !split) return 0;
    /* each call over the span of its own rows (LASTSTAND_GDN_PIECE_ROWS=0: over the step's),
     * so the op's per-M plan picks its backend for the call's size, as for a step of it */
    const int span = env_on("LASTSTAND_GDN_PIECE_ROWS", &span_on);
    int n = 0;
    for (int p = 0; p < n_snap_piece; p++) {
        for (int kind = 0; kind < 1 + split; kind++) { /* kind 1: the decode rows, 0: the rest */
            gdn_seq *o = out + (size_t)n * n_seq;
            int k = 0, lo = f->n_tok, hi = 0;
            for (int s = 0; s < n_seq; s++) {
                const fwd_seq *q = &seqs[s];
                if (q->n_snap < p) continue; /* done in an earlier piece */
                if (split && (q->n_new == 1) != kind) continue;
                int t0 = p ? q->snap_off[p - 1] : 0, t1 = p < q->n_snap ? q->snap_off[p] : q->n_new;
                o[k++] = (gdn_seq){.slot = gs[s].slot, .n_new = t1 - t0, .row0 = gs[s].row0 + t0};
                if (gs[s].row0 + t0 < lo) lo = gs[s].row0 + t0;
                if (gs[s].row0 + t1 > hi) hi = gs[s].row0 + t1;
            }
            if (!k) continue; /* no sequence of this kind in the piece (decode rows: piece 0 only) */
            if (!span) lo = 0, hi = f->n_tok;
            for (int i = 0; i < k; i++) o[i].row0 -= lo;
            f->n_piece_seq[n] = k;
            f->piece_row0[n] = lo;
            f->piece_rows[n] = hi - lo;
            f->piece_snap[n] = -1;
            n++;
        }
        /* snapshot p's copies follow piece p's last call (a piece before the last holds a
         * sequence with a later snapshot, so it has a call) */
        if (p + 1 < n_snap_piece && n > 0) f->piece_snap[n - 1] = p;
    }
    return n;
}

/* Layer-cache li's GDN state of every sequence with a snapshot after piece p, copied into its
 * snapshot slot (stream-ordered device copies). */
static int snap_copy(const fwd_ctx *f, int li, int p, int l, ls_err *e) {
    const model *m = f->m;
    const model_config *c = &m->cfg;
    const mcache *mc = f->c;
    const int conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim;
    const size_t nc = (size_t)conv_dim * (c->lin_conv - 1),
                 nr = (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim * (mc->rec16 ? 2 : 4); /* bytes */
    float *cb = mc->conv + (size_t)li * mc->n_slots * nc;
    char *rb = (mc->rec16 ? (char *)mc->rec16 : (char *)mc->rec) + (size_t)li * mc->n_slots * nr;
    for (int s = 0; s < f->n_seq; s++) {
        const fwd_seq *q = &f->seqs[s];
        if (q->n_snap <= p) continue;
        const int src = q->slot, dst = q->snap_slot[p];
        int rc = m->mem->d2d(cb + (size_t)dst * nc, cb + (size_t)src * nc, sizeof(float) * nc, m->ops.stream, e);
        if (!rc)
            rc = m->mem->d2d(rb + (size_t)dst * nr, rb + (size_t)src * nr, nr, m->ops.stream, e);
        if (rc) return err_prefix(e, "layer %d: GDN snapshot %d of slot %d into slot %d", l, p, src, dst);
    }
    return 0;
}

int next_gdn_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e) {
    model *m = f->m;
    const model_config *c = &m->cfg;
    const gdn_layer_w *g = &m->layers[l].gdn;
    mws *w = f->ws;
    const int T = f->n_tok, nv = c->lin_v_heads, dv = c->lin_v_dim;
    const int val_dim = nv * dv, conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + val_dim;
    int rc, normed = 0;
    /* the four projections of u: one launch where the gemm backend groups them */
    const lin_w *pw[4] = {&g->qkv, &g->z, &g->b, &g->a};
    void *const py[4] = {w->qkv, w->z, w->b, w->a};
    if ((rc = ops_linear_multi(&m->ops, T, u, 4, pw, py, e))) return rc;
    const int li = m->layers[l].cache_idx;
    const mcache *mc = f->c;
    gdn_state st = {
        .conv = mc->conv + (size_t)li * mc->n_slots * conv_dim * (c->lin_conv - 1),
        .rec = mc->rec ? mc->rec + (size_t)li * mc->n_slots * nv * c->lin_k_dim * dv : NULL,
        .n_slots = mc->n_slots,
        .rec16 = mc->rec16 ? mc->rec16 + (size_t)li * mc->n_slots * nv * c->lin_k_dim * dv : NULL};
    gdn_args ga = {.n_seq = f->n_seq, .seqs = f->gseq, .n_tok = T, .w = &g->g, .qkv = w->qkv,
                   .a = w->a, .b = w->b, .st = &st, .out = w->core, .dt = m->ops.act,
                   .seqs_host = f->gseq_host, .z = w->z, .norm_w = g->norm, .norm_eps = c->rms_eps,
                   .norm_done = &normed};
    if (!f->n_piece) {
        if ((rc = ops_gdn_run(&m->ops, &ga, e))) return rc;
    } else { /* the op call by call (next_snap_tables), the snapshot copies between them */
        ga.z = NULL;
        ga.norm_w = NULL;
        ga.norm_done = NULL;
        const size_t asz = act_size(m->ops.act);
        for (int p = 0; p < f->n_piece; p++) {
            const size_t b = (size_t)f->piece_row0[p] * asz; /* the piece's first row, in bytes per column */
            ga.n_tok = f->piece_rows[p];
            ga.qkv = (const char *)w->qkv + b * conv_dim;
            ga.a = (const char *)w->a + b * nv;
            ga.b = (const char *)w->b + b * nv;
            ga.out = (char *)w->core + b * val_dim;
            ga.n_seq = f->n_piece_seq[p];
            ga.seqs = f->gpiece[p];
            ga.seqs_host = f->gpiece_host[p];
            if ((rc = ops_gdn_run(&m->ops, &ga, e))) return rc;
            if (f->piece_snap[p] >= 0 && (rc = snap_copy(f, li, f->piece_snap[p], l, e))) return rc;
        }
    }
    /* the gated norm, unless the gdn backend fused it (gdn_cuda_decode, LASTSTAND_GDN_NORM) */
    if (!normed && (rc = mdl_op_err(m->ops.small->rmsnorm_gated(T * nv, dv, w->core, w->z, g->norm, c->rms_eps,
                                                                w->core, m->ops.act, m->ops.stream),
                                    "gated norm", l, e)))
        return rc;
    return ops_linear(&m->ops, T, w->core, &g->out, out, 0, e);
}
