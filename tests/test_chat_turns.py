"""The turn-by-turn rule's prefixes found in one render (kit/chat_turns.py): the same spans as
rendering every prefix, for templates that allow it and for those that do not (a look ahead, a
length, a namespace or a read after the loop, a buffered loop, break, continue, else), and a
conversation of thousands of messages in about as many steps as it has messages."""

from __future__ import annotations

import random

import pytest
from chat_models import CHATML, MISTRAL, QWEN_TOOLS, TOOLS

from shardsmith.kit.chat import ChatFields, conversation_of, rendered
from shardsmith.kit.chat_template import ChatError, ChatTemplate, prepared
from shardsmith.kit.chat_turns import Observations, Tracked, _Renders

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")
ZEPHYR = ("{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
          "eos_token }}{% elif message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + eos_token }}"
          "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + eos_token }}"
          "{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}{% endfor %}")
LINE = "{{ m.role }}: {{ m.content }}\n"
PROMPT = "{% if add_generation_prompt %}assistant:{% endif %}"
TEMPLATES = {
    "chatml": CHATML, "qwen": QWEN_TOOLS, "mistral": MISTRAL, "llama2": LLAMA2, "zephyr": ZEPHYR,
    "namespace after": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}" + LINE +
                       "{% endfor %}{% if add_generation_prompt %}assistant {{ ns.n }}:{% endif %}",
    "namespace inside": "{% set ns = namespace(seen=false) %}{% for m in messages %}{% if m.role == 'system' %}"
                        "{% set ns.seen = true %}{% endif %}{{ ns.seen }} " + LINE + "{% endfor %}" + PROMPT,
    "last after": "{% for m in messages %}" + LINE + "{% endfor %}"
                  "{% if add_generation_prompt and messages[-1].role == 'user' %}assistant:{% endif %}",
    "break": "{% for m in messages %}{% if m.content == 'stop' %}{% break %}{% endif %}" + LINE + "{% endfor %}" + PROMPT,
    "continue": "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}" + LINE + "{% endfor %}" +
                PROMPT,
    "filtered": "{% for m in messages if m.role != 'system' %}" + LINE + "{% endfor %}" + PROMPT,
    "length": "{% for m in messages %}{{ loop.index }}/{{ loop.length }} " + LINE + "{% endfor %}" + PROMPT,
    "macro": "{% macro r(ms) %}{% for m in ms %}" + LINE + "{% endfor %}{% endmacro %}{{ r(messages) }}" + PROMPT,
    "else": "{% for m in messages[1:] %}" + LINE + "{% else %}nothing yet\n{% endfor %}" + PROMPT,
    "two loops": "{% for m in messages %}{% if m.role == 'system' %}[sys]{% endif %}{% endfor %}"
                 "{% for m in messages %}" + LINE + "{% endfor %}" + PROMPT,
    "joiner": "{% set sep = joiner('| ') %}{% for m in messages %}{{ sep() }}" + LINE + "{% endfor %}" + PROMPT,
    "tojson": "{{ messages|length }}{% for m in messages %}" + LINE + "{% endfor %}{{ messages|tojson|length }}" + PROMPT,
    "count": "{% for m in messages %}" + LINE + "{% endfor %}{% if add_generation_prompt %}{{ messages|length }}:"
             "{% endif %}",
}
WORDS = ["hi", "stop", "the fox", "", " spaced ", "日本語", "a\nb"]


def _conversation(rng: random.Random, *, tools: bool) -> list[dict]:
    messages = [{"role": "system", "content": rng.choice(WORDS)}] if rng.random() < 0.4 else []
    for _ in range(rng.randint(1, 7)):
        messages.append({"role": "user", "content": rng.choice(WORDS)})
        if tools and rng.random() < 0.4:
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"q": rng.choice(WORDS)}}}]})
            messages.extend({"role": "tool", "content": rng.choice(WORDS)} for _ in range(rng.randint(1, 2)))
        if rng.random() < 0.85:
            messages.append({"role": "assistant", "content": rng.choice(WORDS)})
    return messages


def _one_by_one(template: ChatTemplate, messages: list[dict], tools) -> tuple[str, list] | str:
    """The rule as written: every prefix rendered (what kit/chat.py did for every conversation)."""
    try:
        text, _ = template.render(messages, tools=tools)
        spans = []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            ends = []
            for part, prompt in ((messages[:k], True), (messages[:k + 1], False)):
                try:
                    got, _ = template.render(part, tools=tools, add_generation_prompt=prompt, allow_empty=True)
                except ChatError:
                    if part:
                        raise
                    return "first"
                if not text.startswith(got):
                    return "first" if not part else "not turn by turn"
                ends.append(len(got))
            if ends[1] < ends[0]:
                return "not turn by turn"
            spans.append(tuple(ends))
        return text, [s for s in sorted(spans) if s[1] > s[0]]
    except ChatError as exc:
        return str(exc)


def _ours(template: ChatTemplate, messages: list[dict], tools) -> tuple[str, list] | str:
    record = {"messages": messages, **({"tools": tools} if tools else {})}
    try:
        return rendered(template, conversation_of(record, ChatFields()), train_on="assistant")
    except ChatError as exc:
        return str(exc)


def _same(ours, theirs) -> bool:
    if isinstance(theirs, str):  # the same failure
        return isinstance(ours, str) and (theirs in ours or ("turn by turn" in ours) == ("turn by turn" in theirs))
    text, spans = ours
    merged = []  # ours are tidied (touching spans merged)
    for a, b in theirs[1]:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return text == theirs[0] and spans == merged


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_spans_are_those_of_every_prefix_rendered(name):
    template = ChatTemplate(source=TEMPLATES[name], variables={"bos_token": "<s>", "eos_token": "</s>"})
    rng = random.Random(name)
    for i in range(150):
        tools = TOOLS if name == "qwen" and rng.random() < 0.5 else None
        messages = _conversation(rng, tools=name == "qwen")
        assert _same(_ours(template, messages, tools), _one_by_one(template, messages, tools)), (name, i, messages)


@pytest.mark.parametrize(("name", "found"), [("chatml", True), ("mistral", True), ("llama2", True), ("zephyr", False),
                                             ("namespace after", False), ("last after", False), ("macro", False),
                                             ("length", False), ("filtered", True), ("count", False)])
def test_which_templates_give_their_prefixes_in_one_render(name, found):
    template = ChatTemplate(source=TEMPLATES[name], variables={"bos_token": "<s>", "eos_token": "</s>"})
    messages = [{"role": r, "content": f"m{i}"} for i, r in enumerate(["system"] + ["user", "assistant"] * 4)]
    chat = prepared(messages)
    text, _ = template.render(messages)
    with_prompt, _ = template.render(messages, add_generation_prompt=True)
    whole = _Renders(template, chat, None, plain=with_prompt, plain_text=text, add_generation_prompt=True)
    assert all((whole.pieces(k) is not None) == found for k in range(2, len(messages))), name


def test_a_tracked_sequence_reads_as_a_list():
    seen = Observations(4)
    items = prepared([{"role": "user", "content": str(i)} for i in range(4)])
    tracked = Tracked(items, seen)
    assert list(tracked) == items and tracked[1:][0] == items[1] and tracked[-1] == items[-1]
    assert len(tracked) == 4 and items[2] in tracked and tracked == items and bool(tracked)
    with pytest.raises(IndexError):
        tracked[9]


class _Counted(ChatTemplate):
    """A template that counts its renders (of the whole conversation or a prefix)."""

    renders = 0

    def render(self, *args, **kwargs):
        _Counted.renders += 1
        return super().render(*args, **kwargs)

    def render_prepared(self, *args, **kwargs):
        _Counted.renders += 1
        return super().render_prepared(*args, **kwargs)


def test_thousands_of_messages_are_rendered_a_few_times_not_once_per_prefix():
    template = _Counted(source=CHATML, variables={})
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(3000)]
    conv = conversation_of({"messages": messages}, ChatFields())
    _Counted.renders = 0
    text, spans = rendered(template, conv, train_on="assistant")
    assert len(spans) == 1500 and _Counted.renders <= 10, _Counted.renders  # not 3,000 (one per prefix)
    assert [text[a:b] for a, b in spans[:2]] == ["message 1<|im_end|>\n", "message 3<|im_end|>\n"]


# a loop's passes leave state behind, or a template reads messages where no read is seen: each must keep
# the prefixes rendered (every pass starts with more x's than any tail, so a wrong tail still looks a prefix)
AHEAD = "{{ 'x' * 100 }}{{ m.role }}:{{ m.content }};"
UNSEEN = {
    "namespace as text": "{% set ns = namespace(s='') %}{% for m in messages %}" + AHEAD +
                         "{% set ns.s = 'x' * loop.index %}{% endfor %}{{ (ns|string)[18:-3] }}",
    "iterator advanced by the loop": "{% set g = range(1000)|map('string') %}{% for m in messages %}" + AHEAD +
                                     "{{ '' if g|first else '' }}{% endfor %}{{ 'x' * (g|first|int) }}",
    "the tracked messages' own list": "{% set last = messages.items[-1].content if messages.items is defined else "
                                      "messages[-1].content %}{% for m in messages %}" + AHEAD + "{% endfor %}"
                                      "{{ last }}",
}


@pytest.mark.parametrize("name", list(UNSEEN))
def test_state_left_by_the_loop_or_an_unseen_read_keeps_the_prefixes_rendered(name):
    template = ChatTemplate(source=UNSEEN[name])
    messages = [{"role": r, "content": "x" * i} for i, r in enumerate(["user", "assistant"] * 8)]
    ours, theirs = _ours(template, messages, None), _one_by_one(template, messages, None)
    assert not isinstance(theirs, str) and _same(ours, theirs), (ours, theirs)
