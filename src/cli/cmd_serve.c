/* cmd_serve.c: `laststand serve`, the OpenAI-compatible server (DESIGN.md 1, 6).
 *
 * Flags keep SGLang's names so an SGLang launch line works with the program
 * name changed. Every flag is checked before anything loads: an unknown flag
 * or a bad value exits 2 naming it. Without --model-path the built-in demo
 * model is served: built once with `laststand synth --preset demo` into
 * $XDG_CACHE_HOME/laststand/demo-model (or ~/.cache/...), or built in
 * memory (synth:demo) when no cache folder can be written.
 */
#include "cli/cli.h"
#include "base/base.h"
#include "laststand.h"
#include "server/server.h"
#include "cli/serve_auto.h"
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { F_STR, F_INT, F_FLOAT, F_BOOL };

typedef struct flag {
    const char *name;
    int type;
    void *ptr;
    const char *help;
    const char *const *choices; /* NULL-terminated allowed values (F_STR) */
} flag;

static const char *const BACKENDS_ANY[] = {NULL};
static const char *const REASONING[] = {"qwen3", "qwen3-thinking", NULL};
static const char *const TOOLPARSERS[] = {"qwen3_coder", "qwen25", NULL};
static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};
static const char *const LEVELS[] = {"debug", "info", "warning", "error", NULL};
static const char *const SAMPLING_DEFAULTS[] = {"model", "openai", NULL};
static const char *const SAMPLERS[] = {"auto", "host", "device", NULL};
static const char *const ONOFF[] = {"on", "off", NULL};
static const char *const SSM_DTYPES[] = {"auto", "float32", "bfloat16", NULL};
static const char *const QUANTS[] = {"auto", "modelopt_fp4", "nvfp4", "modelopt", "modelopt_fp8",
                                     "modelopt_mixed", "fp8", "bf16", "none", NULL};

typedef struct serve_args {
    const char *model_path, *tokenizer_path, *served_model_name, *host, *quantization;
    const char *backend[SA_NFAM]; /* by SA_*: --fp4-gemm-backend, --moe-runner-backend, ... (serve_auto.h) */
    const char *reasoning_parser, *tool_call_parser, *api_key, *chat_template, *log_level;
    const char *dist_init_addr, *device, *sampling_defaults, *sampling_backend;
    long long cuda_graph_max_bs;
    int disable_cuda_graph;
    long long tp, port, max_running_requests, context_length, chunked_prefill_size, nnodes, node_rank;
    long long responses_store_mb;
    long long max_connections, max_body_mb, timeout_keep_alive, max_total_tokens, max_queued_requests;
    double mem_fraction_static, doctor_timeout;
    const char *doctor_buckets;
    const char *prefix_cache, *mamba_ssm_dtype;
    long long prefix_snapshots, page_size;
    const char *spec_algo;
    long long spec_n, spec_w0, spec_w1, spec_max_bs, spec_steps, spec_topk;
    int trust_backend, disable_custom_all_reduce, enable_metrics, trust_remote_code, disable_radix_cache;
    int dry_run;
    double dry_run_gpu_gib;
} serve_args;

static void usage(const flag *flags, int n) {
    fprintf(stdout, "usage: laststand serve [flags]\n\n");
    for (int i = 0; i < n; i++)
        fprintf(stdout, "  --%-28s %s\n", flags[i].name, flags[i].help);
    fprintf(stdout,
            "\nBackend plans: a backend flag takes auto, one backend NAME, or a plan of backends by batch size,\n"
            "NAME:MAXM,...,NAME: a call of M tokens runs on the first entry with M <= MAXM, the last entry (no\n"
            "bound) takes every larger M. Bounds increase; M is the rows of a GEMM, the tokens of a MoE call, and\n"
            "the new tokens of the whole step for attention and gdn. Example:\n"
            "  --gdn-backend cuda_recurrent:8,cuda_chunked --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm\n"
            "  --gemm-backend cuda_gemv:8,cuda_cublaslt --lm-head-backend cuda_cublaslt\n"
            "The lm_head (the vocab projection, M = the rows that want logits) has a plan of its own, from the\n"
            "doctor's \"lm_head\" rows: its weight is far larger than the projections', so its best backend at\n"
            "small M may differ from theirs.\n"
            "With auto, serve builds each family's plan from the doctor's per-bucket choices (--doctor-buckets),\n"
            "validates it in the smoke test (the model's first layers, 2 of each layer kind; prefill chunks and\n"
            "decode steps run every entry) and prints it in the \"last backend standing\" table. A named\n"
            "backend or plan is validated too and refused if it fails (unless --trust-backend).\n");
}

static int parse_flag(const flag *f, const char *v) {
    char *end;
    switch (f->type) {
    case F_STR:
        if (f->choices && f->choices[0]) {
            int ok = 0;
            for (int i = 0; f->choices[i]; i++) ok |= !strcmp(v, f->choices[i]);
            if (!ok) {
                fprintf(stderr, "laststand serve: error: --%s: '%s' is not one of:", f->name, v);
                for (int i = 0; f->choices[i]; i++) fprintf(stderr, " %s", f->choices[i]);
                fprintf(stderr, "\n");
                return -1;
            }
        }
        *(const char **)f->ptr = v;
        return 0;
    case F_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "laststand serve: error: --%s: expected an integer, got '%s'\n", f->name, v);
            return -1;
        }
        *(long long *)f->ptr = x;
        return 0;
    }
    case F_FLOAT: {
        double x = strtod(v, &end);
        if (end == v || *end) {
            fprintf(stderr, "laststand serve: error: --%s: expected a number, got '%s'\n", f->name, v);
            return -1;
        }
        *(double *)f->ptr = x;
        return 0;
    }
    }
    return -1;
}

/* ---- the demo model ---------------------------------------------------------------- */

static int file_exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static int mkdirs(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; if (mkdir(tmp, 0755) && errno != EEXIST) return -1; *p = '/'; }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* Returns a malloc'd model path: the cached demo folder, or "synth:demo". */
static char *demo_model_path(void) {
    char dir[PATH_MAX];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/laststand/demo-model", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/laststand/demo-model", home);
    else return xstrdup("synth:demo");
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (file_exists(cfg)) return xstrdup(dir);
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", dir, (int)getpid());
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || mkdirs(parent)) {
        log_warn("cannot write %s; serving the demo model built in memory (synth:demo)", dir);
        return xstrdup("synth:demo");
    }
    self[n] = 0;
    log_info("building the demo model into %s (once)", dir);
    char *argv[] = {self, "synth", "--preset", "demo", "--out", tmp, NULL};
    pid_t pid;
    int st = 0;
    if (posix_spawn(&pid, self, NULL, NULL, argv, environ) || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0 || rename(tmp, dir)) {
        log_warn("building the demo model into %s failed; serving synth:demo from memory", dir);
        return xstrdup("synth:demo");
    }
    return xstrdup(dir);
}

/* ---- --dry-run: the memory plan ----------------------------------------------------- */

/* The engine's sizing (engine.c) replayed per GPU on a GPU of a->dry_run_gpu_gib: the weights
 * (model_mem_plan), the GDN state slots of the running requests, a tenth of the rest for prefix
 * snapshots, the KV pool from what remains. Prints the plan; 0, or 2 with the reason when the
 * model cannot be planned, 1 when it does not fit. */
static int dry_run(const serve_args *a) {
    const char *path = a->model_path ? a->model_path : "synth:demo";
    const int tp = a->tp > 1 ? (int)a->tp : 1;
    const int cpu = !strcmp(a->device, "cpu");
    model_opts mo = {.device = cpu ? "cpu" : "cuda", .tp = tp, .mamba_ssm_dtype = a->mamba_ssm_dtype,
                     .mtp = ls_spec_algo_is_mtp(a->spec_algo)};
    model_mem_plan p;
    ls_err e = {0};
    if (model_mem_plan_get(path, &mo, &p, &e)) {
        fprintf(stderr, "laststand serve: error: --dry-run: %s\n", e.msg);
        return 2;
    }
    const double GiB = 1073741824.0, gpu = (a->dry_run_gpu_gib > 0 ? a->dry_run_gpu_gib : 140.4) * GiB;
    const double frac = a->mem_fraction_static > 0 ? a->mem_fraction_static : 0.88;
    const double ctx_overhead = 0.6 * GiB; /* CUDA context, cuBLASLt, NCCL buffers (measured ~0.5 GiB) */
    printf("memory plan: %s, --tp %d on %s (from the config and tensor headers; nothing loaded)\n", path, tp,
           cpu ? "the CPU" : "CUDA");
    printf("  checkpoint: %d layers%s, %.1f GB of tensors (the largest layer %.2f GB, outside the layers %.2f GB)\n",
           p.n_layers, p.n_layers < p.n_layers_ckpt ? " (cut)" : "", p.total_bytes / 1e9, p.largest_layer / 1e9,
           p.host_globals / 1e9);
    printf("  weights per GPU: %.2f GiB (%.2f GiB of them on every GPU: embedding, lm_head, norms, router)\n",
           p.gpu_weights / GiB, p.gpu_replicated / GiB);
    printf("  host memory for the weights while loading: ~%.1f GB (streamed: %s)\n", p.host_peak / 1e9,
           cpu && tp == 1 ? "no, the CPU keeps the checkpoint" : "one layer at a time");
    if (cpu) return 0;
    const double caches = frac * gpu - p.gpu_weights - ctx_overhead;
    const int max_run = a->max_running_requests > 0 ? (int)a->max_running_requests
                                                    : model_auto_max_running(caches, p.slot_bytes);
    const double slots = (double)max_run * p.slot_bytes;
    double left = caches - slots - (p.slot_bytes + 16 * p.kv_token_bytes);
    double snaps = 0;
    if (p.slot_bytes > 0 && left > 0) {
        double n = floor(0.1 * left / p.slot_bytes);
        if (n > 2.0 * max_run) n = 2.0 * max_run;
        snaps = n * p.slot_bytes;
        left -= snaps;
    }
    const double tokens = p.kv_token_bytes > 0 && left > 0 ? floor(left / p.kv_token_bytes) : 0;
    printf("  on a GPU of %.1f GiB at --mem-fraction-static %.2f: %.2f GiB for the caches after the weights and "
           "~%.1f GiB of context\n", gpu / GiB, frac, caches / GiB, ctx_overhead / GiB);
    printf("    GDN state: %.1f MiB a slot; %d running requests%s: %.2f GiB; prefix snapshots: %.2f GiB\n",
           p.slot_bytes / 1048576.0, max_run, a->max_running_requests > 0 ? "" : " (--max-running-requests auto)",
           slots / GiB, snaps / GiB);
    printf("    KV cache: %.1f KiB a token: %.0f tokens fit in the remaining %.2f GiB\n", p.kv_token_bytes / 1024.0,
           tokens, left > 0 ? left / GiB : 0.0);
    const int ctx = a->context_length > 0 ? (int)a->context_length : 0;
    if (p.gpu_weights + GiB > gpu) {
        printf("  verdict: DOES NOT FIT: %.2f GiB of weights per GPU on a %.1f GiB GPU (use a larger --tp)\n",
               p.gpu_weights / GiB, gpu / GiB);
        return 1;
    }
    if (tokens < 32 || (ctx && tokens < ctx)) {
        printf("  verdict: the weights fit, the caches do not (%.0f KV tokens%s): raise --mem-fraction-static, lower "
               "--max-running-requests or --context-length\n", tokens, ctx ? " for one --context-length sequence" : "");
        return 1;
    }
    printf("  verdict: fits (the engine sizes the caches from each GPU's measured free memory at start-up)\n");
    return 0;
}

/* ---- serve ------------------------------------------------------------------------- */

int cmd_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--smoke-trial")) return serve_smoke_child_main(argc, argv);
    serve_args a = {0};
    a.host = "127.0.0.1";
    a.port = 30000;
    a.tp = 1;
    a.log_level = "info";
    a.device = "auto";
    a.quantization = "auto";
    a.sampling_defaults = "model";
    a.max_connections = 512;
    a.max_body_mb = 32;
    a.responses_store_mb = 256;
    a.timeout_keep_alive = 600;
    a.nnodes = 1;
    a.chunked_prefill_size = -2; /* unset */
    a.prefix_snapshots = -2;     /* unset: auto */
    a.page_size = -2;            /* unset: 16 */
    const flag flags[] = {
        {"model-path", F_STR, &a.model_path, "model folder or synth:NAME[,layers=N] (default: the demo model)", NULL},
        {"tokenizer-path", F_STR, &a.tokenizer_path, "tokenizer folder (default: the model folder)", NULL},
        {"served-model-name", F_STR, &a.served_model_name, "model name in the API (default: the model path)", NULL},
        {"tp", F_INT, &a.tp, "tensor-parallel size (default 1)", NULL},
        {"tp-size", F_INT, &a.tp, "alias of --tp", NULL},
        {"host", F_STR, &a.host, "address to bind (default 127.0.0.1)", NULL},
        {"port", F_INT, &a.port, "port (default 30000)", NULL},
        {"quantization", F_STR, &a.quantization, "checkpoint quantization (modelopt_fp4, modelopt_fp8, modelopt_mixed, fp8, bf16; each linear is read as its tensors are stored)", QUANTS},
        {"attention-backend", F_STR, &a.backend[SA_ATTENTION],
         "attention backend: auto (default: the doctor's fastest per batch size), NAME, or a plan (below)", BACKENDS_ANY},
        {"moe-runner-backend", F_STR, &a.backend[SA_MOE], "MoE backend: auto (default), NAME or a plan", BACKENDS_ANY},
        {"fp4-gemm-backend", F_STR, &a.backend[SA_FP4_GEMM], "NVFP4 GEMM backend: auto (default), NAME or a plan", BACKENDS_ANY},
        {"gemm-backend", F_STR, &a.backend[SA_GEMM],
         "BF16 GEMM backend (cuda_cublaslt, cuda_gemv, ...): auto (default), NAME or a plan", BACKENDS_ANY},
        {"gdn-backend", F_STR, &a.backend[SA_GDN], "Gated DeltaNet backend: auto (default), NAME or a plan", BACKENDS_ANY},
        {"lm-head-backend", F_STR, &a.backend[SA_LM_HEAD],
         "the lm_head's own BF16 GEMM backend (gemm backends; M = rows that want logits): auto (default: the "
         "doctor's fastest on the lm_head's shape), NAME or a plan", BACKENDS_ANY},
        {"trust-backend", F_BOOL, &a.trust_backend, "serve with named backends even if validation fails", NULL},
        {"doctor-timeout", F_FLOAT, &a.doctor_timeout,
         "seconds per doctor trial and per smoke-test run at start-up (default 20 on the CPU, 120 on CUDA)", NULL},
        {"doctor-buckets", F_STR, &a.doctor_buckets,
         "batch sizes the start-up doctor checks (default 1,16 on the CPU, 1,2,4,8,16,64,512,2048 on CUDA)", NULL},
        {"reasoning-parser", F_STR, &a.reasoning_parser, "split reasoning_content: qwen3", REASONING},
        {"tool-call-parser", F_STR, &a.tool_call_parser, "parse tool calls: qwen3_coder | qwen25", TOOLPARSERS},
        {"disable-custom-all-reduce", F_BOOL, &a.disable_custom_all_reduce, "accepted (NCCL is the all-reduce)", NULL},
        {"enable-metrics", F_BOOL, &a.enable_metrics, "accepted (/metrics is always on)", NULL},
        {"trust-remote-code", F_BOOL, &a.trust_remote_code, "accepted (no model code is ever run)", NULL},
        {"prefix-cache", F_STR, &a.prefix_cache,
         "automatic prefix caching: on | off (default: on). Full KV pages "
         "are shared by hash of their token run; GDN models also need state snapshots", ONOFF},
        {"prefix-snapshots", F_INT, &a.prefix_snapshots,
         "GDN state snapshot slots of the prefix cache (GDN models: a hit is usable up to a page boundary holding "
         "one; default: a tenth of the cache memory, at most 2 x --max-running-requests; 0: none)", NULL},
        {"mamba-ssm-dtype", F_STR, &a.mamba_ssm_dtype,
         "GDN recurrent state storage: float32 or bfloat16 (half the state memory and bytes a step; the state "
         "rounded to BF16 once a step), default: the config's mamba_ssm_dtype", SSM_DTYPES},
        {"speculative-algorithm", F_STR, &a.spec_algo,
         "speculative decoding: none (default) | ngram (drafts by prompt lookup: the tokens that followed the latest "
         "earlier occurrence of the last n tokens) | mtp, also EAGLE or NEXTN (the checkpoint's own multi-token-"
         "prediction head drafts: Qwen3.5, Qwen3-Next); drafts are verified in one step, outputs are unchanged",
         BACKENDS_ANY},
        {"speculative-num-steps", F_INT, &a.spec_steps,
         "SGLang's draft chain length: the drafts a request proposes per step (num-draft-tokens = steps + 1 when "
         "that is not given)", NULL},
        {"speculative-eagle-topk", F_INT, &a.spec_topk, "SGLang's draft tree width: 1 (a chain) is what runs", NULL},
        {"speculative-num-draft-tokens", F_INT, &a.spec_n,
         "tokens a request verifies per step, its last accepted token included (default 4: 3 drafts; at most 5 on "
         "models with GDN layers, each draft holding a spare GDN state slot)", NULL},
        {"speculative-ngram-min-match-window-size", F_INT, &a.spec_w0, "ngram: the shortest suffix looked up (default 2)", NULL},
        {"speculative-ngram-max-match-window-size", F_INT, &a.spec_w1, "ngram: the longest suffix looked up, tried first (default 12)", NULL},
        {"speculative-max-batch", F_INT, &a.spec_max_bs,
         "no drafts while more requests than this run (default 16: drafted steps run without CUDA graphs)", NULL},
        {"disable-radix-cache", F_BOOL, &a.disable_radix_cache, "same as --prefix-cache off (SGLang's name)", NULL},
        {"mem-fraction-static", F_FLOAT, &a.mem_fraction_static, "memory fraction for weights and KV cache", NULL},
        {"max-running-requests", F_INT, &a.max_running_requests,
         "running batch cap (default: on a GPU as many as the GDN state of a quarter of the cache memory holds, at most 256; CPU 64)", NULL},
        {"max-queued-requests", F_INT, &a.max_queued_requests, "requests waiting for admission before 503 (default 1024)", NULL},
        {"max-total-tokens", F_INT, &a.max_total_tokens, "KV-cache size in tokens (default: from memory)", NULL},
        {"page-size", F_INT, &a.page_size, "KV-cache tokens per page, the prefix cache's unit (default 16)", NULL},
        {"context-length", F_INT, &a.context_length, "context length (default: the model's)", NULL},
        {"chunked-prefill-size", F_INT, &a.chunked_prefill_size, "prefill token budget per step (default 8192, -1: off)", NULL},
        {"api-key", F_STR, &a.api_key, "require 'Authorization: Bearer KEY' (all routes but /health)", NULL},
        {"chat-template", F_STR, &a.chat_template, "Jinja chat template file overriding the model's", NULL},
        {"log-level", F_STR, &a.log_level, "debug | info | warning | error", LEVELS},
        {"nnodes", F_INT, &a.nnodes, "nodes (multi-node serving is not supported yet: 1)", NULL},
        {"node-rank", F_INT, &a.node_rank, "this node's rank (accepted)", NULL},
        {"dist-init-addr", F_STR, &a.dist_init_addr, "rank 0 address host:port (accepted)", NULL},
        {"device", F_STR, &a.device, "auto | cpu | cuda", DEVICES},
        {"sampling-defaults", F_STR, &a.sampling_defaults,
         "model: omitted temperature/top_p/top_k/min_p/repetition_penalty come from generation_config.json (default); "
         "openai: 1.0 / 1.0 / off / 0 / 1.0", SAMPLING_DEFAULTS},
        {"sampling-backend", F_STR, &a.sampling_backend,
         "where tokens are sampled: device (on the GPU, inside the step; needed for CUDA graphs) | host | "
         "auto (default: device on a GPU, host on the CPU)", SAMPLERS},
        {"disable-cuda-graph", F_BOOL, &a.disable_cuda_graph,
         "run decode steps eagerly instead of replaying CUDA graphs per batch-size bucket", NULL},
        {"cuda-graph-max-bs", F_INT, &a.cuda_graph_max_bs,
         "largest decode batch captured as a CUDA graph (default: --max-running-requests)", NULL},
        {"dry-run", F_BOOL, &a.dry_run,
         "print the memory plan per GPU (weights, GDN state slots, KV tokens that fit, host memory while loading) "
         "from the model's config and tensor headers alone, then exit: nothing is loaded, no GPU is needed", NULL},
        {"dry-run-gpu-gib", F_FLOAT, &a.dry_run_gpu_gib,
         "--dry-run: the memory of each GPU in GiB (default 140.4, an H200)", NULL},
        {"max-connections", F_INT, &a.max_connections, "concurrent HTTP connections (default 512)", NULL},
        {"max-body-mb", F_INT, &a.max_body_mb, "request body limit in MiB (default 32)", NULL},
        {"responses-store-mb", F_INT, &a.responses_store_mb,
         "memory for the Responses API's stored responses (store: true), oldest evicted first; 0 keeps none (default 256)", NULL},
        {"timeout-keep-alive", F_INT, &a.timeout_keep_alive, "idle connection timeout in seconds (default 600)", NULL},
    };
    const int nf = (int)(sizeof flags / sizeof flags[0]);
    json_t *args_json = json_object();
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) { usage(flags, nf); json_decref(args_json); return 0; }
        if (strncmp(s, "--", 2)) {
            fprintf(stderr, "laststand serve: error: unexpected argument '%s' (flags start with --)\n", s);
            json_decref(args_json);
            return 2;
        }
        char name[128];
        const char *eq = strchr(s + 2, '=');
        size_t nl = eq ? (size_t)(eq - s - 2) : strlen(s + 2);
        if (nl >= sizeof name) nl = sizeof name - 1;
        memcpy(name, s + 2, nl);
        name[nl] = 0;
        for (char *p = name; *p; p++) if (*p == '_') *p = '-';
        const flag *f = NULL;
        for (int j = 0; j < nf; j++) if (!strcmp(flags[j].name, name)) f = &flags[j];
        if (!f) {
            fprintf(stderr, "laststand serve: error: unknown flag --%s (see laststand serve --help)\n", name);
            json_decref(args_json);
            return 2;
        }
        if (f->type == F_BOOL) {
            if (eq && strcmp(eq + 1, "true") && strcmp(eq + 1, "false")) {
                fprintf(stderr, "laststand serve: error: --%s: expected no value, true or false\n", name);
                json_decref(args_json);
                return 2;
            }
            *(int *)f->ptr = !eq || !strcmp(eq + 1, "true");
            json_object_set_new(args_json, name, json_boolean(*(int *)f->ptr));
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "laststand serve: error: --%s needs a value\n", name);
            json_decref(args_json);
            return 2;
        }
        if (parse_flag(f, v)) { json_decref(args_json); return 2; }
        json_object_set_new(args_json, name, json_string(!strcmp(name, "api-key") ? "<set>" : v));
    }

#define BAD(...) do { fprintf(stderr, "laststand serve: error: " __VA_ARGS__); fputc('\n', stderr); \
                      json_decref(args_json); return 2; } while (0)
    if (a.port < 1 || a.port > 65535) BAD("--port: must be 1..65535, got %lld", a.port);
    if (a.tp < 1 || a.tp > 64) BAD("--tp: must be 1..64, got %lld", a.tp);
    if (a.nnodes < 1) BAD("--nnodes: must be >= 1, got %lld", a.nnodes);
    if (a.nnodes > 1) BAD("--nnodes %lld: multi-node serving is not supported yet (run one node with --tp)", a.nnodes);
    if (a.node_rank < 0 || a.node_rank >= a.nnodes) BAD("--node-rank: must be in [0, %lld), got %lld", a.nnodes, a.node_rank);
    if (a.mem_fraction_static < 0 || a.mem_fraction_static > 1) BAD("--mem-fraction-static: must be in (0, 1], got %g", a.mem_fraction_static);
    if (a.max_running_requests < 0 || a.max_running_requests > 1 << 20) BAD("--max-running-requests: must be >= 1, got %lld", a.max_running_requests);
    if (a.max_queued_requests < 0 || a.max_queued_requests > 1 << 24) BAD("--max-queued-requests: must be >= 1, got %lld", a.max_queued_requests);
    if (a.max_total_tokens < 0 || a.max_total_tokens > 1LL << 31) BAD("--max-total-tokens: must be >= 1, got %lld", a.max_total_tokens);
    if (a.context_length < 0 || a.context_length > 1 << 24) BAD("--context-length: must be >= 1, got %lld", a.context_length);
    if (a.chunked_prefill_size != -2 && a.chunked_prefill_size != -1 && (a.chunked_prefill_size < 1 || a.chunked_prefill_size > 1 << 24))
        BAD("--chunked-prefill-size: must be >= 1 or -1, got %lld", a.chunked_prefill_size);
    if (a.max_connections < 1 || a.max_connections > 65536) BAD("--max-connections: must be 1..65536, got %lld", a.max_connections);
    if (a.max_body_mb < 1 || a.max_body_mb > 4096) BAD("--max-body-mb: must be 1..4096, got %lld", a.max_body_mb);
    if (a.responses_store_mb < 0 || a.responses_store_mb > 1 << 20)
        BAD("--responses-store-mb: must be 0..1048576, got %lld", a.responses_store_mb);
    if (a.cuda_graph_max_bs < 0 || a.cuda_graph_max_bs > 1 << 20) BAD("--cuda-graph-max-bs: must be >= 1, got %lld", a.cuda_graph_max_bs);
    if (a.timeout_keep_alive < 1) BAD("--timeout-keep-alive: must be >= 1, got %lld", a.timeout_keep_alive);
    if (a.page_size != -2 && (a.page_size < 1 || a.page_size > 4096)) BAD("--page-size: must be 1..4096, got %lld", a.page_size);
    if (a.prefix_snapshots != -2 && (a.prefix_snapshots < 0 || a.prefix_snapshots > 1 << 20))
        BAD("--prefix-snapshots: must be >= 0, got %lld", a.prefix_snapshots);
    if (a.disable_radix_cache && a.prefix_cache && !strcmp(a.prefix_cache, "on"))
        BAD("--prefix-cache on contradicts --disable-radix-cache");
    if (a.doctor_timeout < 0) BAD("--doctor-timeout: must be > 0, got %g", a.doctor_timeout);
    if (a.spec_n < 0 || a.spec_n > 1024) BAD("--speculative-num-draft-tokens: must be 2..9, got %lld", a.spec_n);
    if (a.spec_w0 < 0 || a.spec_w0 > 1024) BAD("--speculative-ngram-min-match-window-size: must be 1..1024, got %lld", a.spec_w0);
    if (a.spec_w1 < 0 || a.spec_w1 > 1024) BAD("--speculative-ngram-max-match-window-size: must be 1..1024, got %lld", a.spec_w1);
    if (a.spec_max_bs < 0 || a.spec_max_bs > 1 << 20) BAD("--speculative-max-batch: must be >= 1, got %lld", a.spec_max_bs);
    if (a.spec_steps < 0 || a.spec_steps > 1024) BAD("--speculative-num-steps: must be 1..8, got %lld", a.spec_steps);
    if (a.spec_topk < 0 || a.spec_topk > 1)
        BAD("--speculative-eagle-topk %lld: only 1 (a chain of drafts) is supported, not draft trees", a.spec_topk);
    if (a.spec_steps && a.spec_n && a.spec_n != a.spec_steps + 1)
        BAD("--speculative-num-draft-tokens %lld with --speculative-num-steps %lld: a chain verifies steps + 1 tokens",
            a.spec_n, a.spec_steps);
    if (a.api_key && !*a.api_key) BAD("--api-key: empty");
    if (a.chat_template && !file_exists(a.chat_template)) BAD("--chat-template: %s: no such file", a.chat_template);
    if (a.model_path && strncmp(a.model_path, "synth:", 6) && !file_exists(a.model_path))
        BAD("--model-path: %s: no such folder", a.model_path);
#undef BAD
    log_set_level(log_parse_level(a.log_level));

    if (a.dry_run) {
        if (a.dry_run_gpu_gib < 0) { fprintf(stderr, "laststand serve: error: --dry-run-gpu-gib: must be > 0\n"); json_decref(args_json); return 2; }
        int rc = dry_run(&a);
        json_decref(args_json);
        return rc;
    }
    char *model_path = a.model_path ? xstrdup(a.model_path) : demo_model_path();
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.model_path = model_path;
    o.tokenizer_path = a.tokenizer_path;
    o.chat_template = a.chat_template;
    o.device = strcmp(a.device, "auto") ? a.device : NULL;
    o.tp = (int)a.tp;
    o.sampling_backend = a.sampling_backend;
    o.disable_cuda_graph = a.disable_cuda_graph;
    o.cuda_graph_max_bs = (int)a.cuda_graph_max_bs;
    /* the last backend standing: the doctor's decision and the smoke test (serve_auto.c) */
    serve_auto_opts sa = {.model_path = model_path, .tokenizer_path = a.tokenizer_path, .device = o.device,
                          .trust_backend = a.trust_backend, .timeout_s = a.doctor_timeout,
                          .buckets = a.doctor_buckets, .tp = (int)a.tp, .mamba_ssm_dtype = a.mamba_ssm_dtype,
                          .drafts = a.spec_algo && *a.spec_algo && strcasecmp(a.spec_algo, "none") != 0};
    for (int f = 0; f < SA_NFAM; f++) sa.names[f] = a.backend[f];
    const double t_start = now_sec();
    {
        char serr[1024] = "";
        int src = serve_auto_select(&sa, serr, sizeof serr);
        log_info("start-up: backend selection (doctor + smoke test) %.1f s", now_sec() - t_start);
        if (src) {
            fprintf(stderr, "laststand serve: error: %s\n", serr);
            free(model_path);
            json_decref(args_json);
            return src;
        }
    }
    /* the doctor's picks (a backend or a per-M plan) for flags left at auto stay preferences
     * (per-shape fallback; CUDA graph captures may take a capture-safe backend of the family
     * instead), never one that serve_auto eliminated (banned_backends) */
    for (int f = 0; f < SA_NFAM; f++) {
        const char *user = a.backend[f];
        if (!user || !*user || !strcmp(user, "auto")) o.auto_families |= serve_auto_families[f].auto_bit;
        *serve_auto_engine_name(&o, f) = sa.names[f];
    }
    o.banned_backends = sa.banned;
    o.trust_backend = a.trust_backend;
    if (a.max_running_requests) o.max_running_requests = (int)a.max_running_requests;
    if (a.chunked_prefill_size != -2) o.chunked_prefill_size = (int)a.chunked_prefill_size;
    if (a.context_length) o.context_length = (int)a.context_length;
    if (a.mem_fraction_static > 0) o.mem_fraction_static = a.mem_fraction_static;
    if (a.max_total_tokens) o.max_total_tokens = (int)a.max_total_tokens;
    if (a.page_size != -2) o.page_size = (int)a.page_size;
    if (a.max_queued_requests) o.max_queued_requests = (int)a.max_queued_requests;
    if (a.disable_radix_cache || (a.prefix_cache && !strcmp(a.prefix_cache, "off"))) o.prefix_cache = -1;
    else if (a.prefix_cache) o.prefix_cache = 1;
    if (a.prefix_snapshots != -2) o.prefix_snapshots = a.prefix_snapshots ? (int)a.prefix_snapshots : -1;
    o.mamba_ssm_dtype = a.mamba_ssm_dtype;
    o.speculative_algorithm = a.spec_algo;
    o.speculative_num_draft_tokens = (int)(a.spec_n ? a.spec_n : a.spec_steps ? a.spec_steps + 1 : 0);
    o.speculative_ngram_min_window = (int)a.spec_w0;
    o.speculative_ngram_max_window = (int)a.spec_w1;
    o.speculative_max_batch = (int)a.spec_max_bs;

    ls_engine *eng = NULL;
    char err[1024] = "";
    double t0 = now_sec();
    int rc = ls_engine_open(&o, &eng, err, sizeof err);
    if (rc) {
        fprintf(stderr, "laststand serve: error: %s\n", err);
        free(model_path);
        json_decref(args_json);
        return rc == LS_ERR_INVAL || rc == LS_ERR_UNSUPPORTED ? 2 : 1;
    }
    log_info("model %s loaded in %.1f s", model_path, now_sec() - t0);
    log_info("start-up: backend selection %.1f s + engine (weights, caches, CUDA graphs) %.1f s = %.1f s before "
             "serving", t0 - t_start, now_sec() - t0, now_sec() - t_start);

    srv_config cfg = {0};
    cfg.host = a.host;
    cfg.port = (int)a.port;
    cfg.model_path = model_path;
    cfg.tokenizer_path = a.tokenizer_path;
    cfg.served_model_name = a.served_model_name ? a.served_model_name : a.model_path ? a.model_path : "laststand-demo";
    cfg.api_key = a.api_key;
    cfg.reasoning_parser = a.reasoning_parser != NULL;
    cfg.reasoning_parser_name = a.reasoning_parser;
    cfg.reasoning_always = a.reasoning_parser && !strcmp(a.reasoning_parser, "qwen3-thinking");
    cfg.tool_parser = TP_NONE;
    if (a.tool_call_parser) tp_kind_parse(a.tool_call_parser, &cfg.tool_parser);
    cfg.max_body = (size_t)a.max_body_mb << 20;
    cfg.responses_store_bytes = (size_t)a.responses_store_mb << 20;
    cfg.max_connections = (int)a.max_connections;
    cfg.conn_timeout_s = (int)a.timeout_keep_alive;
    const char *force = getenv("LASTSTAND_TEST_FORCE_IDS");
    cfg.allow_force_ids = force && !strcmp(force, "1");
    if (cfg.allow_force_ids) log_warn("LASTSTAND_TEST_FORCE_IDS=1: requests may force their output ids (tests only)");
    json_object_set_new(args_json, "model_path", json_string(model_path));
    json_object_set_new(args_json, "served_model_name", json_string(cfg.served_model_name));
    json_object_set_new(args_json, "host", json_string(cfg.host));
    json_object_set_new(args_json, "port", json_integer(cfg.port));
    json_object_set_new(args_json, "tp_size", json_integer(a.tp));
    { /* what serve_auto decided: per family a backend or a per-M plan ("a:8,b"), and what it eliminated */
        json_t *bk = json_object();
        for (int f = 0; f < SA_NFAM; f++)
            json_object_set_new(bk, serve_auto_families[f].fam, json_string(sa.names[f] ? sa.names[f] : "auto"));
        json_object_set_new(args_json, "backends", bk);
        json_object_set_new(args_json, "banned_backends", sa.banned ? json_string(sa.banned) : json_null());
    }
    json_object_set_new(args_json, "reasoning_parser", a.reasoning_parser ? json_string(a.reasoning_parser) : json_null());
    json_object_set_new(args_json, "tool_call_parser", a.tool_call_parser ? json_string(a.tool_call_parser) : json_null());
    cfg.server_args = args_json;
    if (!strcmp(a.sampling_defaults, "model")) {
        cfg.preferred_sampling = req_model_sampling_defaults(model_path, &cfg.sampling_defaults);
        if (json_object_size(cfg.preferred_sampling)) {
            buf s; buf_init(&s);
            jpy_dump_compact(&s, cfg.preferred_sampling);
            log_info("sampling defaults from generation_config.json: %s", s.data);
            buf_free(&s);
        }
    } else {
        ls_sampling_default(&cfg.sampling_defaults);
    }

    rc = srv_run(&cfg, eng);
    ls_engine_close(eng);
    json_decref(cfg.preferred_sampling);
    json_decref(args_json);
    free(model_path);
    return rc;
}
