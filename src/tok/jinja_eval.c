/* jinja_eval.c: the evaluator and the public rendering API (jinja.h).
 *
 * Scoping is Jinja2's: `for` gives each iteration a fresh frame over the enclosing
 * one (a `set` inside a loop never leaks out, hence namespace()), `if` opens no
 * frame, a macro call runs in a frame over the frame where the macro was defined.
 * Lookup order: frames, then the render variables, then the globals (range, dict,
 * namespace, raise_exception, strftime_now). Undefined is jinja2's default
 * Undefined: falsy, prints as "", iterates as empty, and any attribute, item,
 * arithmetic or call on it raises its "'x' is undefined" error.
 * Attribute access tries Python methods first then items (`d.items` is the method);
 * subscripts try items first, then attributes, as jinja2's sandboxed getattr/getitem.
 *
 * Guards: render output cap, arena byte cap, macro/expression depth and loop-step
 * budget, each with a clear error.
 */
#include "tok/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CTRL_BREAK = 1, CTRL_CONTINUE = 2 };

#define OUT_CAP_DEFAULT ((size_t)64 << 20)
#define ALLOC_CAP_DEFAULT ((size_t)512 << 20)
#define MAX_DEPTH 300
#define MAX_STEPS 10000000

static int eval(jctx *c, jframe *f, const jnode *x, jval *out);
static int exec_list(jctx *c, jframe *f, jnode *const *list, int n);

/* ---- errors with position -------------------------------------------------------- */
static int at(jctx *c, const jnode *x, int rc) {
    if (rc < 0 && c->has_err && !c->err_line && x) { c->err_line = x->line; c->err_col = x->col; }
    return rc;
}
static int nomem(jctx *c) { return jfail(c, "template used more than %zu bytes of memory", c->alloc_cap); }

/* ---- frames ----------------------------------------------------------------------- */
static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = jalloc(c, sizeof *f);
    if (f) f->parent = parent;
    return f;
}
static void frame_set(jctx *c, jframe *f, const char *k, jval v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->k[i], k)) { f->v[i] = v; return; }
    if (f->n == f->cap) {
        int nc = f->cap ? f->cap * 2 : 4;
        const char **nk = jalloc(c, sizeof(char *) * nc);
        jval *nv = jalloc(c, sizeof(jval) * nc);
        if (!nk || !nv) return;
        if (f->n) { memcpy(nk, f->k, sizeof(char *) * f->n); memcpy(nv, f->v, sizeof(jval) * f->n); }
        f->k = nk; f->v = nv; f->cap = nc;
    }
    f->k[f->n] = k;
    f->v[f->n++] = v;
}
static bool frame_get(jframe *f, const char *k, jval *out) {
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->k[i], k)) { *out = f->v[i]; return true; }
    return false;
}

static const char *fmt_msg(jctx *c, const char *fmt, const char *a, const char *b) {
    size_t n = strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + 1;
    char *m = jalloc(c, n);
    if (!m) return "undefined value";
    snprintf(m, n, fmt, a, b);
    return m;
}

/* ---- output ------------------------------------------------------------------------ */
static int emit(jctx *c, const char *p, size_t n) {
    buf_append(c->out, p, n);
    if (c->out->len > c->out_cap) return jfail(c, "template output exceeds %zu bytes", c->out_cap);
    return 0;
}
static int emit_val(jctx *c, jval v) {
    if (v.t == JT_STR) return emit(c, v.s.p, v.s.n);
    jv_str_append(c->out, v);
    if (c->out->len > c->out_cap) return jfail(c, "template output exceeds %zu bytes", c->out_cap);
    return 0;
}

/* ---- attribute / item access ---------------------------------------------------------- */
static jval undef_attr(jctx *c, jval obj, const char *name) {
    return jv_undef(fmt_msg(c, "'%s' has no attribute '%s'", jv_objrepr(obj), name));
}
static jval undef_elem(jctx *c, jval obj, jval key) {
    buf b;
    buf_init(&b);
    buf_printf(&b, "%s has no element ", jv_objrepr(obj));
    jv_repr_append(&b, key);
    jval s = jv_str(c, b.data, b.len);
    buf_free(&b);
    return jv_undef(s.s.p);
}

int jinja_getattr(jctx *c, jval obj, const char *name, jval *out) {
    if (obj.t == JT_UNDEF) return jfail_undef(c, obj);
    if (obj.t == JT_LOOP) return jinja_loop_attr(c, obj, name, out);
    if (obj.t == JT_NS) {
        jval *v = jd_get_str(obj.d, name);
        *out = v ? *v : undef_attr(c, obj, name);
        return 0;
    }
    int rc = jinja_method(c, obj, name, out);
    if (rc) return rc < 0 ? rc : 0;
    if (obj.t == JT_DICT) {
        jval *v = jd_get_str(obj.d, name);
        if (v) { *out = *v; return 0; }
    }
    *out = undef_attr(c, obj, name);
    return 0;
}

static bool as_index(jval k, int64_t *i) {
    if (k.t == JT_INT) { *i = k.i; return true; }
    if (k.t == JT_BOOL) { *i = k.b; return true; }
    return false;
}

int jinja_getitem(jctx *c, jval obj, jval key, jval *out) {
    if (obj.t == JT_UNDEF) return jfail_undef(c, obj);
    int64_t i;
    switch (obj.t) {
    case JT_DICT: {
        int k = jd_find(obj.d, key);
        if (k >= 0) { *out = obj.d->v[k]; return 0; }
        break;
    }
    case JT_LIST:
        if (as_index(key, &i)) {
            if (i < 0) i += obj.l->n;
            if (i >= 0 && i < obj.l->n) { *out = obj.l->v[i]; return 0; }
            *out = undef_elem(c, obj, key);
            return 0;
        }
        break;
    case JT_STR:
        if (as_index(key, &i)) {
            int64_t n = u8_len(obj.s.p, obj.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = u8_offset(obj.s.p, obj.s.n, i);
                size_t b = a + u8_offset(obj.s.p + a, obj.s.n - a, 1);
                *out = jv_strn_nocopy(obj.s.p + a, b - a);
                return 0;
            }
            *out = undef_elem(c, obj, key);
            return 0;
        }
        break;
    default:
        break;
    }
    if (key.t == JT_STR) {
        const char *name = jv_str(c, key.s.p, key.s.n).s.p;
        if (obj.t == JT_NS || obj.t == JT_LOOP) return jinja_getattr(c, obj, name, out);
        int rc = jinja_method(c, obj, name, out);
        if (rc) return rc < 0 ? rc : 0;
        *out = undef_attr(c, obj, name);
        return 0;
    }
    *out = undef_elem(c, obj, key);
    return 0;
}

/* Python slice semantics over n elements. */
static int slice_indices(jctx *c, jval *sv, int64_t n, int64_t *start, int64_t *stop, int64_t *step) {
    int64_t v[3];
    bool has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = sv[k].t != JT_NONE && sv[k].t != JT_UNDEF;
        if (has[k] && !as_index(sv[k], &v[k]))
            return jfail(c, "slice indices must be integers or None or have an __index__ method");
    }
    *step = has[2] ? v[2] : 1;
    if (*step == 0) return jfail(c, "slice step cannot be zero");
    if (*step > 0) {
        *start = has[0] ? v[0] : 0;
        *stop = has[1] ? v[1] : n;
        if (*start < 0) { *start += n; if (*start < 0) *start = 0; }
        if (*start > n) *start = n;
        if (*stop < 0) { *stop += n; if (*stop < 0) *stop = 0; }
        if (*stop > n) *stop = n;
    } else {
        *start = has[0] ? v[0] : n - 1;
        *stop = has[1] ? v[1] : -1 - n; /* sentinel: before index 0 */
        if (*start < 0) { *start += n; if (*start < 0) *start = -1; }
        if (*start >= n) *start = n - 1;
        if (has[1]) { if (*stop < 0) { *stop += n; if (*stop < 0) *stop = -1; } if (*stop >= n) *stop = n - 1; }
        else *stop = -1;
    }
    return 0;
}

static int do_slice(jctx *c, jval obj, jval *sv, jval *out) {
    if (obj.t == JT_UNDEF) return jfail_undef(c, obj);
    int64_t start, stop, step;
    if (obj.t == JT_LIST) {
        if (slice_indices(c, sv, obj.l->n, &start, &stop, &step)) return ERR_INVAL;
        jval r = jv_list(c, 0, obj.l->tuple);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jl_push(c, r.l, obj.l->v[i]);
        *out = r;
        return 0;
    }
    if (obj.t == JT_STR) {
        int64_t n = u8_len(obj.s.p, obj.s.n);
        if (slice_indices(c, sv, n, &start, &stop, &step)) return ERR_INVAL;
        if (step == 1) {
            if (stop <= start) { *out = jv_strz(""); return 0; }
            size_t a = u8_offset(obj.s.p, obj.s.n, start);
            size_t b = a + u8_offset(obj.s.p + a, obj.s.n - a, stop - start);
            *out = jv_strn_nocopy(obj.s.p + a, b - a);
            return 0;
        }
        /* general step: index code points */
        size_t *offs = jalloc(c, sizeof(size_t) * (size_t)(n + 1));
        if (!offs) return nomem(c);
        size_t p = 0;
        for (int64_t i = 0; i < n; i++) { offs[i] = p; p += u8_offset(obj.s.p + p, obj.s.n - p, 1); }
        offs[n] = obj.s.n;
        buf b;
        buf_init(&b);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) buf_append(&b, obj.s.p + offs[i], offs[i + 1] - offs[i]);
        *out = jv_str(c, b.data ? b.data : "", b.len);
        buf_free(&b);
        return 0;
    }
    /* slices bypass jinja's getitem: Python's own TypeError (constant folding aside) */
    if (obj.t == JT_DICT) return jfail(c, "unhashable type: 'slice'");
    return jfail(c, "'%s' object is not subscriptable", jv_typename(obj));
}

int jinja_iterate(jctx *c, jval v, jlist **out) {
    switch (v.t) {
    case JT_UNDEF: *out = jv_list(c, 0, false).l; return 0;
    case JT_LIST: *out = v.l; return 0;
    case JT_DICT: {
        jval l = jv_list(c, v.d->n, false);
        for (int i = 0; i < v.d->n; i++) jl_push(c, l.l, v.d->k[i]);
        *out = l.l;
        return 0;
    }
    case JT_STR: {
        jval l = jv_list(c, (int)v.s.n, false);
        size_t i = 0;
        while (i < v.s.n) {
            size_t st = i;
            u8_next(v.s.p, v.s.n, &i);
            jl_push(c, l.l, jv_strn_nocopy(v.s.p + st, i - st));
        }
        *out = l.l;
        return 0;
    }
    case JT_LOOP: *out = v.loop->items; return 0;
    default:
        return jfail(c, "'%s' object is not iterable", jv_typename(v));
    }
}

/* ---- loop object ------------------------------------------------------------------------ */
static int loop_changed(jctx *c, jval self, jargs *a, jval *out) {
    jloop *L = self.loop;
    jval cur = jv_list(c, a->npos, true);
    for (int i = 0; i < a->npos; i++) jl_push(c, cur.l, a->pos[i]);
    bool changed = !L->has_changed || !jv_eq(L->changed_last, cur);
    if (changed) { L->changed_last = cur; L->has_changed = true; }
    *out = jv_bool(changed);
    return 0;
}
static int loop_cycle(jctx *c, jval self, jargs *a, jval *out) {
    if (!a->npos) return jfail(c, "no items for cycling given");
    *out = a->pos[self.loop->index0 % a->npos];
    return 0;
}

int jinja_loop_attr(jctx *c, jval lv, const char *name, jval *out) {
    jloop *L = lv.loop;
    if (!strcmp(name, "index")) *out = jv_int(L->index0 + 1);
    else if (!strcmp(name, "index0")) *out = jv_int(L->index0);
    else if (!strcmp(name, "revindex")) *out = jv_int(L->length - L->index0);
    else if (!strcmp(name, "revindex0")) *out = jv_int(L->length - L->index0 - 1);
    else if (!strcmp(name, "first")) *out = jv_bool(L->index0 == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(L->index0 == L->length - 1);
    else if (!strcmp(name, "length")) *out = jv_int(L->length);
    else if (!strcmp(name, "depth")) *out = jv_int(L->depth0 + 1);
    else if (!strcmp(name, "depth0")) *out = jv_int(L->depth0);
    else if (!strcmp(name, "previtem"))
        *out = L->index0 > 0 ? L->items->v[L->index0 - 1] : jv_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = L->index0 + 1 < L->length ? L->items->v[L->index0 + 1] : jv_undef("there is no next item");
    else if (!strcmp(name, "cycle")) *out = jv_func(c, "cycle", loop_cycle, lv);
    else if (!strcmp(name, "changed")) *out = jv_func(c, "changed", loop_changed, lv);
    else *out = undef_attr(c, lv, name);
    return 0;
}

/* ---- calls ------------------------------------------------------------------------------- */
static int call_macro(jctx *c, jmacro *m, jargs *a, jval *out) {
    const jnode *d = m->def;
    int flags = d->op;
    if (++c->depth > c->max_depth) return jfail(c, "maximum recursion depth exceeded (%d nested expressions and calls)", c->max_depth);
    if (++c->steps > c->max_steps) return jfail(c, "template exceeded %lld steps", (long long)c->max_steps);
    jframe *f = frame_new(c, m->closure);
    if (!f) return nomem(c);
    const char *mname = m->name ? m->name : "caller";
    if (a->npos > d->nnames && !(flags & MF_VARARGS))
        return jfail(c, "macro '%s' takes not more than %d argument(s)", mname, d->nnames);
    bool *set = jalloc(c, sizeof(bool) * (d->nnames + 1));
    if (!set) return nomem(c);
    for (int i = 0; i < a->npos && i < d->nnames; i++) { frame_set(c, f, d->names[i], a->pos[i]); set[i] = true; }
    jval kwargs = jv_dict(c, 0), caller = jv_undef("No caller defined");
    for (int k = 0; k < a->nkw; k++) {
        int i;
        for (i = 0; i < d->nnames; i++)
            if (!strcmp(d->names[i], a->kwn[k])) break;
        if (i < d->nnames) {
            if (set[i]) return jfail(c, "macro '%s' got multiple values for argument '%s'", mname, a->kwn[k]);
            frame_set(c, f, d->names[i], a->kwv[k]);
            set[i] = true;
        } else if (!strcmp(a->kwn[k], "caller") && (flags & MF_CALLER)) {
            caller = a->kwv[k];
        } else if (flags & MF_KWARGS) {
            jd_set(c, kwargs.d, jv_strz(a->kwn[k]), a->kwv[k]);
        } else {
            return jfail(c, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[k]);
        }
    }
    for (int i = 0; i < d->nnames; i++) {
        if (set[i]) continue;
        jval v;
        if (d->list2 && d->list2[i]) {
            if (eval(c, f, d->list2[i], &v)) return ERR_INVAL;
        } else {
            v = jv_undef(fmt_msg(c, "parameter '%s' was not provided", d->names[i], NULL));
        }
        frame_set(c, f, d->names[i], v);
    }
    if (flags & MF_CALLER) frame_set(c, f, "caller", caller);
    if (flags & MF_VARARGS) {
        jval va = jv_list(c, 0, true);
        for (int i = d->nnames; i < a->npos; i++) jl_push(c, va.l, a->pos[i]);
        frame_set(c, f, "varargs", va);
    }
    if (flags & MF_KWARGS) frame_set(c, f, "kwargs", kwargs);
    buf b, *saved = c->out;
    buf_init(&b);
    c->out = &b;
    int rc = exec_list(c, f, d->list, d->nlist);
    c->out = saved;
    c->depth--;
    if (rc < 0) { buf_free(&b); return rc; }
    *out = jv_str(c, b.data ? b.data : "", b.len); /* plain str: autoescape is off */
    buf_free(&b);
    return 0;
}

int jinja_call(jctx *c, jval fn, jargs *a, jval *out) {
    switch (fn.t) {
    case JT_MACRO: return call_macro(c, fn.m, a, out);
    case JT_FUNC: return fn.fn->fn(c, fn.fn->self, a, out);
    case JT_LOOP: return jinja_loop_call(c, fn, a, out);
    case JT_UNDEF: return jfail_undef(c, fn);
    default: return jfail(c, "'%s' object is not callable", jv_typename(fn));
    }
}

static int eval_args(jctx *c, jframe *f, const jnode *x, jargs *a, int extra_kw) {
    memset(a, 0, sizeof *a);
    a->npos = x->nlist;
    a->nkw = x->nnames;
    a->pos = jalloc(c, sizeof(jval) * (x->nlist + 1));
    a->kwn = jalloc(c, sizeof(char *) * (x->nnames + extra_kw + 1));
    a->kwv = jalloc(c, sizeof(jval) * (x->nnames + extra_kw + 1));
    if (!a->pos || !a->kwn || !a->kwv) return nomem(c);
    for (int i = 0; i < x->nlist; i++)
        if (eval(c, f, x->list[i], &a->pos[i])) return ERR_INVAL;
    for (int i = 0; i < x->nnames; i++) {
        a->kwn[i] = x->names[i];
        if (eval(c, f, x->list2[i], &a->kwv[i])) return ERR_INVAL;
    }
    return 0;
}

/* ---- operators ------------------------------------------------------------------------------ */
static bool isnum(jval v) { return v.t == JT_INT || v.t == JT_BOOL || v.t == JT_FLOAT; }
static double fnum(jval v) { return v.t == JT_FLOAT ? v.f : v.t == JT_INT ? (double)v.i : (double)v.b; }
static int64_t inum(jval v) { return v.t == JT_INT ? v.i : (int64_t)v.b; }

static const char *OPNAME[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static int binop(jctx *c, int op, jval a, jval b, jval *out) {
    if (op == OP_CONCAT) {
        buf s;
        buf_init(&s);
        jv_str_append(&s, a);
        jv_str_append(&s, b);
        *out = jv_str(c, s.data ? s.data : "", s.len);
        buf_free(&s);
        return 0;
    }
    if (op == OP_MOD && a.t == JT_STR) {
        jargs args = {0};
        if (b.t == JT_LIST && b.l->tuple) { args.npos = b.l->n; args.pos = b.l->v; }
        else { args.npos = 1; args.pos = &b; }
        /* Python treats a non-tuple argument with __getitem__ (list, dict, Undefined) as a mapping */
        return jv_pyformat(c, a, &args, b.t == JT_DICT || (b.t == JT_LIST && !b.l->tuple) ||
                                       b.t == JT_UNDEF, out);
    }
    if (a.t == JT_UNDEF) return jfail_undef(c, a);
    if (b.t == JT_UNDEF) return jfail_undef(c, b);
    if (isnum(a) && isnum(b)) {
        bool fl = a.t == JT_FLOAT || b.t == JT_FLOAT;
        if (!fl) {
            int64_t x = inum(a), y = inum(b), r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return 0;
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return 0;
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; *out = jv_int(r); return 0;
            case OP_DIV:
                if (!y) return jfail(c, "division by zero");
                *out = jv_float((double)x / (double)y);
                return 0;
            case OP_FLOORDIV: case OP_MOD: {
                if (!y) return jfail(c, "integer division or modulo by zero");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                *out = jv_int(op == OP_MOD ? m : q);
                return 0;
            }
            case OP_POW:
                if (y < 0) { *out = jv_float(pow((double)x, (double)y)); return 0; }
                r = 1;
                for (int64_t k = 0; k < y; k++) {
                    if (__builtin_mul_overflow(r, x, &r)) goto ovf;
                    if (r == 0 || r == 1) break;
                }
                if (r == -1 || r == 1) r = (x == -1 && (y & 1)) ? -1 : (x == 0 && y > 0) ? 0 : r;
                *out = jv_int(r);
                return 0;
            }
        } else {
            double x = fnum(a), y = fnum(b);
            switch (op) {
            case OP_ADD: *out = jv_float(x + y); return 0;
            case OP_SUB: *out = jv_float(x - y); return 0;
            case OP_MUL: *out = jv_float(x * y); return 0;
            case OP_DIV:
                if (y == 0) return jfail(c, "float division by zero");
                *out = jv_float(x / y);
                return 0;
            case OP_FLOORDIV:
                if (y == 0) return jfail(c, "float floor division by zero");
                *out = jv_float(floor(x / y));
                return 0;
            case OP_MOD: {
                if (y == 0) return jfail(c, "float modulo");
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                *out = jv_float(m);
                return 0;
            }
            case OP_POW: *out = jv_float(pow(x, y)); return 0;
            }
        }
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR && a.markup != b.markup) {
        /* Markup + str (and str + Markup) HTML-escapes the plain side, as markupsafe does */
        buf s;
        buf_init(&s);
        jv_html_escape(&s, a.markup ? a : jv_str(c, a.s.p, a.s.n), !a.markup);
        jv_html_escape(&s, b, !b.markup);
        *out = jv_str(c, s.data ? s.data : "", s.len);
        out->markup = 1;
        buf_free(&s);
        return 0;
    }
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        char *p = jalloc(c, a.s.n + b.s.n + 1);
        if (!p) return nomem(c);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        p[a.s.n + b.s.n] = 0;
        *out = jv_strn_nocopy(p, a.s.n + b.s.n);
        return 0;
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST && a.l->tuple == b.l->tuple) {
        jval r = jv_list(c, a.l->n + b.l->n, a.l->tuple);
        for (int i = 0; i < a.l->n; i++) jl_push(c, r.l, a.l->v[i]);
        for (int i = 0; i < b.l->n; i++) jl_push(c, r.l, b.l->v[i]);
        *out = r;
        return 0;
    }
    if (op == OP_MUL && (((a.t == JT_STR || a.t == JT_LIST) && (b.t == JT_INT || b.t == JT_BOOL)) ||
                         ((b.t == JT_STR || b.t == JT_LIST) && (a.t == JT_INT || a.t == JT_BOOL)))) {
        jval seq = (a.t == JT_STR || a.t == JT_LIST) ? a : b;
        int64_t k = inum((a.t == JT_STR || a.t == JT_LIST) ? b : a);
        if (k < 0) k = 0;
        size_t unit = seq.t == JT_STR ? seq.s.n : (size_t)seq.l->n;
        if (unit && (size_t)k > c->out_cap / unit) return jfail(c, "repetition result too large");
        if (seq.t == JT_STR) {
            buf s;
            buf_init(&s);
            for (int64_t i = 0; i < k; i++) buf_append(&s, seq.s.p, seq.s.n);
            *out = jv_str(c, s.data ? s.data : "", s.len);
            buf_free(&s);
        } else {
            jval r = jv_list(c, 0, seq.l->tuple);
            for (int64_t i = 0; i < k; i++)
                for (int j = 0; j < seq.l->n; j++) jl_push(c, r.l, seq.l->v[j]);
            *out = r;
        }
        return 0;
    }
    if (op == OP_ADD && a.t == JT_STR)
        return jfail(c, "can only concatenate str (not \"%s\") to str", jv_typename(b));
    if (op == OP_ADD && a.t == JT_LIST)
        return jfail(c, "can only concatenate %s (not \"%s\") to %s", jv_typename(a), jv_typename(b), jv_typename(a));
    return jfail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op == OP_POW ? "** or pow()" : OPNAME[op],
                 jv_typename(a), jv_typename(b));
ovf:
    return jfail(c, "integer overflow in '%s'", OPNAME[op]);
}

int jv_contains(jctx *c, jval container, jval item, bool *res);
int jv_contains(jctx *c, jval container, jval item, bool *res) {
    *res = false;
    switch (container.t) {
    case JT_STR:
        if (item.t != JT_STR) {
            if (item.t == JT_UNDEF) return jfail_undef(c, item);
            return jfail(c, "'in <string>' requires string as left operand, not %s", jv_typename(item));
        }
        *res = item.s.n == 0 || memmem(container.s.p, container.s.n, item.s.p, item.s.n) != NULL;
        return 0;
    case JT_LIST:
        for (int i = 0; i < container.l->n; i++)
            if (jv_eq(container.l->v[i], item)) { *res = true; break; }
        return 0;
    case JT_DICT:
        if (*jv_unhashable(item)) return jfail(c, "unhashable type: '%s'", jv_unhashable(item));
        *res = jd_find(container.d, item) >= 0;
        return 0;
    case JT_UNDEF: return 0;
    default: return jfail(c, "argument of type '%s' is not iterable", jv_typename(container));
    }
}

static int compare(jctx *c, int op, jval a, jval b, bool *res) {
    int r;
    switch (op) {
    case OP_EQ: *res = jv_eq(a, b); return 0;
    case OP_NE: *res = !jv_eq(a, b); return 0;
    case OP_IN: return jv_contains(c, b, a, res);
    case OP_NOTIN:
        if (jv_contains(c, b, a, res)) return ERR_INVAL;
        *res = !*res;
        return 0;
    }
    static const char *names[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    if (jv_cmp(c, a, b, names[op], &r)) return ERR_INVAL;
    if (r == 2) { *res = false; return 0; } /* NaN */
    *res = op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
    return 0;
}

/* ---- expressions --------------------------------------------------------------------------- */
static int eval_filter(jctx *c, jframe *f, const jnode *x, jval operand, jval *out) {
    jargs a;
    if (eval_args(c, f, x, &a, 0)) return ERR_INVAL;
    return at(c, x, ((jfilter_fn)x->impl)(c, operand, &a, out));
}

static int eval_inner(jctx *c, jframe *f, const jnode *x, jval *out) {
    jval a, b;
    switch (x->kind) {
    case N_CONST: *out = x->lit; return 0;
    case N_NAME:
        if (frame_get(f, x->str, out)) return 0;
        if (jinja_global(c, x->str, out)) return 0;
        *out = jv_undef(fmt_msg(c, "'%s' is undefined", x->str, NULL));
        return 0;
    case N_LIST: case N_TUPLE: {
        jval l = jv_list(c, x->nlist, x->kind == N_TUPLE);
        for (int i = 0; i < x->nlist; i++) {
            if (eval(c, f, x->list[i], &a)) return ERR_INVAL;
            jl_push(c, l.l, a);
        }
        *out = l;
        return 0;
    }
    case N_DICT: {
        jval d = jv_dict(c, x->nlist);
        for (int i = 0; i < x->nlist; i++) {
            if (eval(c, f, x->list[i], &a) || eval(c, f, x->list2[i], &b)) return ERR_INVAL;
            if (*jv_unhashable(a)) return jfail(c, "unhashable type: '%s'", jv_unhashable(a));
            jd_set(c, d.d, a, b);
        }
        *out = d;
        return 0;
    }
    case N_GETATTR:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        return jinja_getattr(c, a, x->str, out);
    case N_GETITEM:
        if (eval(c, f, x->a, &a) || eval(c, f, x->b, &b)) return ERR_INVAL;
        return jinja_getitem(c, a, b, out);
    case N_SLICE: {
        jval sv[3];
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        for (int k = 0; k < 3; k++) {
            sv[k] = jv_none();
            if (x->list[k] && eval(c, f, x->list[k], &sv[k])) return ERR_INVAL;
        }
        return do_slice(c, a, sv, out);
    }
    case N_CALL: {
        jargs args;
        if (eval(c, f, x->a, &a) || eval_args(c, f, x, &args, 0)) return ERR_INVAL;
        return jinja_call(c, a, &args, out);
    }
    case N_FILTER:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        return eval_filter(c, f, x, a, out);
    case N_TEST: {
        jargs args;
        bool r;
        if (eval(c, f, x->a, &a) || eval_args(c, f, x, &args, 0)) return ERR_INVAL;
        if (((jtest_fn)x->impl)(c, a, &args, &r)) return ERR_INVAL;
        *out = jv_bool(x->op ? !r : r);
        return 0;
    }
    case N_BINOP:
        if (eval(c, f, x->a, &a) || eval(c, f, x->b, &b)) return ERR_INVAL;
        return binop(c, x->op, a, b, out);
    case N_CMP: {
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        bool r = true;
        for (int i = 0; i < x->nlist && r; i++) {
            if (eval(c, f, x->list[i], &b)) return ERR_INVAL;
            if (at(c, x->list[i], compare(c, x->ops[i], a, b, &r))) return ERR_INVAL;
            a = b;
        }
        *out = jv_bool(r);
        return 0;
    }
    case N_AND:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        if (!jv_truthy(a)) { *out = a; return 0; }
        return eval(c, f, x->b, out);
    case N_OR:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        if (jv_truthy(a)) { *out = a; return 0; }
        return eval(c, f, x->b, out);
    case N_NOT:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case N_NEG: case N_POS:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        if (a.t == JT_UNDEF) return jfail_undef(c, a);
        if (a.t == JT_INT || a.t == JT_BOOL) {
            int64_t v = inum(a);
            *out = jv_int(x->kind == N_NEG ? -v : v);
        } else if (a.t == JT_FLOAT) {
            *out = jv_float(x->kind == N_NEG ? -a.f : a.f);
        } else {
            return jfail(c, "bad operand type for unary %c: '%s'", x->kind == N_NEG ? '-' : '+', jv_typename(a));
        }
        return 0;
    case N_COND:
        if (eval(c, f, x->a, &a)) return ERR_INVAL;
        if (jv_truthy(a)) return eval(c, f, x->b, out);
        if (x->c) return eval(c, f, x->c, out);
        *out = jv_undef("the inline if-expression evaluated to false and no else section was defined.");
        return 0;
    default:
        return jfail(c, "internal: node %d is not an expression", x->kind);
    }
}

static int eval(jctx *c, jframe *f, const jnode *x, jval *out) {
    if (++c->depth > c->max_depth) {
        c->depth--;
        return at(c, x, jfail(c, "maximum recursion depth exceeded (%d nested expressions and calls)", c->max_depth));
    }
    int rc = eval_inner(c, f, x, out);
    c->depth--;
    if (!rc && c->alloc_cap && c->alloc_bytes > c->alloc_cap) rc = nomem(c);
    return at(c, x, rc);
}

/* ---- statements ------------------------------------------------------------------------------ */
static int assign(jctx *c, jframe *f, const jnode *target, jval v) {
    if (target->kind == N_NAME) { frame_set(c, f, target->str, v); return 0; }
    if (target->kind == N_GETATTR) {
        jval ns;
        if (!frame_get(f, target->a->str, &ns)) ns = jv_undef(NULL);
        if (ns.t != JT_NS) return jfail(c, "cannot assign attribute on non-namespace object");
        jd_set(c, ns.d, jv_strz(target->str), v);
        return 0;
    }
    /* tuple unpacking */
    jlist *items;
    if (v.t == JT_DICT || v.t == JT_STR || v.t == JT_LIST) {
        if (jinja_iterate(c, v, &items)) return ERR_INVAL;
    } else {
        return jfail(c, "cannot unpack non-iterable %s object", jv_typename(v));
    }
    if (items->n > target->nnames) return jfail(c, "too many values to unpack (expected %d)", target->nnames);
    if (items->n < target->nnames)
        return jfail(c, "not enough values to unpack (expected %d, got %d)", target->nnames, items->n);
    for (int i = 0; i < target->nnames; i++) frame_set(c, f, target->names[i], items->v[i]);
    return 0;
}

static int capture(jctx *c, jframe *f, jnode *const *list, int n, jval *out) {
    buf b, *saved = c->out;
    buf_init(&b);
    c->out = &b;
    int rc = exec_list(c, f, list, n);
    c->out = saved;
    if (rc >= 0) *out = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    return rc < 0 ? rc : 0;
}

/* Applies a parsed filter chain whose innermost operand is empty (filter blocks, set blocks). */
static int apply_chain(jctx *c, jframe *f, const jnode *x, jval v, jval *out) {
    if (!x) { *out = v; return 0; }
    jval inner;
    if (apply_chain(c, f, x->a, v, &inner)) return ERR_INVAL;
    return eval_filter(c, f, x, inner, out);
}

/* Runs the for statement x over the value it (depth0 > 0: a recursive loop(...) call). */
static int exec_for_value(jctx *c, jframe *f, const jnode *x, jval it, int depth0) {
    jlist *items;
    if (at(c, x->b, jinja_iterate(c, it, &items))) return ERR_INVAL;
    if (x->c) { /* loop filter: evaluated with the target bound, before `loop` exists */
        jval fl = jv_list(c, items->n, false);
        for (int i = 0; i < items->n; i++) {
            jframe *g = frame_new(c, f);
            jval keep;
            if (!g) return nomem(c);
            if (at(c, x, assign(c, g, x->a, items->v[i])) || eval(c, g, x->c, &keep)) return ERR_INVAL;
            if (jv_truthy(keep)) jl_push(c, fl.l, items->v[i]);
        }
        items = fl.l;
    }
    jloop *L = jalloc(c, sizeof *L);
    if (!L) return nomem(c);
    L->items = items;
    L->length = items->n;
    L->depth0 = depth0;
    L->node = x;
    L->frame = f;
    jval lv = {.t = JT_LOOP};
    lv.loop = L;
    jframe *g = NULL;
    for (int i = 0; i < items->n; i++) {
        if (++c->steps > c->max_steps)
            return at(c, x, jfail(c, "template exceeded %lld loop iterations", (long long)c->max_steps));
        L->index0 = i;
        /* each iteration starts from a fresh frame; reuse the last one unless a macro kept it */
        if (g && !g->captured) g->n = 0;
        else if (!(g = frame_new(c, f))) return nomem(c);
        if (at(c, x, assign(c, g, x->a, items->v[i]))) return ERR_INVAL;
        frame_set(c, g, "loop", lv);
        int rc = exec_list(c, g, x->list, x->nlist);
        if (rc < 0) return rc;
        if (rc == CTRL_BREAK) break;
    }
    if (!items->n && x->nlist2) {
        jframe *g = frame_new(c, f);
        if (!g) return nomem(c);
        return exec_list(c, g, x->list2, x->nlist2);
    }
    return 0;
}

static int exec_for(jctx *c, jframe *f, const jnode *x) {
    jval it;
    if (eval(c, f, x->b, &it)) return ERR_INVAL;
    return exec_for_value(c, f, x, it, 0);
}

int jinja_loop_call(jctx *c, jval lv, jargs *a, jval *out) {
    jloop *L = lv.loop;
    if (!L->node->op) return jfail(c, "The loop must have the 'recursive' marker to be called recursively.");
    if (a->npos != 1 || a->nkw) return jfail(c, "loop() takes exactly one iterable argument");
    if (++c->depth > c->max_depth) {
        c->depth--;
        return jfail(c, "maximum recursion depth exceeded (%d nested expressions and calls)", c->max_depth);
    }
    buf b, *saved = c->out;
    buf_init(&b);
    c->out = &b;
    int rc = exec_for_value(c, L->frame, L->node, a->pos[0], L->depth0 + 1);
    c->out = saved;
    c->depth--;
    if (rc >= 0) *out = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    return rc < 0 ? rc : 0;
}

static int exec_node(jctx *c, jframe *f, const jnode *x) {
    jval v;
    switch (x->kind) {
    case N_TEXT: return at(c, x, emit(c, x->str, x->slen));
    case N_OUTPUT:
        if (eval(c, f, x->a, &v)) return ERR_INVAL;
        return at(c, x, emit_val(c, v));
    case N_IF:
        if (eval(c, f, x->a, &v)) return ERR_INVAL;
        return jv_truthy(v) ? exec_list(c, f, x->list, x->nlist) : exec_list(c, f, x->list2, x->nlist2);
    case N_FOR: return exec_for(c, f, x);
    case N_SET:
        if (eval(c, f, x->b, &v)) return ERR_INVAL;
        return at(c, x, assign(c, f, x->a, v));
    case N_SETBLOCK: {
        jval s;
        if (capture(c, f, x->list, x->nlist, &s) || apply_chain(c, f, x->c, s, &v)) return ERR_INVAL;
        return at(c, x, assign(c, f, x->a, v));
    }
    case N_MACRO: {
        jmacro *m = jalloc(c, sizeof *m);
        if (!m) return nomem(c);
        m->def = x;
        m->closure = f;
        f->captured = true;
        m->name = x->str;
        jval mv = {.t = JT_MACRO};
        mv.m = m;
        frame_set(c, f, x->str, mv);
        return 0;
    }
    case N_CALLBLOCK: {
        jmacro *m = jalloc(c, sizeof *m);
        if (!m) return nomem(c);
        m->def = x;
        m->closure = f;
        f->captured = true;
        m->name = "caller";
        jval callee, caller = {.t = JT_MACRO};
        caller.m = m;
        jargs a;
        const jnode *call = x->a;
        if (eval(c, f, call->a, &callee) || eval_args(c, f, call, &a, 1)) return ERR_INVAL;
        a.kwn[a.nkw] = "caller";
        a.kwv[a.nkw++] = caller;
        if (at(c, call, jinja_call(c, callee, &a, &v))) return ERR_INVAL;
        return at(c, x, emit_val(c, v));
    }
    case N_FILTERBLOCK: {
        jval s;
        if (capture(c, f, x->list, x->nlist, &s) || apply_chain(c, f, x->a, s, &v)) return ERR_INVAL;
        return at(c, x, emit_val(c, v));
    }
    case N_WITH: {
        jframe *g = frame_new(c, f);
        if (!g) return nomem(c);
        for (int i = 0; i < x->nnames; i++) {
            if (eval(c, f, x->list2[i], &v)) return ERR_INVAL;
            frame_set(c, g, x->names[i], v);
        }
        return exec_list(c, g, x->list, x->nlist);
    }
    case N_BREAK: return CTRL_BREAK;
    case N_CONTINUE: return CTRL_CONTINUE;
    case N_BODY: return exec_list(c, f, x->list, x->nlist);
    default: return at(c, x, jfail(c, "internal: node %d is not a statement", x->kind));
    }
}

static int exec_list(jctx *c, jframe *f, jnode *const *list, int n) {
    for (int i = 0; i < n; i++) {
        int rc = exec_node(c, f, list[i]);
        if (rc) return rc;
    }
    return 0;
}

/* ---- public API -------------------------------------------------------------------------------- */
int jinja_render(const jinja_tmpl *t, json_t *vars, char **out, int *raised, ls_err *e) {
    *out = NULL;
    if (raised) *raised = 0;
    if (!t) return errf(e, ERR_INVAL, "template is NULL");
    if (vars && !json_is_object(vars)) return errf(e, ERR_INVAL, "template variables must be a JSON object");
    jctx c = {0};
    c.a = arena_new(1 << 16);
    c.alloc_cap = ALLOC_CAP_DEFAULT;
    c.out_cap = OUT_CAP_DEFAULT;
    c.max_depth = MAX_DEPTH;
    c.max_steps = MAX_STEPS;
    c.e = e;
    buf b;
    buf_init(&b);
    c.out = &b;
    c.globals = frame_new(&c, NULL);
    if (vars) {
        const char *k;
        json_t *x;
        json_object_foreach(vars, k, x) frame_set(&c, c.globals, k, jv_from_json(&c, x));
    }
    jframe *root = frame_new(&c, c.globals);
    int rc = exec_list(&c, root, t->root->list, t->root->nlist);
    if (rc < 0 || c.has_err) {
        if (c.raised) {
            if (raised) *raised = 1;
            errf(e, ERR_INVAL, "%s", c.msg);
        } else if (c.err_line) {
            errf(e, ERR_INVAL, "line %d, column %d: %s", c.err_line, c.err_col, c.msg);
        } else {
            errf(e, ERR_INVAL, "%s", c.has_err ? c.msg : "template rendering failed");
        }
        buf_free(&b);
        arena_free(c.a);
        return ERR_INVAL;
    }
    *out = b.data ? buf_detach(&b) : xstrdup("");
    arena_free(c.a);
    return 0;
}

int jinja_apply_chat(const jinja_tmpl *t, json_t *req, const char *bos, const char *eos, char **out,
                     int *raised, ls_err *e) {
    *out = NULL;
    if (raised) *raised = 0;
    if (!json_is_object(req)) return errf(e, ERR_INVAL, "request: must be a JSON object");
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs)) return errf(e, ERR_INVAL, "request.messages: must be an array");
    if (json_array_size(msgs) == 0) {
        /* transformers refuses before rendering, with this message */
        if (raised) *raised = 1;
        return errf(e, ERR_INVAL, "Cannot apply chat template to an empty conversation. Provide at least one message.");
    }
    json_t *tools = json_object_get(req, "tools");
    json_t *agp = json_object_get(req, "add_generation_prompt");
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (agp && !json_is_boolean(agp) && !json_is_null(agp))
        return errf(e, ERR_INVAL, "request.add_generation_prompt: must be a boolean");
    if (kw && !json_is_object(kw) && !json_is_null(kw))
        return errf(e, ERR_INVAL, "request.chat_template_kwargs: must be an object");
    /* apply_chat_template(messages, tools=..., documents=..., add_generation_prompt=...,
     * **special_tokens, **chat_template_kwargs) */
    json_t *vars = json_object();
    json_object_set(vars, "messages", msgs);
    json_object_set(vars, "tools", tools ? tools : json_null());
    json_t *docs = json_object_get(req, "documents");
    json_object_set(vars, "documents", docs ? docs : json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(json_is_true(agp)));
    if (bos) json_object_set_new(vars, "bos_token", json_string(bos));
    if (eos) json_object_set_new(vars, "eos_token", json_string(eos));
    if (json_is_object(kw)) {
        const char *k;
        json_t *x;
        json_object_foreach(kw, k, x) {
            if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") ||
                !strcmp(k, "add_generation_prompt")) {
                json_decref(vars);
                return errf(e, ERR_INVAL, "request.chat_template_kwargs.%s: is a reserved template variable", k);
            }
            json_object_set(vars, k, x);
        }
    }
    int rc = jinja_render(t, vars, out, raised, e);
    json_decref(vars);
    return rc;
}

char *jinja_find_named_chat_template(const char *dir, const char *name, ls_err *e) {
    if (!strcmp(name, "default")) return jinja_find_chat_template(dir, e);
    char path[8400], jpath[4096], dpath[4096];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    snprintf(dpath, sizeof dpath, "%s/additional_chat_templates", dir);
    snprintf(path, sizeof path, "%s/%s.jinja", dpath, name);
    ls_err tmp;
    char *s = read_file(path, NULL, &tmp);
    if (s) return s;
    if (access(jpath, F_OK) == 0 || access(dpath, F_OK) == 0) { /* template files take priority */
        errf(e, ERR_INVAL, "%s: no chat template named \"%s\"", dir, name);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
    size_t i;
    json_t *x;
    json_array_foreach(json_is_array(ct) ? ct : NULL, i, x) {
        json_t *nm = json_object_get(x, "name"), *tp = json_object_get(x, "template");
        if (json_is_string(nm) && !strcmp(json_string_value(nm), name) && json_is_string(tp)) {
            s = xstrdup(json_string_value(tp));
            break;
        }
    }
    json_decref(cfg);
    if (!s) errf(e, ERR_INVAL, "%s: no chat template named \"%s\"", dir, name);
    return s;
}

char *jinja_find_chat_template(const char *dir, ls_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    ls_err tmp;
    char *s = read_file(path, NULL, &tmp);
    if (s) return s;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) {
        errf(e, ERR_INVAL, "%s: no chat_template.jinja, and tokenizer_config.json unreadable: %s", dir, je.text);
        return NULL;
    }
    json_t *ct = json_object_get(cfg, "chat_template");
    char *r = NULL;
    if (json_is_string(ct)) {
        r = xstrdup(json_string_value(ct));
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *x;
        json_array_foreach(ct, i, x) {
            json_t *nm = json_object_get(x, "name"), *tp = json_object_get(x, "template");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") && json_is_string(tp)) {
                r = xstrdup(json_string_value(tp));
                break;
            }
        }
        if (!r) errf(e, ERR_INVAL, "%s: chat_template list has no entry named \"default\"", path);
    } else {
        errf(e, ERR_INVAL, "%s: no chat template (no chat_template.jinja, no \"chat_template\" string or list)", dir);
    }
    json_decref(cfg);
    return r;
}
