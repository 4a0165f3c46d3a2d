"""Constrained-decoding checks shared by tests/test_grammar_json.py (CPU) and
tests/test_gpu_grammar.py (--device cuda, the device-sampler engine).

The server runs a random-weight model: unconstrained, its output is noise, so
an output that parses and validates is the grammar's doing. The schemas used
here have finite languages (enums, booleans, bounded strings and arrays), so a
random model must reach the end; outputs are checked with Python's json and
the jsonschema package (the oracles), tool calls through the official OpenAI
SDK's parsed message.tool_calls."""
import json

import jsonschema
import openai

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {"const": "cat"}},
                                             "required": ["kind"], "additionalProperties": False}]},
    },
    "required": ["name", "color", "ok"],
    "additionalProperties": False,
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 0},
            "precise": {"type": "boolean"}},
            "required": ["unit", "precise"]}}},
    {"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["tz"]}}},
]


def chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe someone."}],
                                          **kw)


def rf_schema(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def check_json_schema_outputs_validate(client, model, seeds=(1, 2, 3, 4)):
    for seed in seeds:
        r = chat(client, model, response_format=rf_schema(PERSON), max_tokens=400, temperature=1.0, seed=seed,
                 extra_body=NO_THINK)
        c = r.choices[0]
        assert c.finish_reason == "stop", (seed, c.finish_reason, c.message.content)
        doc = json.loads(c.message.content)
        jsonschema.validate(doc, PERSON)
    r = chat(client, model, response_format=rf_schema(PERSON), max_tokens=400, temperature=0, extra_body=NO_THINK)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def check_json_schema_streaming(client, model):
    for seed in (11, 12):
        text, finish = "", None
        for ch in chat(client, model, response_format=rf_schema(PERSON), max_tokens=400, temperature=1.0,
                       seed=seed, stream=True, extra_body=NO_THINK):
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        assert finish == "stop", (finish, text)
        jsonschema.validate(json.loads(text), PERSON)


def check_json_object_with_bias(client, model, tokenize):
    """json_object has an infinite language: +8 on '"' and '}' makes a random model close
    strings and objects soon (and checks that logit_bias and the mask combine)."""
    bias = {str(tokenize('"')[0]): 8, str(tokenize("}")[0]): 8}
    for seed in (1, 2, 3):
        r = chat(client, model, response_format={"type": "json_object"}, max_tokens=300, temperature=1.0,
                 seed=seed, logit_bias=bias, extra_body=NO_THINK)
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content
        assert isinstance(json.loads(c.message.content), dict)


def _check_calls(calls, allowed):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls, "no tool calls"
    for tc in calls:
        assert tc.type == "function" and tc.function.name in allowed, tc
        jsonschema.validate(json.loads(tc.function.arguments), by_name[tc.function.name])


def check_tool_choice_required_and_named(client, model):
    for seed in (1, 2, 3):
        r = chat(client, model, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=1.0, seed=seed,
                 extra_body=NO_THINK)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
        _check_calls(c.message.tool_calls, {"get_weather", "get_time"})
    for seed in (4, 5):
        r = chat(client, model, tools=TOOLS, max_tokens=400, temperature=1.0, seed=seed, extra_body=NO_THINK,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c.message
        _check_calls(c.message.tool_calls, {"get_weather"})


def detok(srv, ids):
    status, out = srv.post_json("/detokenize", {"tokens": ids})
    assert status == 200, out
    return out["text"]


def greedy_ids(srv, prompt, n=1, **sp):
    """Greedy ids through SGLang's /generate (it returns output_ids)."""
    status, out = srv.post_json("/generate", {"text": prompt, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, **sp}})
    assert status == 200, out
    return out["output_ids"]


def check_logit_bias_bans_and_forces(client, model, srv):
    t0 = greedy_ids(srv, "The weather is")[0]
    t1 = greedy_ids(srv, "The weather is", logit_bias={str(t0): -100})[0]
    assert t1 != t0
    # the OpenAI route too: the banned token's text is not the greedy one
    first = detok(srv, [t0])
    banned = client.completions.create(model=model, prompt="The weather is", max_tokens=1, temperature=0,
                                       logit_bias={str(t0): -100})
    assert banned.choices[0].text == detok(srv, [t1]) != first
    forced_id = 300
    ids = greedy_ids(srv, "The weather is", n=3, temperature=1.0, seed=3, logit_bias={str(forced_id): 100})
    assert ids == [forced_id] * 3
    f = client.completions.create(model=model, prompt="The weather is", max_tokens=3, temperature=1.0, seed=3,
                                  logit_bias={str(forced_id): 100})
    assert f.choices[0].text == detok(srv, [forced_id] * 3)


def check_bad_schemas_are_400(client, model):
    bad = {"type": "object", "properties": {"age": {"type": "integr"}}}
    try:
        chat(client, model, response_format=rf_schema(bad), max_tokens=5)
        raise AssertionError("accepted a bad schema")
    except openai.BadRequestError as e:
        assert "response_format.json_schema.schema.properties.age.type" in str(e), str(e)
    pat = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(?=[a-z])+$"}}}  # lookahead
    try:
        chat(client, model, response_format=rf_schema(pat), max_tokens=5)
        raise AssertionError("accepted a lookahead pattern")
    except openai.BadRequestError as e:
        assert "response_format.json_schema.schema.properties.id.pattern: '(?' at offset 2" in str(e), str(e)


def check_tool_choice_required_streaming(client, model):
    """The streamed tool-call deltas assemble into calls that validate."""
    calls, finish = {}, None
    for ch in chat(client, model, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=1.0, seed=21,
                   stream=True, extra_body=NO_THINK):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "args": ""})
            if tc.function and tc.function.name:
                c["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                c["args"] += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls, (finish, calls)
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls.values():
        jsonschema.validate(json.loads(c["args"]), by_name[c["name"]])
