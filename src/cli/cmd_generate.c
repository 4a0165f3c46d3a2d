/* cmd_generate.c: `laststand generate --model-path DIR (--ids 1,2,3 |
 * --prompt TEXT [--chat]) [--max-new-tokens N] [--temperature T] [--seed S]
 * [--top-k K] [--top-p P] [--min-p P]
 * [--tokenizer-path DIR] [--chat-template FILE] [--device cpu|cuda]
 * [backend flags]`: one request through the engine (include/laststand.h),
 * exactly as the server runs it: paged KV cache, GDN state slot, the sampler.
 * Greedy at temperature 0 (the default), else sampled with the seeded
 * per-request generator (seed 0 unless given), so runs are reproducible.
 * --chat renders the chat template over one user message with
 * add_generation_prompt. Stops at --max-new-tokens or an EOS id (config,
 * generation_config, tokenizer; --ignore-eos: only at --max-new-tokens). Prints JSON
 * {"ids":[new ids],"text":"..."}; text is "" when the model has no tokenizer.
 * --batch N submits N requests at once, so that the engine decodes them as one batch, as a
 * server at concurrency N would: request i's prompt is the ids rotated left by i (i mod n) places
 * (as many tokens, a different context: identical prompts would route every sequence to the same
 * experts) and its seed --seed + i; one JSON line per request, in submit order. The engine is held
 * while they are submitted (ls_engine_hold), so that they share their first step and two runs
 * schedule the same steps. The engine's
 * closing log line gives the mean decode step.
 */
#include "cli/cli.h"
#include "base/base.h"
#include "laststand.h"
#include "cli/serve_auto.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand generate --model-path DIR (--ids 1,2,3 | --prompt TEXT [--chat])\n"
               "         [--max-new-tokens N] [--temperature T] [--seed S]\n"
               "         [--top-k K] [--top-p P] [--min-p P] [--ignore-eos] [--batch N]\n"
               "         [--tokenizer-path DIR] [--chat-template FILE] [--device cpu|cuda] [--tp N]\n"
               "         [--moe-runner-backend NAME] [--fp4-gemm-backend NAME]\n"
               "         [--attention-backend NAME] [--gdn-backend NAME] [--gemm-backend NAME]\n"
               "         [--lm-head-backend NAME]\n"
               "         (a backend flag takes auto, a NAME or a plan NAME:MAXM,...,NAME)\n"
               "         [--sampling-backend auto|host|device] [--disable-cuda-graph]\n"
               "         [--mamba-ssm-dtype auto|float32|bfloat16]\n"
               "         [--prefix-cache on|off] (default on)\n"
               "         [--speculative-algorithm none|ngram|mtp] [--speculative-num-draft-tokens N]\n"
               "         [--speculative-ngram-min-match-window-size N] [--speculative-ngram-max-match-window-size N]\n"
               "         (speculative decoding: the engine's closing log line counts the drafts accepted)\n");
}

static int bad_value(const char *flag, const char *v, const char *want) {
    fprintf(stderr, "laststand generate: error: %s: expected %s, got '%s'\n", flag, want, v);
    return 2;
}

/* The request's events, gathered on the engine thread. */
typedef struct collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *ids;
    int n;
    buf text;
    int finished;
    char reason[16];
    char error[1200];
} collect;

static void on_event(void *user, const ls_event *ev) {
    collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->token >= 0) c->ids[c->n++] = ev->token;
    if (ev->text) buf_puts(&c->text, ev->text);
    if (ev->finished) {
        c->finished = 1;
        snprintf(c->reason, sizeof c->reason, "%s", ev->finish_reason ? ev->finish_reason : "");
        if (ev->error) snprintf(c->error, sizeof c->error, "%s", ev->error);
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static int print_result(const int32_t *ids, int n, const char *text) {
    json_t *o = json_object(), *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    json_object_set_new(o, "ids", a);
    json_t *t = json_string(text ? text : "");
    json_object_set_new(o, "text", t ? t : json_string(""));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    printf("%s\n", s);
    free(s);
    return fflush(stdout) ? 1 : 0;
}

int cmd_generate(int argc, char **argv) {
    const char *path = NULL, *ids_s = NULL, *prompt = NULL, *max_s = "16", *temp_s = "0", *seed_s = "0";
    const char *tok_path = NULL, *tmpl_path = NULL, *tp_s = "1";
    const char *topk_s = "-1", *topp_s = "1", *minp_s = "0", *pfx_s = NULL, *batch_s = "1";
    const char *sp_n = NULL, *sp_w0 = NULL, *sp_w1 = NULL;
    int chat = 0, ignore_eos = 0;
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (!strcmp(a, "--disable-cuda-graph")) { o.disable_cuda_graph = 1; continue; }
        const int fam = serve_auto_flag_family(a); /* a backend flag */
        const char **dst = fam >= 0 ? serve_auto_engine_name(&o, fam)
                         : !strcmp(a, "--model-path") ? &path
                         : !strcmp(a, "--ids") ? &ids_s
                         : !strcmp(a, "--prompt") ? &prompt
                         : !strcmp(a, "--max-new-tokens") ? &max_s
                         : !strcmp(a, "--temperature") ? &temp_s
                         : !strcmp(a, "--seed") ? &seed_s
                         : !strcmp(a, "--top-k") ? &topk_s
                         : !strcmp(a, "--top-p") ? &topp_s
                         : !strcmp(a, "--min-p") ? &minp_s
                         : !strcmp(a, "--tokenizer-path") ? &tok_path
                         : !strcmp(a, "--chat-template") ? &tmpl_path
                         : !strcmp(a, "--device") ? &o.device
                         : !strcmp(a, "--tp") ? &tp_s
                         : !strcmp(a, "--prefix-cache") ? &pfx_s
                         : !strcmp(a, "--batch") ? &batch_s
                         : !strcmp(a, "--sampling-backend") ? &o.sampling_backend
                         : !strcmp(a, "--mamba-ssm-dtype") ? &o.mamba_ssm_dtype
                         : !strcmp(a, "--speculative-algorithm") ? &o.speculative_algorithm
                         : !strcmp(a, "--speculative-num-draft-tokens") ? &sp_n
                         : !strcmp(a, "--speculative-ngram-min-match-window-size") ? &sp_w0
                         : !strcmp(a, "--speculative-ngram-max-match-window-size") ? &sp_w1 : NULL;
        if (!dst) {
            fprintf(stderr, "laststand generate: error: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "laststand generate: error: flag '%s' needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!path) { fprintf(stderr, "laststand generate: error: --model-path is required\n"); return 2; }
    if (!ids_s == !prompt) {
        fprintf(stderr, "laststand generate: error: give exactly one of --ids or --prompt\n");
        return 2;
    }
    if (chat && !prompt) {
        fprintf(stderr, "laststand generate: error: --chat needs --prompt (it renders the chat template "
                        "over the prompt text)\n");
        return 2;
    }
    if (pfx_s && strcmp(pfx_s, "on") && strcmp(pfx_s, "off")) return bad_value("--prefix-cache", pfx_s, "on or off");
    if (pfx_s) o.prefix_cache = strcmp(pfx_s, "on") ? -1 : 1;
    char *end;
    long tp = strtol(tp_s, &end, 10);
    if (*end || end == tp_s || tp < 1 || tp > 16) return bad_value("--tp", tp_s, "an integer in [1, 16]");
    o.tp = (int)tp;
    {
        const char *const sv[3] = {sp_n, sp_w0, sp_w1};
        const char *const sn[3] = {"--speculative-num-draft-tokens", "--speculative-ngram-min-match-window-size",
                                   "--speculative-ngram-max-match-window-size"};
        int *const sd[3] = {&o.speculative_num_draft_tokens, &o.speculative_ngram_min_window,
                            &o.speculative_ngram_max_window};
        for (int k = 0; k < 3; k++) {
            if (!sv[k]) continue;
            long x = strtol(sv[k], &end, 10);
            if (*end || end == sv[k] || x < 1 || x > 1024) return bad_value(sn[k], sv[k], "an integer in [1, 1024]");
            *sd[k] = (int)x;
        }
    }
    errno = 0;
    long batch = strtol(batch_s, &end, 10);
    if (*end || end == batch_s || errno || batch < 1 || batch > 4096)
        return bad_value("--batch", batch_s, "an integer in [1, 4096]");
    errno = 0;
    long max_new = strtol(max_s, &end, 10);
    if (*end || end == max_s || errno || max_new < 0 || max_new > 1 << 20)
        return bad_value("--max-new-tokens", max_s, "an integer in [0, 1048576]");
    double temp = strtod(temp_s, &end);
    if (*end || end == temp_s || !(temp >= 0) || temp > 1e6)
        return bad_value("--temperature", temp_s, "a number >= 0");
    errno = 0;
    long top_k = strtol(topk_s, &end, 10);
    if (*end || end == topk_s || errno || top_k < -1 || top_k > INT32_MAX)
        return bad_value("--top-k", topk_s, "an integer >= -1 (-1 or 0: off)");
    double top_p = strtod(topp_s, &end);
    if (*end || end == topp_s || !(top_p > 0) || top_p > 1) return bad_value("--top-p", topp_s, "a number in (0, 1]");
    double min_p = strtod(minp_s, &end);
    if (*end || end == minp_s || !(min_p >= 0) || min_p > 1) return bad_value("--min-p", minp_s, "a number in [0, 1]");
    errno = 0;
    unsigned long long seed = strtoull(seed_s, &end, 10);
    if (*end || end == seed_s || errno || seed_s[0] == '-')
        return bad_value("--seed", seed_s, "a non-negative integer");
    int32_t *ids = NULL;
    int n = 0;
    if (ids_s) {
        n = parse_int_list(ids_s, &ids);
        if (n <= 0) {
            free(ids);
            return bad_value("--ids", ids_s, "a comma-separated list of token ids");
        }
    }

    /* --batch requests: a cache for that many sequences, opened like the server's. */
    o.model_path = path;
    o.tokenizer_path = tok_path;
    o.chat_template = tmpl_path;
    o.max_running_requests = (int)batch;
    o.max_queued_requests = (int)batch;
    char err[1400] = "";
    ls_engine *eng = NULL;
    int rc = ls_engine_open(&o, &eng, err, sizeof err);
    if (rc) {
        fprintf(stderr, "laststand generate: error: %s\n", err);
        free(ids);
        return err_exit_code(rc); /* 2 for a bad model or flag; 1 e.g. for a missing GPU */
    }
    ls_model_info mi;
    ls_engine_model_info(eng, &mi);
    int ret = 0;
    const long n_cs = batch;
    collect *cs = xcalloc((size_t)n_cs, sizeof *cs);
    for (long b = 0; b < n_cs; b++) {
        pthread_mutex_init(&cs[b].mu, NULL);
        pthread_cond_init(&cs[b].cv, NULL);
        buf_init(&cs[b].text);
    }

    if (prompt) {
        char *text = NULL;
        if (chat) {
            json_t *req = json_pack("{s:[{s:s,s:s}],s:b}", "messages", "role", "user", "content", prompt,
                                    "add_generation_prompt", 1);
            char *rs = req ? json_dumps(req, JSON_COMPACT) : NULL;
            json_decref(req);
            if (!rs) {
                fprintf(stderr, "laststand generate: error: --prompt: not valid UTF-8\n");
                ret = 2;
                goto done;
            }
            rc = ls_apply_chat_template(eng, rs, &text, err, sizeof err);
            free(rs);
            if (rc) {
                fprintf(stderr, "laststand generate: error: --chat: %s\n", err);
                ret = err_exit_code(rc);
                goto done;
            }
        }
        n = ls_tokenize(eng, text ? text : prompt, &ids, err, sizeof err);
        free(text);
        if (n < 0) {
            fprintf(stderr, "laststand generate: error: --prompt: %s\n", err);
            ret = err_exit_code(n);
            goto done;
        }
        if (n == 0) {
            fprintf(stderr, "laststand generate: error: --prompt: the text encodes to no tokens\n");
            ret = 2;
            goto done;
        }
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= mi.vocab_size) {
            fprintf(stderr, "laststand generate: error: --ids: token id %d is outside the vocabulary [0, %d)\n",
                    ids[i], mi.vocab_size);
            ret = 2;
            goto done;
        }
    if (n + max_new > mi.context_length) {
        fprintf(stderr, "laststand generate: error: --max-new-tokens: %d prompt + %ld new tokens exceed "
                        "the context length %d\n", n, max_new, mi.context_length);
        ret = 2;
        goto done;
    }
    if (max_new == 0) {
        for (long b = 0; b < batch && !ret; b++) ret = print_result(NULL, 0, "");
        goto done;
    }

    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = (float)temp;
    s.top_k = (int)top_k;
    s.top_p = (float)top_p;
    s.min_p = (float)min_p;
    s.has_seed = 1;
    s.max_tokens = (int)max_new;
    s.ignore_eos = ignore_eos;
    int32_t *rot = xmalloc(sizeof(int32_t) * (size_t)n);
    /* held while submitting: the batch's requests share their first step, so that two runs of
     * the same command schedule the same steps (and round the same) */
    ls_engine_hold(eng, 1);
    for (long b = 0; b < batch; b++) {
        cs[b].ids = xmalloc(sizeof(int32_t) * (size_t)(max_new + 1));
        s.seed = seed + (unsigned long long)b;
        for (int i = 0; i < n; i++) rot[i] = ids[(i + b) % n];
        int64_t id = ls_submit(eng, rot, n, &s, on_event, &cs[b], err, sizeof err);
        if (id < 0) {
            fprintf(stderr, "laststand generate: error: request %ld of --batch %ld: %s\n", b + 1, batch, err);
            ret = err_exit_code((int)id);
            /* the ones already submitted finish before the engine closes */
            batch = b;
            break;
        }
    }
    free(rot);
    ls_engine_hold(eng, 0);
    for (long b = 0; b < batch; b++) {
        collect *c = &cs[b];
        pthread_mutex_lock(&c->mu);
        while (!c->finished) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        if (ret) continue;
        if (!strcmp(c->reason, "error")) {
            fprintf(stderr, "laststand generate: error: %s\n", c->error);
            ret = 1;
            continue;
        }
        ret = print_result(c->ids, c->n, c->text.data);
    }
done:
    ls_engine_close(eng);
    for (long b = 0; b < n_cs; b++) {
        free(cs[b].ids);
        buf_free(&cs[b].text);
        pthread_mutex_destroy(&cs[b].mu);
        pthread_cond_destroy(&cs[b].cv);
    }
    free(cs);
    free(ids);
    return ret;
}
