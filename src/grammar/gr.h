/* gr.h: constrained decoding. A JSON Schema (or "any JSON object", or a set of
 * tool calls in the model's own format) is compiled to a byte-level pushdown
 * automaton; a matcher follows one sequence's output through it and gives,
 * per step, the set of vocabulary tokens whose bytes the automaton accepts.
 *
 * Depends on base and tok only. Grammars and vocabularies are immutable after
 * construction and shared between threads (their lazily filled mask caches are
 * locked);
 * a matcher belongs to one sequence and one thread at a time.
 *
 * What the JSON Schema compiler accepts (anything else named in a schema is
 * refused with ERR_INVAL and the JSON path of the keyword, e.g.
 * "schema.properties.age.not: ..."; annotations such as title,
 * description, default, examples, $schema, $id are ignored):
 *   type (a name or a list), nullable, enum, const, properties, required,
 *   additionalProperties (a boolean or a schema; when absent: false under
 *   strict, else any JSON value), items (a schema, false, or the draft-4 list
 *   form = prefixItems), prefixItems, minItems, maxItems, minLength, maxLength,
 *   anyOf / oneOf (both are "any of": exclusivity is not enforced), allOf of
 *   one schema, $ref to "#", "#/$defs/NAME" or "#/definitions/NAME"
 *   (recursion allowed), minimum / exclusiveMinimum >= 0 (the number gets no
 *   minus sign; other bounds are not enforced: numbers are otherwise
 *   unconstrained), pattern on strings (gr_regex.c's dialect: the subset
 *   ECMA-262 and Python's re share, ASCII classes; found anywhere unless
 *   anchored; with minLength / maxLength too), format date, time, date-time,
 *   uuid, ipv4 and email on strings without a pattern (RFC 3339 with real
 *   month lengths and leap years, the offset required; other formats are
 *   annotations). Pattern and format strings are written without escapes,
 *   so characters a JSON string must escape never match them.
 *   patternProperties, not, if/then/else,
 *   dependentSchemas, unevaluated*, contains, uniqueItems, multipleOf,
 *   propertyNames are refused.
 * Output form the automaton allows:
 *   - properties in the schema's order, the optional ones skippable, extra
 *     properties (when allowed) after them; keys and enum/const values exactly
 *     as compact JSON writes them (UTF-8 unescaped, no spaces);
 *   - whitespace: a run of at most GR_WS_MAX bytes of ' ', '\n', '\t' where
 *     JSON allows whitespace (so a model cannot stall in whitespace);
 *   - numbers: at most 15 integer digits, 15 fraction digits, 3 exponent
 *     digits; strings: any UTF-8 (validated, overlongs and surrogates
 *     refused) except unescaped control characters, '"' and '\', with the JSON
 *     escapes; lengths count code points, an escape counts as one;
 *   - nesting at most GR_MAX_DEPTH frames deep (deeper branches are dropped).
 */
#ifndef LS_GRAMMAR_GR_H
#define LS_GRAMMAR_GR_H

#include "base/base.h"
#include "tok/tok.h"

#include <jansson.h>

#define GR_WS_MAX 4
#define GR_MAX_DEPTH 96

typedef struct gr_grammar gr_grammar;
typedef struct gr_vocab gr_vocab;
typedef struct gr_matcher gr_matcher;

/* ---- compiling (the returned grammar holds one reference) ---------------- */
/* schema: a JSON Schema (an object or true). strict: OpenAI's strict flag
 * (additionalProperties defaults to false). path: the JSON path of schema in
 * the request, used as the prefix of error messages. */
int gr_compile_json_schema(const json_t *schema, int strict, const char *path, gr_grammar **out, ls_err *e);
/* The whole output matches the regular expression (gr_regex.c's dialect;
 * SGLang's "regex"). path prefixes error messages. */
int gr_compile_regex(const char *re, const char *path, gr_grammar **out, ls_err *e);
/* A context-free grammar in EBNF / GBNF (gr_ebnf.c; SGLang's "ebnf"), starting at
 * its rule "root". path prefixes error messages (with the line and column). */
int gr_compile_ebnf(const char *text, const char *path, gr_grammar **out, ls_err *e);
/* Any JSON object (response_format json_object). */
gr_grammar *gr_compile_json_object(void);

/* Tool calls in the model's format. tools: the request's "tools" array;
 * only: the function to call (NULL: any of tools); min_calls / max_calls:
 * the number of calls (1/1 for a named function). */
enum { GR_TOOLS_HERMES = 1, GR_TOOLS_XML = 2 };
int gr_compile_tool_calls(const json_t *tools, const char *only, int format, int min_calls, int max_calls,
                          const char *path, gr_grammar **out, ls_err *e);

gr_grammar *gr_ref(gr_grammar *g);
void gr_unref(gr_grammar *g);

/* ---- vocabulary ---------------------------------------------------------- */
/* The byte trie of a tokenizer's tokens. n_vocab: the mask width (the model's
 * vocabulary, which may exceed the tokenizer's ids: extra ids are never
 * allowed). term: ids that end a sequence (EOS and stop ids), allowed only
 * where the grammar accepts. Special tokens are never allowed inside it. */
gr_vocab *gr_vocab_new(const tokenizer *t, int n_vocab, const int32_t *term, int n_term);
/* The same from explicit byte strings (tests): tokens[i] of len[i] bytes;
 * special[i] (may be NULL) marks tokens never allowed. */
gr_vocab *gr_vocab_from_bytes(int n, const char *const *tokens, const int *len, const uint8_t *special,
                              const int32_t *term, int n_term);
void gr_vocab_free(gr_vocab *v);
int gr_vocab_size(const gr_vocab *v);
/* Bitmask words for the vocabulary: (n_vocab + 31) / 32. */
int gr_mask_words(const gr_vocab *v);

/* ---- matching ------------------------------------------------------------ */
/* gate (may be NULL): the constraint starts after the output contains these
 * bytes (e.g. "</think>" for a reasoning model); until then every token is
 * allowed. The matcher holds a reference to g; v must outlive it. */
gr_matcher *gr_matcher_new(gr_grammar *g, const gr_vocab *v, const char *gate);
void gr_matcher_free(gr_matcher *m);
/* Commit one token. 0, or -1 when the automaton rejects it (the matcher then
 * allows only the terminators: the request can still end cleanly). */
int gr_matcher_accept_token(gr_matcher *m, int32_t id);
/* Feed raw bytes (tests, and the bytes after a gate). 0 or -1 as above. */
int gr_matcher_feed(gr_matcher *m, const char *s, size_t n);
/* Allowed tokens of the next step into bits [gr_mask_words]: bit i of word
 * i / 32 set = token i allowed. Returns 1, or 0 when the step is unconstrained
 * (gate not passed yet: bits not written). Never leaves the set empty: when
 * nothing else can follow, the terminators are allowed. */
int gr_matcher_fill_mask(gr_matcher *m, uint32_t *bits);
/* The output so far is a complete sentence of the grammar. */
int gr_matcher_accepting(const gr_matcher *m);
/* Accepting and nothing can follow (only a terminator is allowed). */
int gr_matcher_done(const gr_matcher *m);
int gr_matcher_failed(const gr_matcher *m);
/* The gate has not opened yet: this step is unconstrained. */
int gr_matcher_gated(const gr_matcher *m);
const gr_vocab *gr_matcher_vocab(const gr_matcher *m);

/* Statistics of the last fill_mask (bench): 1 if the state's mask came from
 * the cache of a string / raw-text state. */
int gr_matcher_last_cached(const gr_matcher *m);

#endif
