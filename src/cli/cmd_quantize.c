/* cmd_quantize.c: `laststand quantize --in BF16_DIR --out NVFP4_DIR
 * [--exclude PATTERN...]`: BF16 -> NVFP4 in NVIDIA ModelOpt's layout.
 *
 * For every linear weight W [N, K] that is quantized (reference
 * qwen35-and-nvfp4.md sections 4.3-4.6):
 *   weight_scale_2 = amax(W) / (6 * 448)                       F32 scalar
 *   weight_scale   = e4m3(amax(block16) / 6 / weight_scale_2)  F8_E4M3 [N, K/16]
 *   weight         = e2m1_rne(W / (e4m3 value * weight_scale_2)), two codes
 *                    per byte, element 2i in the low nibble    U8 [N, K/2]
 *   input_scale    = a nominal static activation scale (no calibration data
 *                    here; Hopper W4A16 paths ignore it)       F32 scalar
 * Fused 3-D experts (experts.gate_up_proj [E, 2I, H], experts.down_proj
 * [E, H, I]) are split into per-expert gate/up/down projections, as ModelOpt
 * checkpoints store them. Kept in their source dtype: routers (mlp.gate),
 * shared-expert gates, norms and every 1-D tensor, embeddings, lm_head, all
 * Gated DeltaNet tensors (linear_attn.*, conv1d), vision and MTP weights, and
 * any module matching an --exclude pattern (fnmatch on the module name, e.g.
 * '*self_attn*'). config.json gains quantization_config and
 * hf_quant_config.json is written; the other small files are copied.
 *
 * The output set references the input mapping for tensors kept as they are;
 * only the quantized tensors are held in memory (about 0.28 byte/weight).
 */
#include "cli/cli.h"
#include "base/base.h"
#include "fmt/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_EXCLUDE 256

static const char *default_exclude[] = {
    "lm_head", "*embed_tokens", "model.visual*", "mtp*", "*linear_attn*", "*mlp.gate", "*shared_expert_gate",
};
#define N_DEFAULT_EXCLUDE ((int)(sizeof default_exclude / sizeof default_exclude[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: laststand quantize --in BF16_DIR --out NVFP4_DIR [--exclude PATTERN...]\n"
            "\n"
            "Quantizes the linear weights of a BF16 checkpoint to NVFP4 in ModelOpt's layout\n"
            "(per-expert experts, weight/weight_scale/weight_scale_2/input_scale) and writes\n"
            "quantization_config and hf_quant_config.json.\n"
            "\n"
            "  --in DIR          BF16 checkpoint folder (config.json + safetensors)\n"
            "  --out DIR         output folder (created if missing)\n"
            "  --exclude P ...   keep modules matching these fnmatch patterns in BF16\n"
            "                    (always kept: lm_head, embeddings, routers, shared-expert gates,\n"
            "                    norms, Gated DeltaNet, vision, MTP)\n");
}

/* ---- number formats ------------------------------------------------------ */

/* Non-negative f -> nearest E4M3 code (ties to even code), saturating at 448; 0 for f <= 0. */
static uint8_t to_e4m3(float f) { return f > 0 ? f32_to_fp8_e4m3(f) : 0; }

/* |x| (already divided by the block scale) -> E2M1 magnitude code, round to
 * nearest even (reference 4.6 thresholds). */
static inline uint8_t e2m1_mag(float a) {
    if (a <= 0.25f) return 0;
    if (a < 0.75f) return 1;
    if (a <= 1.25f) return 2;
    if (a < 1.75f) return 3;
    if (a <= 2.5f) return 4;
    if (a < 3.5f) return 5;
    if (a <= 5.0f) return 6;
    return 7;
}

static float to_f32(st_dtype dt, const void *p, size_t i) {
    switch (dt) {
    case ST_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case ST_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* ---- quantizing one [N, K] matrix ----------------------------------------- */

typedef struct qjob {
    st_dtype dt;
    const void *src;   /* [N, K] in dt, row stride K */
    int64_t n, k;
    float scale2;
    uint8_t *codes;    /* [N, K/2] */
    uint8_t *scales;   /* [N, K/16] */
    float *amax_part;  /* per-row amax, for the first pass */
} qjob;

static void amax_rows(void *ctx, int64_t r0, int64_t r1) {
    qjob *q = ctx;
    for (int64_t r = r0; r < r1; r++) {
        float m = 0;
        for (int64_t c = 0; c < q->k; c++) {
            float v = fabsf(to_f32(q->dt, q->src, (size_t)(r * q->k + c)));
            if (v > m || v != v) m = v;
        }
        q->amax_part[r] = m;
    }
}

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
    qjob *q = ctx;
    const int64_t nb = q->k / 16;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t b = 0; b < nb; b++) {
            float x[16], bm = 0;
            for (int j = 0; j < 16; j++) {
                x[j] = to_f32(q->dt, q->src, (size_t)(r * q->k + b * 16 + j));
                if (fabsf(x[j]) > bm) bm = fabsf(x[j]);
            }
            uint8_t sc = to_e4m3(bm / 6.0f / q->scale2);
            q->scales[r * nb + b] = sc;
            float bs = fp8_e4m3_to_f32(sc) * q->scale2; /* the effective block scale */
            for (int j = 0; j < 16; j += 2) {
                uint8_t c[2];
                for (int h = 0; h < 2; h++) {
                    float v = bs > 0 ? x[j + h] / bs : 0.0f;
                    c[h] = e2m1_mag(fabsf(v)) | (v < 0 ? 8 : 0);
                }
                q->codes[r * (q->k / 2) + (b * 16 + j) / 2] = (uint8_t)(c[0] | (c[1] << 4));
            }
        }
    }
}

/* Quantize src [n, k] (row stride k) and add mod.{weight, weight_scale,
 * weight_scale_2, input_scale} to out. */
static int quantize_linear(st_set *out, const char *mod, st_dtype dt, const void *src, int64_t n, int64_t k,
                           ls_err *e) {
    qjob q = {dt, src, n, k, 0, NULL, NULL, NULL};
    q.amax_part = xmalloc(sizeof(float) * (n ? n : 1));
    pool_for(n, 16, amax_rows, &q);
    float amax = 0;
    for (int64_t r = 0; r < n; r++)
        if (q.amax_part[r] > amax || q.amax_part[r] != q.amax_part[r]) amax = q.amax_part[r];
    free(q.amax_part);
    if (!isfinite(amax)) return errf(e, ERR_INVAL, "%s.weight: holds NaN or Inf, cannot quantize", mod);
    q.scale2 = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
    q.codes = xmalloc((size_t)(n * k / 2) + 1);
    q.scales = xmalloc((size_t)(n * k / 16) + 1);
    pool_for(n, 16, quant_rows, &q);
    char nm[512];
    int64_t sh[2] = {n, k / 2};
    snprintf(nm, sizeof nm, "%s.weight", mod);
    int rc = st_add_owned(out, nm, ST_U8, 2, sh, q.codes, (size_t)(n * k / 2), e);
    sh[1] = k / 16;
    snprintf(nm, sizeof nm, "%s.weight_scale", mod);
    if (!rc) rc = st_add_owned(out, nm, ST_F8_E4M3, 2, sh, q.scales, (size_t)(n * k / 16), e);
    else free(q.scales);
    float *s2 = xmalloc(4), *is = xmalloc(4);
    *s2 = q.scale2;
    *is = 8.0f / (6.0f * 448.0f);
    snprintf(nm, sizeof nm, "%s.weight_scale_2", mod);
    if (!rc) rc = st_add_owned(out, nm, ST_F32, 0, NULL, s2, 4, e);
    else free(s2);
    snprintf(nm, sizeof nm, "%s.input_scale", mod);
    if (!rc) rc = st_add_owned(out, nm, ST_F32, 0, NULL, is, 4, e);
    else free(is);
    return rc;
}

/* ---- the command --------------------------------------------------------- */

static int excluded(const char *mod, char **pats, int npat) {
    for (int i = 0; i < npat; i++) {
        if (!fnmatch(pats[i], mod, 0)) return 1;
        /* "path" also covers "path.*" (vLLM's expansion of prefixes) */
        size_t l = strlen(pats[i]);
        if (!strncmp(mod, pats[i], l) && mod[l] == '.') return 1;
    }
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_float_dtype(st_dtype d) { return d == ST_BF16 || d == ST_F16 || d == ST_F32; }

static int copy_file(const char *from, const char *to, ls_err *e) {
    size_t n;
    char *d = read_file(from, &n, e);
    if (!d) return e->code;
    FILE *f = fopen(to, "wb");
    if (!f) { free(d); return errf(e, ERR_IO, "%s: %s", to, strerror(errno)); }
    int bad = fwrite(d, 1, n, f) != n;
    bad |= fclose(f) != 0;
    free(d);
    return bad ? errf(e, ERR_IO, "%s: write failed", to) : 0;
}

static int run(const char *in, const char *outdir, char **pats, int npat, ls_err *e) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", in);
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    if (!cfg) return errf(e, ERR_INVAL, "%s: %s (line %d)", p, je.text, je.line);
    if (!json_is_object(cfg)) { json_decref(cfg); return errf(e, ERR_INVAL, "%s: not a JSON object", p); }
    if (json_object_get(cfg, "quantization_config")) {
        json_decref(cfg);
        return errf(e, ERR_INVAL, "%s: quantization_config: the checkpoint is already quantized", p);
    }
    st_set *src;
    int rc = st_open_dir(in, &src, e);
    if (rc) { json_decref(cfg); return rc; }
    st_set *out = st_new();
    int nq = 0;
    for (int i = 0; i < st_count(src) && !rc; i++) {
        const st_tensor *t = st_get(src, i);
        char mod[512];
        if (t->dtype == ST_U8 || t->dtype == ST_F8_E4M3) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': %s, the checkpoint is already quantized", t->file, t->name,
                      st_dtype_name(t->dtype));
            break;
        }
        /* fused 3-D experts: split per expert */
        int gu = ends_with(t->name, "mlp.experts.gate_up_proj"), dn = ends_with(t->name, "mlp.experts.down_proj");
        if ((gu || dn) && t->ndim == 3 && is_float_dtype(t->dtype)) {
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - strlen(gu ? "gate_up_proj" : "down_proj")), t->name);
            int64_t E = t->shape[0], R = t->shape[1], C = t->shape[2];
            char probe[600];
            snprintf(probe, sizeof probe, "%s0.%s", mod, gu ? "gate_proj" : "down_proj");
            if (!excluded(probe, pats, npat) && C % 16 == 0 && (!gu || R % 2 == 0)) {
                size_t es = st_dtype_size(t->dtype);
                for (int64_t x = 0; x < E && !rc; x++) {
                    const char *base = (const char *)t->data + (size_t)(x * R * C) * es;
                    char m2[600];
                    if (gu) {
                        snprintf(m2, sizeof m2, "%s%lld.gate_proj", mod, (long long)x);
                        rc = quantize_linear(out, m2, t->dtype, base, R / 2, C, e);
                        snprintf(m2, sizeof m2, "%s%lld.up_proj", mod, (long long)x);
                        if (!rc) rc = quantize_linear(out, m2, t->dtype, base + (size_t)(R / 2 * C) * es, R / 2, C, e);
                    } else {
                        snprintf(m2, sizeof m2, "%s%lld.down_proj", mod, (long long)x);
                        rc = quantize_linear(out, m2, t->dtype, base, R, C, e);
                    }
                    nq++;
                }
                if (rc) err_prefix(e, "%s: tensor '%s'", t->file, t->name);
                continue;
            }
        }
        /* a 2-D linear weight */
        if (ends_with(t->name, ".weight") && t->ndim == 2 && is_float_dtype(t->dtype) && t->shape[1] % 16 == 0 &&
            t->shape[0] > 1) {
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - 7), t->name);
            if (!excluded(mod, pats, npat)) {
                rc = quantize_linear(out, mod, t->dtype, t->data, t->shape[0], t->shape[1], e);
                if (rc) err_prefix(e, "%s: tensor '%s'", t->file, t->name);
                nq++;
                continue;
            }
        }
        rc = st_add_ref(out, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, e);
    }
    if (!rc && !nq) rc = errf(e, ERR_INVAL, "%s: no linear weight to quantize (all excluded?)", in);
    if (!rc) rc = st_write_dir(out, outdir, (size_t)4 << 30, e);
    st_close(out);
    st_close(src);
    if (rc) { json_decref(cfg); return rc; }

    /* configs */
    json_t *ex = json_array();
    for (int i = 0; i < npat; i++) json_array_append_new(ex, json_string(pats[i]));
    json_t *prod = json_pack("{s:s,s:s}", "name", "modelopt", "version", "laststand-quantize");
    json_object_set_new(cfg, "quantization_config",
                        json_pack("{s:s,s:s,s:i,s:n,s:O,s:O}", "quant_method", "modelopt", "quant_algo", "NVFP4",
                                  "group_size", 16, "kv_cache_scheme", "ignore", ex, "producer", prod));
    json_t *hq = json_pack("{s:O,s:{s:s,s:n,s:i,s:O}}", "producer", prod, "quantization", "quant_algo", "NVFP4",
                           "kv_cache_quant_algo", "group_size", 16, "exclude_modules", ex);
    snprintf(p, sizeof p, "%s/config.json", outdir);
    if (json_dump_file(cfg, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)))
        rc = errf(e, ERR_IO, "%s: write failed", p);
    snprintf(p, sizeof p, "%s/hf_quant_config.json", outdir);
    if (!rc && json_dump_file(hq, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) rc = errf(e, ERR_IO, "%s: write failed", p);
    json_decref(hq);
    json_decref(ex);
    json_decref(prod);
    json_decref(cfg);
    if (rc) return rc;
    /* the other small files: tokenizer, template, generation config ... */
    DIR *d = opendir(in);
    if (!d) return errf(e, ERR_IO, "%s: %s", in, strerror(errno));
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.' || !strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json") ||
            ends_with(n, ".safetensors") || !strcmp(n, "model.safetensors.index.json"))
            continue;
        char from[4096], to[4096];
        snprintf(from, sizeof from, "%s/%s", in, n);
        snprintf(to, sizeof to, "%s/%s", outdir, n);
        struct stat st;
        if (stat(from, &st) || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) continue;
        rc = copy_file(from, to, e);
    }
    closedir(d);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    char *pats[MAX_EXCLUDE];
    int npat = 0;
    for (int i = 0; i < N_DEFAULT_EXCLUDE; i++) pats[npat++] = (char *)default_exclude[i];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--in") || !strcmp(a, "--out")) {
            if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) {
                fprintf(stderr, "laststand quantize: error: %s: needs a folder\n", a);
                return 2;
            }
            if (!strcmp(a, "--in")) in = argv[++i];
            else out = argv[++i];
        } else if (!strcmp(a, "--exclude")) {
            int got = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
                if (npat == MAX_EXCLUDE) {
                    fprintf(stderr, "laststand quantize: error: --exclude: more than %d patterns\n", MAX_EXCLUDE);
                    return 2;
                }
                pats[npat++] = argv[++i];
                got++;
            }
            if (!got) {
                fprintf(stderr, "laststand quantize: error: --exclude: needs at least one pattern\n");
                return 2;
            }
        } else {
            fprintf(stderr, "laststand quantize: error: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!in) { fprintf(stderr, "laststand quantize: error: --in: is required\n"); return 2; }
    if (!out) { fprintf(stderr, "laststand quantize: error: --out: is required\n"); return 2; }
    struct stat st;
    if (stat(in, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "laststand quantize: error: --in: %s is not a folder\n", in);
        return 2;
    }
    char rin[4096], rout[4096];
    if (realpath(in, rin) && realpath(out, rout) && !strcmp(rin, rout)) {
        fprintf(stderr, "laststand quantize: error: --out: must differ from --in\n");
        return 2;
    }
    if (!stat(out, &st) && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "laststand quantize: error: --out: %s exists and is not a folder\n", out);
        return 2;
    }
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "laststand quantize: error: --out: %s: %s\n", out, strerror(errno));
        return 2;
    }
    ls_err e = {0};
    double t0 = now_sec();
    int rc = run(in, out, pats, npat, &e);
    if (rc) {
        fprintf(stderr, "laststand quantize: error: %s\n", e.msg);
        return err_exit_code(rc);
    }
    fprintf(stderr, "laststand quantize: wrote %s in %.1f s\n", out, now_sec() - t0);
    return 0;
}
