/* sample_block.cu: the sampler with one block of SMP_T threads a row (sample_cuda_block, the
 * engine's with LASTSTAND_SAMPLE_WIDE=0): the steps of sample.cu's header comment, each a pass
 * over the row by the block, top_k / top_p / top logprobs by a radix descent over the rank key
 * (4 bits a pass). It leaves all but one SM idle at batch 1 (36 µs a greedy 248320-wide row, 350-
 * 620 µs a sampled one); it stays as the reference the cluster forms are tested against
 * (test_sample_cuda: the same kept sets, the same seeded tokens) and as the fallback. */
#include "ops/cuda/sample_int.cuh"

/* ---- the radix descent ------------------------------------------------------------------- */

/* The largest key t with measure{key >= t, key >= floor} >= target, where the
 * measure is the count (MASS = 0) or Σ exp(s - m) (MASS = 1) of the row's
 * tokens. 4 bits per pass from the top; the id half is searched only when
 * several tokens share the chosen value and the cut falls among them. */
template <int MASS>
__device__ uint64_t key_descent(const float *__restrict__ w, int V, float inv, int scale, float m, uint64_t floor,
                                double target, smp_shared &sh) {
    uint64_t P = 0;
    double above = 0;
    for (int shf = 60; shf >= 0; shf -= 4) {
        double b[16];
        int c[16];
#pragma unroll
        for (int j = 0; j < 16; j++) { b[j] = 0; c[j] = 0; }
        const uint64_t span = shf == 60 ? 0 : (16ull << shf); /* 0: the whole key space */
        for (int i = threadIdx.x; i < V; i += SMP_T) {
            float s = scaled(w[i], inv, scale);
            uint64_t k = rank_key(s, i);
            if (k < floor || k < P || (span && k - P >= span)) continue;
            int d = (int)((k - P) >> shf);
            double val = MASS ? (double)expf(s - m) : 1.0;
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (d == j) { b[j] += val; c[j]++; }
        }
        blk_sum_dn<16>(b, sh);
        blk_sum_in<16>(c, sh);
        /* the highest digit whose suffix reaches the target; suf = the measure above it.
         * None (rounding put the target past the total): digit 0, everything from P kept. */
        int dsel = -1;
        double suf = 0;
        for (int j = 15; j >= 0; j--) {
            double here = MASS ? b[j] : (double)c[j];
            if (above + suf + here >= target) { dsel = j; break; }
            suf += here;
        }
        if (dsel < 0) {
            dsel = 0;
            suf -= MASS ? b[0] : (double)c[0];
        }
        P += (uint64_t)dsel << shf;
        above += suf;
        if (shf == 32) {
            /* one token holds the chosen value, or (counting) the cut takes all of them */
            if (c[dsel] <= 1 || (!MASS && above + c[dsel] == target)) return P;
        }
    }
    return P;
}

/* ---- the row kernel --------------------------------------------------------------------------- */

template <typename T>
__global__ void __launch_bounds__(SMP_T) smp_row_kernel(int V, const T *__restrict__ logits,
                                                        const smp_row *__restrict__ rows,
                                                        const int32_t *__restrict__ toks, float *__restrict__ work,
                                                        smp_out *__restrict__ out) {
    __shared__ smp_shared sh;
    const int row = blockIdx.x, tid = threadIdx.x;
    const smp_row p = rows[row];
    smp_out *o = &out[row];
    if (p.forced == SMP_ROW_SKIP) {
        if (tid == 0) { o->token = -1; o->bad_idx = -1; o->n_top = 0; o->logprob = 0.f; }
        return;
    }
    const T *x = logits + (size_t)row * V;
    float *w = work + (size_t)row * V;

    const int greedy = !(p.temperature > 0.f) || p.top_k == 1;
    const int want_lp = p.want_lp || p.n_top > 0;
    const uint32_t *mk = row_mask(p, toks, V); /* applied by the widen, like sample.cu */
    const int edits = p.n_ban > 0 || p.n_bias > 0 || (p.rep_pen > 0.f && p.rep_pen != 1.f && p.n_rep > 0) ||
                      ((p.freq_pen != 0.f || p.pres_pen != 0.f) && p.n_cnt > 0);
    /* plain greedy (the common decode row): the argmax during the scan, no work row */
    const int fast = greedy && !want_lp && !edits;

    /* 1. widen, NaN/Inf scan */
    if (tid == 0) sh.bad = INT_MAX;
    __syncthreads();
    const int poison = p.forced == SMP_ROW_POISON ? V / 2 : -1;
    float fv = -INFINITY;
    int fi = 0;
    auto widen = [&](auto mc) { /* instantiated without and with a mask (sample.cu's widen) */
        constexpr bool M = decltype(mc)::value;
        for (int i = tid; i < V; i += SMP_T) {
            float v = load_logit<T>(x, i);
            if (i == poison) v = __int_as_float(0x7fc00000);
            if (!isfinite(v)) atomicMin(&sh.bad, i);
            if (M && !(mask_bits(mk, i) & 1u)) v = -INFINITY;
            if (fast) {
                if (v > fv) { fv = v; fi = i; } /* strided ascending: a thread's first max is its lowest id */
            } else {
                w[i] = v;
            }
        }
    };
    if (mk) widen(smp_bool<true>{});
    else widen(smp_bool<false>{});
    __syncthreads();
    if (sh.bad != INT_MAX) {
        if (tid == 0) {
            o->bad_idx = sh.bad;
            o->bad_val = sh.bad == poison ? __int_as_float(0x7fc00000) : load_logit<T>(x, sh.bad);
            o->token = -1;
            o->n_top = 0;
        }
        return;
    }

    if (fast) {
        blk_argmax(fv, fi, sh);
        if (tid == 0) {
            o->token = p.forced >= 0 ? p.forced : fi;
            o->bad_idx = -1;
            o->n_top = 0;
            o->logprob = 0.f;
        }
        return;
    }

    /* 2. logit_bias (first: the host adds it to the raw logits), bans, repetition, frequency /
     * presence (the lists hold distinct ids) */
    for (int j = tid; j < p.n_bias; j += SMP_T) {
        int id = toks[p.bias_off + j];
        if (id >= 0 && id < V) w[id] = __fadd_rn(w[id], bias_val(p, toks, j));
    }
    __syncthreads();
    for (int j = tid; j < p.n_ban; j += SMP_T) {
        int id = toks[p.ban_off + j];
        if (id >= 0 && id < V) w[id] = -INFINITY;
    }
    __syncthreads();
    if (p.rep_pen > 0.f && p.rep_pen != 1.f) {
        for (int j = tid; j < p.n_rep; j += SMP_T) {
            int id = toks[p.rep_off + j];
            if (id < 0 || id >= V) continue;
            float v = w[id];
            w[id] = v > 0.f ? __fdiv_rn(v, p.rep_pen) : __fmul_rn(v, p.rep_pen);
        }
        __syncthreads();
    }
    if (p.freq_pen != 0.f || p.pres_pen != 0.f) {
        for (int j = tid; j < p.n_cnt; j += SMP_T) {
            int id = toks[p.cnt_off + 2 * j], cnt = toks[p.cnt_off + 2 * j + 1];
            if (id < 0 || id >= V) continue;
            w[id] = __fsub_rn(w[id], __fadd_rn(__fmul_rn(p.freq_pen, (float)cnt), p.pres_pen));
        }
        __syncthreads();
    }

    const float temp = p.temperature > 0.f ? p.temperature : 1.f;
    int token = -1;

    /* 3. greedy */
    if (greedy) {
        float bv = -INFINITY;
        int bi = 0;
        for (int i = tid; i < V; i += SMP_T) {
            float v = w[i];
            if (v > bv) { bv = v; bi = i; } /* strided ascending: first max per thread is its lowest id */
        }
        blk_argmax(bv, bi, sh);
        token = bi;
    }
    if (p.forced >= 0) token = p.forced;
    if (greedy && !want_lp) {
        if (tid == 0) { o->token = token; o->bad_idx = -1; o->n_top = 0; o->logprob = 0.f; }
        return;
    }

    /* 4. scaled logits, max, partition function */
    const int scale = temp != 1.f;
    const float inv = 1.f / temp;
    float m = -INFINITY;
    for (int i = tid; i < V; i += SMP_T) m = fmaxf(m, scaled(w[i], inv, scale));
    m = blk_max(m, sh);
    double z1[1] = {0};
    for (int i = tid; i < V; i += SMP_T) z1[0] += (double)expf(scaled(w[i], inv, scale) - m);
    blk_sum_dn<1>(z1, sh);
    const double Z = z1[0];

    /* 5-6. filter and draw */
    if (token < 0) {
        const int use_k = p.top_k > 0 && p.top_k < V;
        const int use_p = p.top_p > 0.f && p.top_p < 1.f;
        uint64_t tk = 0, tp = 0;
        double base = Z;
        if (use_k) {
            tk = key_descent<0>(w, V, inv, scale, m, 0, (double)p.top_k, sh);
            double b1[1] = {0};
            for (int i = tid; i < V; i += SMP_T) {
                float s = scaled(w[i], inv, scale);
                if (rank_key(s, i) >= tk) b1[0] += (double)expf(s - m);
            }
            blk_sum_dn<1>(b1, sh);
            base = b1[0];
        }
        if (use_p) tp = key_descent<1>(w, V, inv, scale, m, tk, (double)p.top_p * base, sh);
        const uint64_t thr = tk > tp ? tk : tp;
        const float min_p = p.min_p;
        /* segment sums in id order: thread t owns [t·S, (t+1)·S) */
        const int S = (V + SMP_T - 1) / SMP_T, i0 = tid * S, i1 = min(V, i0 + S);
        double seg = 0;
        int last = -1;
        for (int i = i0; i < i1; i++) {
            float s = scaled(w[i], inv, scale);
            float ex = expf(s - m);
            if (rank_key(s, i) >= thr && (!(min_p > 0.f) || ex >= min_p)) {
                seg += (double)ex;
                if (ex > 0.f) last = i; /* never a masked or banned id */
            }
        }
        /* exclusive scan of the segment sums (fixed order: by warp, then across warps) */
        const int lane = tid & 31, wp = tid >> 5;
        double incl = seg;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            double t = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += t;
        }
        if (lane == 31) sh.d[wp] = incl;
        __syncthreads();
        double before = 0, mass = 0;
        for (int k = 0; k < SMP_W; k++) {
            if (k < wp) before += sh.d[k];
            mass += sh.d[k];
        }
        __syncthreads();
        /* [lo, hi) per thread: hi of one thread is bitwise lo of the next, so they tile [0, mass) */
        double prev = __shfl_up_sync(0xffffffffu, incl, 1);
        const double lo = before + (lane ? prev : 0.0), hi = before + incl;
        const double target = philox_uniform(p.seed, p.counter, 0) * mass;
        /* the last candidate overall, for a target at or past the total (rounding) */
        int lastc = last;
#pragma unroll
        for (int off = 16; off; off >>= 1) lastc = max(lastc, __shfl_xor_sync(0xffffffffu, lastc, off));
        if (lane == 0) sh.i[wp] = lastc;
        if (tid == 0) sh.bad = INT_MAX;
        __syncthreads();
        int glast = -1;
        for (int k = 0; k < SMP_W; k++) glast = max(glast, sh.i[k]);
        if (seg > 0 && target >= lo && target < hi) {
            double acc = lo;
            int pick = last;
            for (int i = i0; i < i1; i++) {
                float s = scaled(w[i], inv, scale);
                float ex = expf(s - m);
                if (rank_key(s, i) >= thr && (!(min_p > 0.f) || ex >= min_p)) {
                    acc += (double)ex;
                    if (acc > target) { pick = i; break; }
                }
            }
            atomicMin(&sh.bad, pick); /* one thread's range holds the target */
        }
        __syncthreads();
        token = sh.bad != INT_MAX ? sh.bad : glast;
        if (token < 0) token = 0; /* nothing kept: every logit banned to -inf */
        __syncthreads();
    }

    /* 7. logprobs */
    const double lz = log(Z) + (double)m;
    if (p.n_top > 0) {
        const int n = min(p.n_top, min(SMP_DEV_TOP, V));
        uint64_t tn = key_descent<0>(w, V, inv, scale, m, 0, (double)n, sh);
        if (tid == 0) sh.n_top = 0;
        __syncthreads();
        for (int i = tid; i < V; i += SMP_T) {
            float s = scaled(w[i], inv, scale);
            uint64_t k = rank_key(s, i);
            if (k >= tn) {
                int at = atomicAdd(&sh.n_top, 1);
                if (at < SMP_DEV_TOP) { sh.top_key[at] = k; sh.top_id[at] = i; sh.top_s[at] = s; }
            }
        }
        __syncthreads();
        if (tid == 0) {
            int cnt = min(sh.n_top, n);
            for (int a = 1; a < cnt; a++) /* insertion sort, descending key */
                for (int b = a; b > 0 && sh.top_key[b] > sh.top_key[b - 1]; b--) {
                    uint64_t tk2 = sh.top_key[b]; sh.top_key[b] = sh.top_key[b - 1]; sh.top_key[b - 1] = tk2;
                    int ti = sh.top_id[b]; sh.top_id[b] = sh.top_id[b - 1]; sh.top_id[b - 1] = ti;
                    float ts = sh.top_s[b]; sh.top_s[b] = sh.top_s[b - 1]; sh.top_s[b - 1] = ts;
                }
            while (cnt > 0 && sh.top_s[cnt - 1] == -INFINITY) cnt--; /* masked or banned: the host lists none */
            o->n_top = cnt;
            for (int a = 0; a < cnt; a++) {
                o->top_ids[a] = sh.top_id[a];
                o->top_lp[a] = (float)((double)sh.top_s[a] - lz);
            }
        }
    } else if (tid == 0) {
        o->n_top = 0;
    }
    if (tid == 0) {
        o->token = token;
        o->bad_idx = -1;
        o->logprob = (float)((double)scaled(w[token], inv, scale) - lz);
    }
}

/* ---- launch ----------------------------------------------------------------------------- */

int smp_block_run(const sample_args *a, ls_stream s, ls_err *e) {
    if (a->rows <= 0) return 0;
    int rc = sample_check(a, e);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)s;
    if (a->dt == ACT_BF16)
        smp_row_kernel<bf16><<<a->rows, SMP_T, 0, st>>>(a->vocab, (const bf16 *)a->logits, a->p, a->toks, a->work,
                                                         a->out);
    else
        smp_row_kernel<float><<<a->rows, SMP_T, 0, st>>>(a->vocab, (const float *)a->logits, a->p, a->toks, a->work,
                                                          a->out);
    CU_LAUNCHED(e, "sampling on CUDA (one block a row)");
    return 0;
}

extern "C" const sample_impl sample_cuda_block = {"cuda_sample_block", DEV_CUDA, 1, 1, smp_block_run};
