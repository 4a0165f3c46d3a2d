/* synth.c: random-weight checkpoints with the exact shapes and tensor layout
 * of real architectures (reference/qwen35-and-nvfp4.md sections 1.2, 3, 4;
 * the public Qwen3-30B-A3B and Qwen3-Next-80B-A3B configs).
 *
 * Layouts (what the official releases ship):
 *   qwen3.5 nvfp4: wrapper config (qwen3_5_moe + text_config), tensors under
 *                  `model.language_model.`, routed experts NVFP4 per expert
 *                  (weight U8 [N,K/2], weight_scale F8_E4M3 [N,K/16],
 *                  weight_scale_2 / input_scale F32 scalars), all else BF16.
 *   qwen3.5 bf16:  same config without quantization, experts fused 3-D
 *                  (experts.gate_up_proj [E,2I,H], experts.down_proj [E,H,I]).
 *   qwen3-next, qwen3-moe: `model.` prefix, per-expert experts (BF16, or
 *                  NVFP4 with --quant nvfp4).
 *   nvfp4-fp8:     NVFP4 experts as above; attention, GDN and shared-expert
 *                  projections FP8 (weight F8_E4M3 [N,K], weight_scale F32
 *                  scalar, N(0, std) rounded to E4M3 at 4.5 std = 448), the
 *                  config's quant_algo MIXED_PRECISION (ModelOpt's layout of
 *                  NVIDIA's FP8-attention NVFP4 releases).
 * A_log is F32, everything else BF16 (scales F8_E4M3 / F32 as above).
 *
 * Weights: every tensor is filled block by block from a counter-based PRNG
 * seeded by (seed, tensor name, block index), so the result does not depend
 * on the thread count and is the same in memory and on disk. NVFP4 codes and
 * block scales are drawn directly (no float quantisation) so a 397B layer of
 * 512 experts builds in seconds. Scales keep activations in a realistic
 * range: linears have rms 1/sqrt(K) (output projections half that), plain
 * norms ~1, zero-centred norms ~0, A_log = log(U(1,16)), small dt_bias.
 *
 * synth_build fills every tensor in memory (refusing up front what cannot
 * fit in RAM); synth_write generates and writes one shard (<= 4 GiB) at a
 * time, so writing any preset needs about one shard of memory; synth_open /
 * synth_src_part make one part (the non-layer tensors, or one layer) at a
 * time, each layer into one buffer reused for the next, so a model streamed
 * onto GPUs (model.c) needs about one layer of host memory beyond the
 * non-layer tensors, whatever its size.
 *
 * Owns: nothing global. synth_build hands back an st_set and a config object;
 * a synth_src owns its plan and its layer buffer.
 */
#include "model/synth.h"
#include "model/demo_tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Shards of at most 4 GiB, as HF's save_pretrained would (it uses 5 GB). */
#define SHARD_BYTES ((size_t)4 << 30)

/* ---- presets ------------------------------------------------------------- */

typedef enum { FAM_QWEN35, FAM_NEXT, FAM_QWEN3_MOE } synth_family;

typedef struct preset {
    const char *name;
    synth_family fam;
    int hidden, layers, heads, kv_heads, head_dim;
    double partial_rotary, rope_theta;
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv;
    int experts, top_k, moe_inter, shared_inter;
    int intermediate;  /* dense size written to config (unused by MoE layers) */
    int vocab;         /* 0: the demo tokenizer's size */
    int max_pos;
    int32_t eos, bos;  /* config eos/bos ids (-1: none); demo: filled from its tokenizer */
} preset;

static const preset presets[] = {
    /* tiny Qwen3.5-MoE: 6 GDN + 2 full-attention layers, NVFP4 experts */
    {"demo", FAM_QWEN35, 256, 8, 4, 2, 64, 0.25, 1e7, 4, 8, 32, 32, 4, 16, 4, 128, 128, 512, 0, 32768, -1, -1},
    {"qwen3.5-397b-a17b", FAM_QWEN35, 4096, 60, 32, 2, 256, 0.25, 1e7, 16, 64, 128, 128, 4, 512, 10, 1024, 1024,
     0, 248320, 262144, 248044, -1},
    {"qwen3.5-122b-a10b", FAM_QWEN35, 3072, 48, 32, 2, 256, 0.25, 1e7, 16, 64, 128, 128, 4, 256, 8, 1024, 1024,
     0, 248320, 262144, 248044, -1},
    {"qwen3.5-35b-a3b", FAM_QWEN35, 2048, 40, 16, 2, 256, 0.25, 1e7, 16, 32, 128, 128, 4, 256, 8, 512, 512,
     0, 248320, 262144, 248044, -1},
    {"qwen3-next-80b-a3b", FAM_NEXT, 2048, 48, 16, 2, 256, 0.25, 1e7, 16, 32, 128, 128, 4, 512, 10, 512, 512,
     5120, 151936, 262144, 151645, 151643},
    {"qwen3-30b-a3b", FAM_QWEN3_MOE, 2048, 48, 32, 4, 128, 1.0, 1e6, 0, 0, 0, 0, 0, 128, 8, 768, 0,
     6144, 151936, 40960, 151645, 151643},
    {"qwen3-235b-a22b", FAM_QWEN3_MOE, 4096, 94, 64, 4, 128, 1.0, 1e6, 0, 0, 0, 0, 0, 128, 8, 1536, 0,
     12288, 151936, 40960, 151645, 151643},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static const preset *find_preset(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

static void preset_list(char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < N_PRESETS && k < cap; i++)
        k += snprintf(out + k, cap - k, "%s%s", i ? ", " : "", presets[i].name);
}

/* ---- spec parsing -------------------------------------------------------- */

static int parse_u64(const char *s, uint64_t *v) {
    if (!*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

int synth_parse_spec(const char *spec, synth_opts *o, ls_err *e) {
    memset(o, 0, sizeof *o);
    if (!spec || !*spec) return errf(e, ERR_INVAL, "empty synth spec (want NAME[,layers=N][,seed=S][,quant=Q])");
    /* o->preset and o->quant point at static strings (the preset table and
     * literals), so o outlives spec */
    char tmp[512];
    if (strlen(spec) >= sizeof tmp) return errf(e, ERR_INVAL, "synth spec of %zu characters is too long", strlen(spec));
    snprintf(tmp, sizeof tmp, "%s", spec);
    char *save = NULL, *tok = strtok_r(tmp, ",", &save);
    const preset *p = find_preset(tok ? tok : "");
    if (!p) {
        char list[256];
        preset_list(list, sizeof list);
        return errf(e, ERR_INVAL, "unknown preset '%s' (presets: %s)", tok ? tok : "", list);
    }
    o->preset = p->name;
    while ((tok = strtok_r(NULL, ",", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq) return errf(e, ERR_INVAL, "'%s' is not key=value", tok);
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        uint64_t x;
        if (!strcmp(k, "layers")) {
            if (parse_u64(v, &x) || x < 1 || x > 512)
                return errf(e, ERR_INVAL, "layers=%s is not a count in [1, 512]", v);
            o->layers = (int)x;
        } else if (!strcmp(k, "seed")) {
            if (parse_u64(v, &x)) return errf(e, ERR_INVAL, "seed=%s is not a non-negative integer", v);
            o->seed = x;
        } else if (!strcmp(k, "quant")) {
            if (!strcmp(v, "nvfp4")) o->quant = "nvfp4";
            else if (!strcmp(v, "nvfp4-fp8")) o->quant = "nvfp4-fp8";
            else if (!strcmp(v, "bf16")) o->quant = "bf16";
            else return errf(e, ERR_INVAL, "quant=%s is not nvfp4, nvfp4-fp8 or bf16", v);
        } else if (!strcmp(k, "mtp")) {
            if (!strcmp(v, "chain")) o->mtp_chain = 1;
            else if (!strcmp(v, "random")) o->mtp_chain = 0;
            else return errf(e, ERR_INVAL, "mtp=%s is not random or chain", v);
        } else {
            return errf(e, ERR_INVAL, "unknown key '%s' (layers, seed, quant, mtp)", k);
        }
    }
    return 0;
}

/* ---- PRNG ---------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* xoshiro256** state for one block */
typedef struct rng { uint64_t s[4]; } rng;

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t rng_next(rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}
static void rng_seed(rng *r, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = a ^ rotl(b, 21) ^ rotl(c * 0x9e3779b97f4a7c15ull, 42);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}
/* uniform in [0, 1) */
static inline double rng_unif(rng *r) { return (rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
/* roughly standard normal: Irwin-Hall sum of four 16-bit uniforms, unit variance */
static inline float rng_gauss(rng *r) {
    uint64_t x = rng_next(r);
    int s = (int)(x & 0xffff) + (int)((x >> 16) & 0xffff) + (int)((x >> 32) & 0xffff) + (int)(x >> 48);
    return (float)((s - 2 * 65535) * (1.7320508075688772 / 65536.0));
}

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- tensor plan --------------------------------------------------------- */

typedef enum {
    GEN_NORMAL,     /* BF16/F32: N(0, a) */
    GEN_JITTER,     /* BF16/F32: a + U(-b, b) */
    GEN_LOGUNIF,    /* BF16/F32: log(U(a, b)) */
    GEN_BYTES,      /* U8: uniform random bytes (NVFP4 codes) */
    GEN_E4M3_SCALE, /* F8_E4M3: block scales in [192, 352] */
    GEN_E4M3_NORMAL,/* F8_E4M3: N(0, a) / b rounded to E4M3 (an FP8 weight of per-tensor scale b) */
    GEN_CONST,      /* F32 scalar a */
    GEN_ZERO,       /* any dtype: all bits zero (0.0, E2M1 / E4M3 +0) */
    GEN_EYE,        /* BF16 [N, K]: 1 at (r, r), else 0 */
} gen_kind;

typedef struct tplan {
    char *name;
    st_dtype dt;
    int ndim;
    int64_t shape[4];
    gen_kind gen;
    float a, b;
    void *data;
    size_t nbytes;
} tplan;

typedef struct plan {
    tplan *t;
    int n, cap;
    const preset *p;
    int layers;
    int nvfp4;
    int fp8;   /* nvfp4-fp8: attention, GDN and shared-expert projections FP8 (ModelOpt MIXED_PRECISION) */
    uint64_t seed;
    char prefix[32]; /* "model.language_model." or "model." */
    int mtp;   /* 1: the hybrids' MTP head (mtp.*) as part `layers` */
    int mtp_chain; /* synth_opts.mtp_chain */
    int *layer_start; /* [layers + 1 + mtp]: layer i's tensors are [layer_start[i], layer_start[i + 1]) */
} plan;

static tplan *add(plan *pl, const char *name, st_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2,
                  gen_kind g, float a, float b) {
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? pl->cap * 2 : 256;
        pl->t = xrealloc(pl->t, sizeof(tplan) * pl->cap);
    }
    tplan *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dt = dt;
    t->ndim = ndim;
    int64_t d[3] = {d0, d1, d2};
    t->nbytes = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = d[i];
        t->nbytes *= (size_t)d[i];
    }
    t->gen = g;
    t->a = a;
    t->b = b;
    return t;
}

/* Mean square of the E2M1 code values (uniform codes) and of the block scale
 * values drawn by GEN_E4M3_SCALE: rms(weight) = 2.926 x 265.2 x scale_2. */
#define E2M1_RMS 2.92617
#define SCALE_RMS 265.22

/* Largest |x| an FP8 weight's per-tensor scale maps to 448: 4.5 standard deviations. */
#define FP8_AMAX_STD 4.5f

/* A linear of logical shape [N, K] called `mod` (no .weight): BF16 weight, NVFP4 tensors
 * (nvfp4 = 1) or an FP8 weight with a per-tensor scale (nvfp4 = 2, ModelOpt's FP8), with rms
 * `std`. */
static void linear(plan *pl, const char *mod, int64_t n, int64_t k, float std, int nvfp4) {
    char nm[320];
    if (nvfp4 == 2) {
        const float sc = FP8_AMAX_STD * std / 448.0f;
        snprintf(nm, sizeof nm, "%s.weight", mod);
        add(pl, nm, ST_F8_E4M3, 2, n, k, 0, GEN_E4M3_NORMAL, std, sc);
        snprintf(nm, sizeof nm, "%s.weight_scale", mod);
        add(pl, nm, ST_F32, 0, 0, 0, 0, GEN_CONST, sc, 0);
        snprintf(nm, sizeof nm, "%s.input_scale", mod);
        add(pl, nm, ST_F32, 0, 0, 0, 0, GEN_CONST, (float)(8.0 / 448.0), 0);
        return;
    }
    if (!nvfp4) {
        snprintf(nm, sizeof nm, "%s.weight", mod);
        add(pl, nm, ST_BF16, 2, n, k, 0, GEN_NORMAL, std, 0);
        return;
    }
    snprintf(nm, sizeof nm, "%s.weight", mod);
    add(pl, nm, ST_U8, 2, n, k / 2, 0, GEN_BYTES, 0, 0);
    snprintf(nm, sizeof nm, "%s.weight_scale", mod);
    add(pl, nm, ST_F8_E4M3, 2, n, k / 16, 0, GEN_E4M3_SCALE, 0, 0);
    snprintf(nm, sizeof nm, "%s.weight_scale_2", mod);
    add(pl, nm, ST_F32, 0, 0, 0, 0, GEN_CONST, (float)(std / (E2M1_RMS * SCALE_RMS)), 0);
    /* static activation scale: calibrated amax(x)/(6*448) for activations of amax ~8 */
    snprintf(nm, sizeof nm, "%s.input_scale", mod);
    add(pl, nm, ST_F32, 0, 0, 0, 0, GEN_CONST, (float)(8.0 / (6.0 * 448.0)), 0);
}

static void norm_zero_centred(plan *pl, const char *name, int64_t n) { add(pl, name, ST_BF16, 1, n, 0, 0, GEN_JITTER, 0.0f, 0.1f); }
static void norm_plain(plan *pl, const char *name, int64_t n) { add(pl, name, ST_BF16, 1, n, 0, 0, GEN_JITTER, 1.0f, 0.1f); }

static void layer_tensors(plan *pl, const char *L, int full, int q8);

static void build_plan(plan *pl) {
    const preset *p = pl->p;
    const int64_t H = p->hidden, V = p->vocab;
    const float sH = 1.0f / sqrtf((float)H);
    char nm[320];
    const char *P = pl->prefix;
    int zc = p->fam != FAM_QWEN3_MOE; /* zero-centred (1+w) norms */
    const int q8 = pl->fp8 ? 2 : 0;   /* linear()'s kind for the non-expert projections */

    add(pl, "lm_head.weight", ST_BF16, 2, V, H, 0, GEN_NORMAL, 1.5f * sH, 0);
    snprintf(nm, sizeof nm, "%sembed_tokens.weight", P);
    add(pl, nm, ST_BF16, 2, V, H, 0, GEN_NORMAL, 0.5f, 0);
    snprintf(nm, sizeof nm, "%snorm.weight", P);
    zc ? norm_zero_centred(pl, nm, H) : norm_plain(pl, nm, H);

    pl->layer_start = xmalloc(sizeof(int) * (pl->layers + 2));
    for (int i = 0; i < pl->layers; i++) {
        char L[96];
        pl->layer_start[i] = pl->n;
        snprintf(L, sizeof L, "%slayers.%d.", P, i);
        layer_tensors(pl, L, p->fam == FAM_QWEN3_MOE || (i + 1) % 4 == 0, q8);
    }
    pl->layer_start[pl->layers] = pl->n;
    if (pl->mtp) { /* part `layers`: the multi-token-prediction head, one full-attention MoE layer */
        const int t0 = pl->n;
        layer_tensors(pl, "mtp.layers.0.", 1, q8);
        tplan *fc = add(pl, "mtp.fc.weight", ST_BF16, 2, H, 2 * H, 0, GEN_NORMAL, 0.7f * sH, 0);
        if (pl->mtp_chain) { /* mtp=chain: the layer adds nothing and fc passes the embedding half */
            fc->gen = GEN_EYE;
            for (int i = t0; i < pl->n; i++) {
                const char *n = pl->t[i].name;
                const size_t ln = strlen(n);
                if (strstr(n, "o_proj.weight") || (ln > 16 && !strcmp(n + ln - 16, "down_proj.weight")) ||
                    (strstr(n, "down_proj") && strstr(n, "weight_scale") && !strstr(n, "weight_scale_2")) ||
                    strstr(n, "experts.down_proj"))
                    pl->t[i].gen = GEN_ZERO;
            }
        }
        norm_zero_centred(pl, "mtp.pre_fc_norm_embedding.weight", H);
        norm_zero_centred(pl, "mtp.pre_fc_norm_hidden.weight", H);
        norm_zero_centred(pl, "mtp.norm.weight", H);
    }
    pl->layer_start[pl->layers + pl->mtp] = pl->n;
}

/* One decoder layer's tensors under the name prefix L ("model.layers.3.", "mtp.layers.0."):
 * norms, full attention (full) or a GDN block, the MoE. */
static void layer_tensors(plan *pl, const char *L, int full, int q8) {
    const preset *p = pl->p;
    const int64_t H = p->hidden;
    const float sH = 1.0f / sqrtf((float)H);
    const int zc = p->fam != FAM_QWEN3_MOE;
    char nm[320], mod[256];
    {
        snprintf(nm, sizeof nm, "%sinput_layernorm.weight", L);
        zc ? norm_zero_centred(pl, nm, H) : norm_plain(pl, nm, H);
        snprintf(nm, sizeof nm, "%spost_attention_layernorm.weight", L);
        zc ? norm_zero_centred(pl, nm, H) : norm_plain(pl, nm, H);

        if (full) {
            const int64_t nh = p->heads, nkv = p->kv_heads, hd = p->head_dim;
            int gated = p->fam != FAM_QWEN3_MOE;
            snprintf(mod, sizeof mod, "%sself_attn.q_proj", L);
            linear(pl, mod, (gated ? 2 : 1) * nh * hd, H, sH, q8);
            snprintf(mod, sizeof mod, "%sself_attn.k_proj", L);
            linear(pl, mod, nkv * hd, H, sH, q8);
            snprintf(mod, sizeof mod, "%sself_attn.v_proj", L);
            linear(pl, mod, nkv * hd, H, sH, q8);
            snprintf(mod, sizeof mod, "%sself_attn.o_proj", L);
            linear(pl, mod, H, nh * hd, 0.5f / sqrtf((float)(nh * hd)), q8);
            snprintf(nm, sizeof nm, "%sself_attn.q_norm.weight", L);
            zc ? norm_zero_centred(pl, nm, hd) : norm_plain(pl, nm, hd);
            snprintf(nm, sizeof nm, "%sself_attn.k_norm.weight", L);
            zc ? norm_zero_centred(pl, nm, hd) : norm_plain(pl, nm, hd);
        } else {
            const int64_t nk = p->lin_k_heads, nv = p->lin_v_heads, dk = p->lin_k_dim, dv = p->lin_v_dim;
            const int64_t conv_dim = 2 * nk * dk + nv * dv;
            if (p->fam == FAM_QWEN35) {
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_qkv", L);
                linear(pl, mod, conv_dim, H, sH, q8);
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_z", L);
                linear(pl, mod, nv * dv, H, sH, q8);
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_b", L);
                linear(pl, mod, nv, H, 0.5f * sH, q8);
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_a", L);
                linear(pl, mod, nv, H, 0.5f * sH, q8);
            } else {
                /* Qwen3-Next: fused, grouped per key head */
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_qkvz", L);
                linear(pl, mod, 2 * nk * dk + 2 * nv * dv, H, sH, q8);
                snprintf(mod, sizeof mod, "%slinear_attn.in_proj_ba", L);
                linear(pl, mod, 2 * nv, H, 0.5f * sH, q8);
            }
            snprintf(nm, sizeof nm, "%slinear_attn.conv1d.weight", L);
            add(pl, nm, ST_BF16, 3, conv_dim, 1, p->conv, GEN_NORMAL, 1.0f / sqrtf((float)p->conv), 0);
            snprintf(nm, sizeof nm, "%slinear_attn.dt_bias", L);
            add(pl, nm, ST_BF16, 1, nv, 0, 0, GEN_JITTER, 0.0f, 0.5f);
            snprintf(nm, sizeof nm, "%slinear_attn.A_log", L);
            add(pl, nm, ST_F32, 1, nv, 0, 0, GEN_LOGUNIF, 1.0f, 16.0f);
            snprintf(nm, sizeof nm, "%slinear_attn.norm.weight", L);
            norm_plain(pl, nm, dv);
            snprintf(mod, sizeof mod, "%slinear_attn.out_proj", L);
            linear(pl, mod, H, nv * dv, 0.5f / sqrtf((float)(nv * dv)), q8);
        }

        /* MoE: router, experts, shared expert */
        const int64_t E = p->experts, I = p->moe_inter;
        snprintf(mod, sizeof mod, "%smlp.gate", L);
        linear(pl, mod, E, H, sH, 0);
        const float sup = 1.0f / sqrtf((float)H), sdown = 0.5f / sqrtf((float)I);
        if (p->fam == FAM_QWEN35 && !pl->nvfp4) {
            snprintf(nm, sizeof nm, "%smlp.experts.gate_up_proj", L);
            add(pl, nm, ST_BF16, 3, E, 2 * I, H, GEN_NORMAL, sup, 0);
            snprintf(nm, sizeof nm, "%smlp.experts.down_proj", L);
            add(pl, nm, ST_BF16, 3, E, H, I, GEN_NORMAL, sdown, 0);
        } else {
            for (int64_t x = 0; x < E; x++) {
                snprintf(mod, sizeof mod, "%smlp.experts.%lld.gate_proj", L, (long long)x);
                linear(pl, mod, I, H, sup, pl->nvfp4);
                snprintf(mod, sizeof mod, "%smlp.experts.%lld.up_proj", L, (long long)x);
                linear(pl, mod, I, H, sup, pl->nvfp4);
                snprintf(mod, sizeof mod, "%smlp.experts.%lld.down_proj", L, (long long)x);
                linear(pl, mod, H, I, sdown, pl->nvfp4);
            }
        }
        if (p->shared_inter) {
            const int64_t Is = p->shared_inter;
            snprintf(mod, sizeof mod, "%smlp.shared_expert.gate_proj", L);
            linear(pl, mod, Is, H, sup, q8);
            snprintf(mod, sizeof mod, "%smlp.shared_expert.up_proj", L);
            linear(pl, mod, Is, H, sup, q8);
            snprintf(mod, sizeof mod, "%smlp.shared_expert.down_proj", L);
            linear(pl, mod, H, Is, 0.5f / sqrtf((float)Is), q8);
            snprintf(mod, sizeof mod, "%smlp.shared_expert_gate", L);
            linear(pl, mod, 1, H, sH, 0);
        }
    }
}

/* ---- filling ------------------------------------------------------------- */

#define BLOCK_BYTES ((size_t)1 << 20)

typedef struct job { int t; size_t off; } job;
typedef struct fill_ctx { plan *pl; job *jobs; } fill_ctx;

/* f32 -> bf16, round to nearest even (values here are finite) */
static inline uint16_t to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline void put_val(tplan *t, size_t i, float v) {
    if (t->dt == ST_BF16) ((uint16_t *)t->data)[i] = to_bf16(v);
    else ((float *)t->data)[i] = v;
}

static void fill_block(plan *pl, tplan *t, size_t off) {
    size_t end = off + BLOCK_BYTES < t->nbytes ? off + BLOCK_BYTES : t->nbytes;
    rng r;
    rng_seed(&r, pl->seed, str_hash(t->name), off / BLOCK_BYTES);
    size_t es = st_dtype_size(t->dt);
    switch (t->gen) {
    case GEN_NORMAL:
        if (t->dt == ST_BF16) {
            uint16_t *d = t->data;
            for (size_t i = off / es; i < end / es; i++) d[i] = to_bf16(t->a * rng_gauss(&r));
        } else {
            for (size_t i = off / es; i < end / es; i++) put_val(t, i, t->a * rng_gauss(&r));
        }
        break;
    case GEN_JITTER:
        for (size_t i = off / es; i < end / es; i++) put_val(t, i, t->a + t->b * (float)(2.0 * rng_unif(&r) - 1.0));
        break;
    case GEN_LOGUNIF:
        for (size_t i = off / es; i < end / es; i++) put_val(t, i, (float)log(t->a + (t->b - t->a) * rng_unif(&r)));
        break;
    case GEN_BYTES: {
        unsigned char *d = t->data;
        size_t i = off;
        for (; i + 8 <= end; i += 8) {
            uint64_t x = rng_next(&r);
            memcpy(d + i, &x, 8);
        }
        for (uint64_t x = rng_next(&r); i < end; i++, x >>= 8) d[i] = (unsigned char)x;
        break;
    }
    case GEN_E4M3_SCALE: {
        /* E4M3 codes 0x74..0x7B: 192, 208, 224, 240, 256, 288, 320, 352 */
        unsigned char *d = t->data;
        uint64_t x = 0;
        for (size_t i = off, k = 0; i < end; i++, k++) {
            if (k % 21 == 0) x = rng_next(&r);
            d[i] = (unsigned char)(0x74 + (x & 7));
            x >>= 3;
        }
        break;
    }
    case GEN_E4M3_NORMAL: {
        unsigned char *d = t->data;
        for (size_t i = off; i < end; i++) d[i] = f32_to_fp8_e4m3(t->a * rng_gauss(&r) / t->b);
        break;
    }
    case GEN_CONST:
        for (size_t i = off / es; i < end / es; i++) put_val(t, i, t->a);
        break;
    case GEN_ZERO:
        memset((char *)t->data + off, 0, end - off);
        break;
    case GEN_EYE: {
        uint16_t *d = t->data;
        const size_t K = (size_t)t->shape[1];
        for (size_t i = off / es; i < end / es; i++) d[i] = i / K == i % K ? 0x3f80 : 0;
        break;
    }
    }
}

static void fill_range(void *ctx, int64_t i0, int64_t i1) {
    fill_ctx *c = ctx;
    for (int64_t j = i0; j < i1; j++) fill_block(c->pl, &c->pl->t[c->jobs[j].t], c->jobs[j].off);
}

/* Fill tensors [t0, t1) of the plan: each in a malloc'd block of its own (arena NULL), or laid
 * out 64-byte aligned in arena (the caller sized it, synth_src). ERR_NOMEM (nothing left
 * allocated) when memory runs out. */
static int fill_range_in(plan *pl, int t0, int t1, char *arena, ls_err *e) {
    size_t nj = 0, cap = 1024, at = 0;
    job *jobs = xmalloc(sizeof(job) * cap);
    for (int i = t0; i < t1; i++) {
        tplan *t = &pl->t[i];
        if (arena) {
            t->data = arena + at;
            at += (t->nbytes + 63) & ~(size_t)63;
        } else if (!(t->data = malloc(t->nbytes ? t->nbytes : 1))) {
            for (int k = t0; k < i; k++) { free(pl->t[k].data); pl->t[k].data = NULL; }
            free(jobs);
            return errf(e, ERR_NOMEM, "%s: out of memory allocating '%s' (%zu bytes)", pl->p->name, t->name,
                        t->nbytes);
        }
        for (size_t off = 0; off < t->nbytes; off += BLOCK_BYTES) {
            if (nj == cap) jobs = xrealloc(jobs, sizeof(job) * (cap *= 2));
            jobs[nj++] = (job){i, off};
        }
    }
    fill_ctx c = {pl, jobs};
    pool_for((int64_t)nj, 1, fill_range, &c);
    free(jobs);
    return 0;
}

static int fill_range_of_plan(plan *pl, int t0, int t1, ls_err *e) { return fill_range_in(pl, t0, t1, NULL, e); }

static double plan_bytes(const plan *pl) {
    double b = 0;
    for (int i = 0; i < pl->n; i++) b += (double)pl->t[i].nbytes;
    return b;
}

/* ---- config -------------------------------------------------------------- */

static json_t *exclude_list(const plan *pl) {
    json_t *a = json_array();
    json_array_append_new(a, json_string("lm_head"));
    char nm[96];
    snprintf(nm, sizeof nm, "%sembed_tokens", pl->prefix);
    json_array_append_new(a, json_string(nm));
    if (pl->p->fam == FAM_QWEN35) json_array_append_new(a, json_string("model.visual*"));
    if (pl->mtp) json_array_append_new(a, json_string("mtp.fc")); /* the rest of the head as the layers */
    if (!pl->fp8) { /* MIXED_PRECISION: these are FP8, their tensors say so */
        json_array_append_new(a, json_string("*self_attn*"));
        if (pl->p->fam != FAM_QWEN3_MOE) json_array_append_new(a, json_string("*linear_attn*"));
    }
    json_array_append_new(a, json_string("*mlp.gate"));
    if (pl->p->shared_inter && !pl->fp8) json_array_append_new(a, json_string("*mlp.shared_expert*"));
    return a;
}

static json_t *producer(void) { return json_pack("{s:s,s:s}", "name", "modelopt", "version", "laststand-synth"); }

static json_t *text_config(const plan *pl, int32_t eos, int32_t bos) {
    const preset *p = pl->p;
    json_t *t = json_object();
    const char *mt = p->fam == FAM_QWEN35 ? "qwen3_5_moe_text" : p->fam == FAM_NEXT ? "qwen3_next" : "qwen3_moe";
    if (p->fam != FAM_QWEN35)
        json_object_set_new(t, "architectures", json_pack("[s]", p->fam == FAM_NEXT ? "Qwen3NextForCausalLM" : "Qwen3MoeForCausalLM"));
    json_object_set_new(t, "model_type", json_string(mt));
    json_object_set_new(t, "attention_bias", json_false());
    json_object_set_new(t, "attention_dropout", json_real(0.0));
    json_object_set_new(t, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(t, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(t, "decoder_sparse_step", json_integer(1));
    json_object_set_new(t, "dtype", json_string("bfloat16"));
    json_object_set_new(t, "head_dim", json_integer(p->head_dim));
    json_object_set_new(t, "hidden_act", json_string("silu"));
    json_object_set_new(t, "hidden_size", json_integer(p->hidden));
    json_object_set_new(t, "initializer_range", json_real(0.02));
    if (p->intermediate) json_object_set_new(t, "intermediate_size", json_integer(p->intermediate));
    json_object_set_new(t, "max_position_embeddings", json_integer(p->max_pos));
    json_object_set_new(t, "mlp_only_layers", json_array());
    json_object_set_new(t, "moe_intermediate_size", json_integer(p->moe_inter));
    json_object_set_new(t, "norm_topk_prob", json_true());
    json_object_set_new(t, "num_attention_heads", json_integer(p->heads));
    json_object_set_new(t, "num_experts", json_integer(p->experts));
    json_object_set_new(t, "num_experts_per_tok", json_integer(p->top_k));
    json_object_set_new(t, "num_hidden_layers", json_integer(pl->layers));
    json_object_set_new(t, "num_key_value_heads", json_integer(p->kv_heads));
    json_object_set_new(t, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(t, "router_aux_loss_coef", json_real(0.001));
    json_object_set_new(t, "tie_word_embeddings", json_false());
    json_object_set_new(t, "use_cache", json_true());
    json_object_set_new(t, "vocab_size", json_integer(p->vocab));
    if (p->fam == FAM_QWEN3_MOE) {
        json_object_set_new(t, "rope_theta", json_real(p->rope_theta));
        json_object_set_new(t, "rope_scaling", json_null());
        json_object_set_new(t, "max_window_layers", json_integer(pl->layers));
        json_object_set_new(t, "sliding_window", json_null());
        json_object_set_new(t, "use_sliding_window", json_false());
        return t;
    }
    /* hybrid families */
    json_object_set_new(t, "full_attention_interval", json_integer(4));
    json_object_set_new(t, "linear_conv_kernel_dim", json_integer(p->conv));
    json_object_set_new(t, "linear_key_head_dim", json_integer(p->lin_k_dim));
    json_object_set_new(t, "linear_num_key_heads", json_integer(p->lin_k_heads));
    json_object_set_new(t, "linear_num_value_heads", json_integer(p->lin_v_heads));
    json_object_set_new(t, "linear_value_head_dim", json_integer(p->lin_v_dim));
    json_object_set_new(t, "shared_expert_intermediate_size", json_integer(p->shared_inter));
    json_object_set_new(t, "partial_rotary_factor", json_real(p->partial_rotary));
    if (p->fam == FAM_NEXT) {
        /* the public Qwen3-Next config: flat rope_theta, no layer_types */
        json_object_set_new(t, "rope_theta", json_real(p->rope_theta));
        json_object_set_new(t, "rope_scaling", json_null());
        json_object_set_new(t, "num_nextn_predict_layers", json_integer(pl->mtp));
        return t;
    }
    json_t *lt = json_array();
    for (int i = 0; i < pl->layers; i++)
        json_array_append_new(lt, json_string((i + 1) % 4 == 0 ? "full_attention" : "linear_attention"));
    json_object_set_new(t, "layer_types", lt);
    json_object_set_new(t, "attn_output_gate", json_true());
    json_object_set_new(t, "mamba_ssm_dtype", json_string("float32"));
    json_object_set_new(t, "mtp_num_hidden_layers", json_integer(pl->mtp)); /* the mtp.* head (part `layers`) */
    json_object_set_new(t, "rope_parameters",
                        json_pack("{s:b,s:[i,i,i],s:f,s:f,s:s}", "mrope_interleaved", 1, "mrope_section", 11, 11, 10,
                                  "partial_rotary_factor", p->partial_rotary, "rope_theta", p->rope_theta,
                                  "rope_type", "default"));
    return t;
}

static json_t *quant_config(const plan *pl) {
    return json_pack("{s:s,s:s,s:i,s:n,s:o,s:o}", "quant_method", "modelopt", "quant_algo",
                     pl->fp8 ? "MIXED_PRECISION" : "NVFP4", "group_size", 16, "kv_cache_scheme", "ignore",
                     exclude_list(pl), "producer", producer());
}

static json_t *make_config(const plan *pl, int32_t eos, int32_t bos) {
    json_t *t = text_config(pl, eos, bos);
    json_t *c;
    if (pl->p->fam == FAM_QWEN35) {
        c = json_object();
        json_object_set_new(c, "architectures", json_pack("[s]", "Qwen3_5MoeForConditionalGeneration"));
        json_object_set_new(c, "model_type", json_string("qwen3_5_moe"));
        json_object_set_new(c, "text_config", t);
        json_object_set_new(c, "tie_word_embeddings", json_false());
    } else {
        c = t;
    }
    json_object_set_new(c, "transformers_version", json_string("5.17.0"));
    if (pl->nvfp4) json_object_set_new(c, "quantization_config", quant_config(pl));
    return c;
}

/* ---- build / write ------------------------------------------------------- */

static int make_plan(const synth_opts *o, plan *pl, preset *pcopy, ls_err *e) {
    memset(pl, 0, sizeof *pl);
    const preset *p = find_preset(o->preset ? o->preset : "");
    if (!p) {
        char list[256];
        preset_list(list, sizeof list);
        return errf(e, ERR_INVAL, "unknown preset '%s' (presets: %s)", o->preset ? o->preset : "", list);
    }
    *pcopy = *p;
    if (!strcmp(p->name, "demo")) {
        pcopy->vocab = demo_tok_vocab_size();
        pcopy->eos = demo_tok_id("<|endoftext|>");
    }
    pl->p = pcopy;
    pl->layers = o->layers > 0 ? o->layers : p->layers;
    if (pl->layers > 512) return errf(e, ERR_INVAL, "layers=%d is more than 512", pl->layers);
    const char *q = o->quant ? o->quant : (p->fam == FAM_QWEN35 ? "nvfp4" : "bf16");
    if (strcmp(q, "nvfp4") && strcmp(q, "nvfp4-fp8") && strcmp(q, "bf16"))
        return errf(e, ERR_INVAL, "quant '%s' is not nvfp4, nvfp4-fp8 or bf16", q);
    pl->nvfp4 = strncmp(q, "nvfp4", 5) == 0;
    pl->fp8 = !strcmp(q, "nvfp4-fp8");
    pl->seed = o->seed;
    pl->mtp = p->fam != FAM_QWEN3_MOE; /* the hybrids' checkpoints carry an MTP head */
    pl->mtp_chain = pl->mtp && o->mtp_chain;
    snprintf(pl->prefix, sizeof pl->prefix, "%s", p->fam == FAM_QWEN35 ? "model.language_model." : "model.");
    return 0;
}

static void plan_free(plan *pl) {
    for (int i = 0; i < pl->n; i++) {
        free(pl->t[i].name);
        free(pl->t[i].data);
    }
    free(pl->t);
    free(pl->layer_start);
}

int synth_build(const synth_opts *o, st_set **weights, json_t **config, ls_err *e) {
    *weights = NULL;
    *config = NULL;
    plan pl;
    preset pc;
    int rc = make_plan(o, &pl, &pc, e);
    if (rc) return rc;
    build_plan(&pl);
    /* refuse up front what cannot fit rather than die in the middle */
    double need = plan_bytes(&pl), have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    if (have > 0 && need > 0.9 * have) {
        rc = errf(e, ERR_UNSUPPORTED, "%d layers of %s need %.1f GB of memory, this machine has %.1f GB "
                  "(pass layers=N for fewer layers)", pl.layers, pc.name, need / 1e9, have / 1e9);
        plan_free(&pl);
        return rc;
    }
    rc = fill_range_of_plan(&pl, 0, pl.n, e);
    st_set *s = st_new();
    for (int i = 0; i < pl.n && !rc; i++) {
        tplan *t = &pl.t[i];
        rc = st_add_owned(s, t->name, t->dt, t->ndim, t->shape, t->data, t->nbytes, e);
        t->data = NULL; /* adopted (or freed on error) */
    }
    if (rc) {
        plan_free(&pl);
        st_close(s);
        return rc;
    }
    *config = make_config(&pl, pc.eos, pc.bos);
    plan_free(&pl);
    *weights = s;
    return 0;
}

int synth_config(const synth_opts *o, json_t **config, ls_err *e) {
    *config = NULL;
    plan pl;
    preset pc;
    int rc = make_plan(o, &pl, &pc, e);
    if (rc) return rc;
    build_plan(&pl); /* names and shapes only (the quantization exclude list needs them) */
    *config = make_config(&pl, pc.eos, pc.bos);
    plan_free(&pl);
    return 0;
}

/* ---- on demand ----------------------------------------------------------- */

struct synth_src {
    plan pl;
    preset pc;
    char *arena;      /* the layers' bytes, one layer at a time (reused: no fresh pages per layer) */
    size_t arena_cap;
};

int synth_open(const synth_opts *o, synth_src **out, json_t **config, ls_err *e) {
    *out = NULL;
    if (config) *config = NULL;
    synth_src *s = xcalloc(1, sizeof *s);
    int rc = make_plan(o, &s->pl, &s->pc, e);
    if (rc) {
        free(s);
        return rc;
    }
    s->pl.p = &s->pc;
    build_plan(&s->pl);
    if (config) *config = make_config(&s->pl, s->pc.eos, s->pc.bos);
    *out = s;
    return 0;
}

int synth_src_layers(const synth_src *s) { return s->pl.layers; }

int synth_src_count(const synth_src *s) { return s->pl.n; }

void synth_src_info(const synth_src *s, int i, st_tensor *out) {
    const tplan *t = &s->pl.t[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dt;
    out->ndim = t->ndim;
    for (int k = 0; k < t->ndim; k++) out->shape[k] = t->shape[k];
    out->nbytes = t->nbytes;
    out->file = "<memory>";
}

/* The plan's tensors [t0, t1) of a part. */
static void part_range(const plan *pl, int part, int *t0, int *t1) {
    *t0 = part < 0 ? 0 : pl->layer_start[part];
    *t1 = part < 0 ? pl->layer_start[0] : pl->layer_start[part + 1];
}

size_t synth_src_part_bytes(const synth_src *s, int part) {
    if (part < -1 || part >= s->pl.layers + s->pl.mtp) return 0;
    int t0, t1;
    part_range(&s->pl, part, &t0, &t1);
    size_t b = 0;
    for (int i = t0; i < t1; i++) b += s->pl.t[i].nbytes;
    return b;
}

int synth_src_part(synth_src *s, int part, st_set **out, ls_err *e) {
    *out = NULL;
    if (part < -1 || part >= s->pl.layers + s->pl.mtp)
        return errf(e, ERR_INVAL, "%s: no layer %d (the checkpoint has %d%s)", s->pc.name, part, s->pl.layers,
                    s->pl.mtp ? " and its MTP head as part N" : "");
    int t0, t1, rc = 0;
    part_range(&s->pl, part, &t0, &t1);
    st_set *set = st_new();
    if (part < 0) { /* kept for the model's life: blocks the set owns */
        if ((rc = fill_range_of_plan(&s->pl, t0, t1, e))) {
            st_close(set);
            return rc;
        }
        for (int i = t0; i < t1 && !rc; i++) {
            tplan *t = &s->pl.t[i];
            rc = st_add_owned(set, t->name, t->dt, t->ndim, t->shape, t->data, t->nbytes, e);
            t->data = NULL; /* adopted (or freed on error) */
        }
        for (int i = t0; i < t1; i++) { /* what an error left unadopted */
            free(s->pl.t[i].data);
            s->pl.t[i].data = NULL;
        }
    } else { /* a layer: views into the arena, valid until the next part */
        size_t need = 0;
        for (int i = t0; i < t1; i++) need += (s->pl.t[i].nbytes + 63) & ~(size_t)63;
        if (need > s->arena_cap) {
            free(s->arena);
            s->arena_cap = 0;
            if (!(s->arena = malloc(need ? need : 1))) {
                st_close(set);
                return errf(e, ERR_NOMEM, "%s: out of memory for layer %d (%.2f GB)", s->pc.name, part, need / 1e9);
            }
            s->arena_cap = need;
        }
        fill_range_in(&s->pl, t0, t1, s->arena, e);
        for (int i = t0; i < t1; i++) {
            tplan *t = &s->pl.t[i];
            if (!rc) rc = st_add_ref(set, t->name, t->dt, t->ndim, t->shape, t->data, t->nbytes, e);
            t->data = NULL; /* the arena's */
        }
    }
    if (rc) {
        st_close(set);
        return rc;
    }
    *out = set;
    return 0;
}

void synth_src_close(synth_src *s) {
    if (!s) return;
    plan_free(&s->pl);
    free(s->arena);
    free(s);
}

static int dump_json(json_t *j, const char *dir, const char *name, ls_err *e) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (json_dump_file(j, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)))
        return errf(e, ERR_IO, "%s: write failed", p);
    return 0;
}


/* Generate and write the shards one at a time (plan order: embeddings, then
 * layer by layer), so memory stays near one shard whatever the preset. */
static int write_weights(plan *pl, const char *dir, ls_err *e) {
    int rc = st_remove_weights(dir, e);
    if (rc) return rc;
    int *start = xmalloc(sizeof(int) * (pl->n + 2)), nsh = 0;
    size_t cur = 0;
    double total = 0;
    start[nsh++] = 0;
    for (int i = 0; i < pl->n; i++) {
        if (cur > 0 && cur + pl->t[i].nbytes > SHARD_BYTES) {
            start[nsh++] = i;
            cur = 0;
        }
        cur += pl->t[i].nbytes;
        total += (double)pl->t[i].nbytes;
    }
    start[nsh] = pl->n;
    json_t *wm = json_object();
    char name[64], path[4096];
    for (int k = 0; k < nsh && !rc; k++) {
        if (nsh == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nsh);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = fill_range_of_plan(pl, start[k], start[k + 1], e);
        if (rc) break;
        st_set *s = st_new();
        for (int i = start[k]; i < start[k + 1] && !rc; i++) {
            tplan *t = &pl->t[i];
            rc = st_add_ref(s, t->name, t->dt, t->ndim, t->shape, t->data, t->nbytes, e);
            json_object_set_new(wm, t->name, json_string(name));
        }
        if (!rc) rc = st_write_file(s, path, e);
        st_close(s);
        for (int i = start[k]; i < start[k + 1]; i++) { free(pl->t[i].data); pl->t[i].data = NULL; }
    }
    if (!rc && nsh > 1) {
        json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (json_dump_file(idx, path, JSON_INDENT(2) | JSON_SORT_KEYS)) rc = errf(e, ERR_IO, "%s: write failed", path);
        json_decref(idx);
    } else {
        json_decref(wm);
    }
    free(start);
    return rc;
}

int synth_write(const synth_opts *o, const char *out_dir, ls_err *e) {
    if (mkdir(out_dir, 0755) && errno != EEXIST) return errf(e, ERR_IO, "%s: %s", out_dir, strerror(errno));
    plan pl;
    preset pc;
    int rc = make_plan(o, &pl, &pc, e);
    if (rc) return rc;
    build_plan(&pl);
    rc = write_weights(&pl, out_dir, e);
    json_t *cfg = rc ? NULL : make_config(&pl, pc.eos, pc.bos);
    plan_free(&pl);
    if (rc) return rc;
    rc = dump_json(cfg, out_dir, "config.json", e);
    json_t *qc = json_object_get(cfg, "quantization_config");
    if (!rc && qc) {
        json_t *hq = json_pack("{s:o,s:{s:O,s:n,s:i,s:O}}", "producer", producer(), "quantization", "quant_algo",
                               json_object_get(qc, "quant_algo"), "kv_cache_quant_algo", "group_size", 16,
                               "exclude_modules", json_object_get(qc, "ignore"));
        rc = dump_json(hq, out_dir, "hf_quant_config.json", e);
        json_decref(hq);
    }
    json_decref(cfg);
    if (rc) return rc;
    /* generation_config.json: stop on <|im_end|> and <|endoftext|> */
    int32_t im_end, eot, bos = pc.bos;
    if (!strcmp(pc.name, "demo")) {
        im_end = demo_tok_id("<|im_end|>");
        eot = demo_tok_id("<|endoftext|>");
        bos = -1;
    } else {
        eot = pc.fam == FAM_QWEN35 ? 248044 : 151643;
        im_end = eot + 2;
    }
    json_t *gc = json_pack("{s:o,s:[i,i],s:o,s:b,s:f,s:i,s:f,s:s}", "bos_token_id",
                           bos >= 0 ? json_integer(bos) : json_null(), "eos_token_id", im_end, eot, "pad_token_id",
                           json_integer(eot), "do_sample", 1, "temperature", 0.6, "top_k", 20, "top_p", 0.95,
                           "transformers_version", "5.17.0");
    rc = dump_json(gc, out_dir, "generation_config.json", e);
    json_decref(gc);
    if (!rc && !strcmp(pc.name, "demo")) rc = demo_tok_write(out_dir, e);
    return rc;
}
