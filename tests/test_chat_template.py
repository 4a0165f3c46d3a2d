"""laststand chat-template against transformers' apply_chat_template.

Pins:
- every entry of ../shared/fixtures/tokenizer-qwen3/chat_template.json (Qwen3 template from
  tokenizer_config.json) and chat_template_qwen3.5.json (the official Qwen3.5 template via
  --chat-template): rendered text byte-equal, token ids of that text equal to the fixture's
  (through `laststand tokenize`), and the "error" entries exit 2 with exactly that message;
- freshly random conversations (new seed every run, printed on failure: unicode in many scripts,
  special-token strings inside text, nested tool schemas, several typed tool calls, grouped tool
  responses, reasoning in history, content parts, thinking on/off, system present/absent)
  rendered exactly as the oracle renders them. The oracle is transformers 5.17
  `apply_chat_template` (installed by scripts/setup.sh --test) on the Qwen3 tokenizer folder,
  offline; when transformers cannot be imported, jinja2 configured exactly as transformers
  configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its
  tojson / raise_exception / strftime_now) stands in, and the test says so.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

from conftest import BIN, SHARED, run_ls

TOKDIR = os.path.join(SHARED, "tokenizers", "qwen3")
Q35_TEMPLATE = os.path.join(SHARED, "tokenizers", "qwen3.5", "chat_template.jinja")
FIXDIR = os.path.join(SHARED, "fixtures", "tokenizer-qwen3")


def _load(name):
    p = os.path.join(FIXDIR, name)
    return json.load(open(p, encoding="utf-8")) if os.path.exists(p) else []


def render(tmp_path, req, template=None, name="req.json", tokdir=TOKDIR):
    p = os.path.join(str(tmp_path), name)
    with open(p, "w", encoding="utf-8") as f:
        json.dump(req, f, ensure_ascii=False)
    args = [BIN, "chat-template", "--tokenizer-path", tokdir, "--request", p]
    if template:
        args += ["--chat-template", template]
    # bytes, decoded by hand: text mode would turn the rendered "\r\n" into "\n"
    r = subprocess.run(args, capture_output=True, timeout=120)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8"))


def tokenize_ids(tmp_path, text):
    p = os.path.join(str(tmp_path), "text.txt")
    with open(p, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    r = run_ls("tokenize", "--tokenizer-path", TOKDIR, "--file", p)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


# ---- fixtures ---------------------------------------------------------------------------------
QWEN3 = _load("chat_template.json")
QWEN35 = _load("chat_template_qwen3.5.json")


@pytest.mark.parametrize("i", range(len(QWEN3)))
def test_qwen3_fixture_text_and_ids(i, shared_dir, ls_bin, tmp_path):
    x = QWEN3[i]
    kw = dict(x["kwargs"])
    req = {"messages": x["messages"], "add_generation_prompt": x["add_generation_prompt"]}
    if "tools" in kw:  # apply_chat_template(tools=...) is a named argument, not a template kwarg
        req["tools"] = kw.pop("tools")
    req["chat_template_kwargs"] = kw
    r = render(tmp_path, req)
    assert r.returncode == 0, r.stderr
    assert r.stdout == x["text"]
    assert tokenize_ids(tmp_path, r.stdout) == x["ids"]


@pytest.mark.parametrize("i", range(len(QWEN35)))
def test_qwen35_fixture_text_ids_and_errors(i, shared_dir, ls_bin, tmp_path):
    x = QWEN35[i]
    req = {"messages": x["messages"], "add_generation_prompt": x["add_generation_prompt"],
           "chat_template_kwargs": x["chat_template_kwargs"]}
    if x["tools"] is not None:
        req["tools"] = x["tools"]
    r = render(tmp_path, req, Q35_TEMPLATE)
    if "error" in x:
        assert r.returncode == 2, (r.returncode, r.stdout)
        assert r.stdout == ""
        # raise_exception (and transformers' empty-conversation check): the message verbatim;
        # run-time errors: the same message after the template's name and line/column.
        assert r.stderr.startswith("laststand: error: ")
        assert r.stderr.rstrip("\n").endswith(x["error"]), r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert r.stdout == x["text"]
    assert tokenize_ids(tmp_path, r.stdout) == x["ids"]


def test_qwen35_template_without_tools_key_equals_tools_null(shared_dir, ls_bin, tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    a = render(tmp_path, {"messages": msgs, "add_generation_prompt": True}, Q35_TEMPLATE)
    b = render(tmp_path, {"messages": msgs, "tools": None, "add_generation_prompt": True}, Q35_TEMPLATE)
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_tool_use_template_is_chosen_with_tools_like_transformers(shared_dir, ls_bin, tmp_path):
    cfg = json.load(open(os.path.join(TOKDIR, "tokenizer_config.json")))
    cfg["chat_template"] = [{"name": "default", "template": "D{{ messages|length }}"},
                            {"name": "tool_use", "template": "T{{ tools|length }}{{ eos_token }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    msgs = [{"role": "user", "content": "x"}]
    name, oracle = _oracle(str(tmp_path))
    for tools in (None, [{"type": "function", "function": {"name": "f"}}]):
        req = {"messages": msgs} if tools is None else {"messages": msgs, "tools": tools}
        r = render(tmp_path, req, tokdir=str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert r.stdout == oracle(msgs, tools, None, False, {}), name


def test_generation_tag_renders_its_body_like_transformers(shared_dir, ls_bin, tmp_path):
    """transformers' AssistantTracker extension adds {% generation %}; rendering keeps its body."""
    tmpl = ("{%- for m in messages %}<{{ m.role }}>\n{% if m.role == 'assistant' %}{% generation %}"
            "{{ m.content }}\n{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    t = tmp_path / "gen.jinja"
    t.write_text(tmpl, encoding="utf-8")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    name, oracle = _oracle(TOKDIR)
    if not name.startswith("transformers"):
        pytest.skip("needs transformers' own environment (its AssistantTracker extension)")
    r = render(tmp_path, {"messages": msgs}, str(t))
    assert r.returncode == 0, r.stderr
    assert r.stdout == oracle(msgs, None, tmpl, False, {}), name


def test_cli_reports_bad_request_and_bad_template(shared_dir, ls_bin, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"messages": [', encoding="utf-8")
    r = run_ls("chat-template", "--tokenizer-path", TOKDIR, "--request", str(p))
    assert r.returncode == 2 and "--request" in r.stderr and "line 1" in r.stderr
    t = tmp_path / "t.jinja"
    t.write_text("{% for m in messages %}\n{{ m.content | nosuchfilter }}\n{% endfor %}", encoding="utf-8")
    r = render(tmp_path, {"messages": [{"role": "user", "content": "x"}]}, str(t))
    assert r.returncode == 2
    assert r.stderr == f"laststand: error: {t}: line 2, column 16: No filter named 'nosuchfilter'.\n"
    t.write_text("{{ raise_exception('custom: ' ~ messages|length) }}", encoding="utf-8")
    r = render(tmp_path, {"messages": [{"role": "user", "content": "x"}]}, str(t))
    assert (r.returncode, r.stderr) == (2, "laststand: error: custom: 1\n")


# ---- random conversations vs the oracle -----------------------------------------------------------
def _oracle(tokdir):
    """Returns (name, render(messages, tools, template, agp, kwargs) -> text or raises) for the tokenizer
    folder tokdir (template None: the folder's own chat template)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tokdir)

        def fn(messages, tools, template, agp, kwargs):
            return tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                           add_generation_prompt=agp, **kwargs)
        return f"transformers {transformers.__version__} apply_chat_template", fn
    except Exception as exc:  # pragma: no cover - depends on the environment
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from datetime import datetime

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
        cfg = json.load(open(os.path.join(tokdir, "tokenizer_config.json")))
        special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if cfg.get(k)}
        own = os.path.join(tokdir, "chat_template.jinja")
        own = open(own).read() if os.path.exists(own) else cfg.get("chat_template")

        def fn(messages, tools, template, agp, kwargs):
            if not messages:
                raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
            if template is None and isinstance(own, list):  # named templates: tool_use with tools, else default
                named = {t["name"]: t["template"] for t in own}
                template = named["tool_use"] if tools is not None and "tool_use" in named else named["default"]
            return env.from_string(template or own).render(messages=messages, tools=tools, documents=None,
                                                           add_generation_prompt=agp, **{**special, **kwargs})
        return f"jinja2 {jinja2.__version__} in transformers' environment (transformers unavailable: {exc})", fn


_POOLS = [
    "hello", "world", "Paris", "naïve", "café", "東京", "日本語のテキスト", "中文测试", "한국어", "Привет", "мир",
    "مرحبا", "שלום", "हिन्दी", "ภาษาไทย", "Ελληνικά", "ΟΔΟΣ", "straße", "🙂", "👩‍👩‍👧", "🇫🇷", "e\u0301", "a\u0308",
    "  ", "\n", "\n\n", "\t", "\u3000", "\r\n", " \n ", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_response>", "<tool_response>", "{\"a\": 1}", "'quoted'", "\"dq\"", "back\\slash",
    "{{ not jinja }}", "{% raw %}", "x=1", "42", "3.14", "-7", "null", "true", "None", "\u200b", "\u00a0", "\x7f",
]


def _text(rng, lo=0, hi=10):
    return "".join(rng.choice(_POOLS) + rng.choice(["", " ", " ", "", "\n"]) for _ in range(rng.randint(lo, hi)))


def _json_value(rng, depth=0):
    k = rng.randint(0, 9 if depth < 2 else 5)
    if k == 0: return None
    if k == 1: return rng.choice([True, False])
    if k == 2: return rng.randint(-10**12, 10**12)
    if k == 3: return rng.choice([0.5, -0.0, 1e16, 1e-7, 123456.789, 3.0, 2.5e-300, 1 / 3, 100.0])
    if k in (4, 5): return _text(rng, 0, 4)
    if k in (6, 7): return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng, 1, 2) or "k": _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _schema(rng, depth=0):
    t = rng.choice(["string", "integer", "number", "boolean", "array", "object"] if depth < 2 else ["string", "integer"])
    s = {"type": t}
    if rng.random() < 0.5: s["description"] = _text(rng, 1, 5)
    if t == "string" and rng.random() < 0.3: s["enum"] = [_text(rng, 1, 2) for _ in range(2)]
    if t == "array": s["items"] = _schema(rng, depth + 1)
    if t == "object":
        s["properties"] = {f"p{i}": _schema(rng, depth + 1) for i in range(rng.randint(0, 3))}
        s["required"] = list(s["properties"])[:1]
    return s


def _tool(rng, i):
    params = _schema(rng, 1)
    params["type"] = "object"
    params.setdefault("properties", {"q": {"type": "string"}})
    return {"type": "function", "function": {"name": f"tool_{i}_{rng.choice(['get', 'set', 'find'])}",
                                             "description": _text(rng, 1, 8), "parameters": params}}


def _content(rng, parts_ok):
    if parts_ok and rng.random() < 0.25:
        parts = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.15: parts.append({"type": "image"})
            elif r < 0.25: parts.append({"type": "video", "video": "v.mp4"})
            else: parts.append({"type": "text", "text": _text(rng, 0, 6)})
        return parts
    return _text(rng, 0, 10)


def _conversation(rng, q35):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": _content(rng, False)})
    tools = [_tool(rng, i) for i in range(rng.randint(1, 3))] if rng.random() < 0.5 else None
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": _content(rng, q35)})
        if rng.random() < 0.8 or turn < 1:
            a = {"role": "assistant", "content": _text(rng, 0, 8)}
            r = rng.random()
            if r < 0.35: a["reasoning_content"] = _text(rng, 0, 6)
            elif r < 0.55: a["content"] = "<think>\n" + _text(rng, 0, 5) + "\n</think>\n\n" + a["content"]
            if rng.random() < 0.4:
                calls = []
                for _ in range(rng.randint(1, 3)):
                    args = {f"a{j}": _json_value(rng) for j in range(rng.randint(0, 4))}
                    fn = {"name": f"tool_{rng.randint(0, 2)}_get", "arguments": args}
                    calls.append({"type": "function", "function": fn} if rng.random() < 0.8 else fn)
                a["tool_calls"] = calls
                if rng.random() < 0.3: a["content"] = ""
                msgs.append(a)
                for _ in range(len(calls) if rng.random() < 0.8 else 1):
                    msgs.append({"role": "tool", "content": _text(rng, 0, 6)})
                if rng.random() < 0.5:
                    msgs.append({"role": "assistant", "content": _text(rng, 1, 6)})
            else:
                msgs.append(a)
    if rng.random() < 0.3 and msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": _text(rng, 1, 4)})
    kwargs = {}
    r = rng.random()
    if r < 0.35: kwargs["enable_thinking"] = False
    elif r < 0.7: kwargs["enable_thinking"] = True
    if q35 and rng.random() < 0.2: kwargs["add_vision_id"] = True
    return msgs, tools, rng.random() < 0.75, kwargs


def _compare(tmp_path, tokdir, template_path, rng_seed, n):
    name, fn = _oracle(tokdir)
    print(f"oracle: {name}", file=sys.stderr)
    template = open(template_path).read() if template_path else None
    q35_style = template_path is not None or tokdir != TOKDIR  # templates that accept content parts
    rng = random.Random(rng_seed)
    for k in range(n):
        msgs, tools, agp, kwargs = _conversation(rng, q35_style)
        try:
            want, want_err = fn(msgs, tools, template, agp, kwargs), None
        except Exception as exc:
            want, want_err = None, exc
        req = {"messages": msgs, "add_generation_prompt": agp, "chat_template_kwargs": kwargs}
        if tools is not None:
            req["tools"] = tools
        r = render(tmp_path, req, template_path, tokdir=tokdir)
        ctx = (f"seed {rng_seed} case {k} (tokenizer {tokdir}, template {template_path or 'its own'}, oracle: {name})\n"
               f"request: {json.dumps(req, ensure_ascii=False)}")
        if want_err is not None:
            assert r.returncode == 2, f"{ctx}\noracle raised {want_err!r} but laststand printed {r.stdout!r}"
            if type(want_err).__name__ == "TemplateError":  # raise_exception: the message verbatim
                assert r.stderr == f"laststand: error: {want_err}\n", ctx
            continue
        assert r.returncode == 0, f"{ctx}\nlaststand failed: {r.stderr}"
        assert r.stdout == want, f"{ctx}\nwant {want!r}\ngot  {r.stdout!r}"


@pytest.mark.parametrize("template", ["qwen3", "qwen3.5", "demo"])
def test_random_conversations_match_oracle(template, shared_dir, ls_bin, tmp_path, request):
    seed = int.from_bytes(os.urandom(4), "little")
    if template == "demo":  # the demo model's own template, found in its folder (chat_template.jinja)
        _compare(tmp_path, request.getfixturevalue("demo_model"), None, seed, 100)
    else:
        _compare(tmp_path, TOKDIR, Q35_TEMPLATE if template == "qwen3.5" else None, seed, 150)
