"""End-to-end tests of the Responses API (`/v1/responses`) on the demo model,
driven by the official OpenAI Python SDK: its typed models, its streaming
helper (`client.responses.stream`, which checks the event sequence: created
first, every delta after its item was added, every item done before
response.completed) and `client.responses.parse` (structured outputs into a
pydantic model) are the oracles for the wire format.

The prompt a Responses request renders is checked against the chat route
(itself checked against transformers' chat templates): the same conversation
sent as chat messages must give the same prompt_tokens. Content checks force
the output ids (LASTSTAND_TEST_FORCE_IDS=1, as test_e2e_server.py does)."""
import json
import os

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from e2e_util import Server  # noqa: E402

MODEL = "demo"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                          "metric": {"type": "boolean"}},
                         "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
CALL_TEXT = ("I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
             "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n"
             "</tool_call>")


def _bin(ls_bin):
    return os.environ.get("LASTSTAND_E2E_BIN", ls_bin)


@pytest.fixture(scope="module")
def model_path(request):
    if os.environ.get("LASTSTAND_E2E_BIN"):
        return "synth:demo"
    return request.getfixturevalue("demo_model")


@pytest.fixture(scope="module")
def srv(ls_bin, model_path):
    with Server(_bin(ls_bin), model_path, "--served-model-name", MODEL, "--reasoning-parser", "qwen3",
                "--tool-call-parser", "qwen3_coder", env={"LASTSTAND_TEST_FORCE_IDS": "1"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def eos(srv):
    status, data = srv.get("/get_model_info")
    assert status == 200
    return json.loads(data)["eos_token_ids"][0]


def forced(srv, eos, text):
    return srv.tokenize(text) + [eos]


def chat_prompt_tokens(client, messages, **kw):
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **kw)
    return r.usage.prompt_tokens


def strip_ids(items):
    """Output items as plain dicts without their random ids (for comparing two runs)."""
    out = []
    for it in items:
        d = it.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        d.pop("parsed_arguments", None)
        for c in d.get("content", []) or []:
            c.pop("parsed", None)
        out.append(d)
    return out


# ---- text, retrieval, deletion ---------------------------------------------------------------


def test_text_response_is_stored_retrievable_and_deletable(srv, client, eos):
    ids = forced(srv, eos, "Hello there")
    r = client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "none"}, extra_body={"force_ids": ids})
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "Hello there"
    assert [it.type for it in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.status == "completed" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    # the prompt is the chat route's for the same conversation
    want = chat_prompt_tokens(client, [{"role": "user", "content": "Hi"}],
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.usage.input_tokens == want
    assert r.usage.output_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.reasoning.effort == "none" and r.store is True and r.model == MODEL
    n = client.responses.input_tokens.count(model=MODEL, input="Hi", reasoning={"effort": "none"})
    assert n.input_tokens == want and n.object == "response.input_tokens"
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Hi")]
    d = client.responses.delete(r.id)
    assert d is None or getattr(d, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_store_false_is_not_kept_and_instructions_are_the_system_message(srv, client, eos):
    ids = forced(srv, eos, "Ok")
    r = client.responses.create(model=MODEL, input="Hi", instructions="Answer in French.", store=False,
                                reasoning={"effort": "none"}, extra_body={"force_ids": ids})
    assert r.instructions == "Answer in French." and r.store is False and r.output_text == "Ok"
    want = chat_prompt_tokens(client, [{"role": "system", "content": "Answer in French."},
                                       {"role": "user", "content": "Hi"}],
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.usage.input_tokens == want
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError, match="no stored response"):
        client.responses.create(model=MODEL, input="again", previous_response_id=r.id)


# ---- reasoning, tool calls, streaming ----------------------------------------------------------


def test_reasoning_and_function_call_items_streamed_and_not(srv, client, eos):
    ids = forced(srv, eos, CALL_TEXT)
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS, extra_body={"force_ids": ids})
    assert r.status == "completed"
    assert [it.type for it in r.output] == ["reasoning", "function_call"]  # the "\n\n" between them is no message
    rs, fc = r.output
    assert rs.content[0].type == "reasoning_text" and rs.content[0].text == "I need the weather.\n"
    assert fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.status == "completed"
    assert json.loads(fc.arguments) == {"city": "Paris", "days": 3, "metric": True}
    assert r.output_text == ""
    n_reason = len(srv.tokenize("I need the weather.\n")) + 1  # and </think>
    assert r.usage.output_tokens_details.reasoning_tokens == n_reason
    assert r.usage.output_tokens == len(ids)
    assert r.tools[0].name == "get_weather"

    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=TOOLS,
                                 extra_body={"force_ids": ids}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "I need the weather.\n"
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == fc.arguments
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == fc.arguments
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final.id == events[0].response.id
    assert strip_ids(final.output) == strip_ids(r.output)
    for u in (final.usage, r.usage):  # the second run's prompt comes from the prefix cache
        u.input_tokens_details.cached_tokens = 0
    assert final.usage.model_dump() == r.usage.model_dump()


def test_function_call_output_continues_by_previous_response_id_or_by_items(srv, client, eos):
    ids = forced(srv, eos, CALL_TEXT)
    r1 = client.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS, extra_body={"force_ids": ids})
    fc = r1.output[1]
    answer = forced(srv, eos, "It is sunny.")
    out_item = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}
    r2 = client.responses.create(model=MODEL, previous_response_id=r1.id, input=[out_item], tools=TOOLS,
                                 reasoning={"effort": "none"}, extra_body={"force_ids": answer})
    assert r2.previous_response_id == r1.id and r2.output_text == "It is sunny."
    # the same conversation as chat messages renders the same prompt
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "I need the weather.\n",
                 "tool_calls": [{"id": fc.call_id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": fc.arguments}}]},
                {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny, 21 C"}]
    want = chat_prompt_tokens(client, messages, tools=CHAT_TOOLS,
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r2.usage.input_tokens == want
    # stateless: the earlier items sent back as input give the same prompt
    history = [{"role": "user", "content": "Weather in Paris?"}] + [it.model_dump(exclude_none=True) for it in r1.output]
    r3 = client.responses.create(model=MODEL, input=history + [out_item], tools=TOOLS, store=False,
                                 reasoning={"effort": "none"}, extra_body={"force_ids": answer})
    assert r3.usage.input_tokens == want and r3.output_text == "It is sunny."
    # input_items lists this response's own input only, newest first by default
    items = client.responses.input_items.list(r2.id)
    assert [i.type for i in items.data] == ["function_call_output"]
    # a third turn chains through both
    r4 = client.responses.create(model=MODEL, previous_response_id=r2.id, input="Thanks!",
                                 reasoning={"effort": "none"}, tools=TOOLS, extra_body={"force_ids": forced(srv, eos, "Bye")})
    messages += [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks!"}]
    assert r4.usage.input_tokens == chat_prompt_tokens(
        client, messages, tools=CHAT_TOOLS, extra_body={"chat_template_kwargs": {"enable_thinking": False}})


def test_streamed_text_with_logprobs_equals_non_streamed(srv, client, eos):
    ids = forced(srv, eos, "The answer is four.")
    kw = dict(model=MODEL, input="What is 2+2?", reasoning={"effort": "none"}, top_logprobs=2,
              include=["message.output_text.logprobs"], extra_body={"force_ids": ids})
    r = client.responses.create(**kw)
    lp = r.output[0].content[0].logprobs
    assert len(lp) == len(ids)  # every token, EOS included
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in lp)
    assert "".join(e.token for e in lp[:-1]) == "The answer is four."
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == "The answer is four."
    streamed = [x for e in deltas for x in e.logprobs]
    assert [x.token for x in streamed] == [e.token for e in lp[:len(streamed)]]
    assert final.output_text == r.output_text
    assert [e.token for e in final.output[0].content[0].logprobs] == [e.token for e in lp]


def test_background_responses_are_polled_and_cancelled(srv, client, eos):
    import time
    ids = forced(srv, eos, "Done in the background.")
    r = client.responses.create(model=MODEL, input="Hi", background=True, reasoning={"effort": "none"},
                                extra_body={"force_ids": ids})
    assert r.background is True and r.status in ("queued", "in_progress")
    for _ in range(600):
        got = client.responses.retrieve(r.id)
        if got.status not in ("queued", "in_progress"):
            break
        time.sleep(0.05)
    assert got.status == "completed" and got.output_text == "Done in the background." and got.background is True
    assert got.usage.output_tokens == len(ids)
    # a long one, cancelled while it runs; a finished one cannot be cancelled
    long = client.responses.create(model=MODEL, input="Count", background=True, max_output_tokens=20000,
                                   reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
    time.sleep(0.3)
    with pytest.raises(openai.BadRequestError):
        client.responses.delete(long.id)
    c = client.responses.cancel(long.id)
    assert c.status == "cancelled" and c.id == long.id, c.status
    got = client.responses.retrieve(long.id)
    assert got.status == "cancelled" and got.usage.output_tokens < 20000  # may be 0 on a loaded machine
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(r.id)
    client.responses.delete(long.id)
    # the conversation of a finished background response continues like any other
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, input="And?", reasoning={"effort": "none"},
                                 extra_body={"force_ids": forced(srv, eos, "More.")})
    assert r2.output_text == "More."


def test_max_output_tokens_makes_it_incomplete(srv, client, eos):
    ids = forced(srv, eos, "one two three four five six")
    r = client.responses.create(model=MODEL, input="Count", max_output_tokens=3, reasoning={"effort": "none"},
                                extra_body={"force_ids": ids})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    with client.responses.stream(model=MODEL, input="Count", max_output_tokens=3, reasoning={"effort": "none"},
                                 extra_body={"force_ids": ids}) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


class Weather(pydantic.BaseModel):
    city: str
    days: int
    metric: bool


def test_structured_output_parses_into_the_pydantic_model(client):
    """Constrained decoding on the demo model (its free text is noise): the output
    must still parse into the schema's model."""
    r = client.responses.parse(model=MODEL, input="Weather?", text_format=Weather, reasoning={"effort": "none"},
                               max_output_tokens=400, temperature=0)
    assert r.status == "completed", r.output
    assert isinstance(r.output_parsed, Weather)
    assert r.text.format.type == "json_schema"


def test_max_tool_calls_keeps_the_first(srv, client, eos):
    one = "<tool_call>\n<function=get_weather>\n<parameter=city>\n{}\n</parameter>\n</function>\n</tool_call>"
    text = "x\n</think>\n\n" + one.format("Paris") + "\n" + one.format("Rome")
    ids = forced(srv, eos, text)
    r = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS, extra_body={"force_ids": ids})
    assert [json.loads(it.arguments)["city"] for it in r.output if it.type == "function_call"] == ["Paris", "Rome"]
    r = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS, max_tool_calls=1,
                                extra_body={"force_ids": ids})
    assert [json.loads(it.arguments)["city"] for it in r.output if it.type == "function_call"] == ["Paris"]
    r = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS, parallel_tool_calls=False,
                                extra_body={"force_ids": ids})
    assert [json.loads(it.arguments)["city"] for it in r.output if it.type == "function_call"] == ["Paris"]
    assert r.parallel_tool_calls is False


# ---- listing, errors ----------------------------------------------------------------------------


def test_input_items_pages(srv, client, eos):
    inp = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    r = client.responses.create(model=MODEL, input=inp, reasoning={"effort": "none"},
                                extra_body={"force_ids": forced(srv, eos, "ok")})
    page = client.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text for i in page.data] == ["message 4", "message 3"] and page.has_more
    page2 = client.responses.input_items.list(r.id, limit=2, after=page.data[-1].id)
    assert [i.content[0].text for i in page2.data] == ["message 2", "message 1"]
    asc = client.responses.input_items.list(r.id, order="asc", limit=100)
    assert [i.content[0].text for i in asc.data] == [f"message {i}" for i in range(5)] and not asc.has_more
    status, data = srv.get(f"/v1/responses/{r.id}/input_items?limit=0")
    assert status == 400 and json.loads(data)["error"]["param"] == "limit"


def _err(e):
    return e.value.status_code, e.value.body.get("param") if isinstance(e.value.body, dict) else None, str(e.value)


@pytest.mark.parametrize("kw,param,words", [
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
     "input", "input[0].content[0].type: 'input_image' is not supported"),
    (dict(input="x", tools=[{"type": "web_search"}]), "tools", "tools[0].type: 'web_search' is not supported"),
    (dict(input="x", background=True, stream=True), "background", "not streamed"),
    (dict(input="x", background=True, store=False), "background", "must be stored"),
    (dict(input="x", max_output_tokens=0), "max_output_tokens", "max_output_tokens"),
    (dict(input="x", previous_response_id="resp_nope"), "previous_response_id", "no stored response 'resp_nope'"),
    (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input", "item_reference is not supported"),
    (dict(input=[{"type": "computer_call_output", "call_id": "c"}]), "input", "'computer_call_output' is not supported"),
    (dict(input=[{"role": "robot", "content": "x"}]), "input", "input[0].role: unknown role 'robot'"),
    (dict(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input", "input[0].call_id"),
    (dict(input="x", temperature=-1), "temperature", "temperature: must be >= 0"),
    (dict(input="x", text={"format": {"type": "yaml"}}), "text", "text.format.type"),
    (dict(input="x", tool_choice={"type": "file_search"}), "tool_choice", "'file_search' is not supported"),
    (dict(input="x", include=["file_search_call.results"]), "include", "include[0]"),
    (dict(input="x", reasoning={"effort": "extreme"}), "reasoning", "reasoning.effort"),
    (dict(input="x", text={"format": {"type": "json_schema", "name": "w",
                                      "schema": {"type": "string", "pattern": "(?=a)"}}}),
     "text", "text.format.schema.pattern: '(?' at offset 1"),
])
def test_bad_requests_name_the_field(client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, **kw)
    status, got_param, msg = _err(e)
    assert status == 400 and got_param == param and words in msg, msg


def test_routes_and_the_server_keeps_serving(srv, client, eos):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    status, data = srv.post("/v1/responses", "{bad json")
    assert status == 400 and "invalid JSON body" in json.loads(data)["error"]["message"]
    r = client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "none"},
                                extra_body={"force_ids": forced(srv, eos, "fine")})
    status, data = srv.post(f"/v1/responses/{r.id}/cancel", {})
    assert status == 400 and "Only running background responses" in json.loads(data)["error"]["message"]
    status, _ = srv.request("PUT", f"/v1/responses/{r.id}")
    assert status == 405
    assert client.responses.retrieve(r.id).output_text == "fine"


def test_truncation_auto_drops_the_oldest_items(ls_bin, model_path, eos):
    with Server(_bin(ls_bin), model_path, "--served-model-name", MODEL, "--context-length", "200",
                env={"LASTSTAND_TEST_FORCE_IDS": "1"}) as s:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
        inp = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "words " * 20}
               for i in range(9)]
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=MODEL, input=inp, max_output_tokens=20, reasoning={"effort": "none"})
        assert _err(e)[1] == "input" or "max_output_tokens" in str(e.value)
        r = c.responses.create(model=MODEL, input=inp, max_output_tokens=20, truncation="auto",
                               reasoning={"effort": "none"}, extra_body={"force_ids": s.tokenize("ok") + [eos]})
        assert r.status == "completed" and r.truncation == "auto" and r.output_text == "ok"
        assert r.usage.input_tokens + 20 <= 200


def test_shutdown_cancels_running_background_responses(ls_bin, model_path):
    s = Server(_bin(ls_bin), model_path, "--served-model-name", MODEL)
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
        r = c.responses.create(model=MODEL, input="Count", background=True, max_output_tokens=20000,
                               reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
        assert r.status in ("queued", "in_progress")
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.log_text()
