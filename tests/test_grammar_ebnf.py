"""EBNF / GBNF grammars in constrained decoding (SGLang's `ebnf`), against
`lark` (an Earley parser from PyPI, any context-free grammar) as the oracle.

Each case is one grammar written twice: in the EBNF the server takes and in
lark's syntax. Random strings go through `laststand grammar --ebnf F
--check-file`: a string is accepted exactly when lark parses it, and every
prefix of an accepted string is still viable; the token mask after a prefix
equals brute force over every token's bytes. End to end, the demo model's
output under `ebnf` (chat, completions, /generate) parses with lark, and a
bad grammar is a 400 naming the line and column."""
import json
import os
import random
import subprocess
import tempfile

import pytest

lark = pytest.importorskip("lark")
openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")

from conftest import BIN  # noqa: E402
from e2e_util import Server  # noqa: E402
from test_grammar_json import hf_token_bytes  # noqa: E402

MODEL = "demo"

CASES = [
    (  # JSON-like pairs, comments, classes with counts
        r'''root   ::= "{" ws pair (ws "," ws pair)* ws "}"    # a comment
pair   ::= key ws ":" ws [0-9]+
key    ::= "\"" [a-z_]{1,4} "\""
ws     ::= [ \t]*
''',
        r'''start: "{" ws pair (ws "," ws pair)* ws "}"
pair: key ws ":" ws DIGIT+
key: "\"" LOW ~ 1..4 "\""
ws: WSC*
DIGIT: /[0-9]/
LOW: /[a-z_]/
WSC: /[ \t]/
''',
        ['{"ab":12}', '{ "a" : 1 , "b_":22 }'], list('{}":, ab_z019\t') + ['"a"', '"b"']),
    (  # recursion: arithmetic without left recursion
        r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
''',
        r'''start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: DIGIT+ | "(" expr ")" | "-" factor
DIGIT: /[0-9]/
''',
        ["1+2*3", "-(4-5)/6", "((7))"], list("0123456789+-*/()")),
    (  # nested lists, bounded repetition of a group, UTF-8 literals, single quotes
        r'''root ::= list
list ::= "[" (item ("," item){0,2})? "]"
item ::= list | "é"+ | 'x' | "\u00fc"
''',
        r'''start: list
list: "[" (item ("," item) ~ 0..2)? "]"
item: list | E+ | "x" | "ü"
E: "é"
''',
        ["[]", "[x,[ü],ééé]", "[[[]]]"], ["[", "]", ",", "x", "é", "ü", "y"]),
    (  # '.' is any character; mutual recursion; an empty alternative
        r'''root ::= a "!" .
a ::= "x" b |
b ::= "y" a
''',
        r'''start: a "!" ANY
a: ("x" b)?
b: "y" a
ANY: /./s
''',
        ["!\n", "xy!a", "xyxy!é"], ["x", "y", "!", "a", "\n", "é"]),
]


def run(args, lines=None, prefix=b"", tmp=None):
    pp = os.path.join(tmp, "p.bin")
    with open(pp, "wb") as f:
        f.write(prefix)
    extra = []
    if lines is not None:
        cp = os.path.join(tmp, "c.txt")
        with open(cp, "w") as f:
            f.write("\n".join(x.hex() for x in lines) + "\n")
        extra = ["--check-file", cp]
    else:
        extra = ["--mask"]
    c = subprocess.run([BIN, "grammar", *args, "--prefix-file", pp, *extra], capture_output=True, text=True,
                       timeout=300)
    assert c.returncode == 0, c.stderr
    return json.loads(c.stdout)


def parses(parser, s):
    try:
        parser.parse(s)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize("k", range(len(CASES)))
def test_accepts_exactly_what_lark_parses(demo_model, k):
    ebnf, lark_text, positives, alphabet = CASES[k]
    parser = lark.Lark(lark_text, parser="earley", lexer="dynamic_complete")
    rng = random.Random(k)
    with tempfile.TemporaryDirectory() as tmp:
        gp = os.path.join(tmp, "g.ebnf")
        with open(gp, "w") as f:
            f.write(ebnf)
        args = ["--tokenizer-path", demo_model, "--ebnf", gp]
        samples = list(positives)
        for p in positives:
            assert parses(parser, p), (k, p)
            for _ in range(20):  # near misses
                i = rng.randint(0, len(p))
                samples.append(p[:i] + rng.choice(alphabet) + p[i + 1:])
        samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9))) for _ in range(400)]
        out = run(args, [s.encode() for s in samples], tmp=tmp)
        good = []
        for s, o, a in zip(samples, out["ok"], out["accept"]):
            want = parses(parser, s)
            assert bool(a) == want, (k, s, a)
            if want:
                good.append(s.encode())
        prefixes = sorted({g[:n] for g in good for n in range(len(g) + 1)})
        assert all(run(args, prefixes, tmp=tmp)["ok"]), k
        # the mask after a viable prefix equals brute force over the token bytes
        tb = hf_token_bytes(os.path.join(demo_model, "tokenizer.json"))
        ids = [i for i, b in enumerate(tb) if b]
        for pre in rng.sample(prefixes, min(2, len(prefixes))):
            mask = run(args, prefix=pre, tmp=tmp)
            ok = run(args, [tb[i] for i in ids], prefix=pre, tmp=tmp)["ok"]
            allowed = set(mask["allowed"])
            eos = {i for i in allowed if i >= len(tb) or not tb[i]}
            brute = {i for i, o in zip(ids, ok) if o}
            assert not ((allowed - eos) ^ brute), (k, pre)
            try:
                whole = parses(parser, pre.decode())
            except UnicodeDecodeError:
                whole = False
            assert mask["accepting"] == whole, (k, pre)


@pytest.mark.parametrize("text,words", [
    ('root ::= root "a" | "b"\n', "line 1: rule 'root' is left-recursive"),
    ('root ::= a\na ::= "x"? root\n', "is left-recursive"),
    ('root ::= x\n', "line 1, column 10: rule 'x' is not defined"),
    ('a ::= "x"\n', "no rule named root"),
    ('root ::= "a\n', "unterminated string"),
    ('root ::= ("a"\n', "expected ')'"),
    ('root ::= "a" {2}\n', "unexpected '{'"),
    ('root ::= [a-\n', "unterminated character class"),
    ('root ::= "\\q"\n', "unknown escape"),
    ('root ::= "a"\nroot ::= "b"\n', "defined twice"),
    ('"a"\n', "expected a rule"),
])
def test_bad_grammars_name_the_place(demo_model, text, words):
    with tempfile.TemporaryDirectory() as tmp:
        gp = os.path.join(tmp, "g.ebnf")
        with open(gp, "w") as f:
            f.write(text)
        c = subprocess.run([BIN, "grammar", "--tokenizer-path", demo_model, "--ebnf", gp, "--mask"],
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


def test_ebnf_request_field_constrains_the_output(srv, client):
    ebnf, lark_text = CASES[1][0], CASES[1][1]
    parser = lark.Lark(lark_text, parser="earley", lexer="dynamic_complete")
    small = ebnf.replace("[0-9]+", "[0-9]{1,3}")  # keep the noise model's numbers short
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "An expression"}], max_tokens=60, seed=seed,
            temperature=1.0, extra_body={"ebnf": small, "chat_template_kwargs": {"enable_thinking": False}})
        out = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert parses(parser, out), out
        c = client.completions.create(model=MODEL, prompt="2+", max_tokens=60, seed=seed, temperature=1.0,
                                      extra_body={"ebnf": small})
        if c.choices[0].finish_reason == "stop":
            assert parses(parser, c.choices[0].text), c.choices[0].text
    status, data = srv.post("/generate", {"text": "2+", "sampling_params": {"ebnf": 'root ::= "yes" | "no"',
                                                                             "max_new_tokens": 10}})
    assert status == 200 and json.loads(data)["text"] in ("yes", "no"), data
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       extra_body={"ebnf": 'root ::= x'})
    assert e.value.body["param"] == "ebnf" and "ebnf: line 1, column 10: rule 'x' is not defined" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       extra_body={"ebnf": 'root ::= "a"', "regex": "a"})
    assert "cannot be combined" in e.value.body["message"]
