/* cmd_logits.c: `laststand logits --model-path DIR --ids 1,2,3 [--device cpu|cuda]
 * [--moe-runner-backend NAME] [--fp4-gemm-backend NAME] [--attention-backend NAME]
 * [--gdn-backend NAME] [--gemm-backend NAME] [--lm-head-backend NAME] [--mtp]`: one forward pass over the ids, the fp32 logits of every
 * position as JSON {"shape":[T,V],"logits":[[...],...]} (%.9g: exact floats). --mtp: the checkpoint's
 * multi-token-prediction head's instead, T - 1 rows, row i predicting id i + 2 from the model's
 * hidden state at i and id i + 1 (what MTP drafts are made from). --mtp --chain N: instead, the head's
 * greedy chain from the last id, {"chain":[t1..tN]}: t(k+1) = the argmax of the head's row for
 * (ids[0], next id tk): a synth mtp=chain head's f (tests and benchmarks force outputs along it);
 * --chain-deviate Q: every Q-th id of the chain is a pseudo-random one instead (seeded, the chain
 * goes on from it), for outputs whose drafts are accepted in part.
 * Exit codes: 0 ok, 2 bad flag/value or unloadable model, 1 runtime failure.
 */
#include "cli/cli.h"
#include "cli/serve_auto.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand logits --model-path DIR --ids 1,2,3 [--device cpu|cuda] [--tp N]\n"
               "         [--moe-runner-backend NAME] [--fp4-gemm-backend NAME]\n"
               "         [--attention-backend NAME] [--gdn-backend NAME] [--gemm-backend NAME]\n"
               "         [--lm-head-backend NAME] [--mamba-ssm-dtype auto|float32|bfloat16]\n"
               "         [--mtp [--chain N [--chain-deviate Q]]]\n"
               "         (a backend flag takes auto, a NAME or a plan NAME:MAXM,...,NAME)\n");
}

/* JSON number for a float; NaN/Inf as Python's json module writes them. */
static void put_float(FILE *f, float v) {
    if (isnan(v)) fputs("NaN", f);
    else if (isinf(v)) fputs(v > 0 ? "Infinity" : "-Infinity", f);
    else fprintf(f, "%.9g", v);
}

int cmd_logits(int argc, char **argv) {
    const char *path = NULL, *ids_s = NULL, *tp_s = "1", *chain_s = NULL, *dev_s = NULL;
    model_opts o = {.device = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--mtp")) { o.mtp = 1; continue; }
        const int fam = serve_auto_flag_family(a); /* a backend flag */
        const char **dst = fam >= 0 ? serve_auto_model_name(&o, fam)
                         : !strcmp(a, "--model-path") ? &path
                         : !strcmp(a, "--ids") ? &ids_s
                         : !strcmp(a, "--device") ? &o.device
                         : !strcmp(a, "--mamba-ssm-dtype") ? &o.mamba_ssm_dtype
                         : !strcmp(a, "--chain") ? &chain_s
                         : !strcmp(a, "--chain-deviate") ? &dev_s
                         : !strcmp(a, "--tp") ? &tp_s : NULL;
        if (!dst) {
            fprintf(stderr, "laststand logits: error: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "laststand logits: error: flag '%s' needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!path) { fprintf(stderr, "laststand logits: error: --model-path is required\n"); return 2; }
    char *tp_end;
    long tp = strtol(tp_s, &tp_end, 10);
    if (*tp_end || tp_end == tp_s || tp < 1 || tp > 16) {
        fprintf(stderr, "laststand logits: error: --tp: expected an integer in [1, 16], got '%s'\n", tp_s);
        return 2;
    }
    o.tp = (int)tp;
    long chain = 0;
    if (chain_s) {
        chain = strtol(chain_s, &tp_end, 10);
        if (*tp_end || tp_end == chain_s || chain < 1 || chain > 1000000 || !o.mtp) {
            fprintf(stderr, "laststand logits: error: --chain: expected a count in [1, 1000000] with --mtp, got '%s'%s\n",
                    chain_s, o.mtp ? "" : " without --mtp");
            return 2;
        }
    }
    long deviate = 0;
    if (dev_s) {
        deviate = strtol(dev_s, &tp_end, 10);
        if (*tp_end || tp_end == dev_s || deviate < 2 || !chain) {
            fprintf(stderr, "laststand logits: error: --chain-deviate: expected a period >= 2 with --chain, got '%s'\n",
                    dev_s);
            return 2;
        }
    }
    if (!ids_s) { fprintf(stderr, "laststand logits: error: --ids is required\n"); return 2; }
    int32_t *ids = NULL;
    int n = parse_int_list(ids_s, &ids);
    if (n <= 0) {
        fprintf(stderr, "laststand logits: error: --ids: expected a comma-separated list of token ids, got '%s'\n", ids_s);
        free(ids);
        return 2;
    }
    ls_err e = {0};
    model *m = NULL;
    int rc = model_open(path, &o, &m, &e);
    if (rc) {
        fprintf(stderr, "laststand logits: error: %s\n", e.msg);
        free(ids);
        /* a bad model or flag is 2; what this machine or build cannot do (no GPU, no
         * memory) is 1, as generate */
        return rc == ERR_UNSUPPORTED || rc == ERR_RUNTIME || rc == ERR_NOMEM ? 1 : 2;
    }
    const int V = model_cfg(m)->vocab;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "laststand logits: error: --ids: token id %d is outside the vocabulary [0, %d)\n",
                    ids[i], V);
            model_close(m);
            free(ids);
            return 2;
        }
    float *lg = NULL;
    if (chain) { /* the head's greedy chain from the last id */
        int32_t pair[2] = {ids[0], ids[n - 1]};
        uint64_t x = 88172645463325252ull; /* the deviations' xorshift64 */
        printf("{\"chain\":[");
        for (long k = 0; k < chain && !rc; k++) {
            int32_t best = 0;
            if (deviate && k % deviate == deviate - 1) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                best = (int32_t)(x % (uint64_t)(V > 2000 ? V - 1000 : V)) + (V > 2000 ? 1000 : 0);
            } else {
                if ((rc = model_mtp_logits_all(m, pair, 2, &lg, &e))) break;
                for (int v = 1; v < V; v++)
                    if (lg[v] > lg[best]) best = v;
                free(lg);
                lg = NULL;
            }
            printf(k ? ",%d" : "%d", best);
            pair[1] = best;
        }
        puts("]}");
        if (rc) fprintf(stderr, "laststand logits: error: %s\n", e.msg);
        model_close(m);
        free(ids);
        return rc ? err_exit_code(rc) : fflush(stdout) ? 1 : 0;
    }
    rc = o.mtp ? model_mtp_logits_all(m, ids, n, &lg, &e) : model_logits_all(m, ids, n, &lg, &e);
    if (o.mtp) n--;
    if (rc) {
        fprintf(stderr, "laststand logits: error: %s\n", e.msg);
        model_close(m);
        free(ids);
        return err_exit_code(rc);
    }
    printf("{\"shape\":[%d,%d],\"logits\":[", n, V);
    for (int t = 0; t < n; t++) {
        fputs(t ? ",[" : "[", stdout);
        for (int v = 0; v < V; v++) {
            if (v) putchar(',');
            put_float(stdout, lg[(size_t)t * V + v]);
        }
        putchar(']');
    }
    puts("]}");
    free(lg);
    model_close(m);
    free(ids);
    return fflush(stdout) ? 1 : 0;
}
