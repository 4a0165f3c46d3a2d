/* demo_tok.c: the demo model's tokenizer, learned and written at synth time.
 *
 * tokenizer.json is Hugging Face's format for a Qwen3.5-style byte-level BPE:
 * NFC normalizer; pre-tokenizer Sequence[Split(Qwen3.5 regex, Isolated),
 * ByteLevel(use_regex=false)]; BPE model (vocab + merges, no unk, no byte
 * fallback); ByteLevel decoder; the 33 Qwen3.5 added tokens with their
 * `special` flags (reference/qwen35-and-nvfp4.md section 5.1) at the end of
 * the vocabulary.
 *
 * The merges are learned by a small deterministic BPE trainer over the
 * embedded sample text (synth_corpus.c): count adjacent pairs inside each
 * pre-tokenized word, merge the most frequent (ties: smallest left id, then
 * smallest right id), repeat until the vocabulary holds DEMO_TOK_VOCAB - 33
 * tokens. Ids 0..255 are the 256 bytes in GPT-2's bytes_to_unicode order
 * ('!' = 0), as in the Qwen vocabularies.
 *
 * Owns: nothing global; everything is rebuilt per call.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/demo_tok.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Qwen3.5 pre-tokenizer pattern (\p{M} joins letters; digits singly). */
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const struct { const char *content; int special; } added[] = {
    {"<|endoftext|>", 1}, {"<|im_start|>", 1}, {"<|im_end|>", 1}, {"<|object_ref_start|>", 1},
    {"<|object_ref_end|>", 1}, {"<|box_start|>", 1}, {"<|box_end|>", 1}, {"<|quad_start|>", 1},
    {"<|quad_end|>", 1}, {"<|vision_start|>", 1}, {"<|vision_end|>", 1}, {"<|vision_pad|>", 1},
    {"<|image_pad|>", 1}, {"<|video_pad|>", 1}, {"<tool_call>", 0}, {"</tool_call>", 0},
    {"<|fim_prefix|>", 0}, {"<|fim_middle|>", 0}, {"<|fim_suffix|>", 0}, {"<|fim_pad|>", 0},
    {"<|repo_name|>", 0}, {"<|file_sep|>", 0}, {"<tool_response>", 0}, {"</tool_response>", 0},
    {"<think>", 0}, {"</think>", 0}, {"<|audio_start|>", 1}, {"<|audio_end|>", 1},
    {"<tts_pad>", 1}, {"<tts_text_bos>", 1}, {"<tts_text_eod>", 1}, {"<tts_text_bos_single>", 1},
    {"<|audio_pad|>", 1},
};
#define N_ADDED ((int)(sizeof added / sizeof added[0]))
#define N_BASE (DEMO_TOK_VOCAB - N_ADDED)

int demo_tok_vocab_size(void) { return DEMO_TOK_VOCAB; }

int32_t demo_tok_id(const char *content) {
    for (int i = 0; i < N_ADDED; i++)
        if (!strcmp(added[i].content, content)) return N_BASE + i;
    return -1;
}

/* ---- byte-level alphabet ------------------------------------------------- */

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 to
 * U+0100 upwards. order[i] is the byte of token id i. */
static void byte_alphabet(uint32_t cp[256], unsigned char order[256]) {
    int n = 0, extra = 0;
    unsigned char is_print[256] = {0};
    for (int b = 33; b <= 126; b++) is_print[b] = 1;
    for (int b = 161; b <= 172; b++) is_print[b] = 1;
    for (int b = 174; b <= 255; b++) is_print[b] = 1;
    for (int b = 0; b < 256; b++)
        if (is_print[b]) { cp[b] = (uint32_t)b; order[n++] = (unsigned char)b; }
    for (int b = 0; b < 256; b++)
        if (!is_print[b]) { cp[b] = 256u + (uint32_t)extra++; order[n++] = (unsigned char)b; }
}

static void put_utf8(buf *b, uint32_t c) {
    char t[4];
    if (c < 0x80) { t[0] = (char)c; buf_append(b, t, 1); }
    else if (c < 0x800) { t[0] = (char)(0xC0 | (c >> 6)); t[1] = (char)(0x80 | (c & 63)); buf_append(b, t, 2); }
    else { t[0] = (char)(0xE0 | (c >> 12)); t[1] = (char)(0x80 | ((c >> 6) & 63)); t[2] = (char)(0x80 | (c & 63)); buf_append(b, t, 3); }
}

/* ---- trainer ------------------------------------------------------------- */

typedef struct tokstr { unsigned char *s; int len; } tokstr;

typedef struct word { int *sym; int n; int count; } word;

typedef struct bpe {
    tokstr *tok;       /* [ntok] raw bytes of each token */
    int ntok;
    int (*merge)[2];   /* [nmerge] (left id, right id), in rank order */
    int nmerge;
} bpe;

typedef struct piece { const char *p; int len; } piece;

static int piece_cmp(const void *a, const void *b) {
    const piece *x = a, *y = b;
    int m = x->len < y->len ? x->len : y->len, c = memcmp(x->p, y->p, (size_t)m);
    return c ? c : x->len - y->len;
}

/* Split text with the pre-tokenizer pattern (Isolated: matches and the gaps
 * between them are pieces). */
static int pretokenize(const char *text, piece **out, int *nout, ls_err *e) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)QWEN35_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) return errf(e, ERR_RUNTIME, "demo tokenizer: pattern does not compile (error %d at %zu)", ec, (size_t)eo);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(text), pos = 0;
    int n = 0, cap = 4096;
    piece *v = xmalloc(sizeof(piece) * cap);
    while (pos < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
        size_t s = len, en = len;
        if (rc > 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            s = ov[0];
            en = ov[1];
        }
        if (n + 2 >= cap) v = xrealloc(v, sizeof(piece) * (cap *= 2));
        if (s > pos) v[n++] = (piece){text + pos, (int)(s - pos)};
        if (en > s) v[n++] = (piece){text + s, (int)(en - s)};
        if (en == s) { if (s >= len) break; en = s + 1; } /* cannot happen: no empty alternative */
        pos = en;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    *out = v;
    *nout = n;
    return 0;
}

/* Pair-count table: open addressing over (left, right) keys, cleared slot by slot. */
typedef struct pairtab { uint64_t *key; int64_t *cnt; int *used; int nused; int size; } pairtab;

static void pt_add(pairtab *t, int a, int b, int64_t c) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, h = (k * 0x9e3779b97f4a7c15ull) >> 40;
    for (;; h++) {
        h &= (uint64_t)(t->size - 1);
        if (t->cnt[h] == 0 && t->key[h] == UINT64_MAX) {
            t->key[h] = k;
            t->cnt[h] = c;
            t->used[t->nused++] = (int)h;
            return;
        }
        if (t->key[h] == k) { t->cnt[h] += c; return; }
    }
}

static int train(bpe *m, ls_err *e) {
    uint32_t cp[256];
    unsigned char order[256];
    byte_alphabet(cp, order);
    int byte_id[256];
    memset(m, 0, sizeof *m);
    m->tok = xmalloc(sizeof(tokstr) * N_BASE);
    m->merge = xmalloc(sizeof(int[2]) * N_BASE);
    for (int i = 0; i < 256; i++) {
        m->tok[i].s = xmalloc(1);
        m->tok[i].s[0] = order[i];
        m->tok[i].len = 1;
        byte_id[order[i]] = i;
    }
    m->ntok = 256;

    piece *pc = NULL;
    int np = 0, rc = pretokenize(demo_tok_corpus, &pc, &np, e);
    if (rc) return rc;
    qsort(pc, np, sizeof(piece), piece_cmp);
    word *w = xmalloc(sizeof(word) * (np + 1));
    int nw = 0, total_sym = 0;
    for (int i = 0; i < np;) {
        int j = i;
        while (j < np && !piece_cmp(&pc[i], &pc[j])) j++;
        w[nw].n = pc[i].len;
        w[nw].count = j - i;
        w[nw].sym = xmalloc(sizeof(int) * pc[i].len);
        for (int k = 0; k < pc[i].len; k++) w[nw].sym[k] = byte_id[(unsigned char)pc[i].p[k]];
        total_sym += pc[i].len;
        nw++;
        i = j;
    }
    free(pc);

    pairtab t;
    t.size = 1;
    while (t.size < 4 * total_sym) t.size <<= 1;
    t.key = xmalloc(sizeof(uint64_t) * t.size);
    t.cnt = xcalloc((size_t)t.size, sizeof(int64_t));
    t.used = xmalloc(sizeof(int) * t.size);
    for (int i = 0; i < t.size; i++) t.key[i] = UINT64_MAX;
    t.nused = 0;

    while (m->ntok < N_BASE) {
        for (int i = 0; i < t.nused; i++) { t.key[t.used[i]] = UINT64_MAX; t.cnt[t.used[i]] = 0; }
        t.nused = 0;
        for (int i = 0; i < nw; i++)
            for (int k = 0; k + 1 < w[i].n; k++) pt_add(&t, w[i].sym[k], w[i].sym[k + 1], w[i].count);
        int64_t best = 0;
        uint64_t bk = 0;
        for (int i = 0; i < t.nused; i++) {
            int h = t.used[i];
            if (t.cnt[h] > best || (t.cnt[h] == best && t.key[h] < bk)) { best = t.cnt[h]; bk = t.key[h]; }
        }
        if (!best) { rc = errf(e, ERR_RUNTIME, "demo tokenizer: the sample text allows only %d tokens", m->ntok); break; }
        int a = (int)(bk >> 32), b = (int)(uint32_t)bk;
        /* the merged string: an existing token, or a new one */
        int la = m->tok[a].len, lb = m->tok[b].len, id = -1;
        unsigned char *s = xmalloc((size_t)(la + lb));
        memcpy(s, m->tok[a].s, (size_t)la);
        memcpy(s + la, m->tok[b].s, (size_t)lb);
        for (int i = 256; i < m->ntok && id < 0; i++)
            if (m->tok[i].len == la + lb && !memcmp(m->tok[i].s, s, (size_t)(la + lb))) id = i;
        if (id < 0) {
            id = m->ntok++;
            m->tok[id] = (tokstr){s, la + lb};
        } else {
            free(s);
        }
        m->merge[m->nmerge][0] = a;
        m->merge[m->nmerge][1] = b;
        m->nmerge++;
        for (int i = 0; i < nw; i++) {
            int o = 0;
            for (int k = 0; k < w[i].n; k++) {
                if (k + 1 < w[i].n && w[i].sym[k] == a && w[i].sym[k + 1] == b) { w[i].sym[o++] = id; k++; }
                else w[i].sym[o++] = w[i].sym[k];
            }
            w[i].n = o;
        }
    }
    for (int i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    free(t.key);
    free(t.cnt);
    free(t.used);
    return rc;
}

static void bpe_free(bpe *m) {
    for (int i = 0; i < m->ntok; i++) free(m->tok[i].s);
    free(m->tok);
    free(m->merge);
}

/* ---- files --------------------------------------------------------------- */

static json_t *bytelevel(void) {
    return json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0);
}

static json_t *added_entry(int i, int with_id) {
    json_t *o = json_object();
    if (with_id) json_object_set_new(o, "id", json_integer(N_BASE + i));
    json_object_set_new(o, "content", json_string(added[i].content));
    json_object_set_new(o, "single_word", json_false());
    json_object_set_new(o, "lstrip", json_false());
    json_object_set_new(o, "rstrip", json_false());
    json_object_set_new(o, "normalized", json_false());
    json_object_set_new(o, "special", json_boolean(added[i].special));
    return o;
}

static char *tok_string(const tokstr *t, const uint32_t cp[256]) {
    buf b;
    buf_init(&b);
    for (int k = 0; k < t->len; k++) put_utf8(&b, cp[t->s[k]]);
    return buf_detach(&b);
}

static json_t *tokenizer_json(const bpe *m) {
    uint32_t cp[256];
    unsigned char order[256];
    byte_alphabet(cp, order);
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_t *at = json_array();
    for (int i = 0; i < N_ADDED; i++) json_array_append_new(at, added_entry(i, 1));
    json_object_set_new(root, "added_tokens", at);
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_t *split = json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", QWEN35_PATTERN, "behavior",
                              "Isolated", "invert", 0);
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s,s:[o,o]}", "type", "Sequence", "pretokenizers", split, bytelevel()));
    json_object_set_new(root, "post_processor", bytelevel());
    json_object_set_new(root, "decoder", bytelevel());
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_string(""));
    json_object_set_new(model, "end_of_word_suffix", json_string(""));
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_false());
    json_t *vocab = json_object(), *merges = json_array();
    char **str = xmalloc(sizeof(char *) * m->ntok);
    for (int i = 0; i < m->ntok; i++) {
        str[i] = tok_string(&m->tok[i], cp);
        json_object_set_new(vocab, str[i], json_integer(i));
    }
    for (int i = 0; i < m->nmerge; i++)
        json_array_append_new(merges, json_pack("[s,s]", str[m->merge[i][0]], str[m->merge[i][1]]));
    for (int i = 0; i < m->ntok; i++) free(str[i]);
    free(str);
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "model", model);
    return root;
}

static json_t *tokenizer_config(void) {
    json_t *c = json_object();
    json_object_set_new(c, "add_bos_token", json_false());
    json_object_set_new(c, "add_prefix_space", json_false());
    json_t *dec = json_object();
    for (int i = 0; i < N_ADDED; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", N_BASE + i);
        json_object_set_new(dec, id, added_entry(i, 0));
    }
    json_object_set_new(c, "added_tokens_decoder", dec);
    json_t *extra = json_array();
    for (int i = 0; i < N_ADDED; i++)
        if (added[i].special && strcmp(added[i].content, "<|endoftext|>"))
            json_array_append_new(extra, json_string(added[i].content));
    json_object_set_new(c, "additional_special_tokens", extra);
    json_object_set_new(c, "bos_token", json_null());
    json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(c, "eos_token", json_string("<|im_end|>"));
    json_object_set_new(c, "errors", json_string("replace"));
    json_object_set_new(c, "model_max_length", json_integer(32768));
    json_object_set_new(c, "pad_token", json_string("<|endoftext|>"));
    json_object_set_new(c, "split_special_tokens", json_false());
    json_object_set_new(c, "tokenizer_class", json_string("Qwen2Tokenizer"));
    json_object_set_new(c, "unk_token", json_null());
    return c;
}

/* The demo's chat template, written for laststand to the Qwen3.5 behaviour
 * (reference section 5.2): optional system turn carrying the tool list,
 * qwen3_coder XML tool calls, consecutive tool results grouped in one user
 * turn, reasoning kept only after the last user query, and a generation
 * prompt that opens <think> (or closes it at once with enable_thinking=false). */
static const char CHAT_TEMPLATE[] =
    "{#- laststand demo chat template: Qwen3.5 conventions (thinking on by default, XML tool calls). -#}\n"
    "{%- macro text_of(content) -%}\n"
    "    {%- if content is string -%}\n"
    "        {{- content -}}\n"
    "    {%- elif content is none or content is undefined -%}\n"
    "    {%- elif content is iterable and content is not mapping -%}\n"
    "        {%- for part in content -%}\n"
    "            {%- if part is string -%}\n"
    "                {{- part -}}\n"
    "            {%- elif part.type == 'image' or part.type == 'image_url' -%}\n"
    "                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}\n"
    "            {%- elif part.type == 'video' -%}\n"
    "                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}\n"
    "            {%- elif part.text is defined -%}\n"
    "                {{- part.text -}}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{- raise_exception('Message content must be a string or a list of parts.') -}}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- if not messages -%}\n"
    "    {{- raise_exception('No messages provided.') -}}\n"
    "{%- endif -%}\n"
    "{%- set first_is_system = messages[0].role == 'system' -%}\n"
    "{%- if tools is defined and tools -%}\n"
    "    {{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}\n"
    "    {%- for tool in tools -%}\n"
    "        {{- '\\n' + (tool | tojson) -}}\n"
    "    {%- endfor -%}\n"
    "    {{- '\\n</tools>\\n\\nTo call a function, reply ONLY in this format, with nothing after it:\\n\\n"
    "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n"
    "<parameter=example_parameter_2>\\nA value may span\\nseveral lines\\n</parameter>\\n</function>\\n</tool_call>\\n\\n"
    "<IMPORTANT>\\nRules:\\n- Each <function=...></function> block goes inside <tool_call></tool_call> tags\\n"
    "- Give every required parameter\\n- Any reasoning about the call comes BEFORE the call, never after it\\n"
    "- If no function fits, answer normally and do not mention the functions\\n</IMPORTANT>' -}}\n"
    "    {%- if first_is_system -%}\n"
    "        {%- set sys_text = text_of(messages[0].content) | trim -%}\n"
    "        {%- if sys_text -%}\n"
    "            {{- '\\n\\n' + sys_text -}}\n"
    "        {%- endif -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<|im_end|>\\n' -}}\n"
    "{%- elif first_is_system -%}\n"
    "    {{- '<|im_start|>system\\n' + (text_of(messages[0].content) | trim) + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{#- the last user turn that is a real query, not a batch of tool results -#}\n"
    "{%- set ns = namespace(last_query=-1) -%}\n"
    "{%- for m in messages -%}\n"
    "    {%- if m.role == 'user' -%}\n"
    "        {%- set t = text_of(m.content) | trim -%}\n"
    "        {%- if not (t.startswith('<tool_response>') and t.endswith('</tool_response>')) -%}\n"
    "            {%- set ns.last_query = loop.index0 -%}\n"
    "        {%- endif -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if ns.last_query < 0 -%}\n"
    "    {{- raise_exception('No user query found in messages.') -}}\n"
    "{%- endif -%}\n"
    "{%- for m in messages -%}\n"
    "    {%- set text = text_of(m.content) | trim -%}\n"
    "    {%- if m.role == 'system' -%}\n"
    "        {%- if not loop.first -%}\n"
    "            {{- raise_exception('System message must be at the beginning.') -}}\n"
    "        {%- endif -%}\n"
    "    {%- elif m.role == 'user' -%}\n"
    "        {{- '<|im_start|>user\\n' + text + '<|im_end|>\\n' -}}\n"
    "    {%- elif m.role == 'assistant' -%}\n"
    "        {%- set reasoning = '' -%}\n"
    "        {%- if m.reasoning_content is defined and m.reasoning_content is string -%}\n"
    "            {%- set reasoning = m.reasoning_content -%}\n"
    "        {%- elif '</think>' in text -%}\n"
    "            {%- set reasoning = text.split('</think>')[0].split('<think>')[-1] -%}\n"
    "            {%- set text = text.split('</think>')[-1].lstrip('\\n') -%}\n"
    "        {%- endif -%}\n"
    "        {%- set reasoning = reasoning | trim -%}\n"
    "        {%- if loop.index0 > ns.last_query -%}\n"
    "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + text -}}\n"
    "        {%- else -%}\n"
    "            {{- '<|im_start|>assistant\\n' + text -}}\n"
    "        {%- endif -%}\n"
    "        {%- if m.tool_calls is defined and m.tool_calls -%}\n"
    "            {%- for call in m.tool_calls -%}\n"
    "                {%- set fn = call.function if call.function is defined else call -%}\n"
    "                {%- if loop.first -%}\n"
    "                    {%- if text -%}\n"
    "                        {{- '\\n\\n' -}}\n"
    "                    {%- endif -%}\n"
    "                {%- else -%}\n"
    "                    {{- '\\n' -}}\n"
    "                {%- endif -%}\n"
    "                {{- '<tool_call>\\n<function=' + fn.name + '>\\n' -}}\n"
    "                {%- if fn.arguments is defined and fn.arguments is not none and fn.arguments is not mapping -%}\n"
    "                    {{- raise_exception('Tool call arguments must be a mapping, not a JSON string.') -}}\n"
    "                {%- endif -%}\n"
    "                {%- if fn.arguments is defined and fn.arguments is mapping -%}\n"
    "                    {%- for key, value in fn.arguments | items -%}\n"
    "                        {{- '<parameter=' + key + '>\\n' -}}\n"
    "                        {%- if value is mapping or (value is iterable and value is not string) -%}\n"
    "                            {{- value | tojson -}}\n"
    "                        {%- else -%}\n"
    "                            {{- value | string -}}\n"
    "                        {%- endif -%}\n"
    "                        {{- '\\n</parameter>\\n' -}}\n"
    "                    {%- endfor -%}\n"
    "                {%- endif -%}\n"
    "                {{- '</function>\\n</tool_call>' -}}\n"
    "            {%- endfor -%}\n"
    "        {%- endif -%}\n"
    "        {{- '<|im_end|>\\n' -}}\n"
    "    {%- elif m.role == 'tool' -%}\n"
    "        {%- if loop.first or loop.previtem.role != 'tool' -%}\n"
    "            {{- '<|im_start|>user' -}}\n"
    "        {%- endif -%}\n"
    "        {{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}\n"
    "        {%- if loop.last or loop.nextitem.role != 'tool' -%}\n"
    "            {{- '<|im_end|>\\n' -}}\n"
    "        {%- endif -%}\n"
    "    {%- else -%}\n"
    "        {{- raise_exception('Unexpected message role: ' + (m.role | string)) -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|im_start|>assistant\\n' -}}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false -%}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' -}}\n"
    "    {%- else -%}\n"
    "        {{- '<think>\\n' -}}\n"
    "    {%- endif -%}\n"
    "{%- endif -%}\n";

static int write_json(json_t *j, const char *dir, const char *name, ls_err *e) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int bad = json_dump_file(j, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    return bad ? errf(e, ERR_IO, "%s: write failed", p) : 0;
}

int demo_tok_write(const char *dir, ls_err *e) {
    bpe m;
    int rc = train(&m, e);
    if (!rc) rc = write_json(tokenizer_json(&m), dir, "tokenizer.json", e);
    bpe_free(&m);
    if (!rc) rc = write_json(tokenizer_config(), dir, "tokenizer_config.json", e);
    if (rc) return rc;
    char p[4096];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    FILE *f = fopen(p, "wb");
    if (!f) return errf(e, ERR_IO, "%s: cannot create", p);
    size_t n = strlen(CHAT_TEMPLATE);
    int bad = fwrite(CHAT_TEMPLATE, 1, n, f) != n;
    bad |= fclose(f) != 0;
    return bad ? errf(e, ERR_IO, "%s: write failed", p) : 0;
}
