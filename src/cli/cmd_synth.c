/* cmd_synth.c: `laststand synth --preset NAME --out DIR [--layers N] [--seed S]
 * [--quant nvfp4|nvfp4-fp8|bf16] [--mtp random|chain]`: write a random-weight checkpoint with a real
 * architecture's exact shapes and layout (src/model/synth.c). */
#include "cli/cli.h"
#include "base/base.h"
#include "model/synth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: laststand synth --preset NAME --out DIR [--layers N] [--seed S] [--quant nvfp4|nvfp4-fp8|bf16]\n"
            "                       [--mtp random|chain]\n"
            "\n"
            "Writes a random-weight checkpoint (config.json, safetensors, generation_config.json;\n"
            "hf_quant_config.json for nvfp4; tokenizer and chat template for the demo preset).\n"
            "\n"
            "  --preset NAME   demo, qwen3.5-397b-a17b, qwen3.5-122b-a10b, qwen3.5-35b-a3b,\n"
            "                  qwen3-next-80b-a3b, qwen3-30b-a3b, qwen3-235b-a22b\n"
            "  --out DIR       output folder (created if missing)\n"
            "  --layers N      number of layers (default: the preset's own)\n"
            "  --seed S        PRNG seed (default 0); same seed, same weights\n"
            "  --quant Q       nvfp4 (default for qwen3.5 presets), nvfp4-fp8 (NVFP4 experts, FP8 attention,\n"
            "                  GDN and shared expert: ModelOpt MIXED_PRECISION) or bf16 (default otherwise)\n"
            "  --mtp M         the hybrids' multi-token-prediction head (mtp.*): random (default) or chain\n"
            "                  (tests, benchmarks: its draft after token t is always the same token f(t),\n"
            "                  `laststand logits --mtp --chain N` lists f's chain)\n"
            "\n"
            "`--model-path synth:NAME[,layers=N][,seed=S][,quant=Q][,mtp=M]` builds the same weights in memory.\n");
}

static int bad_flag(const char *flag, const char *why) {
    fprintf(stderr, "laststand synth: error: %s: %s\n", flag, why);
    return 2;
}

static int parse_count(const char *s, unsigned long long max, unsigned long long *v) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end || x > max) return -1;
    *v = x;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *quant = NULL;
    int chain = 0;
    long long layers = -1;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (strncmp(a, "--", 2)) return bad_flag(a, "unexpected argument");
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--preset") || !strcmp(a, "--out") || !strcmp(a, "--layers") || !strcmp(a, "--seed") ||
            !strcmp(a, "--quant") || !strcmp(a, "--mtp")) {
            if (!v) return bad_flag(a, "needs a value");
            i++;
        }
        unsigned long long x;
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--quant")) {
            if (strcmp(v, "nvfp4") && strcmp(v, "nvfp4-fp8") && strcmp(v, "bf16"))
                return bad_flag(a, "must be nvfp4, nvfp4-fp8 or bf16");
            quant = v;
        } else if (!strcmp(a, "--mtp")) {
            if (strcmp(v, "random") && strcmp(v, "chain")) return bad_flag(a, "must be random or chain");
            chain = !strcmp(v, "chain");
        } else if (!strcmp(a, "--layers")) {
            if (parse_count(v, 512, &x) || x < 1) return bad_flag(a, "must be a layer count in [1, 512]");
            layers = (long long)x;
        } else if (!strcmp(a, "--seed")) {
            if (parse_count(v, UINT64_MAX, &x)) return bad_flag(a, "must be a non-negative integer");
            seed = x;
        } else {
            fprintf(stderr, "laststand synth: error: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!preset) return bad_flag("--preset", "is required");
    if (!out) return bad_flag("--out", "is required");
    struct stat st;
    if (!stat(out, &st) && !S_ISDIR(st.st_mode)) return bad_flag("--out", "exists and is not a folder");
    /* validate the preset name through the spec parser (one list of presets) */
    synth_opts o;
    ls_err e = {0};
    if (synth_parse_spec(preset, &o, &e) || strchr(preset, ','))
        return bad_flag("--preset", strchr(preset, ',') ? "takes a bare preset name" : e.msg);
    o.layers = layers > 0 ? (int)layers : 0;
    o.seed = seed;
    o.quant = quant;
    o.mtp_chain = chain;
    double t0 = now_sec();
    int rc = synth_write(&o, out, &e);
    if (rc) {
        fprintf(stderr, "laststand synth: error: %s\n", e.msg);
        return err_exit_code(rc);
    }
    fprintf(stderr, "laststand synth: wrote %s (preset %s) in %.1f s\n", out, o.preset, now_sec() - t0);
    return 0;
}
