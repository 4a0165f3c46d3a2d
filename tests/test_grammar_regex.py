"""Regular expressions in constrained decoding (SGLang's `regex`, JSON Schema's
`pattern`), against Python's `re` and `jsonschema` as the oracles.

1. Differential on bytes: for a set of patterns in the dialect gr_regex.c takes
   (the subset ECMA-262 and Python's re share, ASCII classes), random strings
   are fed through `laststand grammar --regex P --check-file`; a string is
   accepted exactly when `re.fullmatch(P, s, re.ASCII)` matches, and every
   prefix of a matching string is still a viable prefix.
2. Differential on tokens: the token mask after a prefix equals brute force
   over every token's bytes (HF `tokenizers`), EOS exactly when re accepts.
3. End to end on the demo model (noise unless constrained): chat `regex`,
   /generate `sampling_params.regex` and a JSON schema with `pattern`
   properties; outputs checked with re.fullmatch and jsonschema.validate.
4. What the dialect refuses is a 400 naming the field and the offset."""
import json
import os
import random
import re
import subprocess
import tempfile

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("tokenizers")

from conftest import BIN  # noqa: E402
from e2e_util import Server  # noqa: E402
from test_grammar_json import hf_token_bytes  # noqa: E402

MODEL = "demo"

# pattern -> strings it must match (Python's re agrees, checked below)
PATTERNS = {
    r"[a-z]+[0-9]?": ["abc", "z9"],
    r"\d{3}-\d{4}": ["555-1234"],
    r"(ab|cd)*e": ["e", "abcde", "cdcde"],
    r"a{2,4}b?": ["aa", "aaaab"],
    r"[^abc]+": ["xyz", "d-e"],
    r"(?:x|yz){1,3}": ["x", "yzxyz"],
    r"\w+@\w+\.(com|org)": ["me@host.com", "a_1@b.org"],
    r"[A-Z][a-z]*( [A-Z][a-z]*)*": ["Ada", "Ada Lovelace"],
    r"-?\d+(\.\d+)?": ["0", "-12.50"],
    r"\s*\S+\s*": [" x ", "ab"],
    r"(?P<y>\d{4})-(?P<m>0[1-9]|1[0-2])": ["2026-12", "1999-01"],
    r"é+ü?": ["é", "ééü"],
    r"[à-ÿ]{2}": ["àÿ", "éè"],
    r"a.c": ["abc", "a c", "aéc"],
    r"\.\*\+": [".*+"],
    r"[\d\-x]+": ["1-x"],
    r"colou?r": ["color", "colour"],
    r"(a|)b": ["b", "ab"],
    r"a{0}b": ["b"],
    r"x{2,}": ["xx", "xxxx"],
    r"[a-c]*?d": ["d", "abcd"],
}
ALPHABET = list("abcdexyz019-.@ _*+AZLéüàÿè\t") + ["com", "org", "ab", "cd", "yz", "ou", "12", "x"]


def check(pattern, strings, tmp, prefix=b""):
    cp, pp = os.path.join(tmp, "c.txt"), os.path.join(tmp, "p.bin")
    with open(cp, "w") as f:
        f.write("\n".join(s.hex() for s in strings) + "\n")
    with open(pp, "wb") as f:
        f.write(prefix)
    c = subprocess.run([BIN, "grammar", "--tokenizer-path", TOK_DIR, "--regex", pattern, "--prefix-file", pp,
                        "--check-file", cp], capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    out = json.loads(c.stdout)
    return out["ok"], out["accept"]


@pytest.fixture(scope="module", autouse=True)
def _tok_dir(demo_model):
    global TOK_DIR
    TOK_DIR = demo_model


def test_accepts_exactly_what_python_re_fullmatches():
    rng = random.Random(20261203)
    with tempfile.TemporaryDirectory() as tmp:
        for pat, positives in PATTERNS.items():
            rx = re.compile(pat, re.ASCII)
            for p in positives:
                assert rx.fullmatch(p), (pat, p)
            samples = list(positives)
            for _ in range(400):
                samples.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 7))))
            for p in positives:  # near misses: one edit of a match
                for _ in range(10):
                    i = rng.randint(0, len(p))
                    samples.append(p[:i] + rng.choice(ALPHABET) + p[i + 1:])
            data = [s.encode() for s in samples]
            ok, acc = check(pat, data, tmp)
            for s, o, a in zip(samples, ok, acc):
                want = bool(rx.fullmatch(s))
                assert bool(a) == want, (pat, s, a)
                assert o or not a, (pat, s)
            # every prefix of a match can still become one
            prefixes = sorted({s.encode()[:k] for s in samples if rx.fullmatch(s) for k in range(len(s.encode()) + 1)})
            ok, _ = check(pat, prefixes, tmp)
            assert all(ok), (pat, [p for p, o in zip(prefixes, ok) if not o][:5])


def test_masks_equal_brute_force_over_token_bytes(demo_model):
    tb = hf_token_bytes(os.path.join(demo_model, "tokenizer.json"))
    ids = [i for i, b in enumerate(tb) if b]
    cases = [(r"\d{3}-\d{4}", b"55"), (r"[a-z]+[0-9]?", b"ab"), (r"\w+@\w+\.(com|org)", b"me@ho"),
             (r"[A-Z][a-z]*( [A-Z][a-z]*)*", b"Ada"), (r"(ab|cd)*e", b""), (r"é+ü?", b"\xc3")]
    with tempfile.TemporaryDirectory() as tmp:
        for pat, prefix in cases:
            pp = os.path.join(tmp, "p.bin")
            with open(pp, "wb") as f:
                f.write(prefix)
            m = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--regex", pat, "--prefix-file", pp,
                                "--mask"], capture_output=True, text=True, timeout=120)
            assert m.returncode == 0, m.stderr
            mask = json.loads(m.stdout)
            ok, _ = check(pat, [tb[i] for i in ids], tmp, prefix)
            allowed = set(mask["allowed"])
            eos = {i for i in allowed if i >= len(tb) or not tb[i]}
            brute = {i for i, o in zip(ids, ok) if o}
            diff = (allowed - eos) ^ brute
            assert not diff, (pat, prefix, sorted(diff)[:10], [tb[i] for i in sorted(diff)[:10]])
            try:
                whole = bool(re.fullmatch(pat, prefix.decode(), re.ASCII))
            except UnicodeDecodeError:
                whole = False
            assert mask["accepting"] == whole and bool(eos) == whole, (pat, prefix)


@pytest.mark.parametrize("pat,words", [
    (r"a(?=b)", "'(?' at offset 2 is not supported"),
    (r"\bword", "'\\b' at offset 1 is not supported"),
    (r"(a)\1", "'\\1' at offset 4 is not supported"),
    (r"[a-", "unterminated ["),
    (r"a^b", "anchors are supported only at the start and end"),
    (r"a{3,2}", "m < n"),
    (r"(ab", "missing ')'"),
    (r"ab)", "unbalanced ')'"),
    (r"*a", "nothing to repeat"),
    (r"a++", "possessive"),
    (r"(?i)abc", "'(?' at offset 1"),
])
def test_refusals_name_the_construct(demo_model, pat, words):
    c = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--regex", pat, "--mask"],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 2 and words in c.stderr, c.stderr


# ---- end to end -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(ls_bin, demo_model):
    with Server(ls_bin, demo_model, "--served-model-name", MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)


def _metric(srv, name):
    for line in srv.get("/metrics")[1].decode().splitlines():
        if line.startswith(f"laststand:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_regex_request_field_constrains_chat_and_generate(srv, client):
    pat = r"(\d{3})-\d{4}|[A-Z][a-z]{1,6}"
    hits0, compiles0 = _metric(srv, "grammar_cache_hits_total"), _metric(srv, "grammar_compiles_total")
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A phone number or a name?"}], max_tokens=40,
            seed=seed, temperature=1.0, extra_body={"regex": pat, "chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].finish_reason == "stop", r
        assert re.fullmatch(pat, r.choices[0].message.content, re.ASCII), r.choices[0].message.content
        c = client.completions.create(model=MODEL, prompt="Call", max_tokens=40, seed=seed, temperature=1.0,
                                      extra_body={"regex": pat})
        assert re.fullmatch(pat, c.choices[0].text, re.ASCII), c.choices[0].text
    status, data = srv.post("/generate", {"text": "Call", "sampling_params": {"regex": pat, "max_new_tokens": 40,
                                                                               "temperature": 1.0}})
    assert status == 200, data
    assert re.fullmatch(pat, json.loads(data)["text"], re.ASCII)
    # one compile; the other eight requests reuse the grammar (and its warm masks)
    assert _metric(srv, "grammar_compiles_total") - compiles0 == 1
    assert _metric(srv, "grammar_cache_hits_total") - hits0 == 8


def test_json_schema_pattern_properties_validate(client):
    schema = {"type": "object", "additionalProperties": False, "required": ["date", "code", "tag"],
              "properties": {"date": {"type": "string", "pattern": r"^\d{4}-(0[1-9]|1[0-2])-\d{2}$"},
                             "code": {"type": "string", "pattern": r"^[A-Z]{2}\d{3}$"},
                             "tag": {"type": "string", "pattern": "ab", "maxLength": 6}}}
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Fill it in"}], max_tokens=400, seed=seed,
            temperature=1.0, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        doc = json.loads(r.choices[0].message.content)
        jsonschema.validate(doc, schema)  # re.search semantics, as JSON Schema says
        assert len(doc["tag"]) <= 6 and "ab" in doc["tag"]


def test_bad_patterns_are_400s_naming_the_path(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       extra_body={"regex": "(?<=a)b"})
    assert e.value.body["param"] == "regex" and "regex: '(?' at offset 1" in e.value.body["message"]
    schema = {"type": "object", "properties": {"d": {"type": "string", "pattern": r"\p{L}+"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": schema}})
    assert "response_format.json_schema.schema.properties.d.pattern: '\\p' at offset 1" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # needs a quote, which the unescaped form cannot write
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "string", "pattern": '^"$'}}})
    assert "no JSON string without escapes matches it" in e.value.body["message"]


def test_schema_pattern_with_length_bounds(demo_model):
    """A string schema with pattern + minLength / maxLength: accepted exactly when
    json + jsonschema accept the document; every prefix of an accepted one stays
    viable, so decoding never walks into a dead end; the token mask equals brute force."""
    rng = random.Random(7)
    schemas = [({"type": "string", "pattern": "^[a-c]*x$", "minLength": 3, "maxLength": 5}, ["abx", "ccccx"]),
               ({"type": "string", "pattern": "b", "maxLength": 4}, ["b", "bxaé"]),
               ({"type": "string", "pattern": "^(ab|c)+$", "minLength": 4}, ["abab", "cabc", "ccccc"]),
               ({"type": "string", "pattern": "^é[a-z]{0,3}$", "minLength": 2, "maxLength": 3}, ["éa", "éxy"])]
    tb = hf_token_bytes(os.path.join(demo_model, "tokenizer.json"))
    ids = [i for i, b in enumerate(tb) if b]
    with tempfile.TemporaryDirectory() as tmp:
        for sc, known in schemas:
            sp, cp = os.path.join(tmp, "s.json"), os.path.join(tmp, "c.txt")
            with open(sp, "w") as f:
                json.dump(sc, f)
            docs = ['"' + "".join(rng.choice("abcxé") for _ in range(rng.randint(0, 7))) + '"' for _ in range(600)]
            docs += ['"' + k + '"' for k in known]
            data = [d.encode() for d in docs]

            def run(lines, prefix=b""):
                pp = os.path.join(tmp, "p.bin")
                with open(pp, "wb") as f:
                    f.write(prefix)
                with open(cp, "w") as f:
                    f.write("\n".join(x.hex() for x in lines) + "\n")
                c = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--schema", sp, "--prefix-file", pp,
                                    "--check-file", cp], capture_output=True, text=True, timeout=300)
                assert c.returncode == 0, c.stderr
                return json.loads(c.stdout)

            out = run(data)
            good = []
            for d, a in zip(docs, out["accept"]):
                try:
                    jsonschema.validate(json.loads(d), sc)
                    want = True
                except jsonschema.ValidationError:
                    want = False
                assert bool(a) == want, (sc, d)
                if want:
                    good.append(d.encode())
            assert len(good) >= len(known), sc
            prefixes = sorted({g[:k] for g in good for k in range(len(g) + 1)})
            assert all(run(prefixes)["ok"]), sc
            # the mask after a viable prefix equals brute force over the token bytes
            pre = rng.choice(prefixes)
            with open(os.path.join(tmp, "p.bin"), "wb") as f:
                f.write(pre)
            m = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--schema", sp, "--prefix-file",
                                os.path.join(tmp, "p.bin"), "--mask"], capture_output=True, text=True, timeout=120)
            assert m.returncode == 0, m.stderr
            allowed = set(json.loads(m.stdout)["allowed"])
            ok = run([tb[i] for i in ids], pre)["ok"]
            brute = {i for i, o in zip(ids, ok) if o}
            eos = {i for i in allowed if i >= len(tb) or not tb[i]}
            assert not ((allowed - eos) ^ brute), (sc, pre)
    # bounds no match can meet are refused when the schema compiles
    with tempfile.TemporaryDirectory() as tmp:
        sp = os.path.join(tmp, "s.json")
        with open(sp, "w") as f:
            json.dump({"type": "string", "pattern": "^ab$", "minLength": 3}, f)
        c = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--schema", sp, "--mask"],
                           capture_output=True, text=True, timeout=60)
        assert c.returncode == 2 and "schema.pattern: no match has a length within minLength / maxLength" in c.stderr


# ---- string formats ----------------------------------------------------------------------------

def _ok_pydantic(tp, s):
    pyd = pytest.importorskip("pydantic")
    try:
        pyd.TypeAdapter(tp).validate_json(json.dumps(s), strict=True)
        return True
    except pyd.ValidationError:
        return False


def test_string_formats_against_pydantic(demo_model):
    """format date / time / date-time / uuid / ipv4: whatever the automaton accepts, pydantic
    (strict JSON, the client's own parser) accepts too; the values Python writes for random
    dates, times, UUIDs and addresses are all accepted (leap years and month lengths included)."""
    import datetime as dt
    import ipaddress
    import uuid
    rng = random.Random(11)

    def rand_dt():
        d = dt.datetime(rng.randint(1, 9999), 1, 1) + dt.timedelta(days=rng.randint(0, 364),
                                                                     seconds=rng.randint(0, 86399))
        if rng.random() < 0.5:
            d = d.replace(microsecond=rng.randint(0, 999999))
        return d.replace(tzinfo=dt.timezone(dt.timedelta(minutes=rng.choice([0, 60, -330, 840]))))

    def tz_text(d):
        s = d.isoformat()
        return s[:-6] + "Z" if s.endswith("+00:00") and rng.random() < 0.5 else s

    leap = [f"{y:04d}-02-29" for y in (4, 400, 1600, 2000, 2024, 9996)]
    kinds = {
        "date": (dt.date, [rand_dt().date().isoformat() for _ in range(60)] + leap),
        "time": (dt.time, [tz_text(rand_dt()).split("T")[1] for _ in range(60)]),
        "date-time": (dt.datetime, [tz_text(rand_dt()) for _ in range(60)]),
        "uuid": (uuid.UUID, [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(30)] +
                 [str(uuid.uuid4()).upper()]),
        "ipv4": (ipaddress.IPv4Address, [str(ipaddress.IPv4Address(rng.getrandbits(32))) for _ in range(60)]),
    }
    alphabet = list("0123456789-:T.Z+zabcdefF ") + ["02-29", "25", "256", "60", ":60"]
    with tempfile.TemporaryDirectory() as tmp:
        sp, cp = os.path.join(tmp, "s.json"), os.path.join(tmp, "c.txt")
        for fmt, (tp, valid) in kinds.items():
            with open(sp, "w") as f:
                json.dump({"type": "string", "format": fmt}, f)
            cands = list(valid)
            for v in valid:  # near misses: one edit
                for _ in range(4):
                    i = rng.randint(0, len(v))
                    cands.append(v[:i] + rng.choice(alphabet) + v[i + 1:])
            cands += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(200)]
            with open(cp, "w") as f:
                f.write("\n".join(json.dumps(x).encode().hex() for x in cands) + "\n")
            c = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--schema", sp, "--check-file", cp],
                               capture_output=True, text=True, timeout=300)
            assert c.returncode == 0, c.stderr
            acc = json.loads(c.stdout)["accept"]
            for x, a in zip(cands, acc):
                if a:
                    assert _ok_pydantic(tp, x), (fmt, x)  # sound: never a value the client rejects
            for x, a in zip(valid, acc):
                assert a, (fmt, x)                       # complete on what Python itself writes
            assert any(not a and _ok_pydantic(tp, x) is False for x, a in zip(cands, acc)), fmt


def test_pydantic_model_with_formats_end_to_end(client):
    """The workflow: a pydantic model's own JSON schema as response_format; the demo model's
    constrained output must validate as that model."""
    pyd = pytest.importorskip("pydantic")
    import datetime as dt
    import ipaddress
    import uuid

    class Booking(pyd.BaseModel):
        day: dt.date
        at: dt.datetime
        ref: uuid.UUID
        host: ipaddress.IPv4Address
        email: str = pyd.Field(max_length=24, json_schema_extra={"format": "email"})

    schema = Booking.model_json_schema()
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Book it"}], max_tokens=1200, seed=seed,
            temperature=1.0, response_format={"type": "json_schema",
                                              "json_schema": {"name": "b", "schema": schema, "strict": True}},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].finish_reason == "stop", r
        b = Booking.model_validate_json(r.choices[0].message.content)
        assert "@" in b.email and b.at.tzinfo is not None
