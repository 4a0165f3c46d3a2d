/* cmd_generate.c: `laststand generate --model-path DIR (--ids 1,2,3 | --prompt TEXT [--chat])
 * [--tokenizer-path DIR] [--max-new-tokens N] [--temperature T] [--seed S]
 * [--device cpu|cuda] [backend flags]`: generation through the KV cache and GDN state (one
 * prefill step, then one token per step), greedy at temperature 0 (the
 * default), else sampled from softmax(logits / T) with a seeded generator.
 * Stops at max-new-tokens or an end-of-sequence id of the model's config.
 * Prints JSON {"ids":[new ids],"text":"..."}; text is the new tokens decoded
 * (special tokens skipped) when the tokenizer folder (--tokenizer-path, else
 * the model folder) has a tokenizer.json, else "". --prompt needs one;
 * --chat renders the prompt as one user message through the model's chat
 * template (add_generation_prompt) before encoding it.
 */
#include "cli/cli.h"
#include "model/model.h"
#include "tok/jinja.h"
#include "tok/tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand generate --model-path DIR (--ids 1,2,3 | --prompt TEXT [--chat])\n"
               "         [--tokenizer-path DIR] [--max-new-tokens N]\n"
               "         [--temperature T] [--seed S] [--device cpu|cuda]\n"
               "         [--moe-runner-backend NAME] [--fp4-gemm-backend NAME]\n"
               "         [--attention-backend NAME] [--gdn-backend NAME]\n");
}

static int bad_value(const char *flag, const char *v, const char *want) {
    fprintf(stderr, "laststand generate: error: %s: expected %s, got '%s'\n", flag, want, v);
    return 2;
}

/* splitmix64: a small, well-mixed seeded generator. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int32_t pick_token(const float *lg, int V, double temp, uint64_t *rng) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (lg[v] > lg[best]) best = v;
    if (temp <= 0) return best;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp(((double)lg[v] - lg[best]) / temp);
    double r = (double)(rng_next(rng) >> 11) / (double)(1ull << 53) * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += exp(((double)lg[v] - lg[best]) / temp);
        if (acc > r) return v;
    }
    return best;
}

/* s as a JSON string (UTF-8 kept, control characters escaped); frees s. NULL -> "". */
static void put_json_string(FILE *f, char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
    free(s);
}

/* The prompt as one user turn through the tokenizer folder's chat template,
 * with the generation prompt appended. *out is malloc'd. */
static int render_chat(const tokenizer *tk, const char *dir, const char *prompt, char **out, ls_err *e) {
    *out = NULL;
    char *src = jinja_find_chat_template(dir, e);
    if (!src) return e->code ? e->code : ERR_INVAL;
    jinja_tmpl *t = NULL;
    int rc = jinja_parse(src, &t, e);
    free(src);
    if (rc) return rc;
    json_t *req = json_pack("{s:[{s:s,s:s}],s:b}", "messages", "role", "user", "content", prompt,
                            "add_generation_prompt", 1);
    int raised = 0;
    rc = jinja_apply_chat(t, req, tok_bos_token(tk), tok_eos_token(tk), out, &raised, e);
    json_decref(req);
    jinja_free(t);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *path = NULL, *ids_s = NULL, *prompt = NULL, *tok_dir = NULL;
    const char *max_s = "16", *temp_s = "0", *seed_s = "0";
    model_opts o = {.device = "cpu"};
    int chat = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        const char **dst = !strcmp(a, "--model-path") ? &path
                         : !strcmp(a, "--ids") ? &ids_s
                         : !strcmp(a, "--prompt") ? &prompt
                         : !strcmp(a, "--tokenizer-path") ? &tok_dir
                         : !strcmp(a, "--max-new-tokens") ? &max_s
                         : !strcmp(a, "--temperature") ? &temp_s
                         : !strcmp(a, "--seed") ? &seed_s
                         : !strcmp(a, "--device") ? &o.device
                         : !strcmp(a, "--moe-runner-backend") ? &o.moe_backend
                         : !strcmp(a, "--fp4-gemm-backend") ? &o.fp4_gemm_backend
                         : !strcmp(a, "--attention-backend") ? &o.attention_backend
                         : !strcmp(a, "--gdn-backend") ? &o.gdn_backend : NULL;
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
        fprintf(stderr, "laststand generate: error: give exactly one of --ids and --prompt\n");
        return 2;
    }
    if (chat && !prompt) {
        fprintf(stderr, "laststand generate: error: --chat goes with --prompt\n");
        return 2;
    }
    char *end;
    errno = 0;
    long max_new = strtol(max_s, &end, 10);
    if (*end || end == max_s || errno || max_new < 0 || max_new > 1 << 20)
        return bad_value("--max-new-tokens", max_s, "an integer in [0, 1048576]");
    double temp = strtod(temp_s, &end);
    if (*end || end == temp_s || !(temp >= 0) || temp > 1e6)
        return bad_value("--temperature", temp_s, "a number >= 0");
    errno = 0;
    unsigned long long seed = strtoull(seed_s, &end, 10);
    if (*end || end == seed_s || errno || seed_s[0] == '-')
        return bad_value("--seed", seed_s, "a non-negative integer");
    ls_err e = {0};
    /* The tokenizer: --tokenizer-path, else the model folder when it has one. */
    tokenizer *tk = NULL;
    if (!tok_dir && strncmp(path, "synth:", 6)) {
        char tj[4096];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
        FILE *f = fopen(tj, "rb");
        if (f) { fclose(f); tok_dir = path; }
    }
    if (tok_dir && tok_load_dir(tok_dir, &tk, &e)) {
        fprintf(stderr, "laststand generate: error: --tokenizer-path: %s\n", e.msg);
        return 2;
    }
    int32_t *ids = NULL;
    int n;
    if (prompt) {
        if (!tk) {
            fprintf(stderr, "laststand generate: error: --prompt needs a tokenizer.json (in the model "
                            "folder or --tokenizer-path)\n");
            return 2;
        }
        char *text = NULL;
        if (chat && render_chat(tk, tok_dir, prompt, &text, &e)) {
            fprintf(stderr, "laststand generate: error: --chat: %s\n", e.msg);
            tok_free(tk);
            return 2;
        }
        const char *src = text ? text : prompt;
        n = tok_encode(tk, src, strlen(src), &ids, &e);
        free(text);
        if (n <= 0) {
            fprintf(stderr, "laststand generate: error: --prompt: %s\n", n < 0 ? e.msg : "encodes to no tokens");
            free(ids);
            tok_free(tk);
            return 2;
        }
    } else if ((n = parse_int_list(ids_s, &ids)) <= 0) {
        free(ids);
        tok_free(tk);
        return bad_value("--ids", ids_s, "a comma-separated list of token ids");
    }

    model *m = NULL;
    int rc = model_open(path, &o, &m, &e);
    if (rc) {
        fprintf(stderr, "laststand generate: error: %s\n", e.msg);
        free(ids);
        tok_free(tk);
        return 2;
    }
    const model_config *c = model_cfg(m);
    const int V = c->vocab;
    int ret = 0;
    int32_t *out = xmalloc(sizeof(int32_t) * (max_new + 1));
    int32_t *pages = NULL;
    float *lg = xmalloc(sizeof(float) * V);
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "laststand generate: error: %s: token id %d is outside the vocabulary [0, %d)\n",
                    prompt ? "--prompt" : "--ids", ids[i], V);
            ret = 2;
            goto done;
        }
    if (n + max_new > c->max_pos) {
        fprintf(stderr, "laststand generate: error: --max-new-tokens: %d prompt + %ld new tokens exceed "
                        "the context length %d\n", n, max_new, c->max_pos);
        ret = 2;
        goto done;
    }
    const int page = 16, n_pages = (int)((n + max_new + page - 1) / page);
    model_cache_opts co = {.page_size = page, .n_pages = n_pages, .n_slots = 1};
    if ((rc = model_cache_init(m, &co, &e))) goto fail;
    model_slot_reset(m, 0);
    pages = xmalloc(sizeof(int32_t) * n_pages);
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    uint64_t rng = seed;
    int n_past = 0;
    const int32_t *step_ids = ids;
    int step_n = n;
    while (n_out < max_new) {
        fwd_seq s = {.slot = 0, .n_past = n_past, .n_new = step_n, .pages = pages, .logits_all = 0};
        fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = step_ids, .logits = lg};
        if ((rc = model_forward(m, &b, &e))) goto fail;
        n_past += step_n;
        int32_t t = pick_token(lg, V, temp, &rng);
        out[n_out++] = t;
        int stop = 0;
        for (int i = 0; i < c->n_eos; i++) stop |= t == c->eos[i];
        if (stop) break;
        step_ids = &out[n_out - 1];
        step_n = 1;
    }
    printf("{\"ids\":[");
    for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out[i]);
    printf("],\"text\":");
    put_json_string(stdout, tk ? tok_decode(tk, out, n_out, 1) : NULL);
    printf("}\n");
    goto done;
fail:
    fprintf(stderr, "laststand generate: error: %s\n", e.msg);
    ret = err_exit_code(rc);
done:
    free(out);
    free(pages);
    free(lg);
    free(ids);
    tok_free(tk);
    model_close(m);
    return ret ? ret : (fflush(stdout) ? 1 : 0);
}
