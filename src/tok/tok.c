/* tok.c: loading a Hugging Face tokenizer.json (+ tokenizer_config.json) and
 * the encode pipeline; the public functions of tok.h except decoding.
 *
 * Owns: the tokenizer object (strings, tables, steps) until tok_free.
 * Invariants: a loaded tokenizer is immutable except its word cache (which
 * locks), so tok_encode/tok_decode may run on many threads at once. Every load
 * error names the file and the JSON path at fault.
 *
 * Encode (HF TokenizerImpl::encode_single_sequence, add_special_tokens=false):
 * non-normalized added tokens are cut out of the raw text (leftmost-longest,
 * with lstrip / rstrip / single_word), each remaining piece is normalized and
 * normalized added tokens are cut out of it, the rest is pre-tokenized and each
 * word goes through BPE.
 */
#include "tok/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small JSON helpers --------------------------------------------------------- */

typedef struct loadctx {
    const char *file; /* for messages */
    ls_err *e;
} loadctx;

static int jerr(loadctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jerr(loadctx *c, const char *path, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errf(c->e, ERR_INVAL, "%s: %s: %s", c->file, path, msg);
}

static bool jbool(json_t *o, const char *k, bool def) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static const char *jtype(json_t *o) {
    json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A tokenizer.json pattern: {"String": s} or {"Regex": s}. */
static int jpattern(loadctx *c, json_t *p, const char *path, const char **s, size_t *n, bool *is_regex) {
    json_t *v;
    if ((v = json_object_get(p, "String")) && json_is_string(v)) *is_regex = false;
    else if ((v = json_object_get(p, "Regex")) && json_is_string(v)) *is_regex = true;
    else return jerr(c, path, "expected {\"String\": ...} or {\"Regex\": ...}");
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

static char *dupn(const char *s, size_t n) {
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* A Replace step (normalizer or decoder): pattern -> a (and re for a Regex),
 * content -> b. Nothing is left allocated on failure. */
static int load_replace(loadctx *c, json_t *j, const char *path, char **a, size_t *alen, char **b,
                        size_t *blen, pcre2_code **re) {
    const char *ps = NULL;
    size_t pn = 0;
    bool is_re = false;
    char sub[256];
    snprintf(sub, sizeof sub, "%s.pattern", path);
    int rc = jpattern(c, json_object_get(j, "pattern"), sub, &ps, &pn, &is_re);
    if (rc) return rc;
    json_t *ct = json_object_get(j, "content");
    if (!json_is_string(ct)) return jerr(c, path, "Replace without a \"content\" string");
    *re = NULL;
    if (is_re) {
        char why[300];
        if (!(*re = tok_regex_compile(ps, pn, false, why, sizeof why))) return jerr(c, sub, "%s", why);
    }
    *a = dupn(ps, pn);
    *alen = pn;
    *b = dupn(json_string_value(ct), json_string_length(ct));
    *blen = json_string_length(ct);
    return 0;
}

/* ---- normalizer ---------------------------------------------------------------- */

static int load_norm(tokenizer *t, loadctx *c, json_t *j, const char *path) {
    if (!j || json_is_null(j)) return 0;
    const char *ty = jtype(j);
    if (!ty) return jerr(c, path, "missing \"type\"");
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) return jerr(c, path, "Sequence without a \"normalizers\" array");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            int rc = load_norm(t, c, json_array_get(arr, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    tok_norm_step st = {0};
    if (!strcmp(ty, "NFC")) st.kind = NORM_NFC;
    else if (!strcmp(ty, "NFD")) st.kind = NORM_NFD;
    else if (!strcmp(ty, "NFKC")) st.kind = NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) st.kind = NORM_NFKD;
    else if (!strcmp(ty, "Lowercase")) st.kind = NORM_LOWERCASE;
    else if (!strcmp(ty, "StripAccents")) st.kind = NORM_STRIP_ACCENTS;
    else if (!strcmp(ty, "Strip")) {
        st.kind = NORM_STRIP;
        st.left = jbool(j, "strip_left", true);
        st.right = jbool(j, "strip_right", true);
    } else if (!strcmp(ty, "Prepend")) {
        json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) return jerr(c, path, "Prepend without a \"prepend\" string");
        st.kind = NORM_PREPEND;
        st.a = dupn(json_string_value(p), json_string_length(p));
        st.alen = json_string_length(p);
    } else if (!strcmp(ty, "Replace")) {
        st.kind = NORM_REPLACE;
        int rc = load_replace(c, j, path, &st.a, &st.alen, &st.b, &st.blen, &st.re);
        if (rc) return rc;
    } else {
        return jerr(c, path, "normalizer type '%s' is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
                    "Prepend, Strip, StripAccents, Sequence)", ty);
    }
    t->norm = xrealloc(t->norm, (t->n_norm + 1) * sizeof *t->norm);
    t->norm[t->n_norm++] = st;
    return 0;
}

/* ---- pre-tokenizer ------------------------------------------------------------- */

/* The GPT-2 pattern of HF's ByteLevel pre-tokenizer (use_regex = true). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_behavior(loadctx *c, json_t *j, const char *path, int *out) {
    json_t *b = json_object_get(j, "behavior");
    const char *s = json_is_string(b) ? json_string_value(b) : "Isolated";
    if (!strcmp(s, "Isolated")) *out = SPLIT_ISOLATED;
    else if (!strcmp(s, "Removed")) *out = SPLIT_REMOVED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = SPLIT_CONTIGUOUS;
    else return jerr(c, path, "unknown behavior '%s'", s);
    return 0;
}

static int parse_prepend_scheme(json_t *j) {
    json_t *ps = json_object_get(j, "prepend_scheme");
    if (json_is_string(ps)) {
        if (!strcmp(json_string_value(ps), "first")) return PREPEND_FIRST;
        if (!strcmp(json_string_value(ps), "never")) return PREPEND_NEVER;
        return PREPEND_ALWAYS;
    }
    return jbool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
}

static int load_pre(tokenizer *t, loadctx *c, json_t *j, const char *path) {
    if (!j || json_is_null(j)) return 0;
    const char *ty = jtype(j);
    if (!ty) return jerr(c, path, "missing \"type\"");
    char sub[256], why[300];
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) return jerr(c, path, "Sequence without a \"pretokenizers\" array");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            int rc = load_pre(t, c, json_array_get(arr, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    tok_pre_step st = {0};
    if (!strcmp(ty, "Split")) {
        const char *ps = NULL;
        size_t pn = 0;
        bool is_re = false;
        snprintf(sub, sizeof sub, "%s.pattern", path);
        int rc = jpattern(c, json_object_get(j, "pattern"), sub, &ps, &pn, &is_re);
        if (rc) return rc;
        if ((rc = parse_behavior(c, j, path, &st.behavior))) return rc;
        st.kind = PRE_SPLIT;
        st.invert = jbool(j, "invert", false);
        if (!(st.re = tok_regex_compile(ps, pn, !is_re, why, sizeof why))) return jerr(c, sub, "%s", why);
        if (is_re) st.fast = tok_fast_pattern(ps, pn);
    } else if (!strcmp(ty, "ByteLevel")) {
        st.kind = PRE_BYTELEVEL;
        st.add_prefix_space = jbool(j, "add_prefix_space", true);
        st.use_regex = jbool(j, "use_regex", true);
        if (st.use_regex && !(st.re = tok_regex_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), false, why, sizeof why)))
            return jerr(c, path, "%s", why);
    } else if (!strcmp(ty, "Digits")) {
        st.kind = PRE_DIGITS;
        st.individual_digits = jbool(j, "individual_digits", false);
    } else if (!strcmp(ty, "Punctuation")) {
        st.kind = PRE_PUNCTUATION;
        int rc = parse_behavior(c, j, path, &st.behavior);
        if (rc) return rc;
    } else if (!strcmp(ty, "Whitespace")) {
        static const char ws[] = "\\w+|[^\\w\\s]+";
        st.kind = PRE_WHITESPACE;
        st.invert = 1;
        st.behavior = SPLIT_REMOVED;
        if (!(st.re = tok_regex_compile(ws, strlen(ws), false, why, sizeof why))) return jerr(c, path, "%s", why);
    } else if (!strcmp(ty, "WhitespaceSplit")) {
        st.kind = PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(ty, "BertPreTokenizer")) {
        st.kind = PRE_WHITESPACE_SPLIT;
        t->pre = xrealloc(t->pre, (t->n_pre + 1) * sizeof *t->pre);
        t->pre[t->n_pre++] = st;
        st.kind = PRE_PUNCTUATION;
        st.behavior = SPLIT_ISOLATED;
    } else if (!strcmp(ty, "Metaspace")) {
        json_t *r = json_object_get(j, "replacement");
        const char *rs = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        if (strlen(rs) == 0 || strlen(rs) >= sizeof st.replacement) return jerr(c, path, "bad replacement");
        st.kind = PRE_METASPACE;
        strcpy(st.replacement, rs);
        st.prepend_scheme = parse_prepend_scheme(j);
        st.split = jbool(j, "split", true);
    } else {
        return jerr(c, path, "pre-tokenizer type '%s' is not supported (Split, ByteLevel, Digits, Punctuation, "
                    "Whitespace, WhitespaceSplit, BertPreTokenizer, Metaspace, Sequence)", ty);
    }
    t->pre = xrealloc(t->pre, (t->n_pre + 1) * sizeof *t->pre);
    t->pre[t->n_pre++] = st;
    return 0;
}

/* ---- decoder ----------------------------------------------------------------- */

static int load_dec(tokenizer *t, loadctx *c, json_t *j, const char *path) {
    if (!j || json_is_null(j)) return 0;
    const char *ty = jtype(j);
    if (!ty) return jerr(c, path, "missing \"type\"");
    char sub[256];
    t->has_decoder = true;
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) return jerr(c, path, "Sequence without a \"decoders\" array");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            int rc = load_dec(t, c, json_array_get(arr, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    tok_dec_step st = {0};
    if (!strcmp(ty, "ByteLevel")) st.kind = DEC_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) st.kind = DEC_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) st.kind = DEC_FUSE;
    else if (!strcmp(ty, "Strip")) {
        json_t *ct = json_object_get(j, "content");
        if (!json_is_string(ct) || !json_string_length(ct)) return jerr(c, path, "Strip without a \"content\" char");
        st.kind = DEC_STRIP;
        st.a = xstrdup(json_string_value(ct));
        st.alen = strlen(st.a);
        st.start = (int)json_integer_value(json_object_get(j, "start"));
        st.stop = (int)json_integer_value(json_object_get(j, "stop"));
    } else if (!strcmp(ty, "Replace")) {
        st.kind = DEC_REPLACE;
        int rc = load_replace(c, j, path, &st.a, &st.alen, &st.b, &st.blen, &st.re);
        if (rc) return rc;
    } else if (!strcmp(ty, "Metaspace")) {
        json_t *r = json_object_get(j, "replacement");
        st.kind = DEC_METASPACE;
        st.a = xstrdup(json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81");
        st.alen = strlen(st.a);
        st.prepend_scheme = parse_prepend_scheme(j);
    } else {
        return jerr(c, path, "decoder type '%s' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                    "Metaspace, Sequence)", ty);
    }
    t->dec = xrealloc(t->dec, (t->n_dec + 1) * sizeof *t->dec);
    t->dec[t->n_dec++] = st;
    return 0;
}

/* ---- added tokens ---------------------------------------------------------------- */

static void matcher_build(tokenizer *t, tok_matcher *m, bool normalized) {
    int cnt[257] = {0};
    m->n = 0;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].match_len) {
            cnt[(unsigned char)t->added[i].match[0]]++;
            m->n++;
        }
    m->order = xmalloc((m->n + 1) * sizeof *m->order);
    m->start[0] = 0;
    for (int b = 0; b < 256; b++) m->start[b + 1] = m->start[b] + cnt[b];
    int fill[256];
    for (int b = 0; b < 256; b++) fill[b] = m->start[b];
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].match_len)
            m->order[fill[(unsigned char)t->added[i].match[0]]++] = i;
    m->one_first = -1;
    for (int b = 0; b < 256; b++)
        if (cnt[b] == m->n && m->n) m->one_first = b;
    /* longest first within each first byte (insertion sort: few tokens share a byte) */
    for (int b = 0; b < 256; b++)
        for (int i = m->start[b] + 1; i < m->start[b + 1]; i++) {
            int x = m->order[i], k = i;
            while (k > m->start[b] && t->added[m->order[k - 1]].match_len < t->added[x].match_len) {
                m->order[k] = m->order[k - 1];
                k--;
            }
            m->order[k] = x;
        }
}

static int load_added(tokenizer *t, loadctx *c, json_t *arr) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return jerr(c, "added_tokens", "expected an array");
    t->n_added = (int)json_array_size(arr);
    t->added = xcalloc(t->n_added + 1, sizeof *t->added);
    for (int i = 0; i < t->n_added; i++) {
        json_t *o = json_array_get(arr, i);
        json_t *id = json_object_get(o, "id"), *ct = json_object_get(o, "content");
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX - 1)
            return jerr(c, path, "missing or bad \"id\"");
        if (!json_is_string(ct)) return jerr(c, path, "missing \"content\"");
        tok_added *a = &t->added[i];
        a->id = (int32_t)json_integer_value(id);
        a->len = json_string_length(ct);
        a->content = dupn(json_string_value(ct), a->len);
        a->special = jbool(o, "special", false);
        a->lstrip = jbool(o, "lstrip", false);
        a->rstrip = jbool(o, "rstrip", false);
        a->single_word = jbool(o, "single_word", false);
        a->normalized = jbool(o, "normalized", !a->special);
    }
    return 0;
}

/* ---- model -------------------------------------------------------------------- */

static int load_model(tokenizer *t, loadctx *c, json_t *m) {
    if (!json_is_object(m)) return jerr(c, "model", "missing");
    const char *ty = jtype(m);
    if (ty && strcmp(ty, "BPE")) return jerr(c, "model.type", "'%s' is not supported (only BPE)", ty);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return jerr(c, "model.vocab", "expected an object of token -> id");
    if (!json_is_array(merges)) return jerr(c, "model.merges", "expected an array");
    json_t *dr = json_object_get(m, "dropout");
    if (json_is_number(dr) && json_number_value(dr) > 0)
        log_warn("%s: model.dropout %.3g ignored: encoding is deterministic", c->file, json_number_value(dr));

    /* strings: vocab keys and added contents, in one pool */
    size_t total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) total += strlen(key) + 1;
    for (int i = 0; i < t->n_added; i++) total += t->added[i].len + 1;
    t->strpool = xmalloc(total + 1);
    t->strpool_len = 0;

    int32_t max_id = -1;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > INT32_MAX - 1) {
            char path[300];
            snprintf(path, sizeof path, "model.vocab['%.200s']", key);
            return jerr(c, path, "id must be a non-negative integer");
        }
        if (json_integer_value(val) > max_id) max_id = (int32_t)json_integer_value(val);
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_ids = max_id + 1;
    t->piece = xcalloc(t->n_ids + 1, sizeof *t->piece);
    t->piece_len = xcalloc(t->n_ids + 1, sizeof *t->piece_len);
    t->flags = xcalloc(t->n_ids + 1, 1);
    tok_map_init(&t->vocab, json_object_size(vocab));
    json_object_foreach(vocab, key, val) {
        size_t n = strlen(key);
        char *s = t->strpool + t->strpool_len;
        memcpy(s, key, n + 1);
        t->strpool_len += n + 1;
        int32_t id = (int32_t)json_integer_value(val);
        tok_map_put(&t->vocab, s, (uint32_t)n, id);
        t->piece[id] = s;
        t->piece_len[id] = (uint32_t)n;
    }

    json_t *up = json_object_get(m, "continuing_subword_prefix");
    if (json_is_string(up) && json_string_length(up)) t->cont_prefix = xstrdup(json_string_value(up));
    json_t *sf = json_object_get(m, "end_of_word_suffix");
    if (json_is_string(sf) && json_string_length(sf)) t->eow_suffix = xstrdup(json_string_value(sf));
    t->byte_fallback = jbool(m, "byte_fallback", false);
    t->fuse_unk = jbool(m, "fuse_unk", false);
    t->ignore_merges = jbool(m, "ignore_merges", false);
    t->unk_id = -1;
    json_t *unk = json_object_get(m, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id = tok_map_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) return jerr(c, "model.unk_token", "'%s' is not in model.vocab", json_string_value(unk));
    }

    /* merges: "a b" strings or ["a", "b"] pairs; rank = index */
    size_t nm = json_array_size(merges), plen = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    tok_merges_init(&t->merges, nm);
    buf joined;
    buf_init(&joined);
    for (size_t i = 0; i < nm; i++) {
        json_t *mj = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        char path[64];
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        if (json_is_string(mj)) {
            const char *s = json_string_value(mj), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) { buf_free(&joined); return jerr(c, path, "'%s' is not two tokens separated by one space", s); }
            a = s;
            an = (size_t)(sp - s);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_is_array(mj) && json_array_size(mj) == 2 && json_is_string(json_array_get(mj, 0)) &&
                   json_is_string(json_array_get(mj, 1))) {
            a = json_string_value(json_array_get(mj, 0));
            an = json_string_length(json_array_get(mj, 0));
            b = json_string_value(json_array_get(mj, 1));
            bn = json_string_length(json_array_get(mj, 1));
        } else {
            buf_free(&joined);
            return jerr(c, path, "expected \"a b\" or [\"a\", \"b\"]");
        }
        int32_t ia = tok_map_get(&t->vocab, a, an), ib = tok_map_get(&t->vocab, b, bn);
        if (ia < 0) { buf_free(&joined); return jerr(c, path, "unknown token '%.*s'", (int)an, a); }
        if (ib < 0) { buf_free(&joined); return jerr(c, path, "unknown token '%.*s'", (int)bn, b); }
        joined.len = 0;
        buf_append(&joined, a, an);
        size_t skip = bn >= plen ? plen : bn;
        buf_append(&joined, b + skip, bn - skip);
        int32_t in = tok_map_get(&t->vocab, joined.data, joined.len);
        if (in < 0) {
            int rc = jerr(c, path, "merged token '%s' is not in model.vocab", joined.data);
            buf_free(&joined);
            return rc;
        }
        tok_merges_put(&t->merges, ia, ib, (uint32_t)i, in);
    }
    buf_free(&joined);

    for (int b = 0; b < 256; b++) {
        char tmp[8];
        int k = tok_utf8_enc(tok_byte_to_cp[b], tmp);
        t->byte_id[b] = tok_map_get(&t->vocab, tmp, (size_t)k);
        snprintf(tmp, sizeof tmp, "<0x%02X>", b);
        t->byte_fallback_id[b] = tok_map_get(&t->vocab, tmp, 6);
    }
    return 0;
}

/* ---- tokenizer_config.json ------------------------------------------------------ */

static char *config_token(json_t *v) {
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return xstrdup(json_string_value(json_object_get(v, "content")));
    return NULL;
}

static int load_config(tokenizer *t, const char *path, ls_err *e) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return errf(e, ERR_INVAL, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return errf(e, ERR_INVAL, "%s: expected a JSON object", path);
    }
    t->bos_token = config_token(json_object_get(root, "bos_token"));
    t->eos_token = config_token(json_object_get(root, "eos_token"));
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = xstrdup(json_string_value(ct));
    } else if (json_is_array(ct)) {
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *it = json_array_get(ct, i);
            json_t *nm = json_object_get(it, "name"), *tp = json_object_get(it, "template");
            if (json_is_string(nm) && json_is_string(tp) && !strcmp(json_string_value(nm), "default"))
                t->chat_template = xstrdup(json_string_value(tp));
        }
    }
    json_decref(root);
    return 0;
}

/* ---- load / free ------------------------------------------------------------------ */

void tok_free(tokenizer *t) {
    if (!t) return;
    tok_map_free(&t->vocab);
    tok_map_free(&t->added_map);
    tok_map_free(&t->stable);
    tok_merges_free(&t->merges);
    free(t->strpool);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->piece);
    free(t->piece_len);
    free(t->flags);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_pool);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].match != t->added[i].content) free(t->added[i].match);
        free(t->added[i].content);
    }
    free(t->added);
    free(t->match_raw.order);
    free(t->match_norm.order);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
        if (t->norm[i].re) pcre2_code_free(t->norm[i].re);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
    free(t->pre);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
        if (t->dec[i].re) pcre2_code_free(t->dec[i].re);
    }
    free(t->dec);
    free(t->bos_token);
    free(t->eos_token);
    free(t->chat_template);
    tok_cache_free(t);
    free(t->path);
    free(t);
}

static int load_json(tokenizer *t, json_t *root, loadctx *c) {
    if (!json_is_object(root)) return jerr(c, "(root)", "expected a JSON object");
    int rc;
    if ((rc = load_added(t, c, json_object_get(root, "added_tokens")))) return rc;
    if ((rc = load_model(t, c, json_object_get(root, "model")))) return rc;
    if ((rc = load_norm(t, c, json_object_get(root, "normalizer"), "normalizer"))) return rc;
    if ((rc = load_pre(t, c, json_object_get(root, "pre_tokenizer"), "pre_tokenizer"))) return rc;
    if ((rc = load_dec(t, c, json_object_get(root, "decoder"), "decoder"))) return rc;
    t->byte_mode = t->n_pre > 0 && t->pre[t->n_pre - 1].kind == PRE_BYTELEVEL;
    for (int k = 0; k < t->n_pre; k++) {
        tok_pre_step *st = &t->pre[k];
        st->jit = st->re && tok_regex_has_jit(st->re);
        const tok_pre_step *nx = k + 2 == t->n_pre ? &t->pre[k + 1] : NULL;
        st->to_model = nx && nx->kind == PRE_BYTELEVEL && !nx->add_prefix_space && !nx->use_regex;
    }
    t->dec_bytes_only = t->n_dec == 1 && t->dec[0].kind == DEC_BYTELEVEL;

    /* added tokens overlay the vocab for id -> piece; normalized ones match normalized text */
    tok_map_init(&t->added_map, (size_t)t->n_added);
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        char *s = t->strpool + t->strpool_len;
        memcpy(s, a->content, a->len + 1);
        t->strpool_len += a->len + 1;
        t->piece[a->id] = s;
        t->piece_len[a->id] = (uint32_t)a->len;
        t->flags[a->id] = TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0);
        tok_map_put(&t->added_map, s, (uint32_t)a->len, a->id);
        a->match = a->content;
        a->match_len = a->len;
        if (a->normalized && t->n_norm) {
            buf nb;
            buf_init(&nb);
            size_t mn;
            const char *m = tok_normalize(t, a->content, a->len, &nb, &mn);
            a->match = dupn(m, mn);
            a->match_len = mn;
            buf_free(&nb);
            /* HF's id_to_token (and so decode) gives the normalized content */
            t->piece[a->id] = a->match;
            t->piece_len[a->id] = (uint32_t)a->match_len;
        }
    }
    matcher_build(t, &t->match_raw, false);
    matcher_build(t, &t->match_norm, true);
    tok_build_dec_bytes(t);
    tok_build_stable(t);
    return 0;
}

int tok_load_file(const char *path, tokenizer **out, ls_err *e) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        if (je.line < 0 || !strncmp(je.text, "unable to open", 14))
            return errf(e, ERR_INVAL, "%s: %s", path, je.text);
        return errf(e, ERR_INVAL, "%s: line %d, column %d: %s", path, je.line, je.column, je.text);
    }
    tokenizer *t = xcalloc(1, sizeof *t);
    t->path = xstrdup(path);
    tok_cache_init(t);
    loadctx c = {path, e};
    int rc = load_json(t, root, &c);
    json_decref(root);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tok_load_dir(const char *dir, tokenizer **out, ls_err *e) {
    *out = NULL;
    size_t n = strlen(dir);
    char *p = xmalloc(n + 32);
    snprintf(p, n + 32, "%s/tokenizer.json", dir);
    int rc = tok_load_file(p, out, e);
    if (!rc) {
        snprintf(p, n + 32, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            rc = load_config(*out, p, e);
            if (rc) {
                tok_free(*out);
                *out = NULL;
            }
        }
    }
    free(p);
    return rc;
}

/* ---- encode -------------------------------------------------------------------- */

typedef struct enc {
    const tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    buf norm;
    tok_pre_scratch *sc;
} enc;

static void enc_push(enc *x, int32_t id) {
    if (x->n == x->cap) {
        x->cap = x->cap ? x->cap * 2 : 256;
        x->ids = xrealloc(x->ids, x->cap * sizeof *x->ids);
    }
    x->ids[x->n++] = id;
}

/* Split s[0..n) on added tokens of m (HF AddedVocabulary::find_matches):
 * calls piece(x, text, len, is_first) for text and pushes token ids. */
typedef void (*piece_fn)(enc *x, const char *s, size_t n, bool is_first);

static bool prev_is_word(const char *s, size_t end) {
    if (end == 0) return false;
    size_t p = end - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    uint32_t cp;
    tok_utf8_dec((const unsigned char *)s + p, &cp);
    return tok_is_word_char(cp);
}

static bool next_is_word(const char *s, size_t n, size_t at) {
    if (at >= n) return false;
    uint32_t cp;
    tok_utf8_dec((const unsigned char *)s + at, &cp);
    return tok_is_word_char(cp);
}

static void split_added(enc *x, const tok_matcher *m, const char *s, size_t n, bool is_first, piece_fn piece) {
    const tokenizer *t = x->t;
    size_t start_off = 0, i = 0;
    if (m->n)
        while (i < n) {
            if (m->one_first >= 0) { /* every token starts with the same byte: memchr */
                const char *q = memchr(s + i, m->one_first, n - i);
                if (!q) break;
                i = (size_t)(q - s);
            }
            unsigned char b = (unsigned char)s[i];
            int lo = m->start[b], hi = m->start[b + 1];
            const tok_added *hit = NULL;
            for (int k = lo; k < hi; k++) {
                const tok_added *a = &t->added[m->order[k]];
                if (a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len)) {
                    hit = a;
                    break;
                }
            }
            if (!hit) { i++; continue; }
            size_t ms = i, me = i + hit->match_len;
            i = me; /* the scan resumes after the match even when it is discarded */
            if (hit->single_word && ((ms > 0 && prev_is_word(s, ms)) || (me < n && next_is_word(s, n, me)))) continue;
            if (hit->lstrip) {
                size_t p = ms;
                while (p > 0) {
                    size_t q = p - 1;
                    while (q > 0 && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
                    uint32_t cp;
                    tok_utf8_dec((const unsigned char *)s + q, &cp);
                    if (!tok_is_whitespace(cp)) break;
                    p = q;
                }
                ms = p > start_off ? p : start_off;
            }
            if (hit->rstrip) {
                while (me < n) {
                    uint32_t cp;
                    int l = tok_utf8_dec((const unsigned char *)s + me, &cp);
                    if (!tok_is_whitespace(cp)) break;
                    me += (size_t)l;
                }
            }
            if (start_off < ms) piece(x, s + start_off, ms - start_off, is_first && start_off == 0);
            enc_push(x, hit->id);
            start_off = me;
        }
    if (start_off < n) piece(x, s + start_off, n - start_off, is_first && start_off == 0);
}

static void model_word(void *ctx, const char *w, size_t n) {
    enc *x = ctx;
    tok_bpe_word(x->t, w, n, &x->ids, &x->n, &x->cap);
}

static void model_piece(enc *x, const char *s, size_t n, bool is_first) {
    tok_pretokenize(x->t, x->sc, s, n, is_first, model_word, x);
}

static void raw_piece(enc *x, const char *s, size_t n, bool is_first) {
    const tokenizer *t = x->t;
    if (!t->n_norm) {
        split_added(x, &t->match_norm, s, n, is_first, model_piece);
        return;
    }
    size_t nn;
    const char *ns = tok_normalize(t, s, n, &x->norm, &nn);
    split_added(x, &t->match_norm, ns, nn, is_first, model_piece);
}

int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, ls_err *e) {
    *ids = NULL;
    size_t bad = tok_utf8_valid(text, len);
    if (bad != len) return errf(e, ERR_INVAL, "text is not valid UTF-8 (byte %zu)", bad);
    if (len > (size_t)INT32_MAX / 2) return errf(e, ERR_INVAL, "text is too long (%zu bytes)", len);
    enc x = {.t = t};
    x.cap = len / 3 + 64; /* byte-level BPE averages 3-4 bytes per token */
    x.ids = xmalloc(x.cap * sizeof *x.ids);
    buf_init(&x.norm);
    x.sc = tok_pre_scratch_new(t);
    split_added(&x, &t->match_raw, text, len, true, raw_piece);
    buf_free(&x.norm);
    tok_pre_scratch_free(x.sc);
    if (x.n > INT32_MAX) {
        free(x.ids);
        return errf(e, ERR_INVAL, "text is too long");
    }
    *ids = x.ids;
    return (int)x.n;
}

/* ---- lookups ---------------------------------------------------------------------- */

int tok_vocab_size(const tokenizer *t) { return t->n_ids; }

int32_t tok_id(const tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tok_map_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_map_get(&t->vocab, token, n);
}

const char *tok_piece(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->piece[id] : NULL;
}

int tok_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & TOKF_SPECIAL);
}

const char *tok_bos_token(const tokenizer *t) { return t->bos_token; }
const char *tok_eos_token(const tokenizer *t) { return t->eos_token; }
const char *tok_chat_template(const tokenizer *t) { return t->chat_template; }
