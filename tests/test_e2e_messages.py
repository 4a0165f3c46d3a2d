"""End-to-end tests of the Anthropic Messages API (`/v1/messages`) on the demo
model, driven by Anthropic's official Python SDK (`anthropic`, PyPI): its typed
models, `client.messages.stream` (which accumulates the event stream into the
final message and raises on events out of order) and its error classes are
the oracles for the wire format.

The prompt a Messages request renders is checked against the chat route (itself
checked against transformers' chat templates): the same conversation as chat
messages must give the same prompt tokens, and count_tokens the same number.
Content checks force the output ids (LASTSTAND_TEST_FORCE_IDS=1)."""
import json
import os

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from e2e_util import Server  # noqa: E402

MODEL = "demo"
KEY = "sk-laststand-test"
TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                            "metric": {"type": "boolean"}},
                           "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                "parameters": TOOLS[0]["input_schema"]}}]
CALL_TEXT = ("I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
             "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n"
             "</tool_call>")
NO_THINK = {"type": "disabled"}


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
                "--tool-call-parser", "qwen3_coder", env={"LASTSTAND_TEST_FORCE_IDS": "1"}, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def eos(srv):
    status, data = srv.get("/get_model_info")
    assert status == 200
    return json.loads(data)["eos_token_ids"][0]


def forced(srv, eos, text):
    return srv.tokenize(text) + [eos]


def chat_prompt_tokens(oai, messages, thinking=False, **kw):
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": thinking}}, **kw)
    return r.usage.prompt_tokens


def test_text_message_and_count_tokens(srv, client, oai, eos):
    ids = forced(srv, eos, "Hello there")
    m = client.messages.create(model=MODEL, max_tokens=64, system="Be brief.", thinking=NO_THINK,
                               messages=[{"role": "user", "content": "Hi"}], extra_body={"force_ids": ids})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == MODEL
    assert [(b.type, b.text) for b in m.content] == [("text", "Hello there")]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    want = chat_prompt_tokens(oai, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == want
    assert m.usage.output_tokens == len(ids)
    n = client.messages.count_tokens(model=MODEL, system="Be brief.", thinking=NO_THINK,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert n.input_tokens == want


def test_thinking_and_tool_use_streamed_and_not(srv, client, eos):
    ids = forced(srv, eos, CALL_TEXT)
    kw = dict(model=MODEL, max_tokens=200, tools=TOOLS, messages=[{"role": "user", "content": "Weather in Paris?"}],
              extra_body={"force_ids": ids})
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "tool_use"]  # no text block for the "\n\n" between
    think, call = m.content
    assert think.thinking == "I need the weather.\n"
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert call.input == {"city": "Paris", "days": 3, "metric": True}
    assert m.stop_reason == "tool_use" and m.usage.output_tokens == len(ids)
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == call.input
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [b.model_dump(exclude={"id"}) for b in m.content]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == m.usage.output_tokens


def test_tool_result_turn_renders_as_the_chat_conversation(srv, client, oai, eos):
    ids = forced(srv, eos, CALL_TEXT)
    m1 = client.messages.create(model=MODEL, max_tokens=200, tools=TOOLS,
                                messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body={"force_ids": ids})
    call = m1.content[1]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"},
                                         {"type": "text", "text": "Short answer please."}]}]
    m2 = client.messages.create(model=MODEL, max_tokens=64, tools=TOOLS, messages=msgs, thinking=NO_THINK,
                                extra_body={"force_ids": forced(srv, eos, "Sunny.")})
    assert m2.content[0].text == "Sunny."
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I need the weather.\n",
             "tool_calls": [{"id": call.id, "type": "function",
                             "function": {"name": "get_weather", "arguments": json.dumps(call.input)}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
            {"role": "user", "content": "Short answer please."}]
    want = chat_prompt_tokens(oai, chat, tools=CHAT_TOOLS)
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == want
    assert client.messages.count_tokens(model=MODEL, tools=TOOLS, messages=msgs, thinking=NO_THINK).input_tokens == want


def test_stop_sequences_and_max_tokens(srv, client, eos):
    ids = forced(srv, eos, "Hello world and more")
    m = client.messages.create(model=MODEL, max_tokens=64, thinking=NO_THINK, stop_sequences=["world"],
                               messages=[{"role": "user", "content": "Hi"}], extra_body={"force_ids": ids})
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "world"
    assert m.content[0].text == "Hello "
    m = client.messages.create(model=MODEL, max_tokens=2, thinking=NO_THINK,
                               messages=[{"role": "user", "content": "Hi"}], extra_body={"force_ids": ids})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2
    with client.messages.stream(model=MODEL, max_tokens=64, thinking=NO_THINK, stop_sequences=["world"],
                                messages=[{"role": "user", "content": "Hi"}], extra_body={"force_ids": ids}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "world"
    assert final.content[0].text == "Hello "


def test_tool_choice_tool_forces_a_schema_valid_call(client):
    """Constrained decoding on the demo model (its free text is noise)."""
    pick = {"name": "pick", "input_schema": {"type": "object", "required": ["city", "metric"],
                                             "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                            "metric": {"type": "boolean"}}}}
    m = client.messages.create(model=MODEL, max_tokens=300, thinking=NO_THINK, tools=TOOLS + [pick],
                               tool_choice={"type": "tool", "name": "pick"}, extra_body={"temperature": 0},
                               messages=[{"role": "user", "content": "Weather?"}])
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "pick" and m.stop_reason == "tool_use", m
    assert calls[0].input["city"] in ("Paris", "Rome") and isinstance(calls[0].input["metric"], bool)


@pytest.mark.parametrize("kw,words", [
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]),
     "messages[0].content[0].type: 'image' is not supported"),
    (dict(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
    (dict(messages=[{"role": "user", "content": "x"}], tools=[{"type": "web_search_20250305", "name": "web_search"}]),
     "tools[0].type: 'web_search_20250305' is not supported"),
    (dict(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "sometimes"}), "tool_choice.type"),
    (dict(messages=[{"role": "user", "content": "x"}], extra_body={"temperature": -1}), "temperature"),
    (dict(messages=[]), "messages: expected a non-empty array"),
])
def test_bad_requests_are_anthropic_errors_naming_the_field(client, kw, words):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=8, **kw)
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"], body


def test_missing_max_tokens_wrong_key_and_unknown_model(srv, client):
    status, data = srv.post("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and json.loads(data) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: required"}}
    bad = anthropic.Anthropic(base_url=srv.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    # the server keeps serving
    m = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert m.usage.output_tokens == 2


def test_disable_parallel_tool_use_keeps_the_first_call(srv, client, eos):
    one = "<tool_call>\n<function=get_weather>\n<parameter=city>\n{}\n</parameter>\n</function>\n</tool_call>"
    ids = forced(srv, eos, "x\n</think>\n\n" + one.format("Paris") + "\n" + one.format("Rome"))
    kw = dict(model=MODEL, max_tokens=200, tools=TOOLS, messages=[{"role": "user", "content": "Weather?"}],
              extra_body={"force_ids": ids})
    m = client.messages.create(**kw)
    assert [b.input["city"] for b in m.content if b.type == "tool_use"] == ["Paris", "Rome"]
    m = client.messages.create(tool_choice={"type": "auto", "disable_parallel_tool_use": True}, **kw)
    assert [b.input["city"] for b in m.content if b.type == "tool_use"] == ["Paris"]
