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
    with pytest.raises(ChatError, match="the chat template (would make|would raise|asks|made more)"):
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
