"""Constrained decoding (response_format json_schema / json_object, tool_choice
required / named, logit_bias) on the CPU.

1. Differential: for random schemas and random byte prefixes of documents in the
   grammar's output form, the token mask that `laststand grammar --mask` computes
   (vocabulary trie, cached string states) equals brute force: every token's bytes,
   taken from HF `tokenizers` (the oracle for what a token is), appended to the
   prefix and run through the automaton (`--check-file`); EOS is allowed exactly
   when Python's json + jsonschema accept the prefix as a complete document.
2. End to end through the official OpenAI SDK on the demo model (random weights:
   noise unless constrained): outputs parse and validate with json + jsonschema,
   streaming too; tool calls come back as message.tool_calls; logit_bias bans and
   forces; bad schemas are 400s naming the JSON path; /generate's json_schema."""
import json
import os
import random
import re
import subprocess
import tempfile

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
tokenizers = pytest.importorskip("tokenizers")

import grammar_cases as gc  # noqa: E402
from conftest import BIN  # noqa: E402
from e2e_util import Server  # noqa: E402

MODEL = "demo"


# ---- token bytes from HF tokenizers -------------------------------------------------------------

def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def hf_token_bytes(path):
    """[bytes or None (special: never allowed)] per id, as HF's ByteLevel decoder sees each token."""
    tk = tokenizers.Tokenizer.from_file(path)
    inv = _bytes_to_unicode()
    added = tk.get_added_tokens_decoder()
    n = max(tk.get_vocab(with_added_tokens=True).values()) + 1
    out = []
    for i in range(n):
        if i in added:
            out.append(None if added[i].special else added[i].content.encode())
            continue
        t = tk.id_to_token(i)
        if t is None:
            out.append(None)
        elif all(ch in inv for ch in t):
            out.append(bytes(inv[ch] for ch in t))
        else:
            out.append(t.encode())
    return out


# ---- random schemas and documents in the grammar's output form -------------------------------------

CHARS = "abcxyz XYZ019_-.,:;!?\"\\/\n\té€ñ中文"


def rand_schema(rng, depth=0):
    k = rng.choice(["string", "integer", "number", "boolean", "enum", "array", "object", "nullable"]
                   if depth < 2 else ["string", "integer", "boolean", "enum"])
    if k == "string":
        s = {"type": "string"}
        if rng.random() < 0.6:
            s["maxLength"] = rng.randint(1, 12)
        return s
    if k in ("integer", "number", "boolean"):
        return {"type": k}
    if k == "enum":
        return {"enum": rng.sample(["red", "grün", "a b", 3, None, True], rng.randint(1, 4))}
    if k == "nullable":
        return {"type": ["string", "null"], "maxLength": 5}
    if k == "array":
        return {"type": "array", "items": rand_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    props = {f"p{i}_{rng.choice(['k', 'é', 'x'])}": rand_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
    req = [p for p in props if rng.random() < 0.6]
    return {"type": "object", "properties": props, "required": req, "additionalProperties": False}


def ws(rng):
    return rng.choice(["", "", " ", "\n", "\n  ", "\t"])


def rand_doc(rng, s):
    """JSON text for schema s in the automaton's form: schema property order, compact enum
    literals, whitespace runs of at most 4 bytes."""
    t = s.get("type")
    if "enum" in s:
        return json.dumps(rng.choice(s["enum"]), ensure_ascii=False, separators=(",", ":"))
    if t == ["string", "null"]:
        return "null" if rng.random() < 0.3 else rand_doc(rng, {"type": "string", "maxLength": 5})
    if t == "string":
        n = rng.randint(0, s.get("maxLength", 10))
        return json.dumps("".join(rng.choice(CHARS) for _ in range(n)), ensure_ascii=rng.random() < 0.3)
    if t == "integer":
        return str(rng.randint(-99999, 99999))
    if t == "number":
        return rng.choice(["0", "-1.5", "3.25e-3", "12E+2", "7"])
    if t == "boolean":
        return rng.choice(["true", "false"])
    if t == "array":
        items = [rand_doc(rng, s["items"]) for _ in range(rng.randint(0, s["maxItems"]))]
        return "[" + ws(rng) + ("," + ws(rng)).join(items) + ws(rng) + "]"
    members = []
    for k, v in s["properties"].items():
        if k in s["required"] or rng.random() < 0.5:
            members.append(json.dumps(k, ensure_ascii=False) + ws(rng) + ":" + ws(rng) + rand_doc(rng, v))
    return "{" + ws(rng) + ("," + ws(rng)).join(members) + ws(rng) + "}"


def complete_and_valid(prefix, schema):
    try:
        doc = json.loads(prefix.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True


def mask_vs_brute_force(tok_dir, tok_bytes, schema, prefix, tmp):
    sp, pp, cp = (os.path.join(tmp, n) for n in ("s.json", "p.bin", "c.txt"))
    with open(sp, "w") as f:
        json.dump(schema, f)
    with open(pp, "wb") as f:
        f.write(prefix)
    ids = [i for i, b in enumerate(tok_bytes) if b]
    with open(cp, "w") as f:
        f.write("\n".join(tok_bytes[i].hex() for i in ids) + "\n")
    base = [BIN, "grammar", "--tokenizer-path", tok_dir, "--schema", sp, "--strict", "--prefix-file", pp]
    m = subprocess.run(base + ["--mask"], capture_output=True, text=True, timeout=120)
    assert m.returncode == 0, m.stderr
    c = subprocess.run(base + ["--check-file", cp], capture_output=True, text=True, timeout=600)
    assert c.returncode == 0, c.stderr
    mask = json.loads(m.stdout)
    ok = json.loads(c.stdout)["ok"]
    allowed = set(mask["allowed"])
    brute = {i for i, o in zip(ids, ok) if o}
    eos = {i for i in allowed if i >= len(tok_bytes) or not tok_bytes[i]}
    diff = (allowed - eos) ^ brute
    assert not diff, (schema, prefix, sorted(diff)[:20], [tok_bytes[i] for i in sorted(diff)[:20]])
    want_eos = complete_and_valid(prefix, schema)
    assert mask["accepting"] == want_eos, (schema, prefix, mask["accepting"])
    assert bool(eos) == (want_eos or not brute), (schema, prefix, eos)
    return mask["cached"]


def _tok_dirs(demo_model):
    dirs = [("demo", demo_model)]
    q3 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "tokenizers", "qwen3")
    if os.path.exists(os.path.join(q3, "tokenizer.json")):
        dirs.append(("qwen3", q3))
    return dirs


def test_masks_equal_brute_force_over_hf_token_bytes(demo_model):
    rng = random.Random(20261130)
    with tempfile.TemporaryDirectory() as tmp:
        for name, d in _tok_dirs(demo_model):
            tb = hf_token_bytes(os.path.join(d, "tokenizer.json"))
            n_cached = 0
            cases = 14 if name == "demo" else 6
            for k in range(cases):
                schema = rand_schema(rng)
                if schema.get("type") != "object":
                    schema = {"type": "object", "properties": {"v": schema}, "required": ["v"],
                              "additionalProperties": False}
                if k % 3 == 2:  # a free string for the cut below to land in
                    schema["properties"]["s"] = {"type": "string", "maxLength": rng.choice([6, 40])}
                    schema["required"].append("s")
                doc = (ws(rng) + rand_doc(rng, schema)).encode()
                # just inside a string value (after ':' or in an array), not a key
                quotes = [m.end() for m in re.finditer(rb'[:\[][ \n\t]*"', doc)]
                # a third complete, a third anywhere, a third just inside a string (the cached states)
                cut = [len(doc), rng.randint(0, len(doc)),
                       min(len(doc), rng.choice(quotes or [0]) + rng.randint(0, 2))][k % 3]
                n_cached += mask_vs_brute_force(d, tb, schema, doc[:cut], tmp)
            assert n_cached >= 2, (name, n_cached)


# ---- end to end on the demo model ------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(ls_bin, demo_model):
    with Server(ls_bin, demo_model, "--served-model-name", MODEL, "--reasoning-parser", "qwen3",
                "--tool-call-parser", "qwen3_coder", env={"LASTSTAND_TEST_FORCE_IDS": "1"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)


def test_json_schema_outputs_validate(client):
    gc.check_json_schema_outputs_validate(client, MODEL)


def test_json_schema_streaming_validates(client):
    gc.check_json_schema_streaming(client, MODEL)


def test_json_schema_on_completions_and_generate(srv, client):
    r = client.completions.create(model=MODEL, prompt="{", max_tokens=400, temperature=1.0, seed=5,
                                  extra_body={"response_format": gc.rf_schema(gc.PERSON)})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), gc.PERSON)
    status, out = srv.post_json("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 400, "temperature": 1.0, "seed": 6, "json_schema": json.dumps(gc.PERSON)}})
    assert status == 200, out
    jsonschema.validate(json.loads(out["text"]), gc.PERSON)
    status, out = srv.post_json("/generate", {"text": "x", "sampling_params": {"json_schema": "{not json"}})
    assert status == 400 and "sampling_params.json_schema" in out["error"]["message"]


def test_stop_ids_only_where_the_grammar_accepts(srv, client):
    """A stop id that is an ordinary token (' ', allowed all over the document and never the
    only way on) ends the request only where the document is complete: every output still
    validates. (A stop id that is the only way on ends the request: a mask is never empty.)"""
    q = srv.tokenize(" ")[0]
    for seed in (31, 32, 33):
        r = gc.chat(client, MODEL, response_format=gc.rf_schema(gc.PERSON), max_tokens=400, temperature=1.0,
                    seed=seed, extra_body={**gc.NO_THINK, "stop_token_ids": [q]})
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), gc.PERSON)


def test_constraint_starts_after_reasoning(srv, client):
    """Thinking on: the prompt opens <think>; the forced reasoning ends with </think>,
    then the sampled answer is constrained."""
    ids = srv.tokenize("Let me think.\n</think>\n\n")
    r = gc.chat(client, MODEL, response_format=gc.rf_schema(gc.PERSON), max_tokens=400, temperature=1.0, seed=8,
                extra_body={"force_ids": ids, "chat_template_kwargs": {"enable_thinking": True}})
    c = r.choices[0]
    assert c.message.model_extra.get("reasoning_content") == "Let me think.\n"
    assert c.finish_reason == "stop", c.message.content
    jsonschema.validate(json.loads(c.message.content), gc.PERSON)


def test_json_object_with_logit_bias(srv, client):
    gc.check_json_object_with_bias(client, MODEL, srv.tokenize)


def test_tool_choice_required_and_named(client):
    gc.check_tool_choice_required_and_named(client, MODEL)


def test_tool_choice_required_streaming(client):
    gc.check_tool_choice_required_streaming(client, MODEL)


def test_logit_bias_bans_and_forces(srv, client):
    gc.check_logit_bias_bans_and_forces(client, MODEL, srv)


def test_bad_schemas_are_400_naming_the_path(client):
    gc.check_bad_schemas_are_400(client, MODEL)


def test_logprobs_are_of_the_masked_distribution(client):
    """Inside an enum only the enum's tokens are possible: the top logprobs list only
    allowed tokens and their probabilities sum to 1 (renormalised over the mask)."""
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "green", "blue"]}}, "required": ["c"],
              "additionalProperties": False}
    r = gc.chat(client, MODEL, response_format=gc.rf_schema(schema), max_tokens=60, temperature=1.0, seed=2,
                logprobs=True, top_logprobs=20, extra_body=gc.NO_THINK)
    c = r.choices[0]
    assert json.loads(c.message.content)["c"] in ("red", "green", "blue")
    first = c.logprobs.content[0]
    # the first token: "{" or whitespace: few allowed tokens, whose probabilities sum to ~1
    tot = sum(2.718281828459045 ** t.logprob for t in first.top_logprobs)
    assert len(first.top_logprobs) < 20 and abs(tot - 1) < 1e-3, (first.top_logprobs, tot)
