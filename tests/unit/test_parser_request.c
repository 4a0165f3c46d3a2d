/* test_parser_request.c: OpenAI request bodies -> srv_req (server/req.c):
 * SGLang's defaults, every accepted prompt shape, and rejections that name
 * the JSON path and the OpenAI "param". */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

static int parse(srv_req *r, int kind, const char *body, int allow_force, char *param, ls_err *e) {
    memset(e, 0, sizeof *e);
    return req_parse(r, kind, body, strlen(body), allow_force, NULL, param, 64, e);
}

/* Expect a rejection whose message contains `want` and whose param is `want_param`. */
static void rejects(int kind, const char *body, const char *want, const char *want_param) {
    srv_req r; ls_err e; char param[64];
    int rc = parse(&r, kind, body, 0, param, &e);
    if (rc != ERR_INVAL) fail_msg("accepted: %s", body);
    if (!strstr(e.msg, want)) fail_msg("message '%s' lacks '%s' (body %s)", e.msg, want, body);
    if (want_param) assert_string_equal(param, want_param);
    req_free(&r);
}

static void test_chat_defaults_follow_sglang(void **st) {
    (void)st;
    srv_req r; ls_err e; char param[64];
    assert_int_equal(parse(&r, SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0, param, &e), 0);
    assert_float_equal(r.s.temperature, 1.0, 1e-6);
    assert_float_equal(r.s.top_p, 1.0, 1e-6);
    assert_int_equal(r.s.max_tokens, 0);       /* up to the context */
    assert_int_equal(r.n, 1);
    assert_int_equal(r.stream, 0);
    assert_int_equal(r.separate_reasoning, 1);
    assert_int_equal(r.stream_reasoning, 1);
    assert_int_equal(r.enable_thinking, -1);
    assert_int_equal(r.tool_choice, TC_NONE);
    assert_null(r.model);
    req_free(&r);
}

static void test_chat_fields_are_read(void **st) {
    (void)st;
    srv_req r; ls_err e; char param[64];
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}}]}],"
        "\"max_tokens\":5,\"max_completion_tokens\":7,\"temperature\":0,\"top_k\":20,\"seed\":3,\"stop\":\"END\","
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":2,\"logprobs\":true,\"top_logprobs\":3,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
        "\"chat_template_kwargs\":{\"enable_thinking\":false},\"separate_reasoning\":false}";
    assert_int_equal(parse(&r, SRV_CHAT, body, 0, param, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.s.max_tokens, 7); /* max_completion_tokens wins */
    assert_int_equal(r.has_max_tokens, 1);
    assert_float_equal(r.s.temperature, 0, 0);
    assert_int_equal(r.s.top_k, 20);
    assert_int_equal(r.s.has_seed, 1);
    assert_int_equal((int)r.s.seed, 3);
    assert_int_equal(r.s.n_stop, 1);
    assert_string_equal(r.s.stop[0], "END");
    assert_int_equal(r.stream && r.include_usage, 1);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.s.logprobs, 1);
    assert_int_equal(r.s.top_logprobs, 3);
    assert_int_equal(r.tool_choice, TC_AUTO); /* default with tools */
    assert_int_equal(r.enable_thinking, 0);
    assert_int_equal(r.separate_reasoning, 0);
    /* normalised messages: developer -> system, text parts joined, arguments decoded */
    json_t *m0 = json_array_get(r.messages, 0), *m1 = json_array_get(r.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m0, "role")), "system");
    assert_string_equal(json_string_value(json_object_get(m0, "content")), "a\nb");
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(m1, "tool_calls"), 0), "function"), "arguments");
    assert_true(json_is_object(args));
    req_free(&r);
}

static void test_completion_prompt_shapes(void **st) {
    (void)st;
    srv_req r; ls_err e; char param[64];
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":\"hi\"}", 0, param, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.s.max_tokens, 16); /* OpenAI's completions default */
    assert_non_null(r.prompt_strings);
    req_free(&r);
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\"],\"echo\":true}", 0, param, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_int_equal(r.echo, 1);
    req_free(&r);
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":[5,6,7],\"logprobs\":2}", 0, param, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n, 3);
    assert_int_equal(r.prompts[0].ids[2], 7);
    assert_int_equal(r.s.logprobs, 1);
    assert_int_equal(r.s.top_logprobs, 2);
    req_free(&r);
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":[[1,2],[3]]}", 0, param, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[1].ids[0], 3);
    req_free(&r);
}

static void test_rejections_name_the_field(void **st) {
    (void)st;
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[512];
    rejects(SRV_CHAT, "{\"messages\": [}", "invalid JSON body: line 1, column", NULL);
    rejects(SRV_CHAT, "[1,2]", "must be a JSON object", NULL);
    rejects(SRV_CHAT, "{}", "messages: required", "messages");
    rejects(SRV_CHAT, "{\"messages\":[]}", "non-empty", "messages");
    rejects(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"bot\",\"content\":\"y\"}]}",
            "messages[1].role: unknown role 'bot'", "messages");
    rejects(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
            "messages[0].content[0].type", "messages");
    snprintf(b, sizeof b, "{%s,\"temperature\":-0.5}", msg);
    rejects(SRV_CHAT, b, "temperature: must be >= 0", "temperature");
    snprintf(b, sizeof b, "{%s,\"top_p\":0}", msg);
    rejects(SRV_CHAT, b, "top_p", "top_p");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":0}", msg);
    rejects(SRV_CHAT, b, "max_tokens: must be between 1", "max_tokens");
    snprintf(b, sizeof b, "{%s,\"n\":\"two\"}", msg);
    rejects(SRV_CHAT, b, "n: expected an integer", "n");
    snprintf(b, sizeof b, "{%s,\"stop\":[\"a\",3]}", msg);
    rejects(SRV_CHAT, b, "stop[1]", "stop");
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"required\"}", msg);
    rejects(SRV_CHAT, b, "\"required\" needs at least one tool", "tool_choice");
    snprintf(b, sizeof b, "{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", msg);
    rejects(SRV_CHAT, b, "tool_choice.function.name: 'f' is not among", "tool_choice");
    snprintf(b, sizeof b, "{%s,\"top_logprobs\":2}", msg);
    rejects(SRV_CHAT, b, "requires logprobs", "top_logprobs");
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"yaml\"}}", msg);
    rejects(SRV_CHAT, b, "response_format.type: expected text, json_object or json_schema", "response_format");
    snprintf(b, sizeof b, "{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}", msg);
    rejects(SRV_CHAT, b, "response_format.json_schema.schema: required", "response_format");
    snprintf(b, sizeof b, "{%s,\"logit_bias\":{\"12\":101}}", msg);
    rejects(SRV_CHAT, b, "logit_bias.12: the bias must be a number in [-100, 100]", "logit_bias");
    snprintf(b, sizeof b, "{%s,\"logit_bias\":{\"x\":1}}", msg);
    rejects(SRV_CHAT, b, "logit_bias.x: the key must be a token id", "logit_bias");
    snprintf(b, sizeof b, "{%s,\"force_ids\":[1]}", msg);
    rejects(SRV_CHAT, b, "test-only", "force_ids");
    rejects(SRV_COMPLETION, "{\"prompt\":[1,-2]}", "prompt[1]", "prompt");
    rejects(SRV_COMPLETION, "{\"prompt\":[[1],[]]}", "prompt[1]: empty", "prompt");
    rejects(SRV_COMPLETION, "{\"prompt\":{}}", "prompt: expected", "prompt");
    rejects(SRV_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs: expected an integer", "logprobs");
}

static void test_force_ids_accepted_in_test_mode(void **st) {
    (void)st;
    srv_req r; ls_err e; char param[64];
    assert_int_equal(parse(&r, SRV_COMPLETION, "{\"prompt\":\"x\",\"force_ids\":[4,-1]}", 1, param, &e), 0);
    assert_int_equal(r.s.n_force, 2);
    assert_int_equal(r.s.force_ids[1], -1);
    req_free(&r);
}

static void test_model_sampling_defaults_fill_omitted_fields(void **st) {
    (void)st;
    char dir[] = "/tmp/ls_gencfgXXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, \"do_sample\": true}", f);
    fclose(f);
    ls_sampling d;
    json_t *found = req_model_sampling_defaults(dir, &d);
    assert_int_equal(json_object_size(found), 3);
    srv_req r; ls_err e; char param[64];
    const char *body = "{\"prompt\":\"x\",\"top_p\":0.5}";
    assert_int_equal(req_parse(&r, SRV_COMPLETION, body, strlen(body), 0, &d, param, 64, &e), 0);
    assert_float_equal(r.s.temperature, 0.6, 1e-6); /* omitted: the model's */
    assert_int_equal(r.s.top_k, 20);
    assert_float_equal(r.s.top_p, 0.5, 1e-6);       /* given: the request's */
    assert_float_equal(r.s.repetition_penalty, 1.0, 1e-6);
    req_free(&r);
    json_decref(found);
    remove(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults_follow_sglang),
        cmocka_unit_test(test_chat_fields_are_read),
        cmocka_unit_test(test_completion_prompt_shapes),
        cmocka_unit_test(test_rejections_name_the_field),
        cmocka_unit_test(test_force_ids_accepted_in_test_mode),
        cmocka_unit_test(test_model_sampling_defaults_fill_omitted_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
