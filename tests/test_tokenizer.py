"""Tokenizer tests: laststand tokenize / detokenize against HF `tokenizers`.

Pins:
- every entry of ../shared/fixtures/tokenizer-qwen3/tokenize.json (ids, decoded text);
- ids and decoded text equal HF `tokenizers` on thousands of fresh random strings
  (mixed scripts, emoji, ZWJ sequences, combining marks, whitespace runs, digits,
  punctuation, embedded special-token strings) for the Qwen3 tokenizer, for the
  Qwen3 vocab with the Qwen3.5 pre-tokenizer regex (\\p{M}), and for a byte-level
  BPE trained here with the GPT-2 ByteLevel regex, a Lowercase+NFKC normalizer and
  added tokens using lstrip / rstrip / single_word / normalized;
- decode of random id sequences (arbitrary byte soup -> U+FFFD exactly as HF);
- round trip decode(encode(s)) == s on 10,000 random NFC strings;
- the streaming detokenizer's deltas concatenate to decode(ids) and each prefix
  of deltas is a prefix of the decoded text;
- CLI errors exit 2 and name the flag, file or JSON path.

Random tests are seeded from the time; the seed is printed (pytest -s, or in the
failure message) and TOK_TEST_SEED=N reproduces a run.
"""
import json
import os
import random
import subprocess
import tempfile
import time
import unicodedata

import pytest

from conftest import BIN, SHARED, run_ls

tokenizers = pytest.importorskip("tokenizers")

QWEN3 = os.path.join(SHARED, "tokenizers", "qwen3")
FIXTURE = os.path.join(SHARED, "fixtures", "tokenizer-qwen3", "tokenize.json")
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SEED = int(os.environ.get("TOK_TEST_SEED", str(int(time.time()))))
print(f"test_tokenizer: seed {SEED} (TOK_TEST_SEED={SEED} reproduces)")


def need_shared():
    if not os.path.isfile(os.path.join(QWEN3, "tokenizer.json")):
        pytest.skip("../shared/tokenizers/qwen3 is not beside the checkout")


# ---- random text ---------------------------------------------------------------

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<|vision_pad|>", "<|im_start", "im_end|>", "<think", "<<|im_end|>>"]
WORDS = ["the", "The", " quick", "brown", "fox", "I'm", "you've", "they'll", "it's", "IT'S", "we'D",
         "don't", "naïve", "café", "Straße", "ſ", "'ſ", "K", "İstanbul", "ΣΊΣΥΦΟΣ", "ﬁle", "Ǆ",
         "日本語", "中文混合", "テキスト", "한국어", "русский", "ελληνικά", "العربية", "עברית",
         "हिन्दी", "ภาษาไทย", "ქართული", "def", "return", "x**2", "0x1F", "3.14159", "1e-9",
         "http://a.b/c?d=1&e=2#f", "snake_case", "kebab-case", "camelCase", "__init__", "{}", "[]",
         "\\n", "''", '""', "```", "...", "!!!", "?!", "--", "==", "->", "=>", "::", "/*", "*/"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u00a0", "\u3000", "\u2009",
      "\u200b", "\u180e", "\u0085", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\u202f", "\u205f",
      "\ufeff", "\u2060", " \t \n"]
EMOJI = ["😀", "🤖", "🚀", "👩\u200d👩\u200d👧", "👨\u200d💻", "🏳\ufe0f\u200d🌈", "👍🏽", "🇯🇵", "❤\ufe0f",
         "☺", "1\ufe0f\u20e3", "🫠", "\U0001F9D1\U0001F3FF\u200d\U0001F9B2"]
MARKS = [chr(c) for c in range(0x300, 0x370)] + ["\u0e31", "\u093f", "\u0951", "\u05b7", "\u064b",
                                                "\u20dd", "\u1ab0", "\u302a", "\u3099"]
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
          (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x2bff), (0x3000, 0x30ff),
          (0x3130, 0x318f), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xf900, 0xfaff), (0xfb00, 0xfb4f),
          (0xfe00, 0xfe6f), (0xff00, 0xffef), (0x10000, 0x1007f), (0x1d400, 0x1d7ff), (0x1f300, 0x1faff),
          (0x20000, 0x2a6df), (0xe0000, 0xe007f), (0x0, 0x1f)]


# Unassigned in every Unicode version so far (Cn everywhere), and noncharacters.
UNASSIGNED = ["\u0378", "\u038b", "\u05ff", "\u0e7f", "\ufdd0", "\ufffe", "\U0001fffe", "\U000e0080"]


def rand_char(rng):
    """A random char from RANGES, restricted to those assigned in Python's
    Unicode (14.0, as PCRE2 10.42): HF's Oniguruma knows Unicode 16, and letters
    or symbols added since are classified by their newer properties only on the
    fast path (up to 15.0, see test_qwen3_unicode_15_letters_match_hf)."""
    if rng.random() < 0.02:
        return rng.choice(UNASSIGNED)
    while True:
        lo, hi = rng.choice(RANGES)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) != "Cn":
            return c


def rand_text(rng, max_parts=40):
    parts = []
    for _ in range(rng.randint(0, max_parts)):
        k = rng.random()
        if k < 0.25:
            parts.append(rng.choice(WORDS))
        elif k < 0.45:
            parts.append(rng.choice(WS))
        elif k < 0.55:
            parts.append(rng.choice(EMOJI))
        elif k < 0.63:
            parts.append(rng.choice(MARKS))
        elif k < 0.70:
            parts.append(rng.choice(SPECIALS))
        elif k < 0.80:
            parts.append("".join(str(rng.randint(0, 9)) for _ in range(rng.randint(1, 12))))
        elif k < 0.88:
            parts.append("".join(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") for _ in range(rng.randint(1, 5))))
        else:
            parts.append("".join(rand_char(rng) for _ in range(rng.randint(1, 8))))
    return "".join(parts)


def no_surrogates(s):
    return "".join(c for c in s if not 0xd800 <= ord(c) <= 0xdfff)


# ---- laststand in batch ------------------------------------------------------------

def ls_encode(tok_dir, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8", delete=False) as f:
        for s in texts:
            f.write(json.dumps(s) + "\n")
        path = f.name
    try:
        p = run_ls("tokenize", "--tokenizer-path", tok_dir, "--jsonl", "--file", path, check=True)
    finally:
        os.unlink(path)
    out = [json.loads(l)["ids"] for l in p.stdout.split("\n") if l]
    assert len(out) == len(texts)
    return out


def ls_decode(tok_dir, id_lists, skip=False, stream=False):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for ids in id_lists:
            f.write(json.dumps(ids) + "\n")
        path = f.name
    args = ["detokenize", "--tokenizer-path", tok_dir, "--jsonl", path]
    if skip:
        args.append("--skip-special-tokens")
    if stream:
        args.append("--stream")
    try:
        p = run_ls(*args, check=True)
    finally:
        os.unlink(path)
    out = [json.loads(l) for l in p.stdout.split("\n") if l]
    assert len(out) == len(id_lists)
    return out


def compare_with_hf(tok_dir, texts, what):
    hf = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    got = ls_encode(tok_dir, texts)
    bad = [(s, w, g) for s, w, g in zip(texts, want, got) if w != g]
    msg = "\n".join(f"  text={s!r}\n    hf ={w}\n    ls ={g}" for s, w, g in bad[:8])
    assert not bad, f"{what}: {len(bad)}/{len(texts)} encodings differ from HF (seed {SEED}):\n{msg}"
    for skip in (False, True):
        dec = ls_decode(tok_dir, want, skip=skip, stream=True)
        hf_dec = hf.decode_batch(want, skip_special_tokens=skip)
        bad = [(ids, h, d["text"]) for ids, h, d in zip(want, hf_dec, dec) if h != d["text"]]
        msg = "\n".join(f"  ids={i}\n    hf ={h!r}\n    ls ={d!r}" for i, h, d in bad[:8])
        assert not bad, f"{what}: decode(skip_special_tokens={skip}) differs from HF on {len(bad)} (seed {SEED}):\n{msg}"
        bad = [(ids, d["deltas"]) for ids, d in zip(want, dec) if "".join(d["deltas"]) != d["text"]]
        assert not bad, f"{what}: streamed deltas do not add up to decode: ids={bad[0][0]} deltas={bad[0][1]}"
        for ids, d in list(zip(want, dec))[:100]:  # after k ids, the stream has said no more than decode(ids[:k])
            acc = ""
            for k, delta in enumerate(d["deltas"][:-1]):
                acc += delta
                pre = hf.decode(ids[:k + 1], skip_special_tokens=skip)
                assert pre.startswith(acc), f"{what}: after {ids[:k + 1]} the stream said {acc!r}, HF decode {pre!r}"


# ---- tokenizers built here ---------------------------------------------------------

@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    """The Qwen3 vocab with the Qwen3.5 pre-tokenizer regex (\\p{M} joins letters)."""
    need_shared()
    d = tmp_path_factory.mktemp("qwen35pat")
    with open(os.path.join(QWEN3, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    split = j["pre_tokenizer"]["pretokenizers"][0]
    assert split["type"] == "Split"
    split["pattern"]["Regex"] = QWEN35_PATTERN
    with open(d / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return str(d)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A byte-level BPE trained here: NFKC + Lowercase normalizer, the GPT-2
    ByteLevel pre-tokenizer (add_prefix_space, use_regex), merges saved as
    pairs, and added tokens with every flag."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("trained")
    rng = random.Random(1234)
    corpus = [rand_text(rng) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False),
                    AddedToken("Hello", normalized=True), AddedToken("[MASK]", lstrip=True, normalized=False),
                    AddedToken("<tool_call>", rstrip=True, normalized=False),
                    AddedToken("fox", single_word=True, normalized=False),
                    AddedToken("naïve", normalized=True)])
    tok.add_special_tokens([AddedToken("<sép>", normalized=False)])
    tok.save(str(d / "tokenizer.json"))
    return str(d)


# ---- tests ---------------------------------------------------------------------------

def test_fixture_tokenize_json_ids_and_decoded(ls_bin):
    need_shared()
    with open(FIXTURE, encoding="utf-8") as f:
        cases = json.load(f)
    got = ls_encode(QWEN3, [c["text"] for c in cases])
    for c, g in zip(cases, got):
        assert g == c["ids"], f"ids of {c['text']!r}"
    dec = ls_decode(QWEN3, [c["ids"] for c in cases])
    for c, d in zip(cases, dec):
        assert d["text"] == c["decoded"], f"decode of {c['text']!r}"


@pytest.mark.parametrize("path", ["fast", "pcre2"])
def test_qwen3_matches_hf_on_random_text(ls_bin, monkeypatch, path):
    """fast: the hand-written matcher for the Qwen pattern; pcre2: the same
    pattern through PCRE2 (LS_TOK_NO_FASTPATH=1)."""
    need_shared()
    if path == "pcre2":
        monkeypatch.setenv("LS_TOK_NO_FASTPATH", "1")
    rng = random.Random(SEED if path == "fast" else SEED + 11)
    # fixed cases first: Hangul jamo around syllables (utf8proc composes LV + U+11A7 wrongly),
    # canonical reordering, singletons, Unicode white space, contractions with long s
    tricky = ["뎌ᆧ", "가\u11a8", "가\u11a7", "\u1100\u1161\u11a8", "\u1112\u1175\u11c2x", "a\u0323\u0301",
              "a\u0301\u0323", "\u212b\u2126\uf900", "e\u0301\u0301", "x\u180e!", "a\u2028\u2029\u0085b",
              "x'ſa 'Sa 'ſ", " \u3000 \u00a0x", "\r\n\r\n  \n", "\u0915\u093c\u0924"]
    texts = tricky + [rand_text(rng) for _ in range(2500 if path == "fast" else 1000)]
    compare_with_hf(QWEN3, texts, f"qwen3 ({path})")


def test_qwen3_unicode_15_letters_match_hf(ls_bin):
    """Letters assigned in Unicode 15.0/15.1 (CJK Ext H and I, Kawi, Nag Mundari)
    are letters for HF's Oniguruma; the Qwen fast path knows them."""
    need_shared()
    rng = random.Random(SEED + 12)
    pool = [(0x31350, 0x323AF), (0x2EBF0, 0x2EE5D), (0x11F04, 0x11F10), (0x1E4D0, 0x1E4EB)]
    texts = []
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(1, 8)):
            lo, hi = rng.choice(pool)
            parts.append(rng.choice(["", " ", "a", "1", "!", "'s", "\n"]) + "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
        texts.append("".join(parts))
    compare_with_hf(QWEN3, texts, "qwen3 unicode 15 letters")


def test_qwen35_regex_matches_hf_on_random_text(ls_bin, qwen35_dir):
    rng = random.Random(SEED + 1)
    texts = [rand_text(rng) for _ in range(2000)]
    compare_with_hf(qwen35_dir, texts, "qwen3 vocab + qwen3.5 regex")


def test_trained_gpt2_bytelevel_matches_hf_on_random_text(ls_bin, trained_dir):
    rng = random.Random(SEED + 2)
    extra = ["fox", " fox ", "afox", "fox1", "a [MASK] b", "  [MASK]", "<tool_call>  \n x", "HELLO hello",
             "NAÏVE naïve", "<sép>x<sép>", "Ｈｅｌｌｏ", "제ᆧご", "\u11a7가\u11a7ﬁ"]  # NFKC: utf8proc's U+11A7 bug
    texts = extra + [rand_text(rng) + rng.choice(["", " fox", "[MASK]", "<tool_call> ", "HeLLo"]) for _ in range(2000)]
    compare_with_hf(trained_dir, texts, "trained ByteLevel BPE")


def test_long_words_match_hf(ls_bin):
    """Pre-tokens of 10-30 KB (the merge loop's speed on them is pinned in test_tok.c)."""
    need_shared()
    rng = random.Random(SEED + 3)
    texts = ["a" * 20000, "ab" * 10000, "".join(rng.choice("abcdefghij") for _ in range(30000)),
             "中文" * 5000, "😀" * 3000, " " * 10000, "\n" * 5000 + "x", "1" * 10000]
    compare_with_hf(QWEN3, texts, "long words")


def test_decode_random_ids_matches_hf(ls_bin):
    """Random ids make arbitrary byte soup: invalid UTF-8 must become U+FFFD as HF does."""
    need_shared()
    hf = tokenizers.Tokenizer.from_file(os.path.join(QWEN3, "tokenizer.json"))
    rng = random.Random(SEED + 4)
    # bias towards single-byte tokens (ids < 256 are the byte alphabet) and specials
    ids = [[rng.choice([rng.randrange(256), rng.randrange(151643), rng.randrange(151643, 151669)])
            for _ in range(rng.randint(0, 30))] for _ in range(1500)]
    for skip in (False, True):
        got = ls_decode(QWEN3, ids, skip=skip, stream=True)
        want = hf.decode_batch(ids, skip_special_tokens=skip)
        for i, g, w in zip(ids, got, want):
            assert g["text"] == w, f"decode({i}, skip={skip}) (seed {SEED})"
            assert "".join(g["deltas"]) == w, f"stream deltas of {i} (seed {SEED}): {g['deltas']}"
            acc = ""
            for k, delta in enumerate(g["deltas"][:-1]):
                acc += delta
                pre = hf.decode(i[:k + 1], skip_special_tokens=skip)
                assert pre.startswith(acc), f"after {k + 1} ids the stream said {acc!r}, decode says {pre!r}"


def test_round_trip_10000_random_nfc_strings(ls_bin):
    need_shared()
    rng = random.Random(SEED + 5)
    texts = []
    for _ in range(10000):
        s = no_surrogates(rand_text(rng, 12))
        texts.append(unicodedata.normalize("NFC", s))
    ids = ls_encode(QWEN3, texts)
    dec = ls_decode(QWEN3, ids)
    bad = [(s, d["text"]) for s, d in zip(texts, dec) if s != d["text"]]
    assert not bad, f"{len(bad)} round trips differ (seed {SEED}), first: {bad[0][0]!r} -> {bad[0][1]!r}"


def test_stream_deltas_concatenate_to_decode(ls_bin):
    need_shared()
    rng = random.Random(SEED + 6)
    texts = [rand_text(rng, 20) for _ in range(300)]
    ids = ls_encode(QWEN3, texts)
    for skip in (False, True):
        out = ls_decode(QWEN3, ids, skip=skip, stream=True)
        for i, o in zip(ids, out):
            assert "".join(o["deltas"]) == o["text"], f"deltas {o['deltas']} of {i}"
            assert len(o["deltas"]) == len(i) + 1


# ---- CLI contract ------------------------------------------------------------------------

def test_cli_tokenize_text_and_file(ls_bin, tmp_path):
    need_shared()
    p = run_ls("tokenize", "--tokenizer-path", QWEN3, "--text", "Hello world", check=True)
    assert json.loads(p.stdout) == {"ids": [9707, 1879]}
    f = tmp_path / "t.txt"
    f.write_text("日本語のテキストと中文混合", encoding="utf-8")
    p = run_ls("tokenize", "--tokenizer-path", QWEN3, "--file", str(f), check=True)
    assert json.loads(p.stdout)["ids"] == [101059, 102819, 15767, 56833, 61803, 70534, 19182, 104811, 105063]


def test_cli_detokenize_utf8_output_and_skip_special(ls_bin):
    need_shared()
    p = run_ls("detokenize", "--tokenizer-path", QWEN3, "--ids", "151644,101059,151667", check=True)
    assert "\\u" not in p.stdout  # UTF-8, not ASCII-escaped
    assert json.loads(p.stdout) == {"text": "<|im_start|>日本<think>"}
    p = run_ls("detokenize", "--tokenizer-path", QWEN3, "--ids", "151644,101059,151667", "--skip-special-tokens",
               check=True)
    assert json.loads(p.stdout) == {"text": "日本<think>"}  # <think> is added but not special


@pytest.mark.parametrize("args,needle", [
    (["tokenize", "--text", "x"], "--tokenizer-path"),
    (["tokenize", "--tokenizer-path", "/nonexistent", "--text", "x"], "/nonexistent/tokenizer.json"),
    (["tokenize", "--tokenizer-path", "QWEN3"], "--text"),
    (["tokenize", "--tokenizer-path", "QWEN3", "--file", "/nonexistent.txt"], "/nonexistent.txt"),
    (["tokenize", "--tokenizer-path", "QWEN3", "--bogus"], "--bogus"),
    (["detokenize", "--tokenizer-path", "QWEN3", "--ids", "1,x"], "--ids"),
    (["detokenize", "--tokenizer-path", "QWEN3", "--ids", "1,99999999"], "99999999"),
])
def test_cli_bad_input_exits_2_naming_the_culprit(ls_bin, args, needle):
    need_shared()
    args = [QWEN3 if a == "QWEN3" else a for a in args]
    p = run_ls(*args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr


def test_bad_tokenizer_json_names_the_json_path(ls_bin, tmp_path):
    tok = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "decoder": None,
           "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a xx"]}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    p = run_ls("tokenize", "--tokenizer-path", str(tmp_path), "--text", "ab")
    assert p.returncode == 2
    assert "model.merges[1]: unknown token 'xx'" in p.stderr
    tok["model"]["merges"] = [["a", "b"]]
    tok["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    p = run_ls("tokenize", "--tokenizer-path", str(tmp_path), "--text", "ab")
    assert p.returncode == 2 and "pre_tokenizer.pattern" in p.stderr
    (tmp_path / "tokenizer.json").write_text("{not json")
    p = run_ls("tokenize", "--tokenizer-path", str(tmp_path), "--text", "ab")
    assert p.returncode == 2 and "tokenizer.json: line 1" in p.stderr


# ---- other tokenizer.json shapes: normalizers, pre-tokenizers, decoders ----------------------

def _split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


def _bl(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False, "use_regex": regex}


def _seq(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


def _nseq(*steps):
    return {"type": "Sequence", "normalizers": list(steps)}


BL_DEC = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
SHAPES = {
    "split_regex_merged_with_previous": (None, _seq(_split(r"\p{N}+", "MergedWithPrevious"), _bl()), BL_DEC),
    "split_string_merged_with_next": (None, _seq(_split(" ", "MergedWithNext", regex=False), _bl()), BL_DEC),
    "split_contiguous_then_punctuation": (None, _seq(_split(r"[\p{P}\p{S}]", "Contiguous"),
                                                     {"type": "Punctuation", "behavior": "Isolated"}, _bl()), BL_DEC),
    "split_inverted_removed": (None, _seq(_split(r"\s+", "Removed", invert=True), _bl()), BL_DEC),
    "whitespacesplit_digits_punct_next": (None, _seq({"type": "WhitespaceSplit"},
                                                     {"type": "Digits", "individual_digits": True},
                                                     {"type": "Punctuation", "behavior": "MergedWithNext"},
                                                     _bl(prefix=True)), BL_DEC),
    "whitespace_digits_bytelevel_regex": (None, _seq({"type": "Whitespace"}, {"type": "Digits", "individual_digits": False},
                                                     _bl(prefix=True, regex=True)), BL_DEC),
    "bert_pretokenizer": (None, _seq({"type": "BertPreTokenizer"}, _bl()), BL_DEC),
    "bytelevel_then_split_on_mapped_space": (None, _seq(_bl(), _split("\u0120", "MergedWithNext", regex=False)), BL_DEC),
    "nfd_stripaccents_lowercase": (_nseq({"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}),
                                   _bl(prefix=True, regex=True), BL_DEC),
    "nfkd_replace_strip_prepend": (_nseq({"type": "NFKD"}, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
                                         {"type": "Strip", "strip_left": True, "strip_right": True},
                                         {"type": "Prepend", "prepend": "\u2581"}), _bl(), BL_DEC),
    "metaspace_first_split": (_nseq({"type": "NFKC"}, {"type": "Replace", "pattern": {"String": "a"}, "content": "A"}),
                              _seq({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
                                   _bl()),
                              {"type": "Sequence", "decoders": [BL_DEC, {"type": "Metaspace", "replacement": "\u2581",
                                                                         "prepend_scheme": "first", "split": True}]}),
    "metaspace_always_nosplit": (None, _seq({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                             "split": False}, _bl()), BL_DEC),
    "decoder_chain": (None, _bl(regex=True), {"type": "Sequence", "decoders": [
        BL_DEC, {"type": "Replace", "pattern": {"String": "e"}, "content": "E"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}),  # HF panics on stop > 0 for short tokens
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_tokenizer_shapes_match_hf(ls_bin, trained_dir, tmp_path, shape):
    norm, pre, dec = SHAPES[shape]
    with open(os.path.join(trained_dir, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["normalizer"], j["pre_tokenizer"], j["decoder"] = norm, pre, dec
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    rng = random.Random(SEED + 7 + sum(map(ord, shape)))
    texts = ["", " ", "a", "  x  ", "Hello, World! 123 4.5", "naïve café  \t\n x"] + \
            [rand_text(rng, 20) for _ in range(300)]
    if "punct" in shape or "bert" in shape:
        # HF's Punctuation pre-tokenizer classifies with an old Unicode table (U+061D,
        # added in 14.0, is not punctuation to it); keep to ASCII punctuation there.
        texts = ["".join(c for c in t if ord(c) < 0x80 or not unicodedata.category(c).startswith("P")) for t in texts]
    compare_with_hf(str(tmp_path), texts, shape)


def test_sentencepiece_style_byte_fallback_matches_hf(ls_bin, tmp_path):
    """Llama-2 shape: Prepend+Replace normalizer, no pre-tokenizer, byte_fallback with
    <0xXX> tokens, fused <unk>, and the Replace/ByteFallback/Fuse/Strip decoder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    rng = random.Random(99)
    corpus = [rand_text(rng, 20) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=800, limit_alphabet=120, special_tokens=["<unk>", "<s>", "</s>"]))
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    j["model"].update(byte_fallback=True, fuse_unk=True)
    j["normalizer"] = _nseq({"type": "Prepend", "prepend": "\u2581"},
                            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    texts = [rand_text(random.Random(SEED + 8 + i), 15) for i in range(400)]
    compare_with_hf(str(tmp_path), texts, "sentencepiece-style BPE")
    # without byte fallback: unknown chars become one fused <unk>
    j["model"]["byte_fallback"] = False
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    compare_with_hf(str(tmp_path), texts[:200], "sentencepiece-style BPE, unk")


def test_ignore_merges_matches_hf(ls_bin, trained_dir, tmp_path):
    """model.ignore_merges: a word that is itself in the vocab is one token, merges or not."""
    with open(os.path.join(trained_dir, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["ignore_merges"] = True
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    rng = random.Random(SEED + 13)
    compare_with_hf(str(tmp_path), [rand_text(rng, 20) for _ in range(300)], "ignore_merges")


def test_subword_prefix_suffix_and_no_decoder_match_hf(ls_bin, tmp_path):
    """continuing_subword_prefix / end_of_word_suffix in the model, a Whitespace
    pre-tokenizer (not byte-level), an unk token, and no decoder (HF joins with spaces)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    rng = random.Random(7)
    corpus = [rand_text(rng, 20) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=900, limit_alphabet=150, special_tokens=["[UNK]"],
                                                        continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = [rand_text(random.Random(SEED + 14 + i), 15) for i in range(300)]
    compare_with_hf(str(tmp_path), texts, "prefix/suffix BPE")
