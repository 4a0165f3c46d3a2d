/* gr_int.h: the grammar module's private structures, shared by gr_schema.c
 * (compiler), gr_pda.c (the pushdown automaton) and gr_match.c (vocabulary
 * trie, masks, matcher). Nothing here is part of gr.h's contract.
 *
 * A grammar is a graph of nodes. Composite nodes (SEQ, ALT, ARR, REF) only
 * push and pop frames; terminal nodes (LIT, STR, NUM, WS, RAW) consume bytes.
 * The automaton's state is a set of stacks (the grammar is ambiguous under
 * anyOf / optional parts: every live alternative is kept, identical stacks
 * merged); every stack's top is a terminal ready for its next byte, and a
 * flag says whether some alternative has finished the whole grammar.
 */
#ifndef LS_GRAMMAR_GR_INT_H
#define LS_GRAMMAR_GR_INT_H

#include "grammar/gr.h"

#include <pthread.h>
#include <stdatomic.h>

enum { GN_LIT, GN_SEQ, GN_ALT, GN_REF, GN_ARR, GN_STR, GN_NUM, GN_WS, GN_RAW, GN_RE };

/* Node fields by kind:
 *   LIT a = byte offset, b = length (0: the empty sequence)
 *   SEQ/ALT a = kid offset, b = kid count
 *   REF a = target node
 *   ARR a = kid offset of the prefix items, b = their count, c = item node for
 *       the rest (-1: none), d = min count, e = max count (-1: unbounded),
 *       f = separator node (-1: none), between consecutive elements
 *   STR a = min code points, b = max (-1: none)       (a JSON string, quotes included)
 *   NUM a = integer only, b = no minus sign
 *   WS  a = max bytes
 *   RAW a = max content bytes (-1: none): qwen3_coder parameter text, ended by
 *       "\n</parameter>"; the content never holds "</" or "<p" (the parser
 *       would end the value there)
 *   RE  a = DFA index (g->dfas), b = min code points, c = max (-1: none): bytes the
 *       DFA accepts; it may end wherever the DFA accepts (frame pc = DFA state,
 *       x = code points so far) */
typedef struct gr_node { int32_t kind, a, b, c, d, e, f; } gr_node;

typedef struct gr_centry gr_centry;

/* A byte-level DFA (gr_regex.c): state 0 starts; next[q * 256 + b] is the state after
 * byte b or -1 (dead: no accepting state is reachable any more); more[q]: some byte
 * leads on. */
typedef struct gr_dfa {
    int n;
    int32_t *next;
    uint8_t *accept, *more;
    uint8_t *cont;          /* inside a code point: every byte that leads on is a continuation byte */
    int32_t *dmin, *dmax;   /* code points of the shortest / longest completion (GR_LEN_INF: unbounded);
                             * computed by gr_dfa_lengths for terminals with length bounds, else NULL */
} gr_dfa;
#define GR_LEN_INF (1 << 28)
/* Fill dmin / dmax. -1 when the DFA is too large for it (over 1024 states). */
int gr_dfa_lengths(gr_dfa *d);
/* Compile a pattern (gr_regex.c's dialect). json_string: bytes a JSON string must
 * escape never match; search: unanchored ends match anything (JSON Schema's pattern),
 * else the whole text must match. 0, or -1 with err ("pattern: ..." / "'X' at offset N ..."). */
int gr_regex_dfa(const char *re, size_t len, int json_string, int search, gr_dfa *out, char *err, size_t errn);
void gr_dfa_free(gr_dfa *d);
int gr_dfa_match(const gr_dfa *d, const char *s, size_t n); /* the whole of s */

struct gr_grammar {
    gr_node *nodes; int n_nodes, cap_nodes;
    int32_t *kids; int n_kids, cap_kids;
    char *bytes; int n_bytes, cap_bytes;
    int root;
    atomic_int refs;
    /* mask cache of string / raw-text states: key (node, pc, x), for one vocabulary */
    pthread_mutex_t mu;
    const gr_vocab *cache_vocab;
    gr_centry **cache; int n_cache, cap_cache; /* entries never move or go away */
    gr_dfa *dfas; int n_dfas;  /* GN_RE automata */
};

struct gr_centry {
    int32_t node, pc, x;
    uint32_t *bits;      /* tokens whose bytes stay inside the string */
    int32_t *exits;      /* trie nodes right after the string closed */
    int n_exits;
};

/* ---- building (gr_schema.c and tests) ---- */
gr_grammar *gr_new(void);
int gr_add(gr_grammar *g, int kind, int a, int b, int c, int d, int e, int f);
int gr_kids(gr_grammar *g, const int32_t *kids, int n); /* offset of the copied list */
int gr_lit(gr_grammar *g, const char *s, size_t n);
int gr_seq(gr_grammar *g, const int32_t *kids, int n);
int gr_alt(gr_grammar *g, const int32_t *kids, int n);
/* A GN_RE node for the pattern (see gr_regex_dfa), or -1 with err. */
int gr_re(gr_grammar *g, const char *re, size_t len, int json_string, int search, int min_cp, int max_cp, char *err,
          size_t errn);

/* ---- the automaton (gr_pda.c) ---- */
enum { S_OPEN = 0, S_BODY, S_ESC, S_HEX1, S_HEX2, S_HEX3, S_HEX4, S_C1, S_C2, S_C3, S_E0, S_ED, S_F0, S_F4,
       T_DONE = 100 };
enum { N_START = 0, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXPS, N_EXPD };
enum { R_BODY = 0, R_NL, R_LT, R_NLLT, R_STOP = 10 /* + bytes of the stop matched */ };
#define GR_RAW_STOP "\n</parameter>"
#define GR_MAX_SET 128

typedef struct gr_frame { int32_t node, pc, x, up, depth; } gr_frame;

typedef struct gr_pool { gr_frame *f; int n, cap; } gr_pool;

typedef struct gr_set { int32_t *tops; int n; int accept; } gr_set; /* tops: [GR_MAX_SET] */

/* One terminal step: 0 and the new (pc, x) (pc T_DONE: the terminal ended), or -1. */
int gr_term_step(const gr_grammar *g, int node, int32_t *pc, int32_t *x, uint8_t byte);
/* The JSON string part of it (n: a GN_STR node; it need not belong to a grammar). */
int gr_str_step(const gr_node *n, int32_t *pc, int32_t *x, uint8_t byte);
int gr_raw_step(const gr_node *n, int32_t *pc, int32_t *x, uint8_t byte);
int gr_re_step(const gr_grammar *g, const gr_node *n, int32_t *pc, int32_t *x, uint8_t byte);
/* A GN_RE frame may end here / take more bytes. */
int gr_re_can_end(const gr_grammar *g, const gr_node *n, int32_t pc, int32_t x);
int gr_re_more(const gr_grammar *g, const gr_node *n, int32_t pc, int32_t x);
/* A frame for node at its start, on top of up; -1 when too deep. */
int32_t gr_push(gr_pool *p, const gr_grammar *g, int node, int32_t up);
/* Expand frame top (already in p) into terminal-topped stacks added to out. */
void gr_closure(const gr_grammar *g, gr_pool *p, int32_t top, gr_set *out);
/* out = the states after byte b from in (out->tops distinct from in->tops). */
void gr_advance(const gr_grammar *g, gr_pool *p, const gr_set *in, uint8_t b, gr_set *out);
/* The start state of g. */
void gr_start(const gr_grammar *g, gr_pool *p, gr_set *out);
/* Cache key of a lone terminal top, or 0 when the state is not cacheable. */
int gr_cache_key(const gr_grammar *g, const gr_frame *f, int32_t *pc, int32_t *x);

#endif
