/* cmd_doctor.c: `laststand doctor [--model-path DIR | --shapes PRESET] [--device cpu|cuda]
 * [--json FILE]`: the backend elimination of DESIGN.md section 4 (src/doctor).
 * The hidden form `laststand doctor --trial ...` is the child process the
 * doctor runs each backend in.
 * Exit: 0 every bucket has a correct backend; 1 some bucket has none, or the
 * device cannot be used (no GPU: the CUDA error is printed); 2 bad flags.
 */
#include "cli/cli.h"
#include "doctor/doctor.h"
#include "model/model.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: laststand doctor [--model-path DIR|synth:NAME | --shapes PRESET] [--device cpu|cuda]\n"
            "                        [--json FILE] [--families LIST] [--backends LIST] [--m LIST]\n"
            "                        [--fp4-shapes NxK,...] [--trial-timeout S] [--use-cache] [--seed N]\n"
            "                        [--mamba-ssm-dtype auto|float32|bfloat16]\n"
            "  --shapes PRESET   qwen3.5-397b-a17b, qwen3.5-122b-a10b, qwen3.5-35b-a3b, qwen3-next-80b-a3b,\n"
            "                    qwen3-30b-a3b, qwen3-235b-a22b (the real models' op shapes, no weights needed)\n"
            "  --families LIST   of fp4_gemm,gemm,moe,attention,gdn,lm_head (default: all the model has;\n"
            "                    lm_head: the vocab projection's own gemm row group and choice)\n"
            "  --m LIST          batch-size buckets (default 1,2,4,...,2048,3072,4096,8192)\n"
            "  --fp4-shapes      test fp4_gemm on these [N x K] weights instead of the model's\n"
            "  --use-cache       print the cached decision for this GPU, driver, build and shapes if any\n"
            "  --mamba-ssm-dtype the GDN state storage the gdn trials run on (default: the model's config)\n"
            "The matrix goes to stdout, progress to stderr. Exit 0: a correct backend for every bucket.\n");
}

int cmd_doctor(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--trial")) return doctor_trial_main(argc, argv);
    doctor_opts o;
    memset(&o, 0, sizeof o);
    doctor_default_ms(&o);
    o.trial_timeout_s = 60;
    o.seed = 1;
    const char *model = NULL, *preset = NULL, *fp4_shapes = NULL, *device = NULL, *ssm = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--use-cache")) {
            o.use_cache = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "laststand doctor: error: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model-path")) model = v;
        else if (!strcmp(a, "--shapes")) preset = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--json")) o.json_path = v;
        else if (!strcmp(a, "--families")) o.families = v;
        else if (!strcmp(a, "--backends")) o.backends = v;
        else if (!strcmp(a, "--fp4-shapes")) fp4_shapes = v;
        else if (!strcmp(a, "--mamba-ssm-dtype")) ssm = v;
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--trial-timeout")) {
            o.trial_timeout_s = atof(v);
            if (o.trial_timeout_s <= 0) {
                fprintf(stderr, "laststand doctor: error: --trial-timeout: '%s' is not a positive number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--m")) {
            int32_t *ms = NULL;
            int n = parse_int_list(v, &ms);
            if (n <= 0 || n > DOC_MAX_M) {
                fprintf(stderr, "laststand doctor: error: --m: '%s' is not a list of 1..%d batch sizes\n", v, DOC_MAX_M);
                free(ms);
                return 2;
            }
            for (int k = 0; k < n; k++) {
                if (ms[k] <= 0 || ms[k] > 65536) {
                    fprintf(stderr, "laststand doctor: error: --m: %d is not in 1..65536\n", ms[k]);
                    free(ms);
                    return 2;
                }
                o.ms[k] = ms[k];
            }
            o.n_ms = n;
            free(ms);
        } else {
            fprintf(stderr, "laststand doctor: error: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!!model == !!preset) {
        fprintf(stderr, "laststand doctor: error: give exactly one of --model-path and --shapes\n");
        return 2;
    }
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "laststand doctor: error: --device: '%s' is not cpu or cuda\n", device);
        return 2;
    }
    if (!device) {
        device = "cpu";
#ifdef LS_HAVE_CUDA
        ls_err ce = {0};
        if (lsc_device_count(&ce) > 0) device = "cuda";
#endif
    }
    o.device = device;
    static char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "laststand doctor: error: cannot find my own binary (/proc/self/exe)\n");
        return 1;
    }
    exe[n] = 0;
    o.self_exe = exe;

    ls_err e = {0};
    doc_shapes s;
    int rc = model ? doc_shapes_from_model(model, &s, &e) : doc_shapes_from_preset(preset, &s, &e);
    if (!rc && fp4_shapes) rc = doc_shapes_set_fp4(&s, fp4_shapes, &e);
    if (rc) {
        fprintf(stderr, "laststand doctor: error: %s\n", e.msg);
        return 2;
    }
    const int sbf = model_ssm_dtype(ssm, s.state_bf16); /* the gdn trials on the storage serve would run */
    if (sbf < 0) {
        fprintf(stderr, "laststand doctor: error: --mamba-ssm-dtype: '%s' is not float32, bfloat16 or auto\n", ssm);
        return 2;
    }
    s.state_bf16 = sbf;
    rc = doctor_run(&o, &s, &e);
    if (rc < 0) {
        fprintf(stderr, "laststand doctor: error: %s\n", e.msg);
        return err_exit_code(rc) == 2 ? 2 : 1;
    }
    return rc;
}
