/* gr_schema.c: JSON Schema, "any JSON object" and tool calls -> grammar nodes.
 *
 * The supported subset and the output form are listed in gr.h. Every refusal
 * names the JSON path of the keyword at fault, prefixed by the caller's path
 * ("response_format.json_schema.schema.properties.age.type: ...").
 * $ref targets are compiled once each, through a REF node, so recursive
 * schemas make recursive grammars; a schema that would compile to more than
 * MAX_NODES nodes is refused.
 */
#include "grammar/gr_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 200000
#define MAX_NEST 64

typedef struct cref { char *name; int node; } cref;

typedef struct cctx {
    gr_grammar *g;
    ls_err *e;
    const json_t *root;
    const char *root_path;     /* the JSON path of root, for errors inside $ref targets */
    int strict;
    int ws, comma, colon, empty, lbrace, rbrace, lbrack, rbrack, any, str_any, num_any;
    cref *refs;
    int n_refs, cap_refs;
    int nest;
} cctx;

static int lit(cctx *c, const char *s) { return gr_lit(c->g, s, strlen(s)); }

static int seq(cctx *c, int n, ...) {
    int32_t k[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) k[i] = va_arg(ap, int);
    va_end(ap);
    return gr_seq(c->g, k, n);
}

static int alt2(cctx *c, int a, int b) {
    int32_t k[2] = {a, b};
    return gr_alt(c->g, k, 2);
}

/* ARR node over explicit prefix items. */
static int arr(cctx *c, const int32_t *prefix, int n_prefix, int item, int min, int max, int sep) {
    int off = gr_kids(c->g, prefix, n_prefix);
    return gr_add(c->g, GN_ARR, off, n_prefix, item, min, max, sep);
}

/* "[" ... "]" / "{" ... "}" around a list whose minimum may be 0. */
static int bracketed(cctx *c, int open, int close, const int32_t *prefix, int n_prefix, int item, int min,
                     int max) {
    if (max == 0) return seq(c, 3, open, c->ws, close);
    if (min > 0) return seq(c, 5, open, c->ws, arr(c, prefix, n_prefix, item, min, max, c->comma), c->ws, close);
    int body = seq(c, 3, arr(c, prefix, n_prefix, item, 1, max, c->comma), c->ws, close);
    return seq(c, 3, open, c->ws, alt2(c, close, body));
}

/* The JSON text of a value as a literal (compact, UTF-8 unescaped). */
static int json_lit(cctx *c, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!s) return -1;
    int n = gr_lit(c->g, s, strlen(s));
    free(s);
    return n;
}

static void shared_nodes(cctx *c) {
    gr_grammar *g = c->g;
    c->ws = gr_add(g, GN_WS, GR_WS_MAX, 0, 0, 0, 0, 0);
    c->comma = seq(c, 3, c->ws, lit(c, ","), c->ws);
    c->colon = seq(c, 3, c->ws, lit(c, ":"), c->ws);
    c->empty = gr_lit(g, "", 0);
    c->lbrace = lit(c, "{"); c->rbrace = lit(c, "}");
    c->lbrack = lit(c, "["); c->rbrack = lit(c, "]");
    c->str_any = gr_add(g, GN_STR, 0, -1, 0, 0, 0, 0);
    c->num_any = gr_add(g, GN_NUM, 0, 0, 0, 0, 0, 0);
    /* any JSON value, recursively */
    int any = gr_add(g, GN_REF, -1, 0, 0, 0, 0, 0);
    int member = seq(c, 3, c->str_any, c->colon, any);
    int obj = bracketed(c, c->lbrace, c->rbrace, NULL, 0, member, 0, -1);
    int ar = bracketed(c, c->lbrack, c->rbrack, NULL, 0, any, 0, -1);
    int32_t k[7] = {obj, ar, c->str_any, c->num_any, lit(c, "true"), lit(c, "false"), lit(c, "null")};
    g->nodes[any].a = gr_alt(g, k, 7);
    c->any = any;
}

static void cctx_free(cctx *c) {
    for (int i = 0; i < c->n_refs; i++) free(c->refs[i].name);
    free(c->refs);
}

/* ==== schemas ================================================================ */

static int compile(cctx *c, const json_t *s, const char *path);

static int bad(cctx *c, const char *path, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(cctx *c, const char *path, const char *key, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return errf(c->e, ERR_INVAL, "%s%s%s: %s", path, key ? "." : "", key ? key : "", msg);
}

static int get_count(cctx *c, const json_t *s, const char *path, const char *key, int *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (!json_is_number(v) || d < 0 || d != floor(d)) return bad(c, path, key, "expected a non-negative integer");
    *out = d > 1e6 ? 1000000 : (int)d;
    return 0;
}

static const char *const UNSUPPORTED[] = {
    "patternProperties", "not", "if", "then", "else", "dependentSchemas", "dependentRequired",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "uniqueItems", "multipleOf", "propertyNames", "$dynamicRef", "$recursiveRef", NULL};

/* String formats as regular expressions (full matches, no escapes needed): RFC 3339 full-date
 * (real days of the month, leap years, no year 0000), full-time (the offset required, as in
 * date-time), date-time, RFC 4122 uuid, dotted-quad ipv4, and a conservative email
 * (dot-atom local part, a domain of labels and a 2+ letter top label). Other formats are
 * annotations, as before. */
#define RE_YEAR "(\\d{3}[1-9]|\\d{2}[1-9]\\d|\\d[1-9]\\d{2}|[1-9]\\d{3})"
#define RE_MD "((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
#define RE_LEAP "(\\d\\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
#define RE_DATE "(" RE_YEAR "-" RE_MD "|" RE_LEAP ")"
#define RE_TIME "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
#define RE_ATOM "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
#define RE_LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define RE_OCTET "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
static const char *format_re(const char *f) {
    if (!strcmp(f, "date")) return RE_DATE;
    if (!strcmp(f, "time")) return RE_TIME;
    if (!strcmp(f, "date-time")) return RE_DATE "T" RE_TIME;
    if (!strcmp(f, "uuid")) return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    if (!strcmp(f, "ipv4")) return RE_OCTET "(\\." RE_OCTET "){3}";
    if (!strcmp(f, "email")) return RE_ATOM "(\\." RE_ATOM ")*@(" RE_LABEL "\\.)+[A-Za-z]{2,63}";
    return NULL;
}

static int compile_string(cctx *c, const json_t *s, const char *path) {
    int min = 0, max = -1, rc;
    if ((rc = get_count(c, s, path, "minLength", &min)) || (rc = get_count(c, s, path, "maxLength", &max))) return rc;
    if (max >= 0 && min > max)
        return bad(c, path, "minLength", "%d is above maxLength %d", min, max);
    json_t *pat = json_object_get(s, "pattern");
    const char *fre = json_is_string(json_object_get(s, "format")) ? format_re(json_string_value(json_object_get(s, "format")))
                    : NULL;
    if (!pat && fre) { /* a format: its whole text (with pattern, pattern decides) */
        char err[400];
        int re = gr_re(c->g, fre, strlen(fre), 1, 0, min, max, err, sizeof err);
        if (re < 0) return bad(c, path, "format", "%s", err);
        return seq(c, 3, lit(c, "\""), re, lit(c, "\""));
    }
    if (!pat) return gr_add(c->g, GN_STR, min, max, 0, 0, 0, 0);
    if (!json_is_string(pat)) return bad(c, path, "pattern", "expected a regular expression string");
    /* the string's characters as the pattern allows them (found anywhere in the string unless
     * anchored, as JSON Schema says), written without escapes, between quotes */
    char err[400];
    int re = gr_re(c->g, json_string_value(pat), json_string_length(pat), 1, 1, min, max, err, sizeof err);
    if (re < 0) return bad(c, path, "pattern", "%s", err);
    return seq(c, 3, lit(c, "\""), re, lit(c, "\""));
}

static int compile_number(cctx *c, const json_t *s, int integer) {
    json_t *mn = json_object_get(s, "minimum"), *xmn = json_object_get(s, "exclusiveMinimum");
    int nonneg = (json_is_number(mn) && json_number_value(mn) >= 0) || (json_is_number(xmn) && json_number_value(xmn) >= 0);
    return gr_add(c->g, GN_NUM, integer, nonneg, 0, 0, 0, 0);
}

static int compile_array(cctx *c, const json_t *s, const char *path) {
    char sub[1024];
    int min = 0, max = -1, rc;
    if ((rc = get_count(c, s, path, "minItems", &min)) || (rc = get_count(c, s, path, "maxItems", &max))) return rc;
    if (max >= 0 && min > max) return bad(c, path, "minItems", "%d is above maxItems %d", min, max);
    json_t *pi = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    const char *pkey = "prefixItems";
    if (json_is_array(items) && !pi) { pi = items; items = NULL; pkey = "items"; }
    if (pi && !json_is_array(pi)) return bad(c, path, "prefixItems", "expected an array of schemas");
    int np = (int)json_array_size(pi);
    int32_t *pre = xmalloc((size_t)(np + 1) * sizeof *pre);
    for (int i = 0; i < np; i++) {
        snprintf(sub, sizeof sub, "%s.%s[%d]", path, pkey, i);
        int k = compile(c, json_array_get(pi, (size_t)i), sub);
        if (k < 0) { free(pre); return k; }
        pre[i] = k;
    }
    int item = c->any;
    if (items) {
        if (json_is_false(items)) item = -1;
        else {
            snprintf(sub, sizeof sub, "%s.items", path);
            item = compile(c, items, sub);
            if (item < 0) { free(pre); return item; }
        }
    } else if (json_is_false(json_object_get(s, "additionalItems"))) {
        item = -1;
    }
    if (item < 0 && (max < 0 || max > np)) max = np;
    if (max >= 0 && min > max) { free(pre); return bad(c, path, "minItems", "%d is more items than the schema allows (%d)", min, max); }
    int n = bracketed(c, c->lbrack, c->rbrack, pre, np, item, min, max);
    free(pre);
    return n;
}

static int compile_object(cctx *c, const json_t *s, const char *path) {
    char sub[1024];
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    if (props && !json_is_object(props)) return bad(c, path, "properties", "expected an object of schemas");
    if (req && !json_is_array(req)) return bad(c, path, "required", "expected an array of property names");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i))) return bad(c, path, "required", "entry %zu is not a string", i);
    int n = (int)json_object_size(props);
    int cap = n + (int)json_array_size(req) + 1;
    int32_t *key = xmalloc((size_t)cap * sizeof *key), *val = xmalloc((size_t)cap * sizeof *val);
    uint8_t *must = xcalloc((size_t)cap, 1);
    int np = 0, rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        snprintf(sub, sizeof sub, "%s.properties.%s", path, k);
        int vn = compile(c, v, sub);
        if (vn < 0) { rc = vn; goto out; }
        json_t *ks = json_string(k);
        key[np] = json_lit(c, ks);
        json_decref(ks);
        val[np] = vn;
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!strcmp(json_string_value(json_array_get(req, i)), k)) must[np] = 1;
        np++;
    }
    for (size_t i = 0; i < json_array_size(req); i++) { /* required but not described: any value */
        const char *r = json_string_value(json_array_get(req, i));
        if (json_object_get(props, r)) continue;
        int dup = 0;
        for (size_t j = 0; j < i; j++) dup |= !strcmp(r, json_string_value(json_array_get(req, j)));
        if (dup) continue;
        json_t *ks = json_string(r);
        key[np] = json_lit(c, ks);
        json_decref(ks);
        val[np] = c->any;
        must[np++] = 1;
    }
    json_t *ap = json_object_get(s, "additionalProperties");
    int addl;
    if (!ap) addl = c->strict ? -1 : c->any;
    else if (json_is_boolean(ap)) addl = json_is_true(ap) ? c->any : -1;
    else {
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        addl = compile(c, ap, sub);
        if (addl < 0) { rc = addl; goto out; }
    }
    /* tail(first): extra members after the listed ones */
    int tail[2];
    if (addl < 0) tail[0] = tail[1] = c->empty;
    else {
        int member = seq(c, 3, c->str_any, c->colon, addl);
        tail[1] = arr(c, NULL, 0, member, 0, -1, c->comma);
        tail[0] = alt2(c, c->empty, seq(c, 2, c->comma, arr(c, NULL, 0, member, 1, -1, c->comma)));
    }
    /* T(i, first) built from the last property back: [0] = after a member, [1] = nothing yet */
    int t[2] = {tail[0], tail[1]};
    for (int i = np - 1; i >= 0; i--) {
        int mem = seq(c, 3, key[i], c->colon, val[i]);
        int nt[2];
        for (int first = 0; first < 2; first++) {
            int p = first ? seq(c, 2, mem, t[0]) : seq(c, 3, c->comma, mem, t[0]);
            nt[first] = must[i] ? p : alt2(c, p, t[first]);
        }
        t[0] = nt[0];
        t[1] = nt[1];
    }
    rc = seq(c, 5, c->lbrace, c->ws, t[1], c->ws, c->rbrace);
out:
    free(key); free(val); free(must);
    return rc;
}

/* "#", "#/$defs/NAME", "#/definitions/NAME" (JSON pointer escapes ~0 ~1). */
static int compile_ref(cctx *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].name, ref)) return c->refs[i].node;
    const json_t *target = NULL;
    if (!strcmp(ref, "#")) target = c->root;
    else if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        const char *sect = ref[2] == '$' ? "$defs" : "definitions";
        const char *name = ref + (ref[2] == '$' ? 8 : 14);
        char un[512];
        size_t o = 0;
        for (const char *p = name; *p && o + 1 < sizeof un; p++) {
            if (p[0] == '~' && p[1] == '1') { un[o++] = '/'; p++; }
            else if (p[0] == '~' && p[1] == '0') { un[o++] = '~'; p++; }
            else if (*p == '/') return bad(c, path, "$ref", "'%s': nested pointers are not supported", ref);
            else un[o++] = *p;
        }
        un[o] = 0;
        target = json_object_get(json_object_get(c->root, sect), un);
    } else {
        return bad(c, path, "$ref", "'%s' is not supported (only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\")", ref);
    }
    if (!target) return bad(c, path, "$ref", "'%s' does not resolve", ref);
    int node = gr_add(c->g, GN_REF, -1, 0, 0, 0, 0, 0);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    c->refs[c->n_refs++] = (cref){xstrdup(ref), node};
    char sub[1024];
    if (!strcmp(ref, "#")) snprintf(sub, sizeof sub, "%s", c->root_path);
    else snprintf(sub, sizeof sub, "%s.%s", c->root_path, ref + 2); /* "$defs/NAME" */
    for (char *q = sub + strlen(c->root_path); *q; q++) if (*q == '/') *q = '.';
    int t = compile(c, target, sub);
    if (t < 0) return t;
    c->g->nodes[node].a = t;
    return node;
}

static int compile_type(cctx *c, const json_t *s, const char *type, const char *path) {
    if (!strcmp(type, "string")) return compile_string(c, s, path);
    if (!strcmp(type, "number")) return compile_number(c, s, 0);
    if (!strcmp(type, "integer")) return compile_number(c, s, 1);
    if (!strcmp(type, "boolean")) return alt2(c, lit(c, "true"), lit(c, "false"));
    if (!strcmp(type, "null")) return lit(c, "null");
    if (!strcmp(type, "object")) return compile_object(c, s, path);
    if (!strcmp(type, "array")) return compile_array(c, s, path);
    return bad(c, path, "type", "unknown type '%s' (expected string, number, integer, boolean, null, object or array)", type);
}

static int compile_inner(cctx *c, const json_t *s, const char *path) {
    char sub[1024];
    if (json_is_true(s)) return c->any;
    if (json_is_false(s)) return errf(c->e, ERR_INVAL, "%s: the schema false accepts nothing", path);
    if (!json_is_object(s)) return errf(c->e, ERR_INVAL, "%s: expected a schema (an object or a boolean)", path);
    if (c->g->n_nodes > MAX_NODES) return errf(c->e, ERR_INVAL, "%s: the schema is too large (over %d grammar nodes)", path, MAX_NODES);
    for (int i = 0; UNSUPPORTED[i]; i++)
        if (json_object_get(s, UNSUPPORTED[i]))
            return bad(c, path, UNSUPPORTED[i], "not supported by constrained decoding");
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return bad(c, path, "$ref", "expected a string");
        return compile_ref(c, json_string_value(ref), path);
    }
    json_t *cst = json_object_get(s, "const");
    if (cst) return json_lit(c, cst);
    json_t *en = json_object_get(s, "enum");
    if (en) {
        if (!json_is_array(en) || !json_array_size(en)) return bad(c, path, "enum", "expected a non-empty array");
        size_t n = json_array_size(en);
        int32_t *k = xmalloc(n * sizeof *k);
        for (size_t i = 0; i < n; i++) k[i] = json_lit(c, json_array_get(en, i));
        int r = gr_alt(c->g, k, (int)n);
        free(k);
        return r;
    }
    const char *anykeys[2] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        json_t *l = json_object_get(s, anykeys[a]);
        if (!l) continue;
        if (!json_is_array(l) || !json_array_size(l)) return bad(c, path, anykeys[a], "expected a non-empty array of schemas");
        size_t n = json_array_size(l);
        int32_t *k = xmalloc(n * sizeof *k);
        for (size_t i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s.%s[%zu]", path, anykeys[a], i);
            k[i] = compile(c, json_array_get(l, i), sub);
            if (k[i] < 0) { int r = k[i]; free(k); return r; }
        }
        int r = gr_alt(c->g, k, (int)n);
        free(k);
        return r;
    }
    json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            return bad(c, path, "allOf", "only an allOf of exactly one schema is supported");
        snprintf(sub, sizeof sub, "%s.allOf[0]", path);
        return compile(c, json_array_get(all, 0), sub);
    }
    json_t *type = json_object_get(s, "type");
    int nullable = json_is_true(json_object_get(s, "nullable"));
    int32_t k[9];
    int n = 0;
    if (json_is_string(type)) {
        if ((k[n] = compile_type(c, s, json_string_value(type), path)) < 0) return k[n];
        n++;
    } else if (json_is_array(type)) {
        if (!json_array_size(type) || json_array_size(type) > 7) return bad(c, path, "type", "expected 1 to 7 type names");
        for (size_t i = 0; i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) return bad(c, path, "type", "entry %zu is not a string", i);
            if (!strcmp(t, "null")) { nullable = 1; continue; }
            if ((k[n] = compile_type(c, s, t, path)) < 0) return k[n];
            n++;
        }
    } else if (type) {
        return bad(c, path, "type", "expected a type name or a list of them");
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
               json_object_get(s, "additionalProperties")) {
        if ((k[n] = compile_object(c, s, path)) < 0) return k[n];
        n++;
    } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) {
        if ((k[n] = compile_array(c, s, path)) < 0) return k[n];
        n++;
    } else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "pattern")) {
        if ((k[n] = compile_string(c, s, path)) < 0) return k[n];
        n++;
    } else {
        k[n++] = c->any;
        nullable = 0;
    }
    if (nullable) k[n++] = lit(c, "null");
    return gr_alt(c->g, k, n);
}

static int compile(cctx *c, const json_t *s, const char *path) {
    if (++c->nest > MAX_NEST) {
        c->nest--;
        return errf(c->e, ERR_INVAL, "%s: nested more than %d schemas deep", path, MAX_NEST);
    }
    int r = compile_inner(c, s, path);
    c->nest--;
    return r;
}

static int finish(cctx *c, int body, gr_grammar **out) {
    cctx_free(c);
    if (body < 0) {
        gr_unref(c->g);
        return body;
    }
    c->g->root = seq(c, 3, c->ws, body, c->ws);
    *out = c->g;
    return 0;
}

int gr_compile_json_schema(const json_t *schema, int strict, const char *path, gr_grammar **out, ls_err *e) {
    *out = NULL;
    cctx c = {.g = gr_new(), .e = e, .root = schema, .root_path = path ? path : "schema", .strict = strict};
    shared_nodes(&c);
    return finish(&c, compile(&c, schema, path ? path : "schema"), out);
}

gr_grammar *gr_compile_json_object(void) {
    cctx c = {.g = gr_new()};
    shared_nodes(&c);
    int member = seq(&c, 3, c.str_any, c.colon, c.any);
    int obj = bracketed(&c, c.lbrace, c.rbrace, NULL, 0, member, 0, -1);
    gr_grammar *g = NULL;
    finish(&c, obj, &g);
    return g;
}

/* ==== tool calls ================================================================ */

/* A qwen3_coder parameter value: raw text for strings, JSON otherwise. */
static int xml_value(cctx *c, const json_t *ps, const char *path) {
    const char *type = json_string_value(json_object_get(ps, "type"));
    json_t *en = json_object_get(ps, "enum");
    int all_str = json_is_array(en) && json_array_size(en) > 0;
    for (size_t i = 0; all_str && i < json_array_size(en); i++) all_str = json_is_string(json_array_get(en, i));
    static const char stop[] = GR_RAW_STOP;
    if (all_str) {
        size_t n = json_array_size(en);
        int32_t *k = xmalloc(n * sizeof *k);
        for (size_t i = 0; i < n; i++) {
            buf b;
            buf_init(&b);
            buf_puts(&b, json_string_value(json_array_get(en, i)));
            buf_puts(&b, stop);
            k[i] = gr_lit(c->g, b.data, b.len);
            buf_free(&b);
        }
        int r = gr_alt(c->g, k, (int)n);
        free(k);
        return r;
    }
    if (type && !strcmp(type, "string") && !en) {
        int max = -1, rc;
        if ((rc = get_count(c, ps, path, "maxLength", &max))) return rc;
        return gr_add(c->g, GN_RAW, max, 0, 0, 0, 0, 0);
    }
    int v = compile(c, ps, path);
    if (v < 0) return v;
    return seq(c, 2, v, lit(c, stop));
}

static int tool_call(cctx *c, const json_t *fn, int format, const char *path) {
    char sub[1024];
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    c->strict = json_is_true(json_object_get(fn, "strict"));
    snprintf(sub, sizeof sub, "%s.function.parameters", path);
    buf b;
    buf_init(&b);
    int r;
    if (format == GR_TOOLS_HERMES) {
        json_t *ns = json_string(name);
        char *q = json_dumps(ns, JSON_ENCODE_ANY);
        json_decref(ns);
        buf_printf(&b, "<tool_call>\n{\"name\": %s, \"arguments\": ", q);
        free(q);
        int args;
        if (params && !json_is_null(params)) {
            args = compile(c, params, sub);
        } else {
            int member = seq(c, 3, c->str_any, c->colon, c->any);
            args = bracketed(c, c->lbrace, c->rbrace, NULL, 0, member, 0, -1);
        }
        r = args < 0 ? args : seq(c, 3, gr_lit(c->g, b.data, b.len), args, lit(c, "}\n</tool_call>"));
        buf_free(&b);
        return r;
    }
    buf_printf(&b, "<tool_call>\n<function=%s>\n", name);
    int head = gr_lit(c->g, b.data, b.len);
    buf_free(&b);
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    int32_t *k = xmalloc((json_object_size(props) + 3) * sizeof *k);
    int n = 0;
    k[n++] = head;
    const char *pn;
    json_t *ps;
    json_object_foreach(props, pn, ps) {
        char psub[1100];
        snprintf(psub, sizeof psub, "%s.properties.%s", sub, pn);
        int v = xml_value(c, ps, psub);
        if (v < 0) { free(k); return v; }
        buf_init(&b);
        buf_printf(&b, "<parameter=%s>\n", pn);
        int p = seq(c, 3, gr_lit(c->g, b.data, b.len), v, lit(c, "\n"));
        buf_free(&b);
        int must = 0;
        for (size_t i = 0; i < json_array_size(req); i++)
            must |= json_is_string(json_array_get(req, i)) && !strcmp(json_string_value(json_array_get(req, i)), pn);
        k[n++] = must ? p : alt2(c, p, c->empty);
    }
    k[n++] = lit(c, "</function>\n</tool_call>");
    r = gr_seq(c->g, k, n);
    free(k);
    return r;
}

int gr_compile_tool_calls(const json_t *tools, const char *only, int format, int min_calls, int max_calls,
                          const char *path, gr_grammar **out, ls_err *e) {
    *out = NULL;
    cctx c = {.g = gr_new(), .e = e};
    shared_nodes(&c);
    size_t nt = json_array_size(tools);
    int32_t *calls = xmalloc((nt + 1) * sizeof *calls);
    int n = 0, rc = 0;
    for (size_t i = 0; i < nt; i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only))) continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s[%zu]", path ? path : "tools", i);
        c.root = json_object_get(fn, "parameters");
        char rp[600];
        snprintf(rp, sizeof rp, "%s.function.parameters", sub);
        c.root_path = rp;
        for (int r = 0; r < c.n_refs; r++) free(c.refs[r].name); /* "#/$defs/X" means another X per tool */
        c.n_refs = 0;
        int k = tool_call(&c, fn, format, sub);
        if (k < 0) { rc = k; break; }
        calls[n++] = k;
    }
    if (!rc && !n)
        rc = only ? errf(e, ERR_INVAL, "tool_choice: the function '%s' is not among the request's tools", only)
                  : errf(e, ERR_INVAL, "tool_choice: \"required\" needs at least one tool in tools");
    int body = rc;
    if (!rc) body = arr(&c, NULL, 0, gr_alt(c.g, calls, n), min_calls, max_calls, lit(&c, "\n"));
    free(calls);
    return finish(&c, body, out);
}

int gr_compile_regex(const char *re, const char *path, gr_grammar **out, ls_err *e) {
    *out = NULL;
    gr_grammar *g = gr_new();
    char err[400];
    int node = gr_re(g, re, strlen(re), 0, 0, 0, -1, err, sizeof err);
    if (node < 0) {
        gr_unref(g);
        return errf(e, ERR_INVAL, "%s: %s", path ? path : "regex", err);
    }
    g->root = node;
    *out = g;
    return 0;
}
