"""The Jinja language itself, differentially against jinja2 in transformers' environment.

Each case is a small template plus variables; jinja2 (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols and transformers' tojson/raise_exception, exactly as
transformers 5.17 builds it) is the oracle; `laststand chat-template --chat-template FILE` must
print the same bytes, or fail (exit 2) where jinja2 raises, with the same message where the
case says so. Pins whitespace control, trim/lstrip_blocks, loop variables, scoping, slicing,
macros and call blocks, namespace, filters, tests, str/dict methods, Python's str()/repr() of
values, tojson formatting and undefined semantics.
"""
import json
import os
import subprocess

import pytest

from conftest import BIN, SHARED

TOKDIR = os.path.join(SHARED, "tokenizers", "qwen3")


def _env():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
        {"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "image"}]}]
V = {"s": "  Hello, Wörld!  ", "n": 7, "f": 2.5, "neg": -3, "big": 10**15, "t": True, "nul": None,
     "l": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"b": 1, "a": [1, 2], "items": "x"},
     "people": [{"name": "ann", "age": 31}, {"name": "Bob", "age": 25}, {"name": "cy", "age": 31}],
     "u": "ΟΔΟΣ straße ǅ", "nested": {"k": {"v": [1, {"w": "deep"}]}}, "e": "", "zero": 0}

# (template, expect_error_message or None). Variables: V, messages=MSGS, eos_token.
CASES = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("a\n  {% if t %}\n  yes\n  {% endif %}\nb", None),
    ("a  {%- if t %} x {% endif -%}  \n\n b", None),
    ("{% for i in l %}\n    {{ i }}\n{% endfor %}\n", None),
    ("  {{ n }}  \n  {% if t %}T{% endif %}\n", None),
    ("x {#- comment -#} y\n  {# own line #}\nz", None),
    ("{%+ if t %}  kept{% endif +%}\nend", None),
    ("{% raw %}{{ not rendered }} {% if %}{% endraw %}", None),
    ("line1\r\nline2\rline3\n", None),
    ("{{- '  lead' -}}\n\n   {{ 'x' }}   \n", None),
    # expressions and operators
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 7 }}", None),
    ("{{ 'a' ~ 1 ~ none ~ true ~ 2.50 }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ 'x' + 'y' }}", None),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1,2] == [1,2] }}", None),
    ("{{ 'b' in 'abc' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ not t }} {{ t and n }} {{ nul or 'dflt' }}", None),
    ("{{ 'yes' if t else 'no' }} [{{ 'x' if nul }}] {{ (1, 2) }} {{ (1,) }} {{ () }} {{ {'k': [1, 'v']} }}", None),
    ("{{ n > 5 and n < 10 }} {{ not n is even }} {{ -n }} {{ +f }} {{ - -n }}", None),
    ("{{ 1 + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("{{ 'a' + 1 }}", 'can only concatenate str (not "int") to str'),
    ("{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'"),
    ("{{ 1 / 0 }}", "division by zero"),
    # numbers: Python's float repr and int semantics
    ("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 123456789.0 }} {{ 1/3 }} {{ 2.0 }} {{ -0.0 }} {{ 1e22 }} {{ 0.0001 }}", None),
    ("{{ f|int }} {{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ '0x1f'|int(0, 16) }}", None),
    ("{{ n|float }} {{ '2.5'|float }} {{ 'bad'|float }} {{ neg|abs }} {{ 2.675|round(2) }} {{ 2.5|round }} {{ 3|round }}", None),
    ("{{ 7.123|round(1, 'floor') }} {{ 7.123|round(1, 'ceil') }} {{ l|sum }} {{ people|sum(attribute='age') }}", None),
    # slicing and indexing
    ("{{ l[0] }} {{ l[-1] }} {{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ s[2:7] }} {{ s[::-1] }} {{ 'héllo'[1] }}", None),
    ("{{ messages[::-1]|map(attribute='role')|join(',') }} {{ messages[-2:]|length }} {{ u[-4:] }}", None),
    ("{{ l[5] }}|{{ d.zz }}|{{ d['zz'] }}|{{ nul.x }}", None),
    ("{{ l[5].x }}", "list object has no element 5"),
    ("{{ d.zz.y }}", "'dict object' has no attribute 'zz'"),
    ("{{ missing.attr }}", "'missing' is undefined"),
    # undefined semantics
    ("[{{ missing }}] {{ missing is defined }} {{ missing is undefined }} {{ missing|default('dv') }} {{ missing|length }}", None),
    ("{% for x in missing %}{{ x }}{% else %}empty{% endfor %} {{ missing ~ 'c' }} {{ 'q' if missing else 'r' }}", None),
    ("{{ e|default('E') }} {{ e|default('E', true) }} {{ nul|default('N') }} {{ zero|default(9, boolean=true) }}", None),
    ("{{ missing + 1 }}", "'missing' is undefined"),
    ("{{ missing|tojson }}", "Object of type Undefined is not JSON serializable"),
    ("{{ missing() }}", "'missing' is undefined"),
    # loops
    ("{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.depth }};{% endfor %}", None),
    ("{% for m in messages %}{{ loop.previtem.role if loop.previtem }}>{{ loop.nextitem.role if loop.nextitem is defined }}"
     " {{ loop.cycle('odd', 'even') }};{% endfor %}", None),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in d|items %}{{ k }}{% endfor %}", None),
    ("{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", None),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", None),
    ("{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}|{{ loop.index }}{% endfor %}", None),
    ("{% for c in 'héllo' %}{{ c }}.{% endfor %} {% for k in d %}{{ k }}{% endfor %} {{ range(2, 11, 3)|list }}", None),
    ("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", None),
    ("{% for a, b in [(1, 2, 3)] %}{% endfor %}", "too many values to unpack (expected 2)"),
    ("{% for x in n %}{% endfor %}", "'int' object is not iterable"),
    ("{{ range(100001)|length }}", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."),
    # scoping and set
    ("{% set c = 0 %}{% for i in l %}{{ c }}{% set c = c + i %}{{ c }}{% endfor %}={{ c }}", None),
    ("{% set ns = namespace(c=0, items=[]) %}{% for i in l %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }} {{ ns.items }}", None),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set x %}block {{ n }}{% endset %}[{{ x }}] {% set y | upper %}up{% endset %}{{ y }}", None),
    ("{% if t %}{% set inner = 'set in if' %}{% endif %}{{ inner }}", None),
    ("{% with a = 5, b = n %}{{ a + b }}{% endwith %}[{{ a }}]", None),
    ("{% set q = 1 %}{% set q.x = 2 %}", "cannot assign attribute on non-namespace object"),
    # macros and call
    ("{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='z') }} {{ m() }}", None),
    ("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}inside {{ n }}{% endcall %}", None),
    ("{% macro w(x) %}{{ caller(x * 2) }}{% endmacro %}{% call(v) w(4) %}got {{ v }}{% endcall %}", None),
    ("{% macro r(k) %}{% if k > 0 %}{{ k }}{{ r(k - 1) }}{% endif %}{% endmacro %}{{ r(4) }}", None),
    ("{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, a=3) }}", None),
    ("{% set g = 'global' %}{% macro sees() %}{{ g }} {{ n }}{% endmacro %}{{ sees() }}", None),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "macro 'm' takes not more than 1 argument(s)"),
    ("{% filter upper %}shout {{ n }}{% endfilter %}", None),
    # filters
    ("{{ s|trim }}|{{ s|length }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ s|wordcount }}", None),
    ("{{ words|sort }} {{ words|sort(reverse=true) }} {{ words|sort(case_sensitive=true) }} {{ words|unique|list }} {{ words|reverse|list }}", None),
    ("{{ people|sort(attribute='age')|map(attribute='name')|join(', ') }} {{ people|map(attribute='name')|map('upper')|list }}", None),
    ("{{ people|selectattr('age', 'equalto', 31)|list|length }} {{ people|rejectattr('age', '>', 30)|map(attribute='name')|first }}", None),
    ("{{ l|select('odd')|list }} {{ l|reject('even')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ l|max }} {{ l|min }} {{ words|max }}", None),
    ("{{ l|first }} {{ l|last }} {{ s|first }} {{ l|count }} {{ d|list }} {{ d|dictsort }} {{ l|batch(2)|list }}", None),
    ("{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'x'|replace('', '.') }} {{ '%s=%d'|format('k', 5) }}", None),
    ("{{ 'l1\\nl2\\n\\nl4'|indent(2) }}|{{ 'l1\\nl2'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}", None),
    ("{{ '<a href=\"x\">&'|e }} {{ s|string }} {{ l|string }} {{ n|string }} {{ nul|string }} {{ t|safe }} {{ 'x'|center(7) }}!", None),
    ("{{ d|items|list }} {{ missing|items|list }} {{ d|attr('items') is callable }}", None),
    ("{% for k, v in 5|items %}{% endfor %}", "Can only get item pairs from a mapping."),
    ("{{ words|unique(case_sensitive=true)|list }} {{ 'HeLLo'|lower }} {{ u|upper }} {{ u|lower }} {{ 'ǆemal ǳ'|title }}", None),
    # tojson (transformers' json.dumps)
    ("{{ d|tojson }} {{ nested|tojson }} {{ 'ü \"q\" \\\\ \\n \\t \\u0001 é 🙂'|tojson }} {{ [1.0, 1e16, 1e-7, -0.0, 2.5]|tojson }}", None),
    ("{{ d|tojson(indent=2) }}\n{{ l|tojson(indent=0) }}\n{{ {}|tojson(indent=2) }} {{ []|tojson }}", None),
    ("{{ d|tojson(sort_keys=true) }} {{ {'ü': 'é'}|tojson(ensure_ascii=true) }} {{ d|tojson(separators=(',', ':')) }}", None),
    ("{{ messages|tojson }} {{ (1, 'a')|tojson }} {{ {1: 'int key', none: 0, true: 1}|tojson }}", None),
    ("{{ namespace(a=1)|tojson }}", "Object of type Namespace is not JSON serializable"),
    # tests
    ("{{ s is string }}{{ n is number }}{{ t is number }}{{ t is boolean }}{{ n is integer }}{{ f is float }}{{ t is integer }}", None),
    ("{{ d is mapping }}{{ l is sequence }}{{ d is sequence }}{{ s is iterable }}{{ n is iterable }}{{ nul is none }}{{ t is true }}{{ 1 is true }}", None),
    ("{{ n is divisibleby 7 }}{{ n is divisibleby(2) }}{{ n is odd }}{{ 2 is in l }}{{ 'ab' is lower }}{{ range is callable }}{{ 1 is sameas 1 }}", None),
    ("{{ missing is sequence }}{{ missing is iterable }}{{ nul is mapping }}{{ n is gt 3 }}{{ n is le 3 }}{{ 'a' is eq 'a' }}", None),
    # str / dict / list methods
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ s.startswith('  He') }}|{{ s.endswith(('!', '! ')) }}", None),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'x\\ny\\r\\nz'.splitlines() }}", None),
    ("{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('b') }} {{ 'a-b'.replace('-', '') }}", None),
    ("{{ '{} and {}'.format(1, 'x') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{k}!'.format(k=5) }} {{ '{:>5}|{:<4}|{:^6}|{:.2f}|{:05d}'.format('r', 'l', 'c', 3.14159, 42) }}", None),
    ("{{ 'Hello World'.upper() }} {{ 'Hello World'.lower() }} {{ 'hello wORLD'.title() }} {{ 'hello'.capitalize() }} {{ ', '.join(words) }}", None),
    ("{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dv') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items is callable }}", None),
    ("{{ d['items'] }} {{ l.index(2) }} {{ l.count(1) }} {{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ 'ab'.islower() }} {{ 'x'.zfill(3) }}", None),
    ("{{ l.append(4) }}", "access to attribute 'append' of 'list' object is unsafe."),
    ("{{ d.update({'x': 1}) }}", "access to attribute 'update' of 'dict' object is unsafe."),
    # values: Python str()/repr()
    ("{{ ['it\\'s', \"q\\\"\", 'back\\\\', 'tab\\t', 'é', none, true, 1.5, {'k': (1,)}] }}", None),
    ("{{ d }} {{ people[0] }} {{ [[], {}, ()] }} {{ 'a\\x01b'|list }}", None),
    # globals, dict(), namespace
    ("{{ dict(a=1, b='x') }} {{ dict([('k', 1)]) }} {{ namespace(x=1).x }} {{ range(3)|list }} {{ range(5, 0, -2)|list }}", None),
    ("{{ raise_exception('stop here: ' ~ n) }}", "stop here: 7"),
    ("{% if messages[0].role == 'system' %}{{ raise_exception('system found') }}{% endif %}", "system found"),
    # more corners
    ("{{ '%5.1f|%-4s|%r|%d|%.3s|%05.1f|%x %o %e|%%' % (3.14159, 'ab', 'x', 3.7, 'abcdef', 3.14159, 255, 8, 12345.678) }}", None),
    ("{{ '{:,}'.format(1234567) }} {{ '{!r}'.format('a') }} {{ '{:+d} {: d} {:x} {:#x} {:e} {:g} {:%}'.format(5, 5, 255, 255, 0.5, 0.5, 0.25) }}", None),
    ("{{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }} {{ '%s' % (l,) }} {{ '%s and %s'|format('x', 'y') }}", None),
    ("{{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 2 ** 0.5 }} {{ 1.0|string }} {{ 1e100 }} {{ 1.7976931348623157e308 }} {{ 5e-324 }}", None),
    ("{{ 'x' * 0 }}|{{ [0] * 3 }}|{{ 3 * 'ab' }}|{{ none is none }}|{{ none == none }}|{{ 'a'|list }}|{{ 'abc'|reverse }}", None),
    ("{{ -1|abs }} {{ not 1 in [1] }} {{ 1 if 0 else 2 if 0 else 3 }} {{ messages.0.role }} {{ messages[0]['role'] }} {{ (messages|last).role }}", None),
    ("{{ [1,2,3][1:2][0] }} {% set x = [1,2] + [3] %}{{ x|length }} {{ '{{' }} {{ '}}' }} {{ {'a': 1}['a'] }} {{ 'a' < 'b' }} {{ 'B' < 'a' }}", None),
    ("abc  {% if t %}x{% endif %}\n\u3000 {% if t %}y{% endif %}\n\t{# c #}\nz", None),
    ("{{ '\\u00e9\\x41\\101\\q' }} {{ \"a\\'b\" }} {{ 'tab\\there' }}", None),
    ("{{\n  n\n  +\n  1\n}}\n{%\n  if t\n%}\nmultiline\n{%\nendif\n%}\n", None),
    ("trailing\n\n", None),
    ("{%- for m in messages -%}\n  [{{ m.role }}]\n{%- endfor -%}\n  end  \n", None),
    ("{% for m in messages %}\n  {%- if loop.first %}\n    first\n  {%- endif %}\n{% endfor %}\n", None),
    ("{# a - b #}{#- x -#}  \n{{ x|default(none) is none }} {{ 'A'|lower is lower }} {{ 'a b'|title|replace(' ', '') }}", None),
    ("{% macro m(a, b=a*2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }} {% macro o() %}[{{ caller() }}]{% endmacro %}"
     "{% macro i() %}({{ caller() }}){% endmacro %}{% call o() %}{% call i() %}x{% endcall %}{% endcall %}", None),
    ("{% for x in d.values() %}{{ x }};{% endfor %} {{ d|length }} {{ messages|selectattr('role', 'equalto', 'user')|list|last }}", None),
    ("{{ {'html': '</script><b>&'}|tojson }} {{ {'f': [0.1, 100.0, 1e-5, 12345678901234567890.0]}|tojson }}", None),
    ("{{ 'ǅ x'|upper }} {{ 'ŉ'|upper }} {{ 'İ'|lower|length }} {{ 'ΣΑΣ ΑΣ'|lower }} {{ 'ﬁne'|upper }}", None),
    ("{% for m in messages %}{% if m.content is string %}{{ m.content|trim }}{% else %}{% for p in m.content %}"
     "{{ p.text if p.type == 'text' else '<img>' }}{% endfor %}{% endif %}\n{% endfor %}", None),
    ("{{ messages|map(attribute='content')|select('string')|join(' | ') }} {{ people|map(attribute='nope', default='?')|list }}", None),
    ("{{ people|unique(attribute='age')|map(attribute='name')|list }} {{ people|max(attribute='age') }} {{ people|sort(attribute='age,name')|map(attribute='name')|list }}", None),
    ("{{ ['b', 'a']|sort|first }} {{ [3, 1.5, True]|sort }} {{ [[2, 1], [1, 2]]|sort }} {{ l|join }} {{ l|join(', ') }} {{ people|join(',', attribute='name') }}", None),
    ("{{ nested.k.v[1].w }} {{ nested['k']['v'][0] }} {{ nested.k.v[-1]['w']|upper }}", None),
    ("{{ s.split()|length }} {{ 'a b'.split(none) }} {{ '  x  y  '.rsplit(None, 1) }} {{ '  x  y  z '.split(None, 1) }} {{ 'k=v=w'.partition('=') }} {{ 'ab'.center(6, '*') }}", None),
    # found by differential fuzzing against jinja2
    ("{{ missing is callable }} {{ 2.5 is odd }} {{ 3.0 is odd }} {{ -3 is odd }} {{ 'x%s' is odd }} {{ 7.5 is divisibleby 2.5 }}", None),
    ("{{ 0|select|list }} {{ none|map('upper')|list }} {{ ''|reject|list }} {{ missing|last }} {{ 'ab c' % [1] }} {{ 'v=%s' % [1, 2] }} {{ 'x' % missing }}", None),
    ("{{ ('<b>'|safe) + '<i>' }} {{ '<i>' + ('<b>'|safe) }} {{ ['<'|e, 'x'|safe] }} {{ 'a'|safe is escaped }} {{ 'a' is escaped }}", None),
    ("{% macro m() %}<x>{% endmacro %}{{ m() is escaped }} {{ m() + '<' }} {% set b %}<y>{% endset %}{{ b is escaped }}", None),
    ("{{ [[1], [1]]|unique|list }}", "unhashable type: 'list'"),
    ("{{ [1] in {'a': 1} }}", "unhashable type: 'list'"),
    ("{{ d[1:] }}", "unhashable type: 'slice'"),
    ("{{ n[1:] }}", "'int' object is not subscriptable"),
    ("{{ 'x'|indent }} {{ l|indent }}", "'list' object has no attribute 'splitlines'"),
    ("{{ n|indent }}", "unsupported operand type(s) for +=: 'int' and 'str'"),
    # recursive loops, loop.changed, cycler, joiner
    ("{% for n in [{'v': 1, 'c': [{'v': 2, 'c': [{'v': 3}]}]}, {'v': 4}] recursive %}<{{ n.v }}@{{ loop.depth }}"
     "{% if n.c %}[{{ loop(n.c) }}]{% endif %}>{% endfor %}", None),
    ("{% for x in [1, 1, 2, 3, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", None),
    ("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{{ c.reset() }}{{ c.next() }} "
     "{% set j = joiner(' | ') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}", None),
    ("{% for x in l %}{{ loop(x) }}{% endfor %}", "The loop must have the 'recursive' marker to be called recursively."),
    # a Hermes-style recursive type macro over JSON schemas
    ("{%- macro ty(spec) %}{%- set m = {'string': 'str', 'number': 'float', 'integer': 'int', 'boolean': 'bool'} %}"
     "{%- if m[spec.type] is defined %}{{- m[spec.type] }}{%- elif spec.type == 'array' %}{{- 'list[' + ty(spec['items']) + ']' }}"
     "{%- elif spec.type == 'object' %}{%- if spec.additionalProperties is defined %}{{- 'dict[str, ' + ty(spec.additionalProperties) + ']' }}"
     "{%- else %}{{- 'dict' }}{%- endif %}{%- elif spec.type is iterable %}{{- 'Union[' }}{%- for t in spec.type %}{{- ty({'type': t}) }}"
     "{%- if not loop.last %},{% endif %}{%- endfor %}]{%- else %}Any{%- endif %}{%- endmacro %}"
     "{%- for name, f in {'a': {'type': 'array', 'items': {'type': 'integer'}}, 'b': {'type': ['string', 'integer']},"
     " 'c': {'type': 'object', 'additionalProperties': {'type': 'number'}}, 'd': {}}|items %}{{ name }}: {{ ty(f) }}; {% endfor %}", None),
    ("{{ 'The quick brown fox jumps over'|truncate(12) }}|{{ 'The quick brown fox'|truncate(12, true) }}|{{ 'short'|truncate(5) }}|"
     "{{ 'abcdefghij klm'|truncate(9, false, '~', 0) }}|{{ 'héllo wörld again'|truncate(10, leeway=0) }}", None),
    # the variables transformers passes
    ("{{ eos_token }}|{{ bos_token is defined }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}", None),
]


@pytest.fixture(scope="module")
def env():
    return _env()


def _oracle(env, tmpl):
    cfg = json.load(open(os.path.join(TOKDIR, "tokenizer_config.json")))
    special = {k: cfg[k] for k in ("eos_token", "pad_token") if cfg.get(k)}
    return env.from_string(tmpl).render(messages=MSGS, tools=None, documents=None, add_generation_prompt=False,
                                        **{**special, **V})


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # a case pins '\\q'
@pytest.mark.parametrize("i", range(len(CASES)))
def test_template_matches_jinja2(i, env, shared_dir, ls_bin, tmp_path):
    tmpl, err = CASES[i]
    try:
        want, want_err = _oracle(env, tmpl), None
    except Exception as exc:
        want, want_err = None, exc
    t = tmp_path / "t.jinja"
    t.write_bytes(tmpl.encode("utf-8"))
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": MSGS, "add_generation_prompt": False, "chat_template_kwargs": V}),
                   encoding="utf-8")
    r = subprocess.run([BIN, "chat-template", "--tokenizer-path", TOKDIR, "--chat-template", str(t),
                        "--request", str(req)], capture_output=True, timeout=60)
    out, errtxt = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    if err is None:
        assert want_err is None, f"the case expects success but jinja2 raised {want_err!r}"
        assert r.returncode == 0, errtxt
        assert out == want
    else:
        assert want_err is not None and str(want_err) == err, f"jinja2 gave {want_err!r}, the case says {err!r}"
        assert r.returncode == 2, out
        assert errtxt.rstrip("\n").endswith(err), errtxt
