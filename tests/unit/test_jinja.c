/* test_jinja.c: the Jinja renderer's language features, through the C API (tok/jinja.h).
 *
 * The expected strings of the CASES_* tables were produced by jinja2 3.1.6 configured as
 * transformers 5.17 configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols, transformers' tojson), rendering the same template with the variables VARS
 * (generator: see the git history of this file). The other tests pin this renderer's own
 * contract: error positions, raise_exception, the runaway guards, apply_chat's variables and
 * chat-template discovery.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok/jinja.h"

typedef struct jcase { const char *tmpl, *want; } jcase;

static const jcase CASES_WHITESPACE[] = {
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
     "a\n  b\nc"},
    {"x  {%- if true -%}  y  {%- endif -%}  z",
     "xyz"},
    {"{% for i in xs %}\n{{ i }}\n{% endfor %}",
     "1\n2\n3\n4\n5\n"},
    {"  {{- 'v' }}  |  {{ 'w' -}}  \n  end",
     "v  |  wend"},
    {"{# c #}\n  {#- c2 #}  k\n",
     "  k"},
    {"p {%+ if true %}q{% endif %}\n\n",
     "p q"},
    {"{% raw %}  {{ x }} {% endraw %}|{%- raw -%}  r  {%- endraw -%}|",
     "  {{ x }} |r|"},
    {NULL, NULL}};
static const jcase CASES_LOOPS[] = {
    {"{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first|int }}{{ loop.last|int }}{{ loop.length }} {% endfor %}",
     "1043104 2132004 3221004 4310014 "},
    {"{% for m in msgs %}{{ (loop.previtem.role if loop.previtem else '-') }}/{{ loop.nextitem.role if loop.nextitem is defined else '-' }}/{{ loop.cycle('a','b','c') }} {% endfor %}",
     "-/user/a system/assistant/b user/user/c assistant/-/a "},
    {"{% for x in xs if x is odd %}{{ x }}@{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}",
     "1@1/3 3@2/3 5@3/3 "},
    {"{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
     "empty"},
    {"{% for x in xs %}{% if x == 2 %}{% continue %}{% elif x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "13"},
    {"{% for k, v in d.items() %}{{ k }}:{{ v is mapping }} {% endfor %}",
     "z:False a:True "},
    {"{% set c = 10 %}{% for x in xs %}{% set c = c + x %}{{ c }},{% endfor %}{{ c }}",
     "11,12,13,14,15,10"},
    {NULL, NULL}};
static const jcase CASES_SLICING[] = {
    {"{{ xs[::-1] }} {{ xs[1:3] }} {{ xs[-2:] }} {{ xs[:-3] }} {{ xs[::2] }} {{ xs[4:1:-1] }} {{ xs[10:] }} {{ xs[-100:2] }}",
     "[5, 4, 3, 2, 1] [2, 3] [4, 5] [1, 2] [1, 3, 5] [5, 4, 3] [] [1, 2]"},
    {"{{ s[::-1] }}|{{ s[1:4] }}|{{ s[-5:] }}|{{ s[::3] }}|{{ s[1] }}",
     "dlröw olléh|éll|wörld|hlwl|é"},
    {"{{ (msgs[::-1]|first).content }} {{ msgs[1:]|map(attribute='role')|join(',') }}",
     "U2 user,assistant,user"},
    {NULL, NULL}};
static const jcase CASES_MACROS[] = {
    {"{% macro m(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2, 3) }}{{ m(c=4, a=5) }}",
     "[1|B|None][1|2|3][5|B|4]"},
    {"{% macro box(t) %}<{{ t }}:{{ caller() }}>{% endmacro %}{% call box('x') %}in{% endcall %}",
     "<x:in>"},
    {"{% macro each(l) %}{% for i in l %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(v) each(xs) %}({{ v * 2 }}){% endcall %}",
     "(2)(4)(6)(8)(10)"},
    {"{% macro fact(n) %}{{ 1 if n <= 1 else n * (fact(n - 1)|int) }}{% endmacro %}{{ fact(6) }}",
     "720"},
    {"{% set g = 'G' %}{% macro show() %}{{ g }}{{ s|length }}{% endmacro %}{% set g = 'H' %}{{ show() }}",
     "H11"},
    {NULL, NULL}};
static const jcase CASES_NAMESPACE[] = {
    {"{% set ns = namespace(n=0, last='') %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.content %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.last }}",
     "2 U2"},
    {"{% set ns = namespace(d) %}{{ ns.z }} {{ ns.a.n|length }} {{ ns.missing is defined }}",
     "1 3 False"},
    {NULL, NULL}};
static const jcase CASES_TOJSON[] = {
    {"{{ f|tojson }}",
     "[0.1, 1e+16, 1e-05, -0.0, 3.0, 1.2345678901234568e+17, 1.5e+300, 2.5e-08]"},
    {"{{ d|tojson }}",
     "{\"z\": 1, \"a\": {\"n\": [true, null, \"é\\\"\\\\\\n\\t\\u0001\"]}}"},
    {"{{ d|tojson(indent=2) }}",
     "{\n  \"z\": 1,\n  \"a\": {\n    \"n\": [\n      true,\n      null,\n      \"é\\\"\\\\\\n\\t\\u0001\"\n    ]\n  }\n}"},
    {"{{ d|tojson(ensure_ascii=true) }}",
     "{\"z\": 1, \"a\": {\"n\": [true, null, \"\\u00e9\\\"\\\\\\n\\t\\u0001\"]}}"},
    {"{{ 'naïve 東京 🙂 </tag>'|tojson }}",
     "\"naïve 東京 🙂 </tag>\""},
    {"{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
     "{\"a\": 2, \"b\": 1}"},
    {"{{ f }}",
     "[0.1, 1e+16, 1e-05, -0.0, 3.0, 1.2345678901234568e+17, 1.5e+300, 2.5e-08]"},
    {NULL, NULL}};
static const jcase CASES_UNDEFINED[] = {
    {"[{{ nope }}][{{ nope is defined }}][{{ nope|default('D') }}][{{ nope|length }}][{{ nope ~ 'x' }}][{% for a in nope %}{{ a }}{% endfor %}][{{ 'T' if nope else 'F' }}]",
     "[][False][D][0][x][][F]"},
    {"[{{ d.missing }}][{{ d.missing is undefined }}][{{ d['missing']|default(0) }}][{{ msgs[9] is defined }}][{{ none.attr is undefined }}]",
     "[][True][0][False][True]"},
    {NULL, NULL}};
static const char *VARS = "{\"msgs\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U1\"}, {\"role\": \"assistant\", \"content\": \"A1\"}, {\"role\": \"user\", \"content\": \"U2\"}], \"xs\": [1, 2, 3, 4, 5], \"s\": \"héllo wörld\", \"f\": [0.1, 1e+16, 1e-05, -0.0, 3.0, 1.2345678901234568e+17, 1.5e+300, 2.5e-08], \"d\": {\"z\": 1, \"a\": {\"n\": [true, null, \"é\\\"\\\\\\n\\t\\u0001\"]}}}";

/* Renders src with vars_json; returns malloc'd output or NULL (err filled). */
static char *render(const char *src, const char *vars_json, ls_err *err, int *raised) {
    jinja_tmpl *t = NULL;
    json_error_t je;
    json_t *vars = vars_json ? json_loads(vars_json, 0, &je) : json_object();
    assert_non_null(vars);
    char *out = NULL;
    int r = 0;
    if (jinja_parse(src, &t, err) == 0) jinja_render(t, vars, &out, &r, err);
    if (raised) *raised = r;
    jinja_free(t);
    json_decref(vars);
    return out;
}

static void run_cases(const jcase *cases) {
    for (int i = 0; cases[i].tmpl; i++) {
        ls_err e = {0};
        char *out = render(cases[i].tmpl, VARS, &e, NULL);
        if (!out) fail_msg("template %s\nfailed: %s", cases[i].tmpl, e.msg);
        if (strcmp(out, cases[i].want))
            fail_msg("template %s\nwant [%s]\ngot  [%s]", cases[i].tmpl, cases[i].want, out);
        free(out);
    }
}

static void test_whitespace_control_matches_jinja2(void **s) { (void)s; run_cases(CASES_WHITESPACE); }
static void test_loop_variables_match_jinja2(void **s) { (void)s; run_cases(CASES_LOOPS); }
static void test_slicing_with_negative_steps_matches_jinja2(void **s) { (void)s; run_cases(CASES_SLICING); }
static void test_macros_and_call_blocks_match_jinja2(void **s) { (void)s; run_cases(CASES_MACROS); }
static void test_namespace_assignment_matches_jinja2(void **s) { (void)s; run_cases(CASES_NAMESPACE); }
static void test_tojson_floats_unicode_nesting_match_transformers(void **s) { (void)s; run_cases(CASES_TOJSON); }
static void test_undefined_semantics_match_jinja2(void **s) { (void)s; run_cases(CASES_UNDEFINED); }

static void expect_error(const char *src, const char *vars, const char *msg) {
    ls_err e = {0};
    int raised = -1;
    char *out = render(src, vars, &e, &raised);
    if (out) fail_msg("template %s rendered [%s], expected error %s", src, out, msg);
    if (strcmp(e.msg, msg)) fail_msg("template %s\nwant error [%s]\ngot error  [%s]", src, msg, e.msg);
    assert_int_equal(e.code, ERR_INVAL);
    assert_int_equal(raised, 0);
}

static void test_syntax_errors_report_line_and_column(void **s) {
    (void)s;
    expect_error("ok\n{% if x %}\nno end", NULL,
                 "line 3, column 7: Unexpected end of template. Jinja was looking for the following tags: 'elif'.");
    expect_error("a\n  {{ x | nofilter }}", NULL, "line 2, column 10: No filter named 'nofilter'.");
    expect_error("{{ x is nosuchtest }}", NULL, "line 1, column 9: No test named 'nosuchtest'.");
    expect_error("{% for x in y %}{% endif %}", NULL,
                 "line 1, column 20: Encountered unknown tag 'endif'. Jinja was looking for the following tags: 'endfor'.");
    expect_error("{% frobnicate %}", NULL, "line 1, column 4: Encountered unknown tag 'frobnicate'.");
    expect_error("é {{ (1 + ) }}", NULL, "line 1, column 11: unexpected ')'");
    expect_error("{{ 'unterminated }}", NULL, "line 1, column 4: unexpected end of string");
    expect_error("{# never closed", NULL, "line 1, column 1: Missing end of comment tag");
    expect_error("{% break %}", NULL, "line 1, column 4: 'break' outside of a loop");
}

static void test_runtime_errors_report_line_and_column(void **s) {
    (void)s;
    expect_error("line1\n  {{ 1 + 'a' }}", NULL, "line 2, column 6: unsupported operand type(s) for +: 'int' and 'str'");
    expect_error("{% for m in msgs %}\n{{ m.nope.deeper }}{% endfor %}", VARS,
                 "line 2, column 4: 'dict object' has no attribute 'nope'");
    expect_error("\n\n{{ undefined_var.x }}", NULL, "line 3, column 4: 'undefined_var' is undefined");
    expect_error("{{ xs|items|list }}", VARS, "line 1, column 7: Can only get item pairs from a mapping.");
    expect_error("{{ xs.append(1) }}", VARS, "line 1, column 4: access to attribute 'append' of 'list' object is unsafe.");
}

static void test_raise_exception_gives_its_message_and_raised_flag(void **s) {
    (void)s;
    ls_err e = {0};
    int raised = 0;
    char *out = render("x{{ raise_exception('No user query found in messages.') }}", NULL, &e, &raised);
    assert_null(out);
    assert_int_equal(raised, 1);
    assert_int_equal(e.code, ERR_INVAL);
    assert_string_equal(e.msg, "No user query found in messages.");
}

static void test_runaway_templates_stop_with_clear_errors(void **s) {
    (void)s;
    ls_err e = {0};
    char *out = render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, &e, NULL);
    assert_null(out);
    assert_non_null(strstr(e.msg, "maximum recursion depth exceeded"));
    out = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &e, NULL);
    assert_null(out);
    assert_non_null(strstr(e.msg, "loop iterations"));
    out = render("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}", NULL, &e, NULL);
    assert_null(out);
    assert_non_null(strstr(e.msg, "template output exceeds"));
    out = render("{{ range(100001)|length }}", NULL, &e, NULL);
    assert_null(out);
    assert_non_null(strstr(e.msg, "Range too big."));
}

static void test_apply_chat_passes_variables_like_transformers(void **s) {
    (void)s;
    const char *src = "{{ messages|length }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
                      "{{ bos_token is defined }}|{{ eos_token }}|{{ enable_thinking }}|{{ custom }}";
    jinja_tmpl *t;
    ls_err e = {0};
    assert_int_equal(jinja_parse(src, &t, &e), 0);
    json_error_t je;
    json_t *req = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                             "\"chat_template_kwargs\":{\"enable_thinking\":false,\"custom\":[1,2]}}", 0, &je);
    char *out = NULL;
    int raised = 0;
    assert_int_equal(jinja_apply_chat(t, req, NULL, "<|im_end|>", &out, &raised, &e), 0);
    assert_string_equal(out, "1|True|True|False|False|<|im_end|>|False|[1, 2]");
    free(out);
    /* kwargs override the special tokens, as {**special_tokens_map, **kwargs} does */
    json_object_set_new(json_object_get(req, "chat_template_kwargs"), "eos_token", json_string("E"));
    json_object_set_new(req, "add_generation_prompt", json_true());
    json_object_set_new(req, "tools", json_loads("[{\"type\":\"function\"}]", 0, &je));
    assert_int_equal(jinja_apply_chat(t, req, "<s>", "<|im_end|>", &out, &raised, &e), 0);
    assert_string_equal(out, "1|False|True|True|True|E|False|[1, 2]");
    free(out);
    /* transformers refuses an empty conversation before rendering */
    json_object_set_new(req, "messages", json_array());
    assert_int_equal(jinja_apply_chat(t, req, NULL, NULL, &out, &raised, &e), ERR_INVAL);
    assert_int_equal(raised, 1);
    assert_string_equal(e.msg, "Cannot apply chat template to an empty conversation. Provide at least one message.");
    json_object_set_new(req, "messages", json_string("x"));
    assert_int_equal(jinja_apply_chat(t, req, NULL, NULL, &out, &raised, &e), ERR_INVAL);
    assert_int_equal(raised, 0);
    assert_string_equal(e.msg, "request.messages: must be an array");
    json_decref(req);
    jinja_free(t);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_find_chat_template_prefers_jinja_file_then_config(void **s) {
    (void)s;
    char dir[] = "/tmp/ls_jinja_XXXXXX", p1[256], p2[256];
    assert_non_null(mkdtemp(dir));
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    snprintf(p2, sizeof p2, "%s/chat_template.jinja", dir);
    ls_err e = {0};
    assert_null(jinja_find_chat_template(dir, &e));
    write_text(p1, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}");
    char *t = jinja_find_chat_template(dir, &e);
    assert_string_equal(t, "D");
    free(t);
    write_text(p1, "{\"chat_template\": \"S\"}");
    t = jinja_find_chat_template(dir, &e);
    assert_string_equal(t, "S");
    free(t);
    write_text(p2, "J");
    t = jinja_find_chat_template(dir, &e);
    assert_string_equal(t, "J");
    free(t);
    write_text(p1, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
    unlink(p2);
    assert_null(jinja_find_chat_template(dir, &e));
    assert_non_null(strstr(e.msg, "default"));
    /* named templates: the tokenizer_config list, then additional_chat_templates/NAME.jinja */
    write_text(p1, "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", \"template\": \"T\"}]}");
    t = jinja_find_named_chat_template(dir, "tool_use", &e);
    assert_string_equal(t, "T");
    free(t);
    assert_null(jinja_find_named_chat_template(dir, "rag", &e));
    char sub[256], p3[300];
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", dir);
    snprintf(p3, sizeof p3, "%s/tool_use.jinja", sub);
    assert_int_equal(mkdir(sub, 0755), 0);
    write_text(p3, "TF");
    t = jinja_find_named_chat_template(dir, "tool_use", &e);
    assert_string_equal(t, "TF");
    free(t);
    unlink(p3);
    /* template files present: the config list is not consulted any more, as in transformers */
    assert_null(jinja_find_named_chat_template(dir, "tool_use", &e));
    rmdir(sub);
    unlink(p1);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace_control_matches_jinja2),
        cmocka_unit_test(test_loop_variables_match_jinja2),
        cmocka_unit_test(test_slicing_with_negative_steps_matches_jinja2),
        cmocka_unit_test(test_macros_and_call_blocks_match_jinja2),
        cmocka_unit_test(test_namespace_assignment_matches_jinja2),
        cmocka_unit_test(test_tojson_floats_unicode_nesting_match_transformers),
        cmocka_unit_test(test_undefined_semantics_match_jinja2),
        cmocka_unit_test(test_syntax_errors_report_line_and_column),
        cmocka_unit_test(test_runtime_errors_report_line_and_column),
        cmocka_unit_test(test_raise_exception_gives_its_message_and_raised_flag),
        cmocka_unit_test(test_runaway_templates_stop_with_clear_errors),
        cmocka_unit_test(test_apply_chat_passes_variables_like_transformers),
        cmocka_unit_test(test_find_chat_template_prefers_jinja_file_then_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
