/* req_grammar.c: a request's constraint, compiled through the engine's
 * ls_grammar_* API.
 *
 *   response_format json_object          -> any JSON object
 *   response_format json_schema          -> the schema (strict: additionalProperties false by default)
 *   regex (SGLang's field)               -> the whole output matches the regular expression
 *   ebnf (SGLang's field)                -> the output follows the EBNF grammar from its rule root
 *   tool_choice "required"               -> one to MAX_CALLS calls of the request's tools
 *   tool_choice {"function": {"name"}}   -> exactly one call of that function
 * Tool calls use the format of --tool-call-parser (qwen3_coder: the XML form;
 * qwen25: hermes JSON), so the existing parsers turn the output into
 * tool_calls. A tool-call constraint wins over response_format.
 * Reasoning: when the rendered prompt opens <think> (Qwen3.5 with thinking,
 * or --reasoning-parser qwen3-thinking), the model reasons freely and the
 * constraint starts after "</think>"; otherwise it starts at the first token
 * (a template that lets the model open <think> itself gets no reasoning
 * block: the grammar does not allow one).
 */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CALLS 8

/* The top-level field of a JSON path, for the OpenAI error's "param". */
static void param_of(const char *msg, char *out, size_t n) {
    size_t k = strcspn(msg, ".[: ");
    if (k >= n) k = n - 1;
    memcpy(out, msg, k);
    out[k] = 0;
}

int srv_req_constrain(srv *sv, srv_req *r, int opens_think, srv_resp *rs) {
    char err[1200] = "";
    int rc = 0;
    if (r->tool_choice == TC_REQUIRED || r->tool_choice == TC_NAMED) {
        const char *fmt = sv->cfg.tool_parser == TP_QWEN3_CODER ? "qwen3_coder"
                        : sv->cfg.tool_parser == TP_QWEN25 ? "hermes" : NULL;
        if (!fmt) {
            srv_error(rs, 400, NULL, "tool_choice",
                      "tool_choice: \"required\" and named functions need the server's --tool-call-parser "
                      "(qwen3_coder or qwen25) to know the model's tool-call format");
            return -1;
        }
        char *tools = json_dumps(r->tools, JSON_COMPACT);
        int named = r->tool_choice == TC_NAMED;
        rc = ls_grammar_tool_calls(sv->eng, tools, named ? r->tool_choice_name : NULL, fmt, 1,
                                   named || r->one_call ? 1 : MAX_CALLS,
                                   "tools", &r->grammar, err, sizeof err);
        free(tools);
    } else if (r->rf_kind == RF_JSON_OBJECT) {
        rc = ls_grammar_json_object(sv->eng, &r->grammar, err, sizeof err);
    } else if (r->rf_kind == RF_REGEX) {
        rc = ls_grammar_regex(sv->eng, r->regex, r->rf_path, &r->grammar, err, sizeof err);
    } else if (r->rf_kind == RF_EBNF) {
        rc = ls_grammar_ebnf(sv->eng, r->regex, r->rf_path, &r->grammar, err, sizeof err);
    } else if (r->rf_kind == RF_JSON_SCHEMA) {
        char *schema = json_dumps(r->rf_schema, JSON_COMPACT | JSON_ENCODE_ANY);
        rc = ls_grammar_json_schema(sv->eng, schema, r->rf_strict, r->rf_path, &r->grammar, err, sizeof err);
        free(schema);
    } else {
        return 0;
    }
    if (rc < 0) {
        char param[64];
        param_of(err, param, sizeof param);
        srv_error(rs, 400, NULL, param, "%s", err);
        return -1;
    }
    r->s.grammar = r->grammar;
    r->s.grammar_gate = opens_think || sv->cfg.reasoning_always ? "</think>" : NULL;
    return 0;
}
