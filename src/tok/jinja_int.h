/* jinja_int.h: internals shared by the Jinja renderer's files (not a public API).
 *
 *   jinja_parse.c    lexer (transformers' trim_blocks + lstrip_blocks) and parser -> AST
 *   jinja_value.c    values: Python semantics for str()/repr(), equality, ordering, tojson
 *   jinja_eval.c     evaluator: scopes, statements, expressions, macros, loops; public API
 *   jinja_builtins.c tests, str/dict/list methods, global functions, string helpers
 *   jinja_filters.c  filters
 *
 * Memory: the AST lives in the template's arena; every value made while rendering
 * lives in the render's arena (jalloc), freed at once when the render ends. Values
 * are immutable once built, except namespaces (ns.attr assignment), so sharing is free.
 * Strings are UTF-8 byte runs; Python code-point semantics (len, slicing) decode on demand.
 */
#ifndef LS_JINJA_INT_H
#define LS_JINJA_INT_H

#include "base/base.h"
#include "tok/jinja.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- values --------------------------------------------------------------- */
typedef enum {
    JT_UNDEF, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR,
    JT_LIST,   /* list or tuple (l->tuple) */
    JT_DICT,   /* insertion-ordered dict */
    JT_NS,     /* namespace(): a dict whose attributes can be assigned */
    JT_MACRO,  /* macro or call-block caller */
    JT_FUNC,   /* builtin global, bound method, loop.cycle ... */
    JT_LOOP,   /* the `loop` variable of a for */
} jtype;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jval {
    uint8_t t;
    uint8_t markup;            /* JT_STR is a markupsafe.Markup (|safe, |e): repr, `+` escaping */
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        jlist *l;
        jdict *d;
        jmacro *m;
        jfunc *fn;
        jloop *loop;
        const char *umsg;      /* JT_UNDEF: the error raised when it is used (NULL: "undefined") */
    };
} jval;

struct jlist { int n, cap; bool tuple; jval *v; };
struct jdict { int n, cap; jval *k, *v; };

typedef struct jctx jctx;
typedef struct jargs {
    int npos;
    jval *pos;
    int nkw;
    const char **kwn;
    jval *kwv;
} jargs;
typedef int (*jfn_impl)(jctx *c, jval self, jargs *a, jval *out);
struct jfunc { const char *name; jfn_impl fn; jval self; };

/* ---- AST ------------------------------------------------------------------ */
typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL,
    N_FILTER, N_TEST, N_BINOP, N_CMP, N_AND, N_OR, N_NOT, N_NEG, N_POS, N_COND,
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_WITH, N_BREAK, N_CONTINUE, N_BODY,
} nkind;

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;
    int line, col;
    jnode *a, *b, *c;            /* operands / target / iterable / condition */
    jnode **list; int nlist;      /* items, positional args, body, operands of N_CMP */
    jnode **list2; int nlist2;    /* dict values, kw arg values, else body, param defaults */
    const char **names; int nnames; /* kw arg names, macro params, for targets */
    int *ops;                     /* N_CMP: operator per operand after the first */
    const char *str; size_t slen; /* name, attribute, text, filter/test name */
    jval lit;                     /* N_CONST */
    int op;                       /* N_BINOP op; N_TEST negated; N_FOR recursive; N_MACRO flags */
    const void *impl;             /* N_FILTER / N_TEST: the builtin, resolved at parse time */
};

enum { MF_CALLER = 1, MF_VARARGS = 2, MF_KWARGS = 4 };

struct jinja_tmpl {
    arena *a;
    jnode *root;   /* N_BODY */
};

struct jmacro {
    const jnode *def;            /* N_MACRO or N_CALLBLOCK */
    struct jframe *closure;
    const char *name;
};

struct jloop {
    int64_t index0, length;
    jlist *items;                /* the (filtered) sequence being iterated */
    int depth0;
    const jnode *node;           /* the N_FOR (loop(...) re-runs it when recursive) */
    struct jframe *frame;        /* the frame the for statement runs in */
    bool has_changed;            /* loop.changed(): a value was seen */
    jval changed_last;
};

/* ---- render context -------------------------------------------------------- */
typedef struct jframe {
    struct jframe *parent;
    bool captured;               /* a macro closes over it: never reused */
    int n, cap;
    const char **k;
    jval *v;
} jframe;

struct jctx {
    arena *a;
    size_t alloc_bytes, alloc_cap;
    buf *out;
    size_t out_cap;
    jframe *globals;
    int depth, max_depth;
    int64_t steps, max_steps;
    int raised;                  /* raise_exception was called */
    int has_err;
    int err_line, err_col;       /* 0: position not attached yet */
    ls_err *e;
    char msg[1024];
};

/* ---- jinja_value.c ---------------------------------------------------------- */
void *jalloc(jctx *c, size_t n);
jval jv_undef(const char *msg);
jval jv_none(void);
jval jv_bool(bool b);
jval jv_int(int64_t i);
jval jv_float(double f);
jval jv_str(jctx *c, const char *p, size_t n);   /* copies */
jval jv_strz(const char *p);                     /* p must outlive the render */
jval jv_strn_nocopy(const char *p, size_t n);
jval jv_list(jctx *c, int cap, bool tuple);
void jl_push(jctx *c, jlist *l, jval v);
jval jv_dict(jctx *c, int cap);
void jd_set(jctx *c, jdict *d, jval k, jval v);
int jd_find(const jdict *d, jval k);             /* index or -1 */
jval *jd_get_str(const jdict *d, const char *k);
jval jv_func(jctx *c, const char *name, jfn_impl fn, jval self);
jval jv_from_json(jctx *c, json_t *j);
const char *jv_typename(jval v);                  /* Python type name: str, int, NoneType ... */
const char *jv_objrepr(jval v);                   /* Jinja's object_type_repr: "dict object", "None" */
bool jv_truthy(jval v);
bool jv_is_str(jval v);
bool jv_iterable(jval v);
bool jv_is_callable(jval v);
const char *jv_unhashable(jval v);               /* "" if hashable, else "list"/"dict" */
bool jv_eq(jval a, jval b);
int jv_cmp(jctx *c, jval a, jval b, const char *op, int *res); /* <0,0,>0 in *res; error on incomparable */
void jv_str_append(buf *b, jval v);              /* Python str() (undefined -> "") */
void jv_repr_append(buf *b, jval v);             /* Python repr() */
jval jv_tostr(jctx *c, jval v);                  /* str() as a JT_STR value */
void jv_html_escape(buf *b, jval s, bool escape); /* markupsafe.escape of a str (verbatim if !escape) */
void py_float_repr(buf *b, double f);
/* json.dumps(x, ensure_ascii, indent (NULL=None), separators, sort_keys) */
int jv_tojson(jctx *c, buf *b, jval v, bool ensure_ascii, const char *indent,
              const char *item_sep, const char *key_sep, bool sort_keys);
int jv_sort(jctx *c, jval *v, int n, bool case_sensitive, bool reverse, jval *keys);
int jfail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jfail_undef(jctx *c, jval u);
/* UTF-8 helpers (Python str semantics) */
int64_t u8_len(const char *p, size_t n);                  /* code points */
size_t u8_offset(const char *p, size_t n, int64_t cp);    /* byte offset of code point cp */
int32_t u8_next(const char *p, size_t n, size_t *i);      /* decode at *i, advance */
void u8_put(buf *b, int32_t cp);
bool py_isspace(int32_t cp);

/* ---- jinja_builtins.c -------------------------------------------------------- */
typedef int (*jfilter_fn)(jctx *c, jval v, jargs *a, jval *out);
typedef int (*jtest_fn)(jctx *c, jval v, jargs *a, bool *out);
jfilter_fn jinja_find_filter(const char *name);
jtest_fn jinja_find_test(const char *name);
/* obj.name for str/list/dict methods: 1 found (*out a bound JT_FUNC), 0 not a method,
 * negative: error (an unsafe method of the immutable sandbox). */
int jinja_method(jctx *c, jval obj, const char *name, jval *out);
/* Global functions (range, dict, namespace, raise_exception, strftime_now). */
bool jinja_global(jctx *c, const char *name, jval *out);
/* fmt % args; maplike: the single argument is a list/dict (no "not all arguments converted") */
int jv_pyformat(jctx *c, jval fmt, jargs *a, bool maplike, jval *out);
int jargs_get(jargs *a, int pos, const char *kw, jval *out); /* 1 found, 0 absent */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP, CASE_JTITLE };
jval jstr_case(jctx *c, jval s, int mode);                  /* Python upper/lower/title..., jinja title */
jval jstr_strip(jval s, jval chars, int which);             /* which: 1 left, 2 right, 3 both */
jval jstr_replace(jctx *c, jval s, jval old, jval new_, int64_t count);
jval jstr_splitlines(jctx *c, jval s, bool keepends);

/* ---- jinja_eval.c ------------------------------------------------------------- */
int jinja_call(jctx *c, jval f, jargs *a, jval *out);
int jinja_getattr(jctx *c, jval obj, const char *name, jval *out);
int jinja_getitem(jctx *c, jval obj, jval key, jval *out);
int jinja_iterate(jctx *c, jval v, jlist **out);  /* materialize an iterable */
int jinja_loop_attr(jctx *c, jval loopv, const char *name, jval *out);
int jinja_loop_call(jctx *c, jval loopv, jargs *a, jval *out); /* loop(children) of a recursive for */
int jv_contains(jctx *c, jval container, jval item, bool *res); /* Python `item in container` */

#endif
