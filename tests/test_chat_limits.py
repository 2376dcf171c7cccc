"""Crafted chat templates (kit/chat_sandbox.py): what would allocate gigabytes, never end or
overflow the stack is one line and a non-zero exit, at a bound counted in steps and sizes (never
in seconds), and compiling a template allocates nothing."""

from __future__ import annotations

import json

import pytest
from chat_models import CHATML, model_folder, tokenizer_json
from conftest import run_cli

from shardsmith.kit import chat_template
from shardsmith.kit.chat import ChatFields, conversation_of, rendered
from shardsmith.kit.chat_sandbox import environment
from shardsmith.kit.chat_template import ChatError, ChatTemplate

HI = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
SIZES = {  # each would make a value of a gigabyte or more
    "repeat": "{{ 'x' * 10**9 }}",
    "repeat twice": "{{ ('x' * 1000000) * 1000 }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s|length }}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                       "{% endfor %}",
    "%-format": "{{ '%999999999s' % 'x' }}", "%-format star": "{{ '%*s' % (999999999, 'x') }}",
    "center": "{{ 'x'|center(999999999) }}", "ljust": "{{ 'x'.ljust(999999999) }}",
    "str.format": "{{ '{:>999999999}'.format('x') }}", "to_bytes": "{{ (1).to_bytes(999999999, 'big') }}",
    "lipsum": "{{ lipsum(10**6) }}", "join": "{{ (['y' * 1000000] * 1000)|join }}",
    "replace": "{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}", "indent": "{{ ('x\\n' * 1000000)|indent(1000) }}",
    "batch": "{{ [1]|batch(999999999, 0)|list|length }}", "slice": "{{ [1]|slice(999999999)|list|length }}",
    "expandtabs": "{{ ('\\t' * 100000).expandtabs(100000) }}", "tojson indent": "{{ messages|tojson(indent=10**9) }}",
    "power": "{{ 7 ** 999999 }}", "output": "{% for x in range(100000) %}{{ 'a' * 1000 }}{% endfor %}",
    "buffered output": "{% macro f() %}{% for i in range(100000) %}" + "c" * 1000 + "{% endfor %}{% endmacro %}"
                       "{% set x = f() %}",
}


@pytest.mark.parametrize("name", list(SIZES))
def test_what_would_make_a_huge_value_is_a_chat_error(name):
    template = ChatTemplate(source=SIZES[name])
    assert template.syntax_error() is None
    with pytest.raises(ChatError, match="the chat template (would make|would read|would raise|asks|made more)"):
        template.render(HI)


@pytest.mark.parametrize(("source", "size"), [
    ("{{ ('\\n' * 1000000)|indent(1000) }}", 1_000_000),  # blank lines are not indented
    ("{{ ('x ' * 100000)|wordwrap(40) }}", 199_999),
    ("{{ [1, 2, 3]|batch(10**8)|list|length }}", 1),  # no fill: nothing made past the items
    ("{{ ('a\\tb' * 1000).expandtabs(8) }}", 8_001),
    ("{{ ([[1] * 100] * 1000)|sum(start=[])|length }}", 6),
])
def test_what_only_looks_large_renders_as_it_does(source, size):
    text, _ = ChatTemplate(source=source).render(HI)
    assert len(text) == size


def test_compiling_folds_no_operator():
    """Jinja folds constant expressions while compiling: 'x' * 10**9 would be made there."""
    code = environment().compile("{{ 'x' * 10**7 }}{{ 'y' | center(10**7) }}{{ 'z' ~ 'z' * 5000000 }}", raw=True)
    assert len(code) < 20_000


@pytest.mark.parametrize(("source", "words"), [
    ("{% if true %}" * 2000 + "{% endif %}" * 2000, "nests blocks or expressions too deeply"),
    ("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}", "nests blocks or expressions too deeply"),
    ("{% for a in [1] %}" * 25 + "x" + "{% endfor %}" * 25, "too many statically nested blocks"),
    ("{{ x }}" * 30000, "more than 100,000 tokens"),  # (1.5 GB and 20 s to compile a megabyte of them)
])
def test_a_template_too_deep_to_compile_is_one_line(tmp_path, source, words):
    folder = model_folder(tmp_path / "m", tokenizer_json(kind="gpt2"), source)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.jsonl").write_text(json.dumps({"messages": HI}) + "\n")
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", folder / "tokenizer.json",
                  "--chat", "-q")
    assert res.exit_code == 2 and words in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}",  # 10 million passes
    "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}",  # 2 million calls
    "{% for i in range(100000) %}{{ messages|map(attribute='role')|join }}{% endfor %}",
])
def test_work_without_end_runs_out_of_steps_at_the_same_step(monkeypatch, source):
    monkeypatch.setattr(chat_template, "STEPS_BASE", 50_000)
    template = ChatTemplate(source=source)
    conv = conversation_of({"messages": HI}, ChatFields())
    messages = []
    for _ in range(2):
        with pytest.raises(ChatError) as caught:
            rendered(template, conv, train_on="all")
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "took more than 58,000 steps for this conversation" in messages[0]


# work a step did without bound: each case is small enough to finish at once where a step is an item, a
# call or an operator, whatever the step reads (at full size: a 30 MB text scanned a million times,
# a list shared 2**60 times over printed, compared or hashed, 3 MB of words wrapped in Python each step)
READS = {
    "a text scanned each step": "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% if 'y' in s %}{% endif %}"
                                "{% endfor %}",
    "a method reading a text": "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s.count('y') }}{% endfor %}",
    "a shared list compared": "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(18) %}{% set ns.x = [ns.x, ns.x] %}"
                              "{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
    "a shared tuple hashed": "{% set ns = namespace(x=(1,)) %}{% for i in range(18) %}{% set ns.x = (ns.x, ns.x) %}"
                             "{% endfor %}{{ {ns.x: 1}|length }}",
    "a shared list printed": "{% set ns = namespace(x=[1]) %}{% for i in range(18) %}{% set ns.x = [ns.x, ns.x] %}"
                             "{% endfor %}{{ ns.x|tojson|length }}",
    "arguments shared by a macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1, varargs, varargs) }}{% else %}"
                                   "{{ varargs|string|length }}{% endif %}{% endmacro %}{{ f(18, 1) }}",
    "words wrapped in Python": "{% for i in range(3) %}{{ ('ab ' * 20000)|wordwrap(3)|length }}{% endfor %}",
    "an attribute of each item": "{% for i in range(2) %}{{ range(40000)|map(attribute='real')|list|length }}"
                                 "{% endfor %}",
}


@pytest.mark.parametrize("name", list(READS))
def test_what_a_step_reads_is_steps_too(monkeypatch, name):
    monkeypatch.setattr(chat_template, "STEPS_BASE", 50_000)
    with pytest.raises(ChatError, match="took more than 58,000 steps for this conversation"):
        ChatTemplate(source=READS[name]).render(HI)


# memory a render took without counting it: each case is tens of megabytes here, gigabytes at full size
MADE = {
    "a list written out": "{% set s = 'x' * 1000000 %}{{ [s] * 40 }}",
    "a constant written out in a loop": "{% for i in range(100) %}{{ '" + "c" * 700_000 + "' }}{% endfor %}",
    "slices kept": "{% set s = 'x' * 1000000 %}{% set ns = namespace(l=[]) %}{% for i in range(70) %}"
                   "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}",
    "constants filtered": "{% set a = 'x'|center(1000000) %}" * 70,
    "one value formatted many times": "{% set t = ('{0}' * 100).format('x' * 350000) %}",  # (made, then counted)
    "one value %-formatted many times": "{% set t = ('%(a)s' * 100) % {'a': 'x' * 350000} %}",
    "bytes kept": "{% set s = 'x' * 1000000 %}{% set ns = namespace(l=[]) %}{% for i in range(70) %}"
                  "{% set ns.l = ns.l + [s.encode()] %}{% endfor %}",
    "markup kept": "{% set s = 'x' * 1000000 %}{% set ns = namespace(l=[]) %}{% for i in range(70) %}"
                   "{% set ns.l = ns.l + [s|safe] %}{% endfor %}",
}


@pytest.mark.parametrize("name", list(MADE))
def test_what_a_render_makes_is_counted(name):
    with pytest.raises(ChatError, match="the chat template (would make|would read|made more)"):
        ChatTemplate(source=MADE[name]).render(HI)


@pytest.mark.parametrize("operator", ["ns.n + ns.n", "ns.n - (0 - ns.n)"])
def test_integers_doubled_by_addition_stop_at_their_bound(operator):
    """A bit more each step: at 9 million steps a number of 9 million bits, each step slower."""
    source = "{% set ns = namespace(n=1) %}{% for i in range(70000) %}{% set ns.n = " + operator + " %}{% endfor %}"
    with pytest.raises(ChatError, match="would add integers past 65,536 bits"):
        ChatTemplate(source=source).render(HI)


def test_json_indented_deep_is_sized_before_it_is_made():
    """Each item on a line of its own, indented as deep as it lies: 60,000 items 190 lists deep are
    720 MB of indentation (3 GB past the bound at a long conversation's steps), from a 400 kB value."""
    source = ("{% set ns = namespace(x=range(60000)|list) %}{% for i in range(190) %}{% set ns.x = [ns.x] %}"
              "{% endfor %}{{ ns.x|tojson(indent=64)|length }}")
    with pytest.raises(ChatError, match="would make an indented JSON text of"):
        ChatTemplate(source=source).render(HI)


def test_compiling_calls_no_filter():
    """Jinja calls filters of constants while compiling (and writes their result into the code),
    outside any budget: ten of 30 MB each took 3 GB before the first render."""
    code = environment().compile("{% set a = 'x'|center(10000000) %}{{ 'y'|center(10000000) }}", raw=True)
    assert len(code) < 20_000


def test_a_crafted_template_is_a_bad_record_of_one_line(tmp_path):
    folder = model_folder(tmp_path / "m", tokenizer_json(kind="gpt2"), CHATML)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.jsonl").write_text(json.dumps({"messages": HI}) + "\n")
    (tmp_path / "t.jinja").write_text(SIZES["repeat"])
    base = ("pack-tokens", tmp_path / "in", "--tokenizer", folder / "tokenizer.json", "--chat", "-q",
            "--chat-template", tmp_path / "t.jinja")
    res = run_cli(*base, "-o", tmp_path / "out")
    assert res.exit_code == 1 and "line 1: the chat template would make a repetition" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = run_cli(*base, "-o", tmp_path / "skipped", "--on-error", "skip")
    assert res.exit_code != 0 or "1 skipped" in res.stdout + res.stderr


def test_a_conversation_nested_too_deep_is_a_bad_record():
    """Its preparation, tojson and hash all recurse: past 200 levels it is refused before any of them."""
    nested: object = "x"
    for _ in range(900):
        nested = [nested]
    with pytest.raises(ChatError, match="'tools' nests lists and objects 200 levels deep"):
        conversation_of({"messages": HI, "tools": [{"type": "function", "deep": nested}]}, ChatFields())
    with pytest.raises(ChatError, match="'messages' nests lists and objects 200 levels deep"):
        conversation_of({"messages": [*HI, {"role": "user", "content": [nested]}]}, ChatFields())
