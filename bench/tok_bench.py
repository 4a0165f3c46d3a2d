#!/usr/bin/env python3
"""Tokenizer benchmark: encode a 10 MB mixed-language text on one core.

    python3 bench/tok_bench.py [--tokenizer-path DIR] [--mb 10] [--runs 5] [--bin build/laststand] [--hf-whole]

The text is generated deterministically (seed 0): English prose, source code,
Chinese, Japanese, Russian, Arabic, emoji and numbers, in paragraphs.
Every encoder starts each run cold (laststand clears its word cache, HF gets a
freshly loaded Tokenizer) and the best of --runs is reported, wall clock and
CPU time (laststand's encoding thread; HF's whole process, so rayon's thread
counts). On an idle machine the two agree; on a shared one the CPU column is
what one core does and the wall column is what a user waits.
  laststand, whole text:  `laststand tokenize --file TEXT --bench RUNS` (one tok_encode call)
  laststand, per line:    `laststand tokenize --jsonl --file LINES --bench RUNS` (a call per line)
  HF, per line:           Tokenizer.encode_batch(lines, add_special_tokens=False),
                          RAYON_NUM_THREADS=1 (single-threaded)
  HF, whole text:         Tokenizer.encode(text) once (--hf-whole; slow: HF's offset
                          tracking makes one 10 MB call take about a minute)
Ids are compared line by line with HF (and for the whole text with --hf-whole).
The last line of the table is the headline: laststand whole-text MB/s per
core-second (and wall), and the ratio to HF per line, single-threaded.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EN = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
      "you were all her she there would their we him been has when who will no more if out so up said what its "
      "about than into them can only other time new some could these two may first then do any like my now over "
      "such our man me even most made after also did many before must through back years where much your way "
      "well down should because each just those people how too little state good very make world still own see "
      "men work long get here between both life being under never day same another know while last might us "
      "great old year off come since against go came right used take three tokenizer inference server model "
      "kernel memory bandwidth throughput latency request stream batch").split()
RU = ("и в не на я быть он с что а по это она этот к но они мы как из у который то за свой весь год от так о "
      "для ты же все тот мочь вы человек такой его сказать только или еще бы себя один как уже до время если "
      "сам когда другой вот говорить наш мой знать стать при чтобы дело жизнь кто первый очень два день ее "
      "новый рука даже во со раз где там под можно ну какой после их работа без самый потом надо хотеть ли "
      "слово идти большой должен место иметь ничто сервер модель память").split()
AR = ("في من على إلى عن مع هذا هذه كان التي الذي أن لا ما هو هي كل بين قد ذلك بعد عند لم حتى إذا أو ثم كما "
      "لكن غير يوم العالم الناس الحياة الوقت العمل الدولة الكتاب المدينة الماء الليل البيت الطريق اللغة "
      "العربية النموذج الخادم الذاكرة").split()
ZH = ("的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作"
      "里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从"
      "想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头"
      "文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提"
      "立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务"
      "做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界达光放强即像"
      "难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今切院让识候带导"
      "争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存未远叫台单影具罗"
      "字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官火断精满支视消越器"
      "容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历首医局突专费号尽另周"
      "较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敌致陈律足态护七兴派孩验责营星够章"
      "音跟志底站严巴例防族供效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围江织害斗双境客纪采举杀攻")
JA_KANA = ("これ それ あれ この その ここ そこ わたし あなた かれ です ます でした ません する した して いる "
           "ある ない なる なった こと もの ところ とき よう ため から まで より ので のに けれど しかし "
           "サーバー モデル メモリ トークン リクエスト ストリーム カーネル データ システム テスト").split()
JA_KANJI = "日本語東京大学時間世界会社問題自分今日明日言葉仕事電話学生先生新聞天気病院駅銀行映画音楽料理写真"
EMOJI = ["😀", "🤖", "🚀", "👍", "🎉", "❤️", "🔥", "✨", "👩\u200d💻", "🇯🇵", "😂", "🙏", "💡", "📈", "✅"]
IDENT = ("x y i j n buf len ptr ctx data node next prev head tail key value size count index result err tok ids "
         "model layer weight scale out inp tmp acc sum max min").split()
CODE_LINES = [
    "def {a}({b}, {c}):\n    return {b} * {c} + {n}\n",
    "for ({a} = 0; {a} < {b}; {a}++) {{\n    {c}[{a}] = {c}[{a}] * {n} + {b};\n}}\n",
    "if ({a} == NULL || {b}->{c} < {n}) return -1;\n",
    "    {a} = [{b} for {b} in range({n}) if {b} % 2 == 0]\n",
    "static int {a}_{b}(const char *{c}, size_t {a}) {{ /* {n} */\n",
    "const {a} = await fetch(`/api/{b}/${{{c}}}`);\n",
    "    self.{a} = nn.Linear({n}, {n}, bias=False)  # {b}\n",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {c} > {n} GROUP BY {a};\n",
]


def gen_text(mb, seed=0):
    rng = random.Random(seed)
    target = int(mb * 1_000_000)
    parts, size = [], 0

    def words(lst, n, sep=" "):
        return sep.join(rng.choice(lst) for _ in range(n))

    while size < target:
        k = rng.random()
        if k < 0.33:
            sents = []
            for _ in range(rng.randint(2, 6)):
                s = words(EN, rng.randint(6, 18))
                sents.append(s[0].upper() + s[1:] + rng.choice([".", ".", ",", "!", "?", ";"]))
            p = " ".join(sents)
        elif k < 0.52:
            p = "".join(rng.choice(CODE_LINES).format(a=rng.choice(IDENT), b=rng.choice(IDENT), c=rng.choice(IDENT),
                                                      n=rng.randint(0, 4096)) for _ in range(rng.randint(3, 10)))
        elif k < 0.64:
            p = "".join(rng.choice(ZH) for _ in range(rng.randint(20, 80))) + rng.choice(["。", "，", "！", "？"])
            p += "".join(rng.choice(ZH) for _ in range(rng.randint(10, 60))) + "。"
        elif k < 0.72:
            p = ""
            for _ in range(rng.randint(4, 12)):
                p += rng.choice(JA_KANA) if rng.random() < 0.6 else "".join(rng.choice(JA_KANJI) for _ in range(rng.randint(1, 4)))
            p += "。"
        elif k < 0.82:
            s = words(RU, rng.randint(8, 25))
            p = s[0].upper() + s[1:] + "."
        elif k < 0.87:
            p = words(AR, rng.randint(8, 25)) + "."
        elif k < 0.91:
            p = " ".join(rng.choice(EMOJI) * rng.randint(1, 3) + " " + rng.choice(EN) for _ in range(rng.randint(3, 10)))
        else:
            p = " ".join(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 9))), f"{rng.uniform(-1e4, 1e4):.4f}",
                                     f"{rng.randint(1, 28)}/{rng.randint(1, 12)}/20{rng.randint(10, 30)}",
                                     f"0x{rng.getrandbits(32):08x}"]) for _ in range(rng.randint(5, 20)))
        p += rng.choice(["\n", "\n\n", " ", "\n"])
        parts.append(p)
        size += len(p.encode("utf-8"))
    text = "".join(parts).encode("utf-8")[:target].decode("utf-8", "ignore")
    return text


def run_ls(binary, tok, path, runs, jsonl):
    args = ["taskset", "-c", "0", binary, "tokenize", "--tokenizer-path", tok, "--file", path, "--bench", str(runs)]
    if jsonl:
        args.append("--jsonl")
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"laststand failed: {p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-path", default=os.path.join(ROOT, "..", "shared", "tokenizers", "qwen3"))
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "laststand"))
    ap.add_argument("--hf-whole", action="store_true", help="also time HF encode() on the whole text (slow)")
    a = ap.parse_args()

    import tokenizers
    text = gen_text(a.mb)
    nbytes = len(text.encode("utf-8"))
    lines = text.split("\n")
    line_bytes = sum(len(l.encode("utf-8")) for l in lines)
    tmp = tempfile.mkdtemp()
    tpath, lpath = os.path.join(tmp, "text.txt"), os.path.join(tmp, "lines.jsonl")
    with open(tpath, "w", encoding="utf-8") as f:
        f.write(text)
    with open(lpath, "w", encoding="utf-8") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    try:
        ls_whole = run_ls(a.bin, a.tokenizer_path, tpath, a.runs, False)
        ls_lines = run_ls(a.bin, a.tokenizer_path, lpath, a.runs, True)
        p = subprocess.run([a.bin, "tokenize", "--tokenizer-path", a.tokenizer_path, "--jsonl", "--file", lpath],
                           capture_output=True, text=True)
        ls_line_ids = [json.loads(l)["ids"] for l in p.stdout.split("\n") if l]
        ls_whole_ids = None
        if a.hf_whole:
            p = subprocess.run([a.bin, "tokenize", "--tokenizer-path", a.tokenizer_path, "--file", tpath],
                               capture_output=True, text=True)
            ls_whole_ids = json.loads(p.stdout)["ids"]
    finally:
        for x in (tpath, lpath):
            os.unlink(x)
        os.rmdir(tmp)

    try:
        os.sched_setaffinity(0, {0})
    except (AttributeError, OSError):
        pass
    tj = os.path.join(a.tokenizer_path, "tokenizer.json")
    best, best_cpu, hf_line_ids = float("inf"), float("inf"), None
    for _ in range(a.runs):
        hf = tokenizers.Tokenizer.from_file(tj)  # cold cache
        t0, c0 = time.perf_counter(), time.process_time()  # process CPU: counts rayon's thread too
        enc = hf.encode_batch(lines, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
        hf_line_ids = [e.ids for e in enc]
    same_lines = hf_line_ids == ls_line_ids
    rows = []
    if a.hf_whole:
        hf = tokenizers.Tokenizer.from_file(tj)
        t0, c0 = time.perf_counter(), time.process_time()
        whole_ids = hf.encode(text, add_special_tokens=False).ids
        rows.append((f"HF {tokenizers.__version__} encode(whole text), 1 run", nbytes, time.perf_counter() - t0,
                     time.process_time() - c0))
        same_whole = whole_ids == ls_whole_ids
    hf_mbs = line_bytes / 1e6 / best
    hf_cpu_mbs = line_bytes / 1e6 / best_cpu
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"tokenizer: {os.path.abspath(a.tokenizer_path)}")
    print(f"text: {nbytes / 1e6:.2f} MB mixed-language (seed 0), {len(lines)} lines, {ls_whole['tokens']} tokens")
    print(f"ids identical to HF: per line {same_lines}" + (f", whole text {same_whole}" if a.hf_whole else ""))
    print(f"{'encoder (one thread, cold cache, best of ' + str(a.runs) + ')':<52} {'wall s':>7} {'MB/s':>7} {'cpu s':>7} {'MB/s':>7}")
    rows = [(f"HF tokenizers {tokenizers.__version__} encode_batch(lines), RAYON=1", line_bytes, best, best_cpu)] + rows
    rows += [("laststand tok_encode per line", ls_lines["bytes"], ls_lines["best_s"], ls_lines["best_cpu_s"]),
             ("laststand tok_encode(whole text)", ls_whole["bytes"], ls_whole["best_s"], ls_whole["best_cpu_s"])]
    for name, b, w, c in rows:
        print(f"{name:<52} {w:7.3f} {b / 1e6 / w:7.2f} {c:7.3f} {b / 1e6 / c:7.2f}")
    ok = same_lines and (same_whole if a.hf_whole else True)
    print(f"headline: laststand whole text {ls_whole['cpu_mb_per_s']:.1f} MB/s per core-second "
          f"({ls_whole['mb_per_s']:.1f} MB/s wall, load {load:.1f} on {os.cpu_count()} CPUs) = "
          f"{ls_whole['cpu_mb_per_s'] / hf_cpu_mbs:.1f}x HF tokenizers single-threaded per line on CPU time "
          f"({ls_whole['mb_per_s'] / hf_mbs:.1f}x wall){'' if ok else '  [IDS DIFFER]'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
