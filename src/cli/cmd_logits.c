/* cmd_logits.c: `laststand logits --model-path DIR --ids 1,2,3 [--device cpu|cuda]
 * [--moe-runner-backend NAME] [--fp4-gemm-backend NAME] [--attention-backend NAME]
 * [--gdn-backend NAME] [--gemm-backend NAME] [--lm-head-backend NAME] [--mtp]`: one forward pass over the ids, the fp32 logits of every
 * position as JSON {"shape":[T,V],"logits":[[...],...]} (%.9g: exact floats). --mtp: the checkpoint's
 * multi-token-prediction head's instead, T - 1 rows, row i predicting id i + 2 from the model's
 * hidden state at i and id i + 1 (what MTP drafts are made from).
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
               "         [--lm-head-backend NAME] [--mamba-ssm-dtype auto|float32|bfloat16] [--mtp]\n"
               "         (a backend flag takes auto, a NAME or a plan NAME:MAXM,...,NAME)\n");
}

/* JSON number for a float; NaN/Inf as Python's json module writes them. */
static void put_float(FILE *f, float v) {
    if (isnan(v)) fputs("NaN", f);
    else if (isinf(v)) fputs(v > 0 ? "Infinity" : "-Infinity", f);
    else fprintf(f, "%.9g", v);
}

int cmd_logits(int argc, char **argv) {
    const char *path = NULL, *ids_s = NULL, *tp_s = "1";
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
