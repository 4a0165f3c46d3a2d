/* bench_dataset.c: the `random` dataset of `laststand bench`.
 *
 * Lengths follow sglang.bench_serving's sample_random_requests exactly:
 *   input_len_i  ~ U[max(int(I*r), 1), I]      (integers, both ends included)
 *   output_len_i ~ U[int(O*r), O]              (clamped to >= 1 here: a request
 *                                               for 0 tokens is refused by servers)
 * so --random-range-ratio 1 means fixed lengths (SGLang's convention, not vLLM's).
 *
 * Prompt tokens are ids drawn uniformly from a pool of the server's own token
 * ids: with --tokenizer-path every non-special id of the local tokenizer.json;
 * otherwise the distinct ids the server's POST /tokenize returns for a built-in
 * multilingual text (SGLang, vLLM, llama.cpp and llama-cpp-python shapes are
 * tried). Completions send the id list itself when the server accepts ids;
 * chat (and completions on servers that only take text) send the text the
 * server (or the local tokenizer) detokenizes them to. The server's usage
 * reports how many tokens the prompt really had.
 *
 * Owns: the prompts (ids and text) until bench_dataset_free.
 */
#include "cli/bench.h"
#include "tok/tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text whose tokenization gives the id pool: prose, code, numbers and a few
 * scripts, so the pool spans more than ASCII words. Written for this file. */
static const char CORPUS[] =
    "The harbour was quiet before dawn; fishing boats rocked against the pier while gulls argued over "
    "scraps. An engineer walked along the quay, counting the lamps that still worked: twelve of "
    "fifteen. She wrote the number in a small notebook, next to yesterday's readings of tide, wind "
    "and temperature (4.5 degrees, falling). Later the market opened, and traders shouted prices "
    "for mackerel, cod, mussels, oranges, bread, cheese, rope, paint and batteries.\n"
    "Question: why does a distributed system need consensus? Answer: because replicas must agree "
    "on the order of writes even when messages are delayed, duplicated or lost, and a majority "
    "quorum guarantees that any two decisions overlap in at least one node.\n"
    "def moving_average(xs, k):\n    out = []\n    for i in range(len(xs) - k + 1):\n"
    "        out.append(sum(xs[i:i + k]) / k)\n    return out\n"
    "for (int i = 0; i < n; i++) { total += weights[i] * inputs[i]; }\n"
    "SELECT name, COUNT(*) AS visits FROM sessions WHERE day >= '2024-01-01' GROUP BY name;\n"
    "{\"id\": 1729, \"tags\": [\"alpha\", \"beta\"], \"ok\": true, \"ratio\": 0.618}\n"
    "Le chat dort sur la chaise pendant que la pluie tombe doucement sur les toits de la ville. "
    "Der schnelle Zug erreichte den Bahnhof eine Minute zu spät. El mercado abre a las ocho y "
    "cierra al mediodía. Снег шёл всю ночь, и утром город стал белым. "
    "今日は天気が良いので、公園を散歩しましょう。我们明天早上九点在图书馆见面。"
    "오늘 회의는 오후 세 시에 시작합니다. 1 2 3 10 42 100 2048 3.14159 -7 #include <stdio.h> "
    "https://example.org/path?query=value&page=2 user@example.com ~/.config/app.toml $HOME";

typedef struct endpoint_shape {
    const char *tok_path, *detok_path;
    const char *text_key; /* request field carrying the text */
} endpoint_shape;

static const endpoint_shape SHAPES[] = {
    {"/tokenize", "/detokenize", "prompt"},          /* SGLang, vLLM, laststand */
    {"/tokenize", "/detokenize", "content"},         /* llama.cpp server */
    {"/extras/tokenize", "/extras/detokenize", "input"}, /* llama-cpp-python */
};

void bench_dataset_free(bench_dataset *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->p[i].ids);
        free(d->p[i].text);
    }
    free(d->p);
    memset(d, 0, sizeof *d);
}

static char *url_join(const char *base, const char *path) {
    buf b;
    buf_init(&b);
    buf_printf(&b, "%s%s", base, path);
    return buf_detach(&b);
}

/* POST body to base+path; returns the parsed 200 response or NULL (reason in why). */
static json_t *post_json(const bench_opts *o, const char *path, json_t *body, buf *why) {
    char *url = url_join(o->base_url, path);
    char *s = json_dumps(body, JSON_COMPACT);
    int status = 0;
    char *resp = NULL;
    ls_err e = {0};
    json_t *out = NULL;
    if (bench_http_simple(url, o->api_key, s, 60, &status, &resp, &e)) {
        buf_printf(why, "%s: %s; ", path, e.msg);
    } else if (status != 200) {
        char *t = bench_error_text(status, resp);
        buf_printf(why, "%s: %s; ", path, t);
        free(t);
    } else {
        json_error_t je;
        out = json_loads(resp, 0, &je);
        if (!out) buf_printf(why, "%s: invalid JSON (%s); ", path, je.text);
    }
    free(url);
    free(s);
    free(resp);
    return out;
}

/* ---- the server's tokenizer --------------------------------------------------- */

typedef struct server_tok {
    const endpoint_shape *shape;
    const char *model;
} server_tok;

static int server_tokenize(const bench_opts *o, server_tok *st, const char *text, int32_t **ids,
                           buf *why) {
    for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++) {
        if (st->shape && st->shape != &SHAPES[k]) continue;
        json_t *body = json_object();
        json_object_set_new(body, SHAPES[k].text_key, json_string(text));
        if (st->model) json_object_set_new(body, "model", json_string(st->model));
        if (strcmp(SHAPES[k].text_key, "input")) json_object_set_new(body, "add_special_tokens", json_false());
        json_t *r = post_json(o, SHAPES[k].tok_path, body, why);
        json_decref(body);
        if (!r) continue;
        json_t *toks = json_object_get(r, "tokens");
        size_t n = json_array_size(toks);
        int good = json_is_array(toks) && n > 0;
        for (size_t i = 0; good && i < n; i++) good = json_is_integer(json_array_get(toks, i));
        if (!good) {
            buf_printf(why, "%s: no integer \"tokens\" array in the response; ", SHAPES[k].tok_path);
            json_decref(r);
            continue;
        }
        *ids = xmalloc(sizeof(int32_t) * n);
        for (size_t i = 0; i < n; i++) (*ids)[i] = (int32_t)json_integer_value(json_array_get(toks, i));
        json_decref(r);
        st->shape = &SHAPES[k];
        return (int)n;
    }
    return -1;
}

static char *server_detokenize(const bench_opts *o, server_tok *st, const int32_t *ids, int n, buf *why) {
    json_t *body = json_object();
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    json_object_set_new(body, "tokens", arr);
    if (st->model) json_object_set_new(body, "model", json_string(st->model));
    json_t *r = post_json(o, st->shape->detok_path, body, why);
    json_decref(body);
    if (!r) return NULL;
    const char *keys[] = {"text", "content", "prompt"};
    char *out = NULL;
    for (int k = 0; k < 3 && !out; k++) {
        const char *s = json_string_value(json_object_get(r, keys[k]));
        if (s) out = xstrdup(s);
    }
    if (!out) buf_printf(why, "%s: no \"text\" in the response; ", st->shape->detok_path);
    json_decref(r);
    return out;
}

/* vocab_size of GET /get_model_info (laststand reports it), or 0. */
static int model_info_vocab(const bench_opts *o, buf *why) {
    char *url = url_join(o->base_url, "/get_model_info");
    int status = 0, n = 0;
    char *resp = NULL;
    ls_err e = {0};
    if (!bench_http_simple(url, o->api_key, NULL, 30, &status, &resp, &e) && status == 200) {
        json_t *j = json_loads(resp, 0, NULL);
        json_t *vs = json_object_get(j, "vocab_size");
        if (json_is_integer(vs) && json_integer_value(vs) > 0 && json_integer_value(vs) < (1 << 30))
            n = (int)json_integer_value(vs);
        json_decref(j);
    }
    if (!n) buf_printf(why, "/get_model_info: no vocab_size; ");
    free(url);
    free(resp);
    return n;
}

/* Where ids become text: the local tokenizer, else the server's detokenize route. */
typedef struct vocab {
    server_tok st;
    tokenizer *tk;
} vocab;

static char *detok(const bench_opts *o, vocab *v, const int32_t *ids, int n, buf *why) {
    if (v->tk) return tok_decode(v->tk, ids, n, 0);
    return server_detokenize(o, &v->st, ids, n, why);
}

/* Does POST /v1/completions take a list of token ids as the prompt? */
static int server_accepts_ids(const bench_opts *o, const char *model, const int32_t *ids, int n) {
    json_t *body = json_object();
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    if (model) json_object_set_new(body, "model", json_string(model));
    json_object_set_new(body, "prompt", arr);
    json_object_set_new(body, "max_tokens", json_integer(1));
    json_object_set_new(body, "temperature", json_real(0));
    buf why;
    buf_init(&why);
    json_t *r = post_json(o, "/v1/completions", body, &why);
    json_decref(body);
    int ok = 0;
    if (r) {
        json_t *pt = json_object_get(json_object_get(r, "usage"), "prompt_tokens");
        /* exactly our ids: a server that stringified the list would count more */
        ok = json_is_integer(pt) && json_integer_value(pt) == n;
        json_decref(r);
    }
    buf_free(&why);
    return ok;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int bench_dataset_make(const bench_opts *o, const char *model, bench_dataset *d, ls_err *e) {
    memset(d, 0, sizeof *d);
    int is_chat = !strcmp(o->backend, "openai-chat");
    buf why;
    buf_init(&why);
    vocab v = {{NULL, model}, NULL};
    int32_t *pool = NULL;
    int npool = 0;
    if (o->tokenizer_path) {
        /* every regular (non-special) id of the local tokenizer */
        int rc = tok_load_dir(o->tokenizer_path, &v.tk, e);
        if (rc) {
            err_prefix(e, "--tokenizer-path %s", o->tokenizer_path);
            return rc;
        }
        int nv = tok_vocab_size(v.tk);
        pool = xmalloc(sizeof(int32_t) * (nv > 0 ? nv : 1));
        for (int32_t id = 0; id < nv; id++)
            if (tok_piece(v.tk, id) && !tok_is_special(v.tk, id)) pool[npool++] = id;
        if (npool == 0) {
            tok_free(v.tk);
            free(pool);
            return errf(e, ERR_INVAL, "--tokenizer-path %s: the tokenizer has no regular tokens", o->tokenizer_path);
        }
        d->vocab_source = "tokenizer-path";
    } else {
        /* the id pool: distinct ids of the corpus, by the server's tokenizer */
        npool = server_tokenize(o, &v.st, CORPUS, &pool, &why);
        int vocab_size = npool <= 0 && !is_chat ? model_info_vocab(o, &why) : 0;
        if (vocab_size > 0) {
            /* no tokenizer on the server (e.g. a synth: model): every id below
             * its vocab_size, sent as ids (sglang's random-ids) */
            pool = xmalloc(sizeof(int32_t) * vocab_size);
            for (int i = 0; i < vocab_size; i++) pool[i] = i;
            npool = vocab_size;
            d->vocab_source = "/get_model_info vocab_size";
        } else if (npool <= 0) {
            int rc = errf(e, ERR_INVAL,
                          "--base-url %s: the server offers no tokenize endpoint to draw prompt tokens from "
                          "(%s); give --tokenizer-path DIR",
                          o->base_url, why.data ? why.data : "");
            buf_free(&why);
            return rc;
        }
        else d->vocab_source = v.st.shape->tok_path;
    }
    qsort(pool, npool, sizeof *pool, cmp_i32);
    int m = 0;
    for (int i = 0; i < npool; i++)
        if (i == 0 || pool[i] != pool[m - 1]) pool[m++] = pool[i];
    npool = m;
    why.len = 0;

    d->as_ids = !is_chat && server_accepts_ids(o, model, pool, npool < 8 ? npool : 8);
    if (!d->as_ids && !v.tk && !v.st.shape) {
        free(pool);
        buf_free(&why);
        return errf(e, ERR_INVAL, "--base-url %s: the server has no tokenizer routes and refuses token-id prompts; "
                                  "give --tokenizer-path DIR", o->base_url);
    }
    /* Text prompts use only ids that decode on their own to non-empty valid
     * text (byte pieces of a split character would make a server's
     * detokenizer fail or emit U+FFFD). Checked lazily, once per id drawn:
     * a small run asks about a few ids, a large one at most the whole pool. */
    signed char *valid = xcalloc(npool, 1); /* 0 unknown, 1 usable, -1 not */
    int n_invalid = 0;
    d->vocab_n = npool;

    /* lengths and ids, one rng stream: reproducible for a given --seed */
    uint64_t rng = o->seed * 0x2545F4914F6CDD1Dull + 1;
    d->n = o->num_prompts;
    d->p = xcalloc(d->n, sizeof *d->p);
    int in_lo = (int)floor(o->input_len * o->range_ratio);
    if (in_lo < 1) in_lo = 1;
    int out_lo = (int)floor(o->output_len * o->range_ratio);
    for (int i = 0; i < d->n; i++) {
        bench_prompt *p = &d->p[i];
        p->n_ids = (int)bench_rng_int(&rng, in_lo, o->input_len);
        int ol = (int)bench_rng_int(&rng, out_lo, o->output_len);
        p->output_len = ol < 1 ? 1 : ol;
        p->ids = xmalloc(sizeof(int32_t) * p->n_ids);
        for (int j = 0; j < p->n_ids; j++) {
            int k;
            for (;;) {
                k = (int)bench_rng_int(&rng, 0, npool - 1);
                if (d->as_ids || valid[k] > 0) break;
                if (valid[k] < 0) continue;
                char *t = detok(o, &v, &pool[k], 1, &why);
                valid[k] = t && *t && bench_utf8_valid(t, strlen(t)) && !strstr(t, "\xEF\xBF\xBD") ? 1 : -1;
                free(t);
                if (valid[k] > 0) break;
                if (++n_invalid == npool) {
                    int rc = errf(e, ERR_RUNTIME, "%s: no token id detokenizes to valid text on its own (%s)",
                                  v.tk ? "--tokenizer-path" : "--base-url", why.data ? why.data : "");
                    free(pool), free(valid), buf_free(&why);
                    if (v.tk) tok_free(v.tk);
                    bench_dataset_free(d);
                    return rc;
                }
            }
            p->ids[j] = pool[k];
        }
    }
    free(pool);
    free(valid);
    why.len = 0;

    if (!d->as_ids) {
        for (int i = 0; i < d->n; i++) {
            d->p[i].text = detok(o, &v, d->p[i].ids, d->p[i].n_ids, &why);
            if (!d->p[i].text) {
                int rc = errf(e, ERR_RUNTIME, "--base-url %s: detokenizing prompt %d failed: %s", o->base_url,
                              i, why.data ? why.data : "");
                buf_free(&why);
                if (v.tk) tok_free(v.tk);
                bench_dataset_free(d);
                return rc;
            }
        }
    }
    if (v.tk) tok_free(v.tk);
    buf_free(&why);
    return 0;
}
