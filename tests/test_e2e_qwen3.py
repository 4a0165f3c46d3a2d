"""The server on a Qwen3 model with the real Qwen3 tokenizer and chat template
(../shared/tokenizers/qwen3): the transformers-written qwen3 fixture, its
embedding and lm_head widened to the Qwen3 vocabulary (151,936 rows) so that
every Qwen3 token id is valid. Checks the Qwen3 conventions end to end with
the OpenAI SDK: the model opens <think> itself (thinking on), the template
closes it in the prompt (enable_thinking false), tool calls are JSON inside
<tool_call> (--tool-call-parser qwen25), and tool_calls history renders."""
import json
import os
import shutil
import struct

import pytest

openai = pytest.importorskip("openai")
np = pytest.importorskip("numpy")

from e2e_util import Server  # noqa: E402

VOCAB = 151936
IM_END = 151645


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes)."""
    header, off = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, raw in tensors.values():
            f.write(raw)


@pytest.fixture(scope="module")
def qwen3_model(shared_dir, tmp_path_factory):
    src = os.path.join(shared_dir, "fixtures", "models", "qwen3")
    out = str(tmp_path_factory.mktemp("qwen3-vocab"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(vocab_size=VOCAB, eos_token_id=IM_END)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    rng = np.random.default_rng(0)
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            rows = np.frombuffer(raw, dtype=np.uint16).reshape(t["shape"])
            rows = rows[rng.integers(0, rows.shape[0], VOCAB)]  # every id gets a real fixture row
            raw, t = rows.tobytes(), {**t, "shape": [VOCAB, t["shape"][1]]}
        tensors[name] = (t["dtype"], t["shape"], raw)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    return out


@pytest.fixture(scope="module")
def srv(ls_bin, shared_dir, qwen3_model):
    tok = os.path.join(shared_dir, "tokenizers", "qwen3")
    with Server(os.environ.get("LASTSTAND_E2E_BIN", ls_bin), qwen3_model, "--tokenizer-path", tok,
                "--served-model-name", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
                "--context-length", "2048", env={"LASTSTAND_TEST_FORCE_IDS": "1"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=120)


def ask(client, srv, text, content="What is 2+2?", **kw):
    ids = srv.tokenize(text) + [IM_END]
    extra = kw.pop("extra_body", {})
    return client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": content}],
                                          extra_body={"force_ids": ids, **extra}, **kw)


def test_qwen3_model_opens_think_itself(srv, client):
    assert srv.tokenize("<think></think><tool_call>") == [151667, 151668, 151657]
    r = ask(client, srv, "<think>\nUser asks 2+2.\n</think>\n\nIt is 4.")
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "\nUser asks 2+2.\n"
    assert m.content == "\n\nIt is 4."
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["matched_stop"] == IM_END
    chunks = list(ask(client, srv, "<think>\nUser asks 2+2.\n</think>\n\nIt is 4.", stream=True))
    assert "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks) == "\nUser asks 2+2.\n"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "\n\nIt is 4."


def test_qwen3_thinking_off_prompt_closes_think(srv, client):
    r = ask(client, srv, "It is 4.", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "It is 4."
    assert r.choices[0].message.model_extra.get("reasoning_content") is None


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def test_qwen3_json_tool_calls_stream_and_history(srv, client):
    text = ('<think>\nneed weather\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 3}}\n</tool_call>')
    chunks = list(ask(client, srv, text, "Weather?", tools=TOOLS, stream=True))
    calls = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            calls.setdefault(tc.index, {"name": tc.function.name, "id": tc.id, "args": ""})
            calls[tc.index]["args"] += tc.function.arguments or ""
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["args"]) == {"city": "Paris", "days": 3}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # the call goes back as history (arguments as a JSON string) with the tool's answer
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0]["id"], "type": "function",
                                                                   "function": {"name": "get_weather",
                                                                                "arguments": calls[0]["args"]}}]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny, 21 C"}]
    ids = srv.tokenize("Sunny.") + [IM_END]
    r = client.chat.completions.create(model="qwen3", messages=msgs, tools=TOOLS,
                                       extra_body={"force_ids": ids,
                                                   "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Sunny." and r.choices[0].finish_reason == "stop"
